"""A captured call that returns with torch's process-wide context changed -- the default
dtype, deterministic algorithms, a mode entered and not left -- leaves eager's process
changed after every call, where a served call (the captured program, under the context
the capture recorded) would not. The capture refuses it, naming what changed, with
either tracer; a change fn undoes before it returns is served, exactly."""

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


@pytest.fixture(autouse=True)
def _context_put_back() -> Iterator[None]:
    yield
    torch.set_default_dtype(torch.float32)
    torch.use_deterministic_algorithms(False)


def _model_and_input() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 4).eval(), torch.randn(2, 4)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize(
    "fn, named",
    [
        (leaves_float64, "the default dtype torch.float64 (it was torch.float32"),
        (leaves_deterministic, "deterministic algorithms True (it was False"),
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
