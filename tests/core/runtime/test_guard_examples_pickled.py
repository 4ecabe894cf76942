"""Round 5 (issue 26), needless refusals at a Dynamo capture: a registry dict a guard
reads is pickled with everything it holds, as the example Dynamo rebuilds the guards
from (``_compat.dynamo.guard_examples_pickled_as_read``).

- A registry that also holds a recursive inner function (its closure holds itself)
  made every capture reading it fail with ``RecursionError`` in Dynamo's guard pickler,
  told as an error in fn ("fix the error at the location shown"), though ``torch.compile``
  runs it and the recursive entry is never read.
- A registry function with a keyword-only default (``def act(x, *, k=2.0)``) was refused
  at capture: Dynamo's pickler drops ``__kwdefaults__``, so its guard on
  ``__kwdefaults__['k']`` could not be rebuilt ("'NoneType' object is not subscriptable").

- A registry that also holds a function with a default no pickle can hold (a lock),
  never read: Dynamo passes defaults to the function's constructor, so the capture
  failed with "cannot pickle '_thread.lock' object" (and, once keyword-only defaults were
  kept, with one of those too). Defaults no guard reads are pickled as None.

All are served now; the near misses are still refused: the read function refilled with
another closure value, with other code, or given another keyword default after load or
before it. One capture per tracer, every change played in one fresh process and
compared with eager on the changed state.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from tests.harness import attack_in_child, capture_pair

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


def make_self_ref() -> Callable[[torch.Tensor], torch.Tensor]:
    """An ordinary recursive inner function: its closure holds itself."""

    def act(x: torch.Tensor) -> torch.Tensor:
        return x * act.scale  # type: ignore[attr-defined]

    act.scale = 2.0  # type: ignore[attr-defined]
    return act


def make_act(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def act(x: torch.Tensor) -> torch.Tensor:
        return x * k

    return act


def make_other_code(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def act(x: torch.Tensor) -> torch.Tensor:
        return x + k

    return act


def make_kw_act() -> Callable[..., torch.Tensor]:
    def kw_act(x: torch.Tensor, *, k: float = 3.0) -> torch.Tensor:
        return x * k

    return kw_act


LOCK = threading.Lock()


def make_locked() -> Callable[..., torch.Tensor]:
    """Defaults no pickle can hold (a lock), one positional and one keyword-only."""

    def locked(x: torch.Tensor, lock: Any = LOCK, *, kwlock: Any = LOCK) -> torch.Tensor:
        with lock, kwlock:
            return x - 1

    return locked


RECURSIVE: dict[str, Callable[..., torch.Tensor]] = {
    "selfref": make_self_ref(),
    "act": make_act(2.0),
    "locked": make_locked(),
}
KW: dict[str, Callable[..., torch.Tensor]] = {"kw": make_kw_act(), "locked": make_locked()}


class Uses(nn.Module):
    """Reads a plain function beside a recursive one, and a keyword-default function."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return RECURSIVE["act"](x) + KW["kw"](x)


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def _attacked(child: str, model: type[nn.Module], tracer: str, tmp_path: Path) -> Any:
    """The file's attack: ``model()`` in eval mode and a (3, 4) input captured through
    ``serve`` under ``tracer``, then ``child`` run against the pair in a fresh process."""
    return attack_in_child(
        child,
        serve,
        lambda: model().eval(),
        lambda: torch.randn(3, 4),
        directory=tmp_path,
        tracer=TRACERS[tracer](),
    )


#: What every child below starts with: the artifact's outcome against eager, as JSON.
CHILD_PRELUDE = """
import json, warnings
warnings.simplefilter("ignore")
import torch, precompile
from tests.core.runtime import test_guard_examples_pickled as case

def outcome(run, model, x):
    try:
        got = run(model, x)
    except precompile.PrecompileError as error:
        return ["refused", str(error)]
    return ["served", bool(torch.equal(got, case.serve(model, x)))]
"""

