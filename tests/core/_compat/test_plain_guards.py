"""Issue 14 build 2: a standalone Dynamo artifact whose guards all translate serves
without importing ``torch._dynamo`` (``plain_guards``), and refuses every call Dynamo's
guard manager refuses; one with any other guard keeps Dynamo's and says why
(``GUARD_RUNTIME`` in its metadata)."""

from __future__ import annotations

from pathlib import Path

import torch

import precompile
from tests.fixtures import dynamo_free_models as models
from tests.harness import REPO, run_json


def _capture(fn, calls, directory: Path) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    paths = str(directory / "a.py"), str(directory / "a.cache")
    with precompile.capture(
        fn, artifact_path=paths[0], cache_path=paths[1], backend="eager"
    ) as cap:
        for args in calls:
            cap(*args)
    return paths


def test_plain_guards_decide_as_dynamo_does(tmp_path: Path) -> None:
    """Differential: per fixture, frame and variant, Dynamo's guard manager and the
    Dynamo-free guards judge the same frame locals under a battery of changed calls
    (dtype, shapes within and outside the dynamic range, strides, views, requires_grad,
    subclasses, argument types, module attributes, submodules and hooks, dict keys,
    list length, constants, None vs tensor, one tensor passed twice, a global, grad and
    inference mode, default dtype and device, deterministic mode, autocast). No call may
    be accepted by one and refused by the other."""
    report = run_json(
        "from tests.fixtures.dynamo_free_differential import main; main()",
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
    )
    for name, case in report.items():
        assert case["path"] == {"path": "plain", "reason": None}, (name, case["path"])
        assert case["untranslated"] == [] and case["frames_skipped"] == [], (name, case)
        assert case["inconsistent"] == [], (name, case["inconsistent"])
        assert case["looser"] == [], f"{name}: Dynamo-free guards accept what Dynamo refuses"
        assert case["stricter"] == [], f"{name}: Dynamo-free guards refuse what Dynamo serves"
        assert case["accepted"] >= 10 and case["refused"] >= 10, (name, case)
        assert case["entry"]["as captured"] is True, name
    entry = report["two_prints"]["entry"]
    for refused in (
        "x: dtype float64",
        "x: last dim +1",
        "x: requires_grad",
        "x: Parameter subclass",
        "x: None",
        "model: submodule swapped",
        "model: fewer submodules",
        "model: instance shadows a method",
        "inference_mode",
    ):
        assert entry[refused] is False, refused
    assert report["pair"]["entry"]["two inputs are one tensor"] is False
    assert report["mixed"]["entry"]["scale: float changed"] is False
    assert report["mixed"]["entry"]["cfg: dict key renamed"] is False


SERVE = """
import json, sys, warnings
import torch
import precompile
from tests.fixtures import dynamo_free_models as models

model, x = models.build(), torch.randn(8, 32)
run = precompile.load({artifact!r}, {cache!r})
results = {{"after_load": "torch._dynamo" in sys.modules}}
outs = [run(model, x), run(model, torch.randn(16, 32)), run(models.build(), torch.randn(5, 32))]
refs = [models.two_prints(model, x)]
results["exact"] = bool(torch.equal(outs[0], refs[0]))
refused = {{}}
swapped = models.build()
swapped.net[0] = torch.nn.Linear(32, 64, bias=False)


def under_autocast():
    with torch.autocast("cpu"):
        return run(model, x)


calls = {{
    "dtype": lambda: run(model, x.double()),
    "batch 1": lambda: run(model, torch.randn(1, 32)),
    "width": lambda: run(model, torch.randn(8, 33)),
    "swapped": lambda: run(swapped, x),
    "autocast": under_autocast,
}}
for name, call in calls.items():
    try:
        call()
        refused[name] = None
    except precompile.PrecompileError as error:
        refused[name] = str(error)
results["refused"] = refused
results["after_calls"] = "torch._dynamo" in sys.modules
print(json.dumps(results))
"""


