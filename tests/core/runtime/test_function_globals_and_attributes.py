"""Round 5 (issue 26), functions at global paths: what a function computes with includes
which globals its code reads and its own attributes the trace read.

- The same code, defaults and closure made in another namespace
  (``FunctionType(code, other_globals)``) reads other globals than its module's, which
  are what the global-read checks watch: it was served the captured graph by make_fx,
  and by Dynamo when it was there before load (adopted by name). Both refuse it now
  (``value_fingerprints.home_globals``, in make_fx's fingerprint and in Dynamo's
  ``GLOBAL_READS`` rows), after load and before it.
- A function's own attribute the traced code read (``scaled.scale``) changed after load
  was served by make_fx: its ``__dict__`` is fingerprinted at the names the trace read and
  watched by version like any dict.

The near misses stay served: the registry refilled by the same maker, an attribute the
trace did not read set, the read attribute set to its own value. One capture per tracer,
every change played in one fresh process from the captured state.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import precompile
from tests.harness import attack_in_child

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}

SCALE = 2.0


def make_act() -> Callable[[torch.Tensor], torch.Tensor]:
    def act(x: torch.Tensor) -> torch.Tensor:
        return x * SCALE

    return act


def other_globals_act() -> Callable[[torch.Tensor], torch.Tensor]:
    """``make_act``'s code run in a namespace where SCALE is 5: the same module, qualified
    name, code, defaults and closure as the registry's function, other globals."""
    namespace = {"__name__": __name__, "SCALE": 5.0}
    maker = types.FunctionType(make_act.__code__, namespace, "make_act")
    return maker()  # type: ignore[no-any-return]


def scaled(x: torch.Tensor) -> torch.Tensor:
    return x * scaled.scale  # type: ignore[attr-defined]


scaled.scale = 3.0  # type: ignore[attr-defined]
REGISTRY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"act": make_act()}


class Uses(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return REGISTRY["act"](x) + scaled(x)


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


CHILD = """
import json, warnings
warnings.simplefilter("ignore")
import torch, precompile
from tests.core.runtime import test_function_globals_and_attributes as case
from tests.harness import served_or_refused

def outcome(run, model, x):
    return served_or_refused(lambda: run(model, x), lambda: case.serve(model, x))

def refill_same():
    case.REGISTRY["act"] = case.make_act()

def refill_other():
    case.REGISTRY["act"] = case.other_globals_act()

def set_attr(name, value):
    return lambda: setattr(case.scaled, name, value)

original = case.REGISTRY["act"]
def restore():
    case.REGISTRY["act"] = original
    case.scaled.scale = 3.0
    vars(case.scaled).pop("unread", None)

torch.manual_seed(0)
model, x = case.Uses().eval(), torch.randn(3, 4)
changes = {{
    "refilled by the same maker": refill_same,
    "refilled with the same code in other globals": refill_other,
    "unread attribute set": set_attr("unread", 7.0),
    "read attribute set to its value": set_attr("scale", 3.0),
    "read attribute changed": set_attr("scale", 5.0),
}}
out = {{}}
with torch.no_grad():
    run = precompile.load({artifact!r}, {cache!r})
    out["first"] = [outcome(run, model, x) for _ in range(2)]
    for name, change in changes.items():
        change()
        out[name] = outcome(run, model, x)
        restore()
        out[name + ", restored"] = outcome(run, model, x)
        change()
        out[name + ", before load"] = outcome(
            precompile.load({artifact!r}, {cache!r}), model, x
        )
        restore()
print(json.dumps(out))
"""


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_other_globals_and_own_attributes_are_refused_near_misses_served(
    tracer: str, tmp_path: Path
) -> None:
    out = attack_in_child(
        CHILD,
        serve,
        lambda: Uses().eval(),
        lambda: torch.randn(3, 4),
        directory=tmp_path,
        tracer=TRACERS[tracer](),
    )
    served = ["served", True]
    assert out["first"] == [served] * 2, out
    for name in (
        "refilled by the same maker",
        "unread attribute set",
        "read attribute set to its value",
    ):
        for when in ("", ", before load"):
            assert out[name + when] == served, (name + when, out)
    for name in ("refilled with the same code in other globals", "read attribute changed"):
        assert out[name + ", restored"] == served, (name, out)
    for when in ("", ", before load"):
        kind, text = out["refilled with the same code in other globals" + when]
        assert kind == "refused", (when, out)
        assert "REGISTRY['act']" in text and "other globals than its module's" in text, text
        kind, text = out["read attribute changed" + when]
        # Refused, naming the attribute, or served equal to eager.
        assert [kind, text] == served or (kind == "refused" and "scale" in text), (when, out)
