"""A flag read only as ``self.flag and self.training`` on a module in eval decides nothing
(``neutral_reads.read_only_under_training``), but eager runs the flag's truth test
*before* it reads ``training``: a value whose ``__bool__`` stores into the module, or
raises (a many-valued tensor), makes eager differ from the graph. So the flag stays
checked by the kind of its value (``value_fingerprints.PURE_TRUTH_TYPES``, shared by
both tracers): a value of a type whose truth test is pure is served, any other is
refused naming the flag.

Each tracer's artifact is captured here once and served in one fresh process, each
cell on a fresh model, compared with eager on the changed model. make_fx serves any
value of a pure type; Dynamo keeps a ``TYPE_MATCH`` on the flag (its guard kinds have
no "type in a set"), so it serves values of the captured type only and refuses an int
where the capture saw a bool -- with the fix in its words."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from tests.harness import capture_pair, run_json

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


class Truthy:
    """A flag whose truth test stores into the module that tests it."""

    def __init__(self, owner: nn.Module) -> None:
        self.owner = owner

    def __bool__(self) -> bool:
        self.owner.scale = 3.0
        return True


class Flagged(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flag: Any = False
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x + 100
        return x * self.scale


class AbsentFlag(nn.Module):
    """The flag absent at capture, read as ``getattr(self, "flag", False)``."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if getattr(self, "flag", False) and self.training:
            x = x + 100
        return x * self.scale


def serve(model: nn.Module, x: torch.Tensor) -> Any:
    return model(x)


CHILD = """
import json, warnings
warnings.simplefilter("ignore")
import torch
import precompile
from tests.core.runtime import test_training_flag_truth_test as t
run = precompile.load({artifact!r}, {cache!r})
Model = getattr(t, {model!r})
changes = {{
    "stores": lambda m: t.Truthy(m),
    "many-valued tensor": lambda m: torch.ones(2, dtype=torch.bool),
    "int 1": lambda m: 1,
    "True": lambda m: True,
}}
out = {{}}
for cell, value in changes.items():
    torch.manual_seed(0)
    model, x = Model().eval(), torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(run(model, x), t.serve(model, x))
        model.flag = value(model)
        try:
            got = run(model, x)
        except precompile.PrecompileError as error:
            out[cell] = ["refused", str(error)]
            continue
        try:
            want = t.serve(model, x)
        except Exception as error:
            out[cell] = ["served where eager fails", repr(error)]
            continue
        out[cell] = ["served", bool(torch.equal(got, want))]
print(json.dumps(out))
"""


def _served(tracer: str, model: str, directory: Path) -> dict[str, list[Any]]:
    """Capture ``serve`` on ``model`` in eval, then each cell in one fresh process."""
    torch.manual_seed(0)
    with torch.no_grad():
        artifact, cache = capture_pair(
            serve,
            globals()[model]().eval(),
            torch.randn(3, 4),
            directory=directory,
            tracer=TRACERS[tracer](),
        )
    code = CHILD.format(artifact=artifact, cache=cache, model=model)
    return dict(run_json(textwrap.dedent(code)))


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_flag_is_checked_by_the_kind_of_its_truth_test(tracer: str, tmp_path: Path) -> None:
    out = _served(tracer, "Flagged", tmp_path)
    for cell in ("stores", "many-valued tensor"):
        kind, message = out[cell]
        assert kind == "refused", (tracer, cell, out[cell])
        assert "flag" in message and "truth test" in message, message
        assert "before it reads `training`" in message, message
    assert "Truthy" in out["stores"][1] and "Tensor" in out["many-valued tensor"][1]
    assert out["True"] == ["served", True], (tracer, out["True"])
    if tracer == "make_fx":
        assert out["int 1"] == ["served", True], out["int 1"]
        assert "Set flag to a bool" in out["stores"][1]
    else:
        # Dynamo checks the captured type (TYPE_MATCH): an int where a bool was
        # captured is refused, saying to set a bool.
        kind, message = out["int 1"]
        assert kind == "refused" and "set it to a bool" in message, out["int 1"]


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_flag_absent_at_capture(tracer: str, tmp_path: Path) -> None:
    """``getattr(self, "flag", False)`` with no flag at capture: make_fx checks the kind
    of whatever is set later like any flag. Dynamo has no guard for "the type of what
    ``getattr`` with a default finds" (absent, its type guard would fail): a flag set
    later is served with any value, a known wrong answer for one whose truth test stores
    or raises (docs/trust.md, "Known wrong answers"), asserted so that a fix shows."""
    out = _served(tracer, "AbsentFlag", tmp_path)
    assert out["True"] == ["served", True] and out["int 1"] == ["served", True], out
    if tracer == "make_fx":
        for cell in ("stores", "many-valued tensor"):
            kind, message = out[cell]
            assert kind == "refused" and "truth test" in message, (cell, out[cell])
    else:
        assert out["stores"] == ["served", False], out["stores"]
        assert out["many-valued tensor"][0] == "served where eager fails", out
