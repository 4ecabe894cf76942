"""Round 5: a global container whose class is a user subclass, and a global dict read by
key while traced code reaches the module's globals another way.

* A ``dict``/``list`` subclass held in a global (``class Table(dict)`` with
  ``__missing__``): its lookups run its class's code, so its class is noted like an
  object's (``value_fingerprints._fingerprint_container``) and the class record compares
  ``__missing__``/``__getitem__`` (``class_fingerprints.PROTOCOL_DUNDERS``), by the
  class dict's version per call. Set on the class after load: refused, never the
  captured value served.
* A global dict read by constant keys (``CFG["a"]``) is compared at those keys only
  where no traced code may reach the module's globals otherwise
  (``bytecode_names.reaches_globals``: ``globals()``, ``vars``, ``__dict__``,
  ``sys.modules``, ``getattr``, ...) nor reads it through its module (``cfgmod.CFG``);
  otherwise whole, so an unread key changed is refused.

Without the class note the make_fx capture refused the subclass's method outright (a
function held by a class dict no watched value reached) unless it was reachable some
other way, and then served the captured value (the round-5 harness cells). Near misses
stay served: an unrelated class attribute set on the subclass, and a key no
code reads changed in a dict read by key alone. Each loaded in a fresh process, both
tracers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from tests.core.runtime import _keyed_cfg_module as cfgmod
from tests.harness import attack_in_child, set_undoably


class Table(dict):  # type: ignore[type-arg]
    def __missing__(self, key: Any) -> float:
        return 3.0


class Row(list):  # type: ignore[type-arg]
    def __getitem__(self, i: Any) -> Any:
        return super().__getitem__(i) * 2.0


TABLE = Table(a=2.0)
ROW = Row([1.5, 4.0])
CFG: dict[str, float] = {"a": 2.0, "z": 1.0}
PLAIN: dict[str, float] = {"a": 2.0, "z": 1.0}


class ReadsMissing(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * TABLE["b"]


class ReadsRow(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * ROW[0]


def _sum_through_globals() -> float:
    return float(sum(globals()["CFG"].values()))


class ReadsKeyAndGlobals(nn.Module):
    """CFG read by key here, summed whole in a helper through ``globals()``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * CFG["a"] + _sum_through_globals()


class ReadsKeyAndModule(nn.Module):
    """cfgmod's CFG read by key in cfgmod, summed whole here through the module."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * cfgmod.scale() + float(sum(cfgmod.CFG.values()))


class ReadsPlainKey(nn.Module):
    """PLAIN read by key alone: the near miss where the keyed rule still holds."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * PLAIN["a"]


def _set(owner: Any, name: str, value: Any) -> Callable[[], Callable[[], None]]:
    """A change setting ``owner.name`` (or ``owner[name]`` for a dict); its undo."""

    return lambda: set_undoably(owner, name, value)


#: name -> (model, change, whether the change is a no-op that must stay served)
CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], Callable[[], None]], bool]] = {
    "__missing__ changed": (ReadsMissing, _set(Table, "__missing__", lambda s, k: 9.0), False),
    "__getitem__ set on the dict subclass": (
        ReadsMissing,
        _set(Table, "__getitem__", lambda s, k: 7.0),
        False,
    ),
    "list subclass __getitem__ changed": (
        ReadsRow,
        _set(Row, "__getitem__", lambda s, i: 5.0),
        False,
    ),
    "unrelated class attribute (no-op)": (ReadsMissing, _set(Table, "note", "x"), True),
    "unread key changed, read via globals()": (ReadsKeyAndGlobals, _set(CFG, "z", 5.0), False),
    "unread key changed, read via the module": (
        ReadsKeyAndModule,
        _set(cfgmod.CFG, "z", 5.0),
        False,
    ),
    "unread key changed, read by key alone (no-op)": (ReadsPlainKey, _set(PLAIN, "z", 5.0), True),
}

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}

CHILD = """
import json, warnings
warnings.simplefilter("ignore")
from tests.core.runtime.test_dict_subclass_and_globals_reach import attack
print(json.dumps(attack({artifact!r}, {cache!r}, {case!r})))
"""


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def attack(artifact: str, cache: str, case: str) -> dict[str, Any]:
    """In the fresh process: two served calls equal to eager, the change, one call."""
    run = precompile.load(artifact, cache)
    model = CASES[case][0]().eval()
    x = torch.arange(1.0, 3.0)
    out: dict[str, Any] = {}
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(run(model, x), model(x))
        undo = CASES[case][1]()
        try:
            got = run(model, x)
            out["changed"] = ["served", bool(torch.equal(got, model(x)))]
        except precompile.PrecompileError as error:
            out["changed"] = ["refused", str(error)]
        finally:
            undo()
        out["undone"] = bool(torch.equal(run(model, x), model(x)))
    return out


@pytest.mark.parametrize("tracer", sorted(TRACERS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_changed_class_or_reached_dict_is_refused_and_near_miss_served(
    tracer: str, case: str, tmp_path: Any
) -> None:
    make, _, no_op = CASES[case]
    out = attack_in_child(
        CHILD.replace("{case!r}", repr(case)),
        serve,
        lambda: make().eval(),
        lambda: torch.arange(1.0, 3.0),
        directory=tmp_path,
        tracer=TRACERS[tracer](),
    )
    kind, detail = out["changed"]
    if no_op:
        assert [kind, detail] == ["served", True], json.dumps(out)
    else:
        assert kind == "refused", json.dumps(out)
        # Dynamo's guards say "no captured variant serves this call"; make_fx names the
        # value ("Restore it, or capture again").
        assert detail.startswith("precompile:") and "(invariant" in detail, detail
    assert out["undone"] is True
