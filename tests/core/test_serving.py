"""Issue 27, items 1-4: serving in production -- the fallback, stats(), the serving log and
shadow checks -- each served from a fresh process, both tracers, eager backend.

The partial-effects rule is shown on a Dynamo artifact whose continuation (after a graph
break) refuses once the entry's graph has updated a train-mode BatchNorm: the fallback is
not taken, and the buffers moved once.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from tests.fixtures import serving_models as m
from tests.harness import capture_pair, run_json, run_python, together

TRACERS = ["make_fx", "dynamo"]
BACKENDS = ["eager", "inductor"]

PRELUDE = """
import json, os, sys, warnings
import torch, precompile
warnings.simplefilter("ignore", precompile.ArtifactTrustWarning)
from tests.fixtures import serving_models as m
caught = []
warnings.showwarning = lambda message, category, *a, **k: caught.append(
    (category.__name__, str(message)))
warnings.simplefilter("always", precompile.EagerFallbackWarning)
"""


def _tracer(name: str) -> Any:
    return precompile.MakeFxTracer() if name == "make_fx" else precompile.DynamoTracer()


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    directory = tmp_path_factory.mktemp("serving")
    out = {}
    for name in TRACERS:
        for backend in BACKENDS:
            suffix = "" if backend == "eager" else f"_{backend}"
            out[f"mlp_{name}{suffix}"] = capture_pair(
                m.run_model, m.mlp(), torch.randn(8, 64), directory=directory,
                name=f"mlp_{name}{suffix}", tracer=_tracer(name), backend=backend,
            )  # fmt: skip
    out["bn_break"] = capture_pair(
        m.bn_break, m.bn_model(), torch.randn(8, 4), directory=directory, name="bn_break",
        tracer=precompile.DynamoTracer(), training=True,
    )  # fmt: skip
    out["add_one"] = capture_pair(m.add_one_, torch.randn(3), directory=directory, name="add")
    return out


def _serve(code: str, **env: str) -> dict[str, Any]:
    return run_json(PRELUDE + textwrap.dedent(code), **env)


# -- 1. the fallback -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tracer", TRACERS)
def test_fallback_serves_a_refused_call_warns_once_and_counts(
    pairs: dict[str, tuple[str, str]], tracer: str, backend: str
) -> None:
    artifact, cache = pairs[f"mlp_{tracer}" + ("" if backend == "eager" else f"_{backend}")]
    out = _serve(f"""
        model = m.mlp()
        calls = []
        def fallback(*args, **kwargs):
            calls.append(1)
            return m.run_model(*args, **kwargs)
        run = precompile.load({artifact!r}, {cache!r}, fallback=fallback)
        x8, x3 = torch.randn(8, 64), torch.randn(3, 64)
        served = run(model, x8)
        a = run(model, x3)
        b = run(model, x3)
        bare = precompile.load({artifact!r}, {cache!r})
        try:
            bare(model, x3)
            raised = False
        except precompile.PrecompileError:
            raised = True
        print(json.dumps({{
            "served_ok": bool(torch.allclose(served, model(x8))),
            "fallback_ok": bool(torch.equal(a, model(x3))) and bool(torch.equal(b, model(x3))),
            "fallback_calls": len(calls),
            "warnings": [c for c in caught if c[0] == "ServingFallbackWarning"],
            "stats": run.stats(),
            "bare_raised": raised,
            "bare_stats": bare.stats(),
        }}))
    """)
    assert out["served_ok"] and out["fallback_ok"]
    assert out["fallback_calls"] == 2
    assert len(out["warnings"]) == 1, out["warnings"]
    stats = out["stats"]
    assert (stats["calls"], stats["served"], stats["fallback"], stats["refused"]) == (3, 1, 2, 0)
    [reason] = stats["reasons"]
    assert reason["count"] == 2 and reason["fallback"] == 2 and reason["partial"] == 0
    assert reason["reason"].startswith("precompile:") and "\n" not in reason["reason"]
    assert reason["reason"] in out["warnings"][0][1]
    assert reason["signatures"] == ["Sequential, float32[3,64] cpu contiguous"]
    assert out["bare_raised"]
    bare = out["bare_stats"]
    assert (bare["calls"], bare["refused"], bare["fallback"]) == (1, 1, 0)


def test_a_refusal_of_the_pair_itself_never_falls_back(
    pairs: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    """A swapped cache (a torn pair) and an edited artifact raise at load, fallback or not:
    a swapped artifact must not look like a coverage gap."""
    artifact, _ = pairs["mlp_make_fx"]
    _, other_cache = pairs["mlp_dynamo"]
    torn = tmp_path / "torn.py"
    shutil.copy(artifact, torn)
    shutil.copy(other_cache, tmp_path / "torn.cache")
    edited = tmp_path / "edited.py"
    shutil.copy(artifact, edited)
    shutil.copy(pairs["mlp_make_fx"][1], tmp_path / "edited.cache")
    edited.write_text(edited.read_text() + "\n# edited\n")
    out = _serve(f"""
        result = {{}}
        for name in ("torn", "edited"):
            path = os.path.join({str(tmp_path)!r}, name)
            try:
                precompile.load(path + ".py", path + ".cache", fallback=m.run_model)
                result[name] = "loaded"
            except precompile.PrecompileError as error:
                result[name] = error.message
        print(json.dumps(result))
    """)
    assert out["torn"] != "loaded" and out["edited"] != "loaded", out


def test_a_refusal_after_part_of_the_call_ran_does_not_fall_back(
    pairs: dict[str, tuple[str, str]],
) -> None:
    """bn_break's continuation refuses (SCALE rebound) after the entry's graph ran the
    train-mode BatchNorm: falling back would update its running stats a second time."""
    artifact, cache = pairs["bn_break"]
    out = _serve(f"""
        import copy
        model = m.bn_model().train()
        reference = copy.deepcopy(model)
        calls = []
        def fallback(*args):
            calls.append(1)
            return m.bn_break(*args)
        run = precompile.load({artifact!r}, {cache!r}, fallback=fallback)
        x = torch.randn(8, 4)
        m.SCALE = 3.0
        try:
            run(model, x)
            message = None
        except precompile.PrecompileError as error:
            message = str(error)
        reference(x)  # eager applies the BatchNorm's update once
        once = all(torch.equal(a, b) for a, b in zip(model.buffers(), reference.buffers()))
        # A refusal at the entry (another batch shape) runs nothing first: it falls back.
        y = run(model, torch.randn(5, 4))
        print(json.dumps({{"message": message, "fallback_calls": len(calls), "once": once,
                          "tracked": int(model.bn.num_batches_tracked), "stats": run.stats()}}))
    """)
    assert out["message"] is not None
    assert "after part of it had already run" in out["message"]
    assert "could not fall back" in out["message"]
    assert out["once"], "the BatchNorm's buffers moved other than once"
    assert out["fallback_calls"] == 1 and out["tracked"] == 2  # 1 refused + 1 fallback
    stats = out["stats"]
    assert (stats["refused"], stats["fallback"], stats["served"]) == (1, 1, 0)
    partial = [r for r in stats["reasons"] if r["partial"]]
    assert len(partial) == 1 and partial[0]["refused"] == 1
    assert "SCALE" in partial[0]["reason"]


# -- 2. counters ---------------------------------------------------------------------------


@pytest.mark.parametrize("tracer", TRACERS)
def test_stats_keeps_a_bounded_set_of_signatures_and_never_a_value(
    pairs: dict[str, tuple[str, str]], tracer: str
) -> None:
    artifact, cache = pairs[f"mlp_{tracer}"]
    out = _serve(f"""
        model = m.mlp()
        run = precompile.load({artifact!r}, {cache!r}, fallback=m.run_model)
        for _ in range(5):
            run(model, torch.randn(8, 64))
        run(model, torch.randn(64, 16).t())
        for n in range(1, 13):
            if n != 8:
                run(model, torch.full((n, 64), 123.456))
        print(json.dumps(run.stats()))
    """)
    assert out["served"] == 5 and out["calls"] == 17
    assert sum(r["count"] for r in out["reasons"]) == 12
    for reason in out["reasons"]:
        assert len(reason["signatures"]) <= 8
    text = json.dumps(out)
    assert "123.456" not in text and "123.4" not in text
    signatures = [s for r in out["reasons"] for s in r["signatures"]]
    assert "Sequential, float32[16,64] cpu other" in signatures
    assert "Sequential, float32[1,64] cpu contiguous" in signatures


# -- 3. the serving log ----------------------------------------------------------------------

LOG_WRITER = """
model = m.mlp()
run = precompile.load({artifact!r}, {cache!r}, fallback=m.run_model, serving_log={log!r})
for i in range({n}):
    run(model, torch.randn(8 if i % 4 else 3, 64))
