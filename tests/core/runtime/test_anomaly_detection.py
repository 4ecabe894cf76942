"""A call whose backward an artifact compiled, made under autograd's anomaly detection,
is refused: eager checks the output of every backward function it runs and raises at
the first NaN ("Function 'SqrtBackward0' returned nan values"), and a compiled backward
runs no such function (helper-79 found make_fx training artifacts and Dynamo with
Inductor answering, NaN gradients left in ``.grad``).

Covered, each in a fresh process: training captures (the backward inside fn) under both
tracers and both backends, and a make_fx inference capture of an input that requires
grad, whose backward runs when the caller calls ``.backward()`` (under anomaly detection
around the call, or around the caller's backward alone: helper-81's find). Dynamo's eager backend
runs eager's autograd, so anomaly detection works through it as in eager. Ordinary
calls, and calls under ``set_detect_anomaly(True, check_nan=False)`` (which only
records where each node was made), are served with eager's values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from tests.harness import run_json

MODELS = """import torch


def step(model, x):
    # Negative activations: sqrt gives NaN, and so does its backward.
    loss = model(x).sqrt().sum()
    loss.backward()
    return loss.detach()


def forward(model, x):
    return model(x).sqrt().sum()


def make():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 4), torch.randn(3, 4)
"""

CAPTURE = """
import warnings, torch, precompile
import amodels
warnings.simplefilter("ignore")
tracer = precompile.MakeFxTracer() if {tracer!r} == "make_fx" else precompile.DynamoTracer()
model, x = amodels.make()
with precompile.capture(amodels.step, artifact_path="step.py", cache_path="step.cache",
                        tracer=tracer, backend={backend!r}, training=True) as cap:
    cap(model, x)
if {tracer!r} == "make_fx":
    model, x = amodels.make()
    with precompile.capture(amodels.forward, artifact_path="fwd.py", cache_path="fwd.cache",
                            tracer=precompile.MakeFxTracer(), backend={backend!r}) as cap:
        cap(model, x.requires_grad_())
print("{{}}")
"""

SERVE = """
import contextlib, json, warnings, torch, precompile
import amodels
warnings.simplefilter("ignore")
modes = {{
    "ordinary": contextlib.nullcontext,
    "detect_anomaly": torch.autograd.detect_anomaly,
    "no nan check": lambda: torch.autograd.set_detect_anomaly(True, check_nan=False),
}}


def outcome(call):
    model, x = amodels.make()
    try:
        loss = call(model, x)
    except precompile.PrecompileError as error:
        return ["refused", str(error)]
    except RuntimeError as error:
        return ["raises", str(error).split(" in its")[0]]
    return ["value", [loss.item(), model.weight.grad.tolist()]]


def by_hand(fn):
    def call(model, x):
        loss = fn(model, x.requires_grad_())
        loss.backward()
        return loss.detach()
    return call


artifacts = {{"step": amodels.step}}
if {tracer!r} == "make_fx":
    artifacts["fwd"] = amodels.forward
cells = {{}}
for name, eager in artifacts.items():
    run = precompile.load(f"{{name}}.py", f"{{name}}.cache")
    for mode, context in modes.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with context():
                want = outcome(eager if name == "step" else by_hand(eager))
                got = outcome(run if name == "step" else by_hand(run))
        same = got == want or (
            got[0] == want[0] == "value" and json.dumps(got) == json.dumps(want)
        )
        cells[f"{{name}} {{mode}}"] = ["same" if same else got[0], got[1], want]


def backward_only(fn):
    # The call outside anomaly detection, the caller's backward under it.
    def call(model, x):
        loss = fn(model, x.requires_grad_())
        with torch.autograd.detect_anomaly():
            loss.backward()
        return loss.detach()
    return call


if {tracer!r} == "make_fx":
    run = precompile.load("fwd.py", "fwd.cache")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cells["fwd backward only"] = [
            *outcome(backward_only(run)), outcome(backward_only(amodels.forward))
        ]
print(json.dumps(cells, default=str))
"""


@pytest.mark.parametrize(
    ("tracer", "backend"),
    [("make_fx", "eager"), ("make_fx", "inductor"), ("dynamo", "eager"), ("dynamo", "inductor")],
)
def test_nan_checks_of_anomaly_detection_are_not_skipped_by_a_compiled_backward(
    tmp_path: Path, tracer: str, backend: str
) -> None:
    (tmp_path / "amodels.py").write_text(MODELS)
    run_json(CAPTURE.format(tracer=tracer, backend=backend), cwd=tmp_path, pythonpath=[tmp_path])
    cells = run_json(SERVE.format(tracer=tracer), cwd=tmp_path, pythonpath=[tmp_path])
    names = ["step", "fwd"] if tracer == "make_fx" else ["step"]
    for name in names:
        for mode in ("ordinary", "no nan check"):
            assert cells[f"{name} {mode}"][0] == "same", cells[f"{name} {mode}"]
        kind, message, want = cells[f"{name} detect_anomaly"]
        assert want == ["raises", "Function 'SqrtBackward0' returned nan values"], want
        if (tracer, backend) == ("dynamo", "eager"):
            assert kind == "same", (kind, message)  # eager's autograd, eager's error
        else:
            assert kind == "refused", (kind, message)
            assert "anomaly detection" in message and "check_nan=False" in message, message
    if tracer == "make_fx":
        # The artifact's compiled backward, run by the caller under anomaly detection.
        kind, message, want = cells["fwd backward only"]
        assert want == ["raises", "Function 'SqrtBackward0' returned nan values"], want
        assert kind == "refused" and "anomaly detection" in message, (kind, message)


def backward_under_detection(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    loss = model(x).sqrt().sum()
    with torch.autograd.detect_anomaly():
        loss.backward()
    return loss.detach()


def backward_without_nan_check(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    loss = model(x).sqrt().sum()
    with torch.autograd.detect_anomaly(check_nan=False):
        loss.backward()
    return loss.detach()


def test_fn_running_its_backward_under_anomaly_detection_is_refused_at_capture_naming_it(
    tmp_path: Path,
) -> None:
    """make_fx traces the NaN check autograd's engine runs on every gradient under
    detection (``isnan(grad).any().item()``) as a read of tensor values; the refusal
    names anomaly detection and ``check_nan=False``, where it said only "fn depends on
    tensor values" (helper-81). Without the NaN check the same fn is captured."""
    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 4), torch.randn(3, 4)
    paths = {"artifact_path": str(tmp_path / "a.py"), "cache_path": str(tmp_path / "a.cache")}
    fn: Any = backward_under_detection
    with pytest.raises(precompile.PrecompileError) as refused:
        with precompile.capture(
            fn, tracer=precompile.MakeFxTracer(), training=True, **paths
        ) as cap:
            cap(model, x)
    message = str(refused.value)
    assert "anomaly detection" in message and "inside autograd's engine" in message, message
    assert "check_nan=False" in message, message
    location = refused.value.location
    assert location is not None and location.file == __file__, location
    assert location.line == fn.__code__.co_firstlineno + 3, location  # loss.backward()
    fn = backward_without_nan_check
    with precompile.capture(fn, tracer=precompile.MakeFxTracer(), training=True, **paths) as cap:
        cap(model, x)
    assert (tmp_path / "a.py").is_file()
