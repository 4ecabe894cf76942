"""A captured call that returns with torch's process-wide context changed -- the default
dtype, deterministic algorithms, grad mode, a mode entered and not left -- leaves eager's
process changed after every call, where a served call (the captured program, under the
context the capture recorded) would not. The capture refuses it, naming what changed,
with either tracer; a change fn undoes before it returns is served, exactly.

Grad mode: an inference capture traces with grad off, so fn leaving it on shows as a
change (both tracers), and fn leaving it off -- ``torch.set_grad_enabled(False)`` with no
with-block, or ``torch._C._set_grad_enabled`` -- is seen by make_fx's trail of the
switches fn calls (``call_context.GradModeTrail``; helper-77's find). With-blocks, a
``@torch.no_grad()`` helper and a manual restore (``prev = torch.is_grad_enabled()``) are
served, and the caller's grad mode is its own afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import precompile
from tests.harness import capture_pair, run_json

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


def leaves_float64(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    torch.set_default_dtype(torch.float64)
    return out


def leaves_deterministic(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    torch.use_deterministic_algorithms(True)
    return model(x)


def undoes_float64(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    torch.set_default_dtype(torch.float64)
    try:
        return model(x) + torch.ones(()).to(x.dtype)
    finally:
        torch.set_default_dtype(torch.float32)


def leaves_grad_on(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    torch.set_grad_enabled(True)
    return model(x)


def leaves_grad_off(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    torch.set_grad_enabled(False)
    return model(x)


def leaves_grad_off_directly(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    torch._C._set_grad_enabled(False)
    return model(x)


@torch.no_grad()
def _halved(x: torch.Tensor) -> torch.Tensor:
    return x / 2


def switches_and_restores(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        y = model(x)
        torch.set_grad_enabled(True)  # undone by the block's exit
    with torch.set_grad_enabled(False):
        y = y + model(x)
    prev = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    y = _halved(y)
    torch.set_grad_enabled(prev)
    return y


@pytest.fixture(autouse=True)
def _context_put_back() -> Iterator[None]:
    yield
    torch.set_default_dtype(torch.float32)
    torch.use_deterministic_algorithms(False)
    torch.set_grad_enabled(True)


def _model_and_input() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 4).eval(), torch.randn(2, 4)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize(
    "fn, named",
    [
        (leaves_float64, "the default dtype torch.float64 (it was torch.float32"),
        (leaves_deterministic, "deterministic algorithms True (it was False"),
        (leaves_grad_on, "grad mode True (it was False"),
    ],
)
def test_a_call_that_leaves_the_context_changed_is_refused(
    tmp_path: Path, tracer: str, fn: object, named: str
) -> None:
    model, x = _model_and_input()
    with pytest.raises(precompile.PrecompileError, match="returned with") as refused:
        capture_pair(fn, model, x, directory=tmp_path, tracer=TRACERS[tracer]())
    assert named in str(refused.value)


SERVE = """
import json, torch, precompile
from tests.core.capturing.test_call_context import _model_and_input, undoes_float64
model, x = _model_and_input()
run = precompile.load(*{paths!r})
with torch.no_grad():
    got = run(model, x)
    want = undoes_float64(model, x)
print(json.dumps([torch.equal(got, want), str(torch.get_default_dtype())]))
"""


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_change_undone_before_fn_returns_is_served(tmp_path: Path, tracer: str) -> None:
    model, x = _model_and_input()
    paths = capture_pair(undoes_float64, model, x, directory=tmp_path, tracer=TRACERS[tracer]())
    assert torch.get_default_dtype() == torch.float32
    assert run_json(SERVE.format(paths=list(paths))) == [True, "torch.float32"]


@pytest.mark.parametrize(
    "tracer, fn, named",
    [
        ("make_fx", leaves_grad_off, "returned with grad mode off, set at"),
        (
            "make_fx",
            leaves_grad_off_directly,
            "returned with the grad mode torch._C._set_grad_enabled set",
        ),
        ("dynamo", leaves_grad_off, "returned with grad mode False (it was True"),
        ("dynamo", leaves_grad_off_directly, "returned with grad mode False (it was True"),
    ],
)
def test_grad_mode_left_off_by_an_inference_capture_is_refused(
    tmp_path: Path, tracer: str, fn: object, named: str
) -> None:
    """Off is the trace's own mode: make_fx follows the trail of switches, which tells it
    was left set; Dynamo runs no Python of fn while it traces, and its compiled code sets
    nothing already set, so a fn whose code names a switch runs once more eagerly under
    grad on, which shows it left off."""
    model, x = _model_and_input()
    with pytest.raises(precompile.PrecompileError) as refused:
        capture_pair(fn, model, x, directory=tmp_path, tracer=TRACERS[tracer]())
    assert named in str(refused.value) and "test_call_context.py:" in str(refused.value)


SERVE_GRAD = """
import json, torch, precompile
from tests.core.capturing.test_call_context import _model_and_input, switches_and_restores
model, x = _model_and_input()
run = precompile.load(*{paths!r})
got = run(model, x)
after = torch.is_grad_enabled()
want = switches_and_restores(model, x)
print(json.dumps([torch.allclose(got, want), after, torch.is_grad_enabled()]))
"""


@pytest.mark.parametrize("tracer", TRACERS)
def test_grad_mode_switched_and_put_back_is_served(tmp_path: Path, tracer: str) -> None:
    model, x = _model_and_input()
    with torch.no_grad():
        paths = capture_pair(
            switches_and_restores, model, x, directory=tmp_path, tracer=TRACERS[tracer]()
        )
    # Served under no_grad: fn read the grad mode, and an artifact serves the mode it
    # traced; the caller's mode is what it was, as in eager.
    served = run_json(
        "import torch; torch.set_grad_enabled(False)\n" + SERVE_GRAD.format(paths=list(paths))
    )
    assert served == [True, False, False], served
