"""Parity with eager: captured in-process, then served in a fresh process with other
weights, and from python_code alone where precompile is not importable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from tests.fixtures.models import CASES, observe, serve
from tests.harness import assert_same, serve_fresh

BACKENDS = ["eager", "inductor"]


def _capture_and_drive(case_name: str, backend: str, directory: Path) -> dict[str, Any]:
    """Capture on the case's first call, serve the remaining calls through load()."""
    case = CASES[case_name]
    paths = str(directory / f"{case_name}.py"), str(directory / f"{case_name}.cache")
    args = case.build(0)
    runnable: list[Any] = []
    with precompile.capture(
        case.fn,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.MakeFxTracer(),
        backend=backend,
        training=case.training,
    ) as cap:

        def call(*a: Any) -> Any:
            if runnable:
                return runnable[0](*a)
            out = cap(*a)
            cap.save()
            runnable.append(precompile.load(*paths))
            return out

        served = observe(args, case.drive(call, args))
    return {"paths": paths, "served": served, "report": cap.report()}


@pytest.fixture(scope="session", params=BACKENDS)
def captured(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp(f"artifacts-{request.param}")
    return {
        "backend": request.param,
        "dir": directory,
        "cases": {name: _capture_and_drive(name, request.param, directory) for name in CASES},
    }


@pytest.mark.parametrize("case_name", list(CASES))
def test_in_process_parity_with_eager(captured: dict[str, Any], case_name: str) -> None:
    expected = serve(case_name, CASES[case_name].fn, 0)
    assert_same(captured["cases"][case_name]["served"], expected)


@pytest.fixture(scope="session")
def fresh_results(
    captured: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    entries = [
        {"key": name, "case": name, "artifact": c["paths"][0], "cache": c["paths"][1], "seed": 1}
        for name, c in captured["cases"].items()
    ]
    return serve_fresh(entries, tmp_path_factory.mktemp("fresh"))


@pytest.mark.parametrize("case_name", list(CASES))
def test_fresh_process_parity_with_other_weights(
    fresh_results: dict[str, Any], case_name: str
) -> None:
    result = fresh_results[case_name]
    assert "error" not in result, result.get("traceback")
    assert_same(result, serve(case_name, CASES[case_name].fn, 1))


def test_fresh_load_imports_no_compiler(fresh_results: dict[str, Any]) -> None:
    # Eager artifacts never need the compiler; Inductor artifacts loaded with their cache
    # bind prebuilt kernels and need it neither.
    loaded = fresh_results["__modules__"]
    assert not [m for m in loaded if m.startswith(("torch._dynamo", "torch._inductor"))]


def test_serves_without_precompile_installed(captured: dict[str, Any], tmp_path: Path) -> None:
    entries = [
        {"key": name, "case": name, "artifact": c["paths"][0], "seed": 2}
        for name, c in captured["cases"].items()
    ]
    entries.append(
        {
            "key": "mismatch",
            "case": "mlp_wrong_shape",
            "artifact": captured["cases"]["mlp"]["paths"][0],
            "seed": 2,
        }
    )
    results = serve_fresh(entries, tmp_path, without_precompile=True)
    for name in CASES:
        assert "error" not in results[name], results[name].get("traceback")
        assert_same(results[name], serve(name, CASES[name].fn, 2))
    # The artifact's own error class: same name, and not the package's (not importable).
    error = results["mismatch"]["error"]
    assert error.startswith("artifact.PrecompileError: "), error
    assert "invariant 3" in error


def test_capture_result_updates_batchnorm_stats_once(captured: dict[str, Any]) -> None:
    case = CASES["convbn_train"]
    before = case.build(0)[0].bn.running_mean.clone()
    served = captured["cases"]["convbn_train"]["served"]["arg0.buffer.bn.running_mean"]
    eager_once = serve("convbn_train", case.fn, 0)["arg0.buffer.bn.running_mean"]
    assert not torch.equal(served, before)
    torch.testing.assert_close(served, eager_once)
    assert (
        captured["cases"]["convbn_train"]["served"]["arg0.buffer.bn.num_batches_tracked"].item()
        == 1
    )


def test_training_step_keeps_frozen_grad_none(captured: dict[str, Any]) -> None:
    served = captured["cases"]["train_step"]["served"]
    assert served["arg0.grad.out.bias"] is None
    assert all(g[3] is None for g in served["result"]["grads"])
    assert served["arg0.grad.body.weight"] is None  # zero_grad() after the last step
    assert all(g[0] is not None for g in served["result"]["grads"])


def test_output_alias_and_inplace_mutation_are_reproduced(captured: dict[str, Any]) -> None:
    assert captured["cases"]["alias"]["served"]["arg0.aliased_by_result0"] is True
    original = CASES["inplace"].build(0)[0]
    mutated = captured["cases"]["inplace"]["served"]["arg0.input"]
    torch.testing.assert_close(mutated, original * 0.5 + 1.0)


def test_report_is_json_ready_and_names_sources(captured: dict[str, Any]) -> None:
    import json

    report = captured["cases"]["mlp"]["report"].to_dict()
    json.dumps(report)
    assert report["ok"] and report["tracer"] == "make_fx" and report["graph"]["ops"] > 0
    assert report["target"]["name"] == "mlp_fn"
    paths = [s["path"] for s in report["sources"]]
    assert any(p.endswith("tests/fixtures/models.py") for p in paths)
    assert {"trace_s", "lower_s", "emit_s", "load_s", "first_call_s"} <= set(report["timings"])
