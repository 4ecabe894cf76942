"""A tensor's exact Python type is part of what a make_fx graph stands for.

A capture takes only ``torch.Tensor`` and ``nn.Parameter`` (``fx_inputs.check_tensor``
refuses subclasses), and its graph runs torch's own ops on the tensors' data. A call
that passes a subclass whose ``__torch_function__`` (or any override) changes a result
-- as an input, as a parameter replaced after load, or as a parameter whose
``__class__`` is reassigned in place (no watched dict changes) -- would be served the
plain graph where eager runs the override. make_fx refuses it (``check_tensor_types``,
one rule for inputs and model state, on the slow path only: the C-level guards of the
fast paths compare exact types), with the eager and Inductor backends. Dynamo refuses
by its own TENSOR_MATCH. The near misses stay served: an ``nn.Parameter`` passed where a
tensor was captured, parameters frozen with ``requires_grad_(False)``, and a plain call
after a refused one.

Each tracer/backend's artifact is captured once and served in one fresh process; each
cell starts from a fresh model, is served twice unchanged, changed, then served and
compared with eager on the changed model.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from tests.harness import capture_pair, run_json

CASES = {
    "make_fx-eager": (precompile.MakeFxTracer, "eager"),
    "make_fx-inductor": (precompile.MakeFxTracer, "inductor"),
    "dynamo-eager": (precompile.DynamoTracer, "eager"),
}


def serve(model: nn.Module, x: torch.Tensor) -> Any:
    return model(x)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4)).eval()


CHILD = """
import json
import torch
from torch import nn
import precompile

class Scaled(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {{}})
        if isinstance(out, torch.Tensor) and func is torch.nn.functional.linear:
            return out * 3
        return out

class ScaledParameter(nn.Parameter):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {{}}))
        return out * 3 if func is torch.nn.functional.linear else out

def serve(model, x):
    return model(x)

def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4)).eval()

def subclass_param(m, x):
    m[0].weight = ScaledParameter(m[0].weight.detach().clone())
    return x

def class_reassigned(m, x):
    m[0].weight.__class__ = ScaledParameter
    return x

def frozen(m, x):
    m.requires_grad_(False)
    return x

SCENARIOS = {{
    "input a tensor subclass": lambda m, x: x.as_subclass(Scaled),
    "input's __class__ reassigned": lambda m, x: (setattr(x, "__class__", Scaled), x)[1],
    "parameter a Parameter subclass": subclass_param,
    "parameter's __class__ reassigned": class_reassigned,
    "input an nn.Parameter (no-op)": lambda m, x: nn.Parameter(x * 3),
    "requires_grad_(False) (no-op)": frozen,
}}

fn = precompile.load({artifact!r}, {cache!r})
out = {{}}
with torch.no_grad():
    for name, change in SCENARIOS.items():
        m, x = mlp(), torch.ones(2, 4)
        fn(m, x), fn(m, x)
        x = change(m, x)
        try:
            got = fn(m, x)
        except precompile.PrecompileError as e:
            outcome = ["refused", str(e)]
        else:
            want = serve(m, x)
            same = torch.allclose(got.as_subclass(torch.Tensor), want.as_subclass(torch.Tensor))
            outcome = ["served", bool(same)]
        # A plain call on a fresh model after it: served equal to eager.
        m2, x2 = mlp(), torch.ones(2, 4)
        after = torch.allclose(fn(m2, x2), serve(m2, x2))
        out[name] = [*outcome, bool(after)]
print(json.dumps(out))
"""

#: The refusal's words per changed cell, make_fx (the tensor named, its type).
MAKE_FX_WORDS = {
    "input a tensor subclass": "input 0 is a __main__.Scaled, a subclass of torch.Tensor",
    "input's __class__ reassigned": "input 0 is a __main__.Scaled, a subclass of torch.Tensor",
    "parameter a Parameter subclass": (
        "parameter '0.weight' is a __main__.ScaledParameter, a subclass of nn.Parameter"
    ),
    "parameter's __class__ reassigned": (
        "parameter '0.weight' is a __main__.ScaledParameter, a subclass of nn.Parameter"
    ),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, list[Any]]]:
    results = {}
    for case, (tracer, backend) in CASES.items():
        directory: Path = tmp_path_factory.mktemp(case)
        torch.manual_seed(0)
        with torch.no_grad():
            artifact, cache = capture_pair(
                serve,
                _mlp(),
                torch.ones(2, 4),
                directory=directory,
                tracer=tracer(),
                backend=backend,
            )
        child = textwrap.dedent(CHILD.format(artifact=artifact, cache=cache))
        results[case] = run_json(child)
    return results


@pytest.mark.parametrize("case", list(CASES))
def test_subclass_refused_and_near_misses_served(
    outcomes: dict[str, dict[str, list[Any]]], case: str
) -> None:
    got = outcomes[case]
    for name, (kind, detail, after) in got.items():
        assert after is True, (case, name)
        if name.endswith("(no-op)"):
            assert [kind, detail] == ["served", True], (case, name, detail)
            continue
        assert kind == "refused", (case, name, detail)
        if case.startswith("make_fx"):
            assert MAKE_FX_WORDS[name] in detail, (case, name, detail)
            assert "as_subclass(torch.Tensor)" in detail, detail
