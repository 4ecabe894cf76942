"""A served call made under a ``torch.func`` transform (grad, vmap) is refused: the graph
runs torch's operations on the wrapped tensors' data outside the transform, so the
transform would not see them.

helper-79: ``torch.func.grad`` of a make_fx inference artifact's call returned zeros where
eager returns the gradient (a warn-once InferenceGradWarning was all), and under ``vmap``
the Inductor artifact crashed with a raw RuntimeError. Both are refused now (a wrapped
parameter too: the model-state check asks the same question), cold in a fresh process;
the plain call is served exactly, and so is vmap on the eager backend, whose ATen graph
goes through the batching rules eager's ops do. Dynamo artifacts refused grad already.

A forward-AD dual input (``torch.autograd.forward_ad.make_dual``) on Inductor crashed with
a raw NotImplementedError from its extern matmul (its fused kernels would drop the
tangent); it is refused on both tracers, and served by the eager backend's graphs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import precompile
from tests.harness import capture_pair, run_json


def relu_linear(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).relu()


def _model_and_input() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 4).eval(), torch.randn(2, 4)


SERVE = """
import json, warnings, torch, precompile
import torch.autograd.forward_ad as fwAD
from tests.core.runtime.test_functorch_transforms import _model_and_input, relu_linear
warnings.simplefilter("ignore")
model, x = _model_and_input()
run = precompile.load(*{paths!r})
calls = {{
    "grad": lambda f: torch.func.grad(lambda t: f(model, t).sum())(x),
    "vmap": lambda f: torch.func.vmap(lambda t: f(model, t))(torch.stack([x, 2 * x])),
    "forward-AD": lambda f: tangent(lambda: f(model, fwAD.make_dual(x, torch.ones_like(x)))),
    "forward-AD, plain input": lambda f: tangent(lambda: fwAD.make_dual(f(model, x), x)),
    "forward-AD, dual weight": lambda f: tangent(lambda: with_dual_weight(f)),
}}


def with_dual_weight(f):
    weight = model.weight
    model._parameters["weight"] = fwAD.make_dual(weight.detach(), torch.ones_like(weight))
    try:
        return f(model, x)
    finally:
        model._parameters["weight"] = weight


def tangent(call):
    with fwAD.dual_level():
        return fwAD.unpack_dual(call()).tangent.clone()


cells = {{"plain": "exact" if torch.equal(run(model, x), relu_linear(model, x)) else "wrong"}}
for name, call in calls.items():
    want = call(relu_linear)
    try:
        cells[name] = "exact" if torch.equal(call(run), want) else "wrong"
    except precompile.PrecompileError as error:
        cells[name] = "refused: " + str(error)
print(json.dumps(cells))
"""


@pytest.mark.parametrize(
    ("tracer", "backend"),
    [("make_fx", "eager"), ("make_fx", "inductor"), ("dynamo", "eager"), ("dynamo", "inductor")],
)
def test_a_call_under_a_torch_func_transform_is_refused(
    tmp_path: Path, tracer: str, backend: str
) -> None:
    model, x = _model_and_input()
    with torch.no_grad():
        paths = capture_pair(
            relu_linear,
            model,
            x,
            directory=tmp_path,
            backend=backend,
            tracer=precompile.DynamoTracer() if tracer == "dynamo" else None,
        )
    cells = run_json(SERVE.format(paths=list(paths)))
    assert cells["plain"] == "exact", cells
    assert cells["grad"].startswith("refused: "), cells
    if tracer == "make_fx":
        assert "torch.func transform" in cells["grad"], cells
    # vmap of make_fx's eager-backend graph of ATen ops goes through their batching
    # rules, as eager's does: served, exactly; Inductor's kernels would not see it (and
    # Dynamo's guards refuse the batched tensor).
    if (tracer, backend) == ("make_fx", "eager"):
        assert cells["vmap"] == "exact", cells
    else:
        assert cells["vmap"].startswith("refused: "), cells
    # A forward-AD dual input: the eager backend's ATen operations carry its tangent, as
    # eager's do; Inductor's kernels would drop it (its extern matmul raised a raw
    # NotImplementedError), so it is refused, naming the argument. A call made inside a
    # dual level with plain tensors is served.
    assert cells["forward-AD, plain input"] == "exact", cells
    if backend == "eager":
        assert cells["forward-AD"] == "exact", cells
    else:
        assert cells["forward-AD"].startswith("refused: "), cells
        assert "argument 1 is a forward-AD dual tensor" in cells["forward-AD"], cells
    # A dual parameter of the module argument (helper-83: the check walked modules but
    # never reported one). Dynamo's guards refuse a plain tensor where a Parameter was.
    dual_weight = cells["forward-AD, dual weight"]
    if (tracer, backend) == ("make_fx", "eager"):
        assert dual_weight == "exact", cells
    elif tracer == "make_fx":
        assert "argument 0's 'weight' is a forward-AD dual tensor" in dual_weight, cells
    else:
        assert dual_weight.startswith("refused: "), cells
