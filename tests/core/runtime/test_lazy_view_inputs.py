"""A tensor with its conjugate bit set (``z.conj()``) is a lazy view eager resolves where
an op needs it. helper-77 found a make_fx artifact that, given one, crashed inside its
graph with a raw RuntimeError (``view_as_real doesn't work on unresolved conjugated
tensors``): the comparison behind the input guard let it through to the graph. The
capture refuses one, naming the fix, and the served call refuses one as a
PrecompileError, cold and warm; the plain tensor is served exactly, and so is a
negative-bit view (``z.conj().imag``), which every op's dispatch resolves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import precompile
from tests.harness import capture_pair, run_json


def real_plus_imag(model: torch.nn.Module, z: torch.Tensor) -> torch.Tensor:
    return model(z.real) + z.imag


def _model_and_input() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 4).eval(), torch.randn(2, 4, dtype=torch.cfloat)


def linear(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def scaled(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Its input and bias read by a kernel Inductor generates, not only by an ATen call
    (``addmm`` resolves the bit as eager does)."""
    return model(x * 2.0) + model.bias * 3.0


def scaled_in_place(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``scaled``, writing its input: a copy could not stand in for it."""
    x.mul_(2.0)
    return model(x) + model.bias * 3.0


SERVE = """
import json, torch, precompile
from tests.core.runtime.test_lazy_view_inputs import _model_and_input, linear, real_plus_imag
model, z = _model_and_input()
complex_run = precompile.load(*{complex_paths!r})
real_run = precompile.load(*{real_paths!r})
cells = {{}}
def call(name, run, fn, value):
    try:
        with torch.no_grad():
            got = run(model, value)
            cells[name] = "exact" if torch.equal(got, fn(model, value)) else "wrong"
    except precompile.PrecompileError as error:
        cells[name] = "refused: " + str(error)
    except Exception as error:
        cells[name] = "error: " + repr(error)
negated = z.conj().imag  # a real tensor with its negative bit set
assert negated.is_neg()
# Cold (the first call) and warm (after a served call built the input guard).
call("conj cold", complex_run, real_plus_imag, z.conj())
call("plain", complex_run, real_plus_imag, z)
call("conj warm", complex_run, real_plus_imag, z.conj())
call("real plain", real_run, linear, z.real.contiguous())
call("neg warm", real_run, linear, negated)
print(json.dumps(cells))
"""


def test_a_lazy_conjugate_view_is_refused_at_capture_and_served_call(tmp_path: Path) -> None:
    model, z = _model_and_input()
    with pytest.raises(precompile.PrecompileError, match=r"(?s)conjugate bit.*resolve_conj\(\)"):
        capture_pair(real_plus_imag, model, z.conj(), directory=tmp_path, name="conj")
    complex_paths = capture_pair(real_plus_imag, model, z, directory=tmp_path)
    real_paths = capture_pair(linear, model, z.real.contiguous(), directory=tmp_path, name="r")
    cells = run_json(SERVE.format(complex_paths=list(complex_paths), real_paths=list(real_paths)))
    assert cells["plain"] == "exact" and cells["real plain"] == "exact", cells
    for name in ("conj cold", "conj warm"):
        assert cells[name].startswith("refused: "), cells
        assert "conjugate bit set" in cells[name] and "resolve_conj()" in cells[name], cells
    # A negative bit every op's dispatch resolves: served, and exact.
    assert cells["neg warm"] == "exact", cells


SERVE_INDUCTOR = """
import json, torch, precompile
from tests.core.runtime.test_lazy_view_inputs import _model_and_input, scaled, scaled_in_place
model, z = _model_and_input()
runs = {{"scaled": precompile.load(*{paths!r}), "in place": precompile.load(*{written!r})}}
fns = {{"scaled": scaled, "in place": scaled_in_place}}
cells = {{}}
def call(name, which, m, make):
    try:
        with torch.no_grad():
            served, eager = make(), make()
            got = runs[which](m, served)
            want = fns[which](m, eager)
            same = torch.equal(got, want) and torch.equal(served, eager)
            cells[name] = "exact" if same else "wrong"
    except precompile.PrecompileError as error:
        cells[name] = "refused: " + str(error)
    except Exception as error:
        cells[name] = "error: " + repr(error)
x = z.real.contiguous()
# Contiguous, as captured (a one-element z.conj().imag is too): no layout copy resolves
# it. Its storage holds x; the bit says it is -x.
negated = lambda: torch._neg_view(x.clone())
assert negated().is_neg() and negated().is_contiguous()
call("neg cold", "scaled", model, negated)
call("plain", "scaled", model, lambda: x.clone())
call("neg warm", "scaled", model, negated)
call("neg written", "in place", model, negated)
call("plain written", "in place", model, lambda: x.clone())
model.bias = torch.nn.Parameter(torch._neg_view(model.bias.detach().clone()))
assert model.bias.is_neg()
call("neg parameter", "scaled", model, lambda: x.clone())
print(json.dumps(cells))
"""


def test_a_negative_bit_view_is_resolved_or_refused_by_an_inductor_artifact(
    tmp_path: Path,
) -> None:
    """helper-79: Inductor's kernels read a negative-bit view's storage as it lies (the
    values negated), so a make_fx/Inductor artifact served ``-x`` for ``x``, as an input
    and as a parameter. An input is served through a resolved copy now, exactly, cold and
    warm; one the graph writes (a copy would cut it from the caller's tensor) and a
    parameter are refused, naming the fix."""
    model, z = _model_and_input()
    x = z.real.contiguous()
    paths = capture_pair(scaled, model, x, directory=tmp_path, name="ind", backend="inductor")
    written = capture_pair(
        scaled_in_place, model, x.clone(), directory=tmp_path, name="w", backend="inductor"
    )
    cells = run_json(SERVE_INDUCTOR.format(paths=list(paths), written=list(written)))
    for name in ("plain", "neg cold", "neg warm", "plain written"):
        assert cells[name] == "exact", cells
    for name in ("neg written", "neg parameter"):
        assert cells[name].startswith("refused: "), cells
        assert "negative bit set" in cells[name] and "resolve_neg()" in cells[name], cells
