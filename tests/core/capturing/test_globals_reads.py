"""A global read through the module's own dict -- ``globals()["K"]``,
``globals().get("K2", d)`` -- is a read of that name, under both tracers.

helper-83: make_fx recorded the globals a trace loads by name (``LOAD_GLOBAL``), so
``model(x) * globals()["K"]`` was served with the captured K after ``K = 3.0`` (Dynamo
guards the dict's entries it read). Now each constant key is recorded as a load of that
name is, absent ones as absent; a use of ``globals()`` that is not by constant key
(its length, its items) is refused at capture, as no record follows the whole namespace.
Each change is made in a fresh process before and after load.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import precompile
from tests.harness import attack_in_child

K = 2.0
UNRELATED = 1.0


def reads_globals(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x) * globals()["K"] + globals().get("SHIFT", 0.5)


def counts_globals(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x) * len(globals())


CHILD = """
import json, torch, precompile
import tests.core.capturing.test_globals_reads as t

def model_and_input():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 4).eval(), torch.randn(3, 4)

def outcome(run):
    model, x = model_and_input()
    try:
        got = run(model, x)
    except precompile.PrecompileError as error:
        return ["refused", str(error)]
    return ["served" if torch.equal(got, t.reads_globals(model, x)) else "wrong", ""]

changes = {{
    "K": ("t.K = 3.0", "t.K = 2.0"),
    "SHIFT bound": ("t.SHIFT = 1.5", "del t.SHIFT"),
    "unrelated": ("t.UNRELATED = 5.0", "t.UNRELATED = 1.0"),
}}
out = {{}}
run = precompile.load({artifact!r}, {cache!r})
out["first"] = outcome(run)
for name, (change, undo) in changes.items():
    exec(change)
    out[name + ", before load"] = outcome(precompile.load({artifact!r}, {cache!r}))
    out[name + ", after load"] = outcome(run)
    exec(undo)
out["restored"] = outcome(run)
print(json.dumps(out))
"""

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_a_global_read_through_globals_is_checked(tracer: str, tmp_path: Path) -> None:
    out = attack_in_child(
        CHILD,
        reads_globals,
        lambda: torch.nn.Linear(4, 4).eval(),
        lambda: torch.randn(3, 4),
        directory=tmp_path,
        tracer=TRACERS[tracer](),
    )
    for served in ("first", "restored", "unrelated, before load", "unrelated, after load"):
        assert out[served] == ["served", ""], (served, out)
    for name in ("K", "SHIFT bound"):
        for when in ("before load", "after load"):
            kind, text = out[f"{name}, {when}"]
            assert kind == "refused", (name, when, out)
            if tracer == "make_fx":
                assert name.split()[0] in text, (name, when, text)


def _refusal_at_capture(fn: object, tracer: str, tmp_path: Path) -> str:
    """The PrecompileError a capture of ``fn`` raises, as text."""
    torch.manual_seed(0)
    with pytest.raises(precompile.PrecompileError) as refused:
        with (
            precompile.capture(
                fn,
                artifact_path=str(tmp_path / "a.py"),
                cache_path=str(tmp_path / "a.cache"),
                tracer=TRACERS[tracer](),
            ) as cap,
            torch.no_grad(),
        ):
            cap(torch.nn.Linear(4, 4).eval(), torch.randn(3, 4))
    return str(refused.value)


def test_globals_used_whole_is_refused_at_make_fx_capture(tmp_path: Path) -> None:
    message = _refusal_at_capture(counts_globals, "make_fx", tmp_path)
    assert "counts_globals reads its module's namespace through globals()" in message, message
    assert "test_globals_reads.py:" in message, message


W_A = 1.0
W_B = 2.0


def sums_globals(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x) * sum(v for k, v in globals().items() if k.startswith("W_"))


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_globals_walked_is_refused_at_capture_under_both_tracers(
    tracer: str, tmp_path: Path
) -> None:
    """Was (Dynamo): a raw ``TypeError: cannot pickle 'module' object`` out of the
    capture, from the constants of Dynamo's compiled code (helper-83)."""
    message = _refusal_at_capture(sums_globals, tracer, tmp_path)
    assert "globals()" in message, message
