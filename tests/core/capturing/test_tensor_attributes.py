"""A Python attribute set on a parameter, a buffer or an input is not on the make_fx
trace's stand-in for that tensor: a read of it is refused at capture, naming the tensor
and the attribute (``capturing/fx_tensor_attributes``).

Before, ``getattr(weight, "scale", 1.0)`` took the default in the trace and the artifact
served ``1.0`` where eager used ``2.0`` -- a wrong answer from the first call -- and a
plain read raised an AttributeError about a fake tensor. A tensor whose attributes fn
never reads (transformers marks buffers with ``persistent`` and ``_is_buffer``) is
captured and served in a fresh process."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

import precompile
from tests.fixtures import tensor_attributes as t
from tests.harness import capture_pair, run_json


@pytest.mark.parametrize(
    ("model", "fn", "x_attribute", "words"),
    [
        (
            "ScaledByWeightAttribute",
            "step",
            None,
            "the Python attribute 'scale' of parameter 'lin.weight'",
        ),
        (
            "ShiftedByBufferAttribute",
            "step",
            None,
            "the Python attribute 'shift' of buffer 'offset'",
        ),
        (
            "MarkedBuffer",
            "read_input_attribute",
            3.0,
            "the Python attribute 'weight' of input value 0",
        ),
        # Through the instance dict (no attribute lookup): baked before, now refused.
        (
            "ScaledThroughVars",
            "step",
            None,
            "the Python attribute 'scale' of parameter 'lin.weight' (read through",
        ),
        (
            "ShiftedThroughDunderDict",
            "step",
            None,
            "the Python attribute 'shift' of buffer 'offset' (read through",
        ),
        ("CountsWeightAttributes", "step", None, "the instance dict of parameter 'lin.weight'"),
        (
            "MarkedBuffer",
            "read_input_vars",
            3.0,
            "the Python attribute 'weight' of input value 0 (read through",
        ),
        # Read on fn's behalf by the standard library.
        (
            "ScaledThroughChainMap",
            "step",
            None,
            "the Python attribute 'scale' of parameter 'lin.weight' (read",
        ),
        (
            "ScaledThroughDeepCopy",
            "step",
            None,
            "the instance dict of parameter 'lin.weight' (read",
        ),
    ],
)
def test_a_read_of_a_tensors_python_attribute_is_refused(
    tmp_path: Path, model: str, fn: str, x_attribute: float | None, words: str
) -> None:
    x = torch.randn(2, 3)
    if x_attribute is not None:
        x.weight = x_attribute  # type: ignore[attr-defined]
    with torch.no_grad(), pytest.raises(precompile.PrecompileError) as refused:
        capture_pair(getattr(t, fn), getattr(t, model)(), x, directory=tmp_path)
    assert f"fn reads {words}" in str(refused.value), str(refused.value)


def test_a_python_attribute_set_on_a_parameter_in_forward_is_refused(tmp_path: Path) -> None:
    """``weight.calls = getattr(weight, "calls", 0) + 1``: the trace set it on the
    stand-in, where no check looked, and served calls multiplied by 1 where eager counts
    up (found by an attack on these checks)."""
    model = t.CountsOnItsWeight()
    with torch.no_grad(), pytest.raises(precompile.PrecompileError) as refused:
        capture_pair(t.step, model, torch.randn(2, 3), directory=tmp_path)
    assert "parameter 'lin.weight'.calls (a Python attribute set on" in str(refused.value)
    assert "calls" not in vars(model.lin.weight)


@pytest.mark.parametrize("model", ["MarkedBuffer", "LooksUpAnotherName"])
def test_a_tensor_whose_attributes_are_not_read_is_served(tmp_path: Path, model: str) -> None:
    """Attributes fn never reads, or a name looked up through the instance dict that
    neither the real tensor nor its stand-in has: eager's answer either way."""
    torch.manual_seed(0)
    x = torch.randn(2, 3)
    with torch.no_grad():
        artifact, cache = capture_pair(t.step, getattr(t, model)(), x, directory=tmp_path)
    result = run_json(
        textwrap.dedent(
            f"""
            import json, torch, precompile
            from tests.fixtures import tensor_attributes as t
            torch.manual_seed(0)
            x = torch.randn(2, 3)
            model = t.{model}()
            with torch.no_grad():
                served = precompile.load({artifact!r}, {cache!r})(model, x)
                print(json.dumps(torch.equal(served, t.step(model, x))))
            """
        )
    )
    assert result is True