print(json.dumps({{"pid": os.getpid(), "hash": run._serving.code_hash}}))
"""


def test_serving_log_from_two_processes_at_once_parses_line_by_line(
    pairs: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    artifact, cache = pairs["mlp_make_fx"]
    log = tmp_path / "serving.jsonl"
    script = PRELUDE + LOG_WRITER.format(artifact=artifact, cache=cache, log=str(log), n=40)
    pids = {result["pid"] for result in together(*[lambda: run_json(script) for _ in range(2)])}
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert {r["pid"] for r in records} == pids
    for r in records:
        assert r["format"] == "precompile-serving-log" and r["version"] == 1
        assert r["target"] == "tests.fixtures.serving_models.run_model"
        assert len(r["code_hash"]) >= 16
    assert sum(r["served"] for r in records) == 60
    assert sum(r["fallback"] for r in records) == 20
    [reason] = {x["reason"] for r in records for x in r["reasons"]}
    assert all(
        x["signatures"] == ["Sequential, float32[3,64] cpu contiguous"]
        for r in records
        for x in r["reasons"]
    )


def test_serving_log_from_the_environment_goes_to_a_file_per_process_in_a_directory(
    pairs: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    artifact, cache = pairs["mlp_dynamo"]
    directory = tmp_path / "logs"
    directory.mkdir()
    out = _serve(
        LOG_WRITER.replace(", serving_log={log!r}", "").format(artifact=artifact, cache=cache, n=8),
        PRECOMPILE_SERVING_LOG=str(directory),
    )
    [path] = directory.iterdir()
    assert path.name == f"precompile-serving-{out['pid']}.jsonl"
    [record] = [json.loads(line) for line in path.read_text().splitlines()]
    assert (record["served"], record["fallback"], record["code_hash"]) == (6, 2, out["hash"])


def test_a_serving_log_that_cannot_be_written_warns_once_and_fails_no_call(
    pairs: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    artifact, cache = pairs["mlp_make_fx"]
    log = tmp_path / "missing" / "dir" / "log.jsonl"
    out = _serve(f"""
        model = m.mlp()
        run = precompile.load({artifact!r}, {cache!r}, fallback=m.run_model, serving_log={str(log)!r})
        for i in range(4):
            run(model, torch.randn(3, 64))
            run.flush_serving_log()
        print(json.dumps({{"stats": run.stats(), "warnings": [c for c in caught if "serving log" in c[1]]}}))
    """)
    assert out["stats"]["fallback"] == 4
    assert len(out["warnings"]) == 1


# -- 4. shadow checks ------------------------------------------------------------------------


@pytest.mark.parametrize("tracer", TRACERS)
def test_shadow_compares_sampled_calls_and_counts_mismatches(
    pairs: dict[str, tuple[str, str]], tracer: str, tmp_path: Path
) -> None:
    artifact, cache = pairs[f"mlp_{tracer}"]
    log = tmp_path / "shadow.jsonl"
    out = _serve(f"""
        import random
        model = m.mlp()
        x = torch.randn(8, 64)
        agree = precompile.load({artifact!r}, {cache!r}, fallback=m.run_model, shadow=1.0)
        for _ in range(3):
            agree(model, x)
        wrong = lambda model, x: m.run_model(model, x) + 1
        differ = precompile.load({artifact!r}, {cache!r}, fallback=wrong, shadow=1.0,
                                 serving_log={str(log)!r})
        served = differ(model, x)
        differ.flush_serving_log()
        strict = precompile.load({artifact!r}, {cache!r}, fallback=wrong, shadow=1.0,
                                 shadow_strict=True)
        try:
            strict(model, x)
            strict_message = None
        except precompile.PrecompileError as error:
            strict_message = error.message
        sampled = precompile.load({artifact!r}, {cache!r}, fallback=m.run_model, shadow=0.3,
                                  shadow_seed=7)
        for _ in range(50):
            sampled(model, x)
        draws = random.Random(7)
        expected = sum(draws.random() < 0.3 for _ in range(50))
        print(json.dumps({{"agree": agree.stats()["shadow"], "differ": differ.stats(),
                          "served_ok": bool(torch.equal(served, model(x))),
                          "strict": strict_message, "sampled": sampled.stats()["shadow"],
                          "expected": expected}}))
    """)
    assert out["agree"]["runs"] == 3 and out["agree"]["mismatches"] == 0
    assert out["served_ok"]  # a mismatch is reported, the artifact's answer still served
    shadow = out["differ"]["shadow"]
    assert shadow["runs"] == 1 and shadow["mismatches"] == 1
    assert (
        shadow["mismatch_signatures"][0]["signature"] == "Sequential, float32[8,64] cpu contiguous"
    )
    [record] = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["shadow_mismatches"] == 1 and record["mismatches"][0]["signature"]
    assert out["strict"] and "shadow check" in out["strict"]
    assert out["sampled"]["runs"] == out["expected"] and 0 < out["expected"] < 50


def test_shadow_runs_leave_state_changed_once(pairs: dict[str, tuple[str, str]]) -> None:
    """The fallback of a shadow run gets copies of the arguments: an in-place input write
    (make_fx) and a train-mode BatchNorm update (Dynamo, graph break) happen once."""
    add_artifact, add_cache = pairs["add_one"]
    bn_artifact, bn_cache = pairs["bn_break"]
    out = _serve(f"""
        import copy
        add = precompile.load({add_artifact!r}, {add_cache!r}, fallback=m.add_one_, shadow=1.0)
        x = torch.zeros(3)
        add(x)
        bn = precompile.load({bn_artifact!r}, {bn_cache!r}, fallback=m.bn_break, shadow=1.0)
        model = m.bn_model().train()
        reference = copy.deepcopy(model)
        inputs = torch.randn(8, 4)
        bn(model, inputs)
        reference(inputs)
        once = all(torch.equal(a, b) for a, b in zip(model.buffers(), reference.buffers()))
        print(json.dumps({{"x": x.tolist(), "add": add.stats()["shadow"],
                          "bn": bn.stats()["shadow"], "once": once}}))
    """)
    assert out["x"] == [1.0, 1.0, 1.0]
    assert out["add"]["runs"] == 1 and out["add"]["mismatches"] == 0
    assert out["bn"]["runs"] == 1 and out["bn"]["mismatches"] == 0
    assert out["once"]


# -- arguments -------------------------------------------------------------------------------


def test_serving_arguments_are_validated(pairs: dict[str, tuple[str, str]]) -> None:
    artifact, cache = pairs["mlp_make_fx"]
    with pytest.raises(TypeError, match="fallback"):
        precompile.load(artifact, cache, fallback="m.run_model")  # type: ignore[arg-type]
    for rate in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            precompile.load(artifact, cache, fallback=m.run_model, shadow=rate)
    with pytest.raises(ValueError, match="needs fallback"):
        precompile.load(artifact, cache, shadow=0.01)


def test_import_precompile_stays_light() -> None:
    proc = run_python(
        "import sys, precompile.serving, precompile.loading;"
        "print(any(n.startswith('torch') for n in sys.modules))",
        cold=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
