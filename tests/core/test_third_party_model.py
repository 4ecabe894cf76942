"""A model from a third-party library: a randomly initialised Hugging Face GPT-2 called
through an entry with a graph break, captured with the Dynamo tracer (eager and Inductor
backends), served in a fresh process with zero compiles, in parity with eager and with
torch.compile (run in a fresh process of its own). The break is in the entry, after the
model call, so the artifact serves standalone."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from tests.fixtures.gpt2_entry import build_model, input_ids, next_token_logprobs
from tests.harness import assert_same, run_saving_job, together

BACKENDS = ["eager", "inductor"]
SERVE_SEEDS = [1, 2]  # other token values, same shape as the captured call


def _serve_fresh(job: dict[str, Any], directory: Path) -> dict[str, Any]:
    job_file = directory / f"job-{len(list(directory.iterdir()))}.json"
    return dict(
        run_saving_job(
            "tests.fixtures.gpt2_entry",
            job,
            job_file,
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
    )


@pytest.fixture(autouse=True)
def _quiet_dynamo() -> None:
    torch._logging.set_logs(dynamo=logging.ERROR)


@pytest.fixture(scope="module", params=BACKENDS)
def gpt2(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    torch._logging.set_logs(dynamo=logging.ERROR)
    backend = request.param
    directory = tmp_path_factory.mktemp(f"gpt2-{backend}")
    torch._dynamo.reset()
    model = build_model(seed=0)
    state_dict = directory / "state_dict.pt"
    torch.save(model.state_dict(), state_dict)
    paths = str(directory / "gpt2.py"), str(directory / "gpt2.cache")
    with warnings.catch_warnings():
        warnings.simplefilter("error", precompile.RiskyGuardWarning)
        with precompile.capture(
            next_token_logprobs,
            artifact_path=paths[0],
            cache_path=paths[1],
            tracer=precompile.DynamoTracer(),
            backend=backend,
        ) as cap:
            captured = cap(model, input_ids(0))
    job = {"state_dict": str(state_dict), "seeds": SERVE_SEEDS}
    artifact = {"artifact": paths[0], "cache": paths[1]}
    jobs = {
        "gpt2-fresh": {**job, **artifact},
        "gpt2-load-first": {**job, **artifact, "load_first": True},
        "gpt2-compile": {**job, "torch_compile": backend},
    }
    dirs = {name: tmp_path_factory.mktemp(name) for name in jobs}
    fresh, load_first, torch_compile = together(
        *(lambda name=name: _serve_fresh(jobs[name], dirs[name]) for name in jobs)
    )
    return {
        "backend": backend,
        "model": model,
        "captured": captured,
        "report": cap.report(),
        "summary": cap.summary(),
        "fresh": fresh,
        "load_first": load_first,
        "torch_compile": torch_compile,
    }


def test_capture_runs_for_real_like_eager(gpt2: dict[str, Any]) -> None:
    assert_same(gpt2["captured"], next_token_logprobs(gpt2["model"], input_ids(0)))


def test_break_in_the_entry_serves_standalone(gpt2: dict[str, Any]) -> None:
    report, summary = gpt2["report"], gpt2["summary"]
    assert report.serving_mode == "standalone"
    (gb,) = report.graph_breaks
    assert gb["gb_id"] == "GB0025"
    assert gb["location"]["file"].endswith("tests/fixtures/gpt2_entry.py")
    assert summary.complete and summary.frames == 2, str(summary)
    # transformers' forward decorators read ``func.__code__``: Dynamo guards it with a
    # CONSTANT_MATCH whose derived check is an identity, which the default filter drops.
    code_guards = [s for s in report.audit.dropped if s.path.endswith(".__code__")]
    assert code_guards and all(s.dropped_by == "default" for s in code_guards)
    assert not [s for s in report.audit.dropped if s.dropped_by == "user"]
    assert not report.audit.risky


def test_fresh_process_parity_with_eager_and_torch_compile(gpt2: dict[str, Any]) -> None:
    fresh, reference = gpt2["fresh"], gpt2["torch_compile"]
    assert "error" not in fresh, fresh.get("traceback")
    assert "error" not in reference, reference.get("traceback")
    assert fresh["installed"] is False
    eager = {seed: next_token_logprobs(gpt2["model"], input_ids(seed)) for seed in SERVE_SEEDS}
    assert_same(fresh["results"], eager)
    assert_same(fresh["results"], reference["results"])


def test_fresh_process_compiles_nothing(gpt2: dict[str, Any]) -> None:
    assert gpt2["fresh"]["dynamo_frames_compiled"] == 0
    assert gpt2["torch_compile"]["dynamo_frames_compiled"] > 0  # the count can fail


def test_loading_before_the_state_its_guards_read_is_refused_clearly(
    gpt2: dict[str, Any],
) -> None:
    # transformers fills a class registry when a model is built; the guards read it by key
    # position. Loaded before any model exists, the artifact says what to do.
    error = gpt2["load_first"]["error"]
    assert error.startswith("precompile.errors.PrecompileError: precompile: the guards of"), error
    assert "could not be rebuilt in this process" in error
    assert "build the model" in error
