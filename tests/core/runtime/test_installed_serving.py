"""Installed serving: graph breaks inside functions the entry calls (a child module's
forward, a helper in another module), served in a fresh process with zero compiles,
in parity with torch.compile and eager; serve-time compiles refused or allowed and
counted; a process that already compiled the function refused; unload."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

import precompile
from tests.fixtures.installed_models import CASES
from tests.fixtures.models import observe, serve
from tests.harness import assert_same, run_json, run_python, serve_fresh, together


@pytest.fixture(autouse=True)
def _quiet_dynamo() -> None:
    torch._logging.set_logs(dynamo=logging.ERROR)


@pytest.fixture(scope="session", params=["eager", "inductor"])
def installed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    torch._logging.set_logs(dynamo=logging.ERROR)
    directory = tmp_path_factory.mktemp(f"installed-{request.param}")
    cases = {}
    for name, case in CASES.items():
        torch._dynamo.reset()
        paths = str(directory / f"{name}.py"), str(directory / f"{name}.cache")
        args = case.build(0)
        with precompile.capture(
            case.fn,
            artifact_path=paths[0],
            cache_path=paths[1],
            backend=request.param,
            training=case.training,
        ) as cap:
            served = observe(args, case.drive(cap, args))
        cases[name] = {"paths": paths, "served": served, "report": cap.report()}
    # Installed artifacts sharing a function (ChattyNet's forwards) cannot serve in one
    # process (tested below), so each is served in a fresh process of its own.
    entries = [
        [{"key": n, "case": n, "artifact": c["paths"][0], "cache": c["paths"][1], "seed": 1}]
        for n, c in cases.items()
    ]
    reference = [{"key": n, "case": n, "torch_compile": request.param, "seed": 1} for n in cases]
    dirs = [tmp_path_factory.mktemp("installed-fresh") for _ in entries]
    compile_dir = tmp_path_factory.mktemp("installed-compile")
    *results, torch_compile = together(
        *(lambda e=e, d=d: serve_fresh(e, d) for e, d in zip(entries, dirs)),
        lambda: serve_fresh(reference, compile_dir),
    )
    fresh: dict[str, Any] = {"__dynamo_frames_compiled__": 0}
    for n, result in zip(cases, results):
        fresh[n] = result[n]
        fresh["__dynamo_frames_compiled__"] += result["__dynamo_frames_compiled__"]
    return {
        "backend": request.param,
        "cases": cases,
        "fresh": fresh,
        "torch_compile": torch_compile,
    }


@pytest.mark.parametrize("case_name", list(CASES))
def test_fresh_process_parity_with_eager_and_torch_compile(
    installed: dict[str, Any], case_name: str
) -> None:
    case = installed["cases"][case_name]
    assert case["report"].serving_mode == "installed"
    assert_same(case["served"], serve(case_name, CASES[case_name].fn, 0))
    fresh = installed["fresh"][case_name]
    assert "error" not in fresh, fresh.get("traceback")
    assert_same(fresh, serve(case_name, CASES[case_name].fn, 1))
    reference = installed["torch_compile"][case_name]
    assert "error" not in reference, reference.get("traceback")
    assert_same(fresh, reference)


def test_fresh_process_compiles_nothing(installed: dict[str, Any]) -> None:
    assert installed["fresh"]["__dynamo_frames_compiled__"] == 0
    assert installed["torch_compile"]["__dynamo_frames_compiled__"] > 0


def test_breaks_are_reported_where_they_happen(installed: dict[str, Any]) -> None:
    report = installed["cases"]["helper_break"]["report"]
    (gb,) = report.graph_breaks
    assert gb["location"]["file"].endswith("tests/fixtures/helper_ops.py")
    frames = {f["name"]: f for f in report.frames}
    assert frames["rescale"]["reached_by_call"] and frames["rescale"]["variants"] == 1


SERVE_TIME = """
import json, logging, torch, warnings, precompile
torch._logging.set_logs(dynamo=logging.ERROR)
warnings.simplefilter("ignore")
from torch._dynamo.utils import counters
from tests.fixtures.installed_models import ChattyNet, child_break
model = ChattyNet().eval()
run = precompile.load({artifact!r}, {cache!r}, allow_serve_time_compiles={allow})
assert run.installed
x = torch.randn(4, 8)
torch.testing.assert_close(run(model, x), child_break(model, x))  # captured: served
before = counters["frames"]["total"]
try:
    x = torch.randn(4, 8).double()
    result = run(model.double(), x)
    torch.testing.assert_close(result, child_break(model, x))
    cell = {{"result": "exact", "message": ""}}
except precompile.PrecompileError as error:
    cell = {{"result": "refused", "message": str(error)}}
