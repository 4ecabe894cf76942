"""A flag read only as ``self.flag and self.training`` on a module in eval decides nothing
(``neutral_reads.read_only_under_training``), but eager runs the flag's truth test
*before* it reads ``training``: a value whose ``__bool__`` stores into the module, or
raises (a many-valued tensor), makes eager differ from the graph. So the flag stays
checked by the kind of its value (``value_fingerprints.truth_kind`` over
``PURE_TRUTH_TYPES``, shared by both tracers): a value of a type whose truth test is
pure is served, any other is refused naming the flag, in one text.

make_fx checks it in its module fingerprint; Dynamo in its per-call module check
(``multigraph_dependencies``), from the flags the capture relaxed (``MODULE_HOOKS``
roots' ``"flags"``), so both serve the same table: on the instance, absent at capture
(``getattr(self, "flag", False)``), on the class (changed at class level after a served
call: the class dict is watched), and on a child module behind a graph break (Dynamo's
installed artifact).

Each tracer's artifact is captured here once per model and served in one fresh process,
each cell on a fresh model, first served unchanged, then changed and compared with eager
on the changed model."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from tests.fixtures.truth_test_flags import Flagged as Flagged
from tests.fixtures.truth_test_flags import Truthy as Truthy
from tests.harness import capture_pair, run_json

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


class AbsentFlag(nn.Module):
    """The flag absent at capture, read as ``getattr(self, "flag", False)``."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if getattr(self, "flag", False) and self.training:
            x = x + 100
        return x * self.scale


class ClassFlag(nn.Module):
    """The flag held by the class, changed at class level."""

    flag: Any = False

    def __init__(self) -> None:
        super().__init__()
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x + 100
        return x * self.scale


class BrokenChild(nn.Module):
    """A child whose forward breaks the graph before it reads its flag: Dynamo serves
    the parent as an installed artifact."""

    def __init__(self) -> None:
        super().__init__()
        self.flag: Any = False
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * 1.5
        torch._dynamo.graph_break()
        if self.flag and self.training:
            x = x + 100
        return x * self.scale


class InstalledFlag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.child = BrokenChild()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.child(x) + 1


#: Per model: where its cells set the flag (an expression of ``model``), and the words
#: its refusals name the flag's module by (make_fx, Dynamo).
WHERE = {
    "Flagged": ("model", ("the model of module argument 0", "`model`")),
    "AbsentFlag": ("model", ("the model of module argument 0", "`model`")),
    "ClassFlag": ("type(model)", ("the model of module argument 0", "`model`")),
    "InstalledFlag": ("model.child", ("submodule 'child' of module argument 0", "`model.child`")),
}


CELLS = ("stores", "many-valued tensor", "int 1", "True", "deleted")


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
    "deleted": None,
}}
out = {{}}
for cell, value in changes.items():
    torch.manual_seed(0)
    model, x = Model().eval(), torch.randn(3, 4)
    target = {where}
    with torch.no_grad():
        # Served unchanged first: the change is then met by the per-call fast path.
        assert torch.equal(run(model, x), t.serve(model, x))
        if value is not None:
            target.flag = value(model)
        elif "flag" in vars(target):
            del target.flag
        else:
            continue  # absent at capture: nothing to delete
        try:
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
        finally:
            if isinstance(target, type):
                target.flag = False
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
    if tracer == "dynamo":
        # Not vacuous: the child's graph break makes an installed artifact.
        mode = precompile.inspect_artifact(artifact)["SERVING_MODE"]
        assert (mode == "installed") == (model == "InstalledFlag"), (model, mode)
    code = CHILD.format(artifact=artifact, cache=cache, model=model, where=WHERE[model][0])
    return dict(run_json(textwrap.dedent(code)))


@pytest.mark.parametrize("model", sorted(WHERE))
@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_flag_is_checked_by_the_kind_of_its_truth_test(
    tracer: str, model: str, tmp_path: Path
) -> None:
    """Both tracers, one table: a value whose truth test stores or raises is refused
    naming the flag and its module, in one text; True and an int (where a bool was
    captured) are served equal to eager -- on the instance, absent at capture, on the
    class, and on a child behind a graph break; a flag held at capture and deleted is
    refused (eager's plain read raises)."""
    out = _served(tracer, model, tmp_path)
    where = WHERE[model][1][tracer == "dynamo"]
    if model != "AbsentFlag":
        # A flag held at capture, deleted: eager's plain read raises. Refused in one text.
        kind, message = out.pop("deleted")
        assert kind == "refused" and f"{where} has no attribute 'flag'" in message, out
        assert "deleted since capture" in message and "Restore it (a bool)" in message
    assert sorted(out) == sorted(c for c in CELLS if c != "deleted"), out
    if tracer == "make_fx" and model == "ClassFlag":
        # make_fx checks the class's flag in the class record (CLASS_STATE), by the kind
        # of its truth test as the instance's (``class_fingerprints.CLASS_TRUTH``): the
        # refusal names the class.
        where = f"class {__name__}.ClassFlag"
    for cell, kind_name in (("stores", "Truthy"), ("many-valued tensor", "Tensor")):
        kind, message = out[cell]
        assert kind == "refused", (tracer, model, cell, out[cell])
        assert f"{where} has flag set to a " in message and kind_name in message, message
        assert "truth test before it reads `training`" in message, message
        assert "Set flag to a bool" in message, message
    assert out["True"] == ["served", True], (tracer, model, out["True"])
    assert out["int 1"] == ["served", True], (tracer, model, out["int 1"])