CHILD = (
    CHILD_PRELUDE
    + """
def kwdefault(value):
    def change():
        case.KW["kw"].__kwdefaults__ = {{"k": value}}
    return change

def refill_kw_other():
    act = case.make_kw_act()
    act.__kwdefaults__ = {{"k": 5.0}}
    case.KW["kw"] = act

saved = dict(case.RECURSIVE), dict(case.KW)
def restore():
    case.RECURSIVE.clear(); case.RECURSIVE.update(saved[0])
    case.KW.clear(); case.KW.update(saved[1])
    saved[1]["kw"].__kwdefaults__ = {{"k": 3.0}}

changes = {{
    "act refilled by the same maker": lambda: case.RECURSIVE.update(act=case.make_act(2.0)),
    "recursive entry refilled": lambda: case.RECURSIVE.update(selfref=case.make_self_ref()),
    "kw refilled by the same maker": lambda: case.KW.update(kw=case.make_kw_act()),
    "kwdefault set to its value": kwdefault(3.0),
    "act refilled with another k": lambda: case.RECURSIVE.update(act=case.make_act(5.0)),
    "act refilled with other code": lambda: case.RECURSIVE.update(
        act=case.make_other_code(2.0)
    ),
    "kwdefault changed": kwdefault(5.0),
    "kwdefault changed in place": lambda: case.KW["kw"].__kwdefaults__.update(k=5.0),
    "kw refilled with another kwdefault": refill_kw_other,
}}
torch.manual_seed(0)
model, x = case.Uses().eval(), torch.randn(3, 4)
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
)

SERVED = ["served", True]

#: the changes that cannot alter the result: each must be served, equal to eager
NO_OPS = (
    "act refilled by the same maker",
    "recursive entry refilled",
    "kw refilled by the same maker",
    "kwdefault set to its value",
)

#: the near misses: the read function computes otherwise; refused with these words
#: (make_fx's and Dynamo's own ways of naming the read path)
CHANGES = {
    "act refilled with another k": "RECURSIVE",
    "act refilled with other code": "RECURSIVE",
    "kwdefault changed": "KW",
    "kwdefault changed in place": "KW",
    "kw refilled with another kwdefault": "KW",
}


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_registry_beside_recursive_and_kwdefaults_served_near_misses_refused(
    tracer: str, tmp_path: Path
) -> None:
    out = _attacked(CHILD, Uses, tracer, tmp_path)
    assert out["first"] == [SERVED] * 2, out
    for name in NO_OPS:
        for when in ("", ", before load"):
            assert out[name + when] == SERVED, (name + when, out)
    for name, words in CHANGES.items():
        assert out[name + ", restored"] == SERVED, (name, out)
        for when in ("", ", before load"):
            kind, text = out[name + when]
            assert kind == "refused", (name + when, out)
            assert words in text, (name + when, text)


class UsesSelfRef(nn.Module):
    """Calls the recursive function itself: it reads its own attribute through its cell."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return RECURSIVE["selfref"](x) + 1


SELF_CHILD = (
    CHILD_PRELUDE
    + """
def scale(value):
    return lambda: setattr(case.RECURSIVE["selfref"], "scale", value)

original = case.RECURSIVE["selfref"]
def restore():
    case.RECURSIVE["selfref"] = original
    original.scale = 2.0

changes = {{
    "refilled by the same maker": lambda: case.RECURSIVE.update(selfref=case.make_self_ref()),
    "scale set to its value": scale(2.0),
    "scale changed": scale(5.0),
}}
torch.manual_seed(0)
model, x = case.UsesSelfRef().eval(), torch.randn(3, 4)
out = {{}}
with torch.no_grad():
    run = precompile.load({artifact!r}, {cache!r})
    out["first"] = outcome(run, model, x)
    for name, change in changes.items():
        change()
        out[name] = outcome(run, model, x)
        restore()
        change()
        out[name + ", before load"] = outcome(
            precompile.load({artifact!r}, {cache!r}), model, x
        )
        restore()
print(json.dumps(out))
"""
)


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_recursive_function_refilled_by_its_maker_served_its_attribute_refused(
    tracer: str, tmp_path: Path
) -> None:
    out = _attacked(SELF_CHILD, UsesSelfRef, tracer, tmp_path)
    assert out["first"] == SERVED, out
    for name in ("refilled by the same maker", "scale set to its value"):
        for when in ("", ", before load"):
            assert out[name + when] == SERVED, (name + when, out)
    for when in ("", ", before load"):
        kind, text = out["scale changed" + when]
        # Named by the attribute, or (Dynamo, before load) by the path it was read at.
        assert kind == "refused", (when, out)
        assert "scale" in text or "RECURSIVE['selfref']" in text, (when, text)


class Settings:
    """A plain config object a model reads two attributes of, holding a lock and a note
    nothing reads: Dynamo pickled it whole as a guard example ("cannot pickle
    '_thread.lock' object" at capture)."""

    def __init__(self) -> None:
        self.flag = True
        self.scale = 2.0
        self.note = "unread"
        self.lock = threading.Lock()


SETTINGS = Settings()


class UsesSettings(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if SETTINGS.flag:
            return x * SETTINGS.scale
        return x


SETTINGS_CHILD = (
    CHILD_PRELUDE
    + """import threading

saved = dict(vars(case.SETTINGS))
def restore():
    vars(case.SETTINGS).clear(); vars(case.SETTINGS).update(saved)

def setting(name, value):
    return lambda: setattr(case.SETTINGS, name, value)

changes = {{
    "lock replaced": lambda: setattr(case.SETTINGS, "lock", threading.Lock()),
    "note changed": setting("note", "other"),
    "flag cleared": setting("flag", False),
    "scale changed": setting("scale", 3.0),
}}
torch.manual_seed(0)
model, x = case.UsesSettings().eval(), torch.randn(3, 4)
out = {{}}
with torch.no_grad():
    run = precompile.load({artifact!r}, {cache!r})
    out["first"] = outcome(run, model, x)
    for name, change in changes.items():
        change()
        out[name] = outcome(run, model, x)
        restore()
        change()
        out[name + ", before load"] = outcome(
            precompile.load({artifact!r}, {cache!r}), model, x
        )
        restore()
print(json.dumps(out))
"""
)


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_object_with_unpicklable_unread_attribute_served_read_ones_checked(
    tracer: str, tmp_path: Path
) -> None:
    out = _attacked(SETTINGS_CHILD, UsesSettings, tracer, tmp_path)
    assert out["first"] == SERVED, out
    for name in ("lock replaced", "note changed"):
        for when in ("", ", before load"):
            assert out[name + when] == SERVED, (name + when, out)
    for name, words in (("flag cleared", "flag"), ("scale changed", "scale")):
        for when in ("", ", before load"):
            kind, text = out[name + when]
            assert kind == "refused", (name + when, out)
            assert words in text, (name + when, text)


class ReadsSettingsLock(nn.Module):
    """Branches on the lock itself: Dynamo guards it, and no artifact can hold it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if SETTINGS.lock.locked():
            return x
        return x * 2


def test_a_guarded_value_that_cannot_be_pickled_is_named_not_blamed_on_fn(
    tmp_path: Path,
) -> None:
    """Was: "fn raised InternalTorchDynamoError ... fix the error at the location shown
    (fn runs for real during capture)", pointing at the call, as if fn were wrong."""
    with pytest.raises(precompile.PrecompileError) as caught:
        capture_pair(
            serve,
            ReadsSettingsLock().eval(),
            torch.randn(3, 4),
            directory=tmp_path,
            tracer=precompile.DynamoTracer(),
        )
    text = str(caught.value)
    assert "SETTINGS.lock" in text and "cannot be serialized" in text, text
    assert "fn runs for real" not in text, text


GLOBAL_GAIN = 2.0


def reads_globals(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``globals()`` breaks Dynamo's graph mid-expression: the continuation's locals hold
    the module's globals dict, and with it the builtins dict."""
    return model(x) * globals()["GLOBAL_GAIN"]


GLOBALS_CHILD = """
import json, torch, precompile
import tests.core.runtime.test_guard_examples_pickled as t
torch.manual_seed(0)
model, x = torch.nn.Linear(4, 4).eval(), torch.randn(3, 4)
run = precompile.load({artifact!r}, {cache!r})

def outcome():
    try:
        got = run(model, x)
    except precompile.PrecompileError as error:
        return ["refused", str(error)]
    return ["served" if torch.equal(got, t.reads_globals(model, x)) else "wrong", ""]

out = {{"first": outcome()}}
t.GLOBAL_GAIN = 3.0
out["changed"] = outcome()
t.GLOBAL_GAIN = 2.0
out["restored"] = outcome()
print(json.dumps(out))
"""


def test_a_module_globals_dict_across_a_graph_break_is_captured_and_checked(
    tmp_path: Path,
) -> None:
    """Was refused at capture: "the guards of torch_dynamo_resume_in_reads_globals_at_...
    could not be rebuilt in this process: TypeError: _dispatch_keys() ... _Missing(None)".
    Dynamo's pickler saved the builtins dict's ``getattr`` as missing, and pickle rebuilds
    every bound method through it, the continuation's tensor's reducer included. Served
    now, and the global's change is refused (the continuation guards its value)."""
    out = attack_in_child(
        GLOBALS_CHILD,
        reads_globals,
        lambda: torch.nn.Linear(4, 4).eval(),
        lambda: torch.randn(3, 4),
        directory=tmp_path,
        tracer=precompile.DynamoTracer(),
    )
    assert out["first"] == ["served", ""], out
    assert out["restored"] == ["served", ""], out
    kind, text = out["changed"]
    assert kind == "refused" and "GLOBAL_GAIN" in text, out


#: A module-level lambda with a default: its qualified name (``<lambda>``) finds nothing
#: in this module.
scale_by = lambda x, k=2.0: x * k  # noqa: E731


class UsesLambda(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scale_by(x) + 1


LAMBDA_CHILD = (
    CHILD_PRELUDE
    + """
lam = case.scale_by
changes = {{
    "defaults": lambda: setattr(lam, "__defaults__", (5.0,)),
    "rebound": lambda: setattr(case, "scale_by", lambda x, k=2.0: x * k + 1),
}}
torch.manual_seed(0)
model, x = case.UsesLambda().eval(), torch.randn(3, 4)
out = {{}}
with torch.no_grad():
    run = precompile.load({artifact!r}, {cache!r})
    out["first"] = outcome(run, model, x)
    for name, change in changes.items():
        change()
        out[name] = outcome(run, model, x)
        lam.__defaults__ = (2.0,)
        case.scale_by = lam
print(json.dumps(out))
"""
)


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_a_module_level_lambda_with_defaults_is_captured_and_checked(
    tracer: str, tmp_path: Path
) -> None:
    """helper-88: Dynamo's guard pickler looks a function up by its qualified name and
    saved a module-level lambda (``<lambda>``, found nowhere) as missing, so its guard
    on ``__defaults__`` could never be rebuilt: every capture of a target calling it
    failed (PC001). It is saved as a local function is now; its defaults and binding are
    still checked per call."""
    out = _attacked(LAMBDA_CHILD, UsesLambda, tracer, tmp_path)
    assert out["first"] == SERVED, out
    for name in ("defaults", "rebound"):
        assert out[name][0] == "refused", (name, out)