print(json.dumps({{**cell, "compiled_frames": counters["frames"]["total"] - before}}))
"""


def test_serve_time_compile_refused_then_allowed_and_counted(installed: dict[str, Any]) -> None:
    artifact, cache = installed["cases"]["child_break"]["paths"]
    refused, allowed = together(
        *(
            lambda allow=allow: run_json(
                SERVE_TIME.format(artifact=artifact, cache=cache, allow=allow)
            )
            for allow in (False, True)
        )
    )
    assert refused["result"] == "refused" and refused["compiled_frames"] == 0, refused
    assert "no captured variant serves this call" in refused["message"], refused
    assert "allow_serve_time_compiles=True" in refused["message"], refused
    assert allowed["result"] == "exact", allowed
    assert allowed["compiled_frames"] > 0, allowed


def test_a_process_that_compiled_the_function_is_refused(installed: dict[str, Any]) -> None:
    code = f"""
import logging, torch, warnings, precompile
torch._logging.set_logs(dynamo=logging.ERROR)
warnings.simplefilter("ignore")
from tests.fixtures.installed_models import ChattyNet, child_break
torch.compile(child_break, backend="eager")(ChattyNet().eval(), torch.randn(4, 8))
try:
    precompile.load({installed['cases']['child_break']['paths'][0]!r})
except precompile.PrecompileError as error:
    print("REFUSED", error)
"""
    proc = run_python(code)
    assert "REFUSED" in proc.stdout and "fresh process" in proc.stdout, proc.stdout + proc.stderr


def test_unload_then_load_again(installed: dict[str, Any]) -> None:
    code = f"""
import logging, torch, warnings, precompile
torch._logging.set_logs(dynamo=logging.ERROR)
warnings.simplefilter("ignore")
from tests.fixtures.installed_models import ChattyNet, child_break
paths = {list(installed['cases']['child_break']['paths'])!r}
model, x = ChattyNet().eval(), torch.randn(4, 8)
with precompile.load(*paths) as run:
    torch.testing.assert_close(run(model, x), child_break(model, x))
run.unload()  # idempotent
again = precompile.load(*paths)
torch.testing.assert_close(again(model, x), child_break(model, x))
print("COVERS", again.covers(model, x)["served_by"], again.covers(model, torch.randn(5, 8))["served_by"])
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert "COVERS 0 None" in proc.stdout, proc.stdout


def test_two_installed_artifacts_sharing_a_function_are_refused(installed: dict[str, Any]) -> None:
    code = f"""
import logging, torch, warnings, precompile
torch._logging.set_logs(dynamo=logging.ERROR)
warnings.simplefilter("ignore")
first = precompile.load({installed['cases']['child_break']['paths'][0]!r})
try:
    precompile.load({installed['cases']['child_train_step']['paths'][0]!r})
except precompile.PrecompileError as error:
    print("REFUSED", error)
first.unload()
precompile.load({installed['cases']['child_train_step']['paths'][0]!r})
print("LOADED after unload")
"""
    proc = run_python(code)
    assert "REFUSED" in proc.stdout and "another installed artifact" in proc.stdout, (
        proc.stdout + proc.stderr
    )
    assert "LOADED after unload" in proc.stdout


def test_installed_artifact_metadata(installed: dict[str, Any]) -> None:
    meta = precompile.inspect_artifact(installed["cases"]["child_break"]["paths"][0])
    assert meta["SERVING_MODE"] == "installed"
    assert {f["name"] for f in meta["FRAMES"]} >= {"child_break", "forward"}


def test_capture_covers_decides_as_the_loaded_artifact(tmp_path: Any) -> None:
    """An installed capture is not executed in the capture process, so its covers() reads
    the entry's serialized guards there; the choice is ``runtime.multigraph_variants``'s own
    (``variant_coverage``), the one a fresh load makes: same variant, same failure text."""
    from tests.fixtures.installed_models import ChattyNet, child_break

    torch._dynamo.reset()
    paths = str(tmp_path / "covers.py"), str(tmp_path / "covers.cache")
    model = ChattyNet().eval()
    with precompile.capture(
        child_break, artifact_path=paths[0], cache_path=paths[1], backend="eager"
    ) as cap:
        cap(model, torch.randn(4, 8))
    assert cap.report().serving_mode == "installed"
    at_capture = [cap.covers(model, torch.randn(4, 8)), cap.covers(model, torch.randn(5, 8))]
    assert at_capture[0] == {"served_by": 0, "failures": []}
    assert at_capture[1]["served_by"] is None
    assert "`x` has size 5 at dim 0; the capture saw 4" in at_capture[1]["failures"][0]["guard"]
    proc = run_python(
        f"""
import logging, torch, warnings, precompile
torch._logging.set_logs(dynamo=logging.ERROR)
warnings.simplefilter("ignore")
from tests.fixtures.installed_models import ChattyNet
run, model = precompile.load(*{list(paths)!r}), ChattyNet().eval()
print("COVERS", [run.covers(model, torch.randn(4, 8)), run.covers(model, torch.randn(5, 8))])
"""
    )
    assert proc.returncode == 0, proc.stderr
    assert f"COVERS {at_capture!r}" in proc.stdout, proc.stdout
