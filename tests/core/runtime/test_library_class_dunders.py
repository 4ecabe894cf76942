"""A protocol dunder set on a library module class (``nn.Linear.__getattr__ = f``): Python
calls it implicitly when forward reads ``self.weight``, so eager computes with what it
returns. Dynamo inlines its own attribute lookup, so no code of ``Module.__getattr__``
ran in the trace, and the class check compared only the library attributes whose code
ran: a Dynamo artifact served the old weights (found by the round-4 attack). The
protocol dunders of every library class along the MROs are now compared too. Both
tracers, fresh process, the patch made before load and after two served calls: refused,
naming the dunder, or served as eager."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from tests.harness import attack_in_child

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


class TwoLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def doubled(self: nn.Module, name: str) -> Any:
    value = nn.Module.__getattr__(self, name)
    return value * 2 if name == "weight" else value


CHILD = """
import json
import torch
from torch import nn
import precompile
from tests.core.runtime.test_library_class_dunders import TwoLinear, doubled, serve

outcomes = {{}}
for when in ("before load", "after serving"):
    if when == "before load":
        nn.Linear.__getattr__ = doubled
    torch.manual_seed(0)
    model, x = TwoLinear().eval(), torch.randn(3, 4)
    with torch.no_grad():
        try:
            # A refusal at load or at the call: both are the artifact saying no.
            run = precompile.load({artifact!r}, {cache!r})
            if when == "after serving":
                run(model, x)
                run(model, x)
                nn.Linear.__getattr__ = doubled
            want = serve(model, x)
            got = run(model, x)
            outcomes[when] = ["served", bool(torch.allclose(got, want))]
        except precompile.PrecompileError as error:
            outcomes[when] = ["refused", str(error)]
    del nn.Linear.__getattr__
print(json.dumps(outcomes))
"""


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_a_library_class_getattr_set_is_refused_or_served_as_eager(
    tracer: str, tmp_path: Path
) -> None:
    outcomes = attack_in_child(
        CHILD,
        serve,
        TwoLinear,
        lambda: torch.randn(3, 4),
        directory=tmp_path,
        tracer=TRACERS[tracer](),
    )
    for when, (kind, detail) in outcomes.items():
        if kind == "served":
            assert detail is True, (tracer, when)
        else:
            assert "__getattr__" in detail, (tracer, when, detail)