def test_served_without_importing_dynamo(tmp_path: Path) -> None:
    """Fresh process: load + calls (both batch sizes and one between, the dynamic
    variant) never import torch._dynamo, serve what eager computes, and changed calls are
    refused with PrecompileError in the user's words."""
    model = models.build()
    artifact, cache = _capture(
        models.two_prints, [(model, torch.randn(8, 32)), (model, torch.randn(16, 32))], tmp_path
    )
    assert precompile.inspect_artifact(artifact)["GUARD_RUNTIME"] == {
        "path": "plain",
        "reason": None,
    }
    results = run_json(SERVE.format(artifact=artifact, cache=cache), cwd=REPO)
    assert results["after_load"] is False and results["after_calls"] is False
    assert results["exact"] is True
    refused = results["refused"]
    assert all(refused.values()), refused
    assert "`x` has dtype Double; the capture saw Float" in refused["dtype"]
    assert "2 <= " in refused["batch 1"] or "size" in refused["batch 1"], refused["batch 1"]
    assert "L['" not in refused["width"], refused["width"]
    assert "autocast" in refused["autocast"]


def test_guard_outside_the_whitelist_keeps_dynamo(tmp_path: Path) -> None:
    """A torch.device argument is guarded by equality with a device object, outside the
    whitelist: the artifact keeps Dynamo's guard manager, says why, and still serves and
    refuses as before."""
    x = torch.randn(4, 4)
    artifact, cache = _capture(models.to_device, [(x, torch.device("cpu"))], tmp_path)
    runtime = precompile.inspect_artifact(artifact)["GUARD_RUNTIME"]
    assert runtime == {"path": "dynamo", "reason": "to_device: EQUALS_MATCH on a device, list"}
    dynamo_imported = run_json(
        "import json, sys, torch, precompile\n"
        "from tests.fixtures import dynamo_free_models as models\n"
        f"run = precompile.load({artifact!r}, {cache!r})\n"
        "x = torch.randn(4, 4)\n"
        "cpu = torch.device('cpu')\n"
        "assert torch.equal(run(x, cpu), models.to_device(x, cpu))\n"
        "try:\n"
        "    run(x, torch.device('meta'))\n"
        "    raise SystemExit('served another device')\n"
        "except precompile.PrecompileError:\n"
        "    pass\n"
        "print(json.dumps('torch._dynamo' in sys.modules))\n",
        cwd=REPO,
    )
    assert dynamo_imported is True


def test_installed_mode_keeps_dynamo(tmp_path: Path) -> None:
    """Installed serving runs Dynamo's frame evaluation: it keeps Dynamo, and says so."""
    from tests.fixtures.installed_models import ChattyNet, child_break

    artifact, _cache = _capture(child_break, [(ChattyNet().eval(), torch.randn(4, 8))], tmp_path)
    metadata = precompile.inspect_artifact(artifact)
    assert metadata["SERVING_MODE"] == "installed"
    assert metadata["GUARD_RUNTIME"] == {
        "path": "dynamo",
        "reason": "installed serving runs Dynamo's frame evaluation",
    }


SERVE_CONV = """
import json, sys
import torch
import precompile
from tests.fixtures import dynamo_free_models as models

model = models.build_conv()
run = precompile.load({artifact!r}, {cache!r})
results = {{}}
for batch in (1, 2, 5, 15, 16):
    x = torch.randn(batch, 3, 8, 8)
    try:
        results[batch] = bool(torch.equal(run(model, x), models.conv_print(model, x)))
    except precompile.PrecompileError as error:
        results[batch] = str(error)
results["dynamo"] = "torch._dynamo" in sys.modules
print(json.dumps(results))
"""


def test_a_chained_shape_guard_is_served_without_dynamo(tmp_path: Path) -> None:
    """The dynamic variant of a convolution captured at batch 1 and 2 is guarded by
    ``2 <= batch <= 15``: served without Dynamo, exactly, inside the range, and refused
    outside it, as Dynamo's guard would (ResNet's shape)."""
    model = models.build_conv()
    artifact, cache = _capture(
        models.conv_print,
        [(model, torch.randn(1, 3, 8, 8)), (model, torch.randn(2, 3, 8, 8))],
        tmp_path,
    )
    assert precompile.inspect_artifact(artifact)["GUARD_RUNTIME"] == {
        "path": "plain",
        "reason": None,
    }
    results = run_json(SERVE_CONV.format(artifact=artifact, cache=cache))
    assert results["dynamo"] is False
    assert [results[str(b)] for b in (1, 2, 5, 15)] == [True] * 4, results
    assert "no captured variant of `conv_print` serves this call" in results["16"], results
    assert "2 <= x.size()[0] <= 15" in results["16"], results["16"]
