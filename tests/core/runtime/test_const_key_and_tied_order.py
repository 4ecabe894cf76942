"""Round 5's last make_fx needless refusals, each served where the change cannot alter the
answer and still refused where the same kind of change does:

- a global dict read by a key held in a module global (``CFG[K]``, ``HAS in CFG``,
  ``CFG.get(GET, d)`` with ``K = "a"``): the key is the global's value at capture, as
  constant as a literal because ``K`` is itself a global read of the traced code,
  recorded and checked per call (``bytecode_names.keyed_uses`` with the code's
  globals). A key nothing reads added or changed: served; ``K`` rebound, the read key's
  value changed, the tested key added, the got key removed: refused, naming it;
- the same dict tested or ``get`` with a key global that it does not hold (``HAS in
  CFG``, ``CFG.get(ABSENT, d)``): Dynamo guarded all of CFG's keys for such a traced key,
  refusing an unread key added; it is guarded as ``'h' not in CFG`` now (the key's own
  value guard pins it): an unread key added or removed is served by both tracers, the
  absent key added or its global rebound refused; the same for a key an attribute
  holds (``self.key in CFG``, Dynamo);
- a model with a tied weight (``fc3.weight is fc1.weight``) whose submodules are walked
  in another order (``del m.fc1; m.fc1 = fc1``, ``_modules`` reversed, before or after
  load): the shared tensor's first name follows the walk order, so the lifted tensors
  are keyed by every name each tensor has (``single_graph_model_state.all_state_names``)
  and the ties compared as the sets of names that share a tensor (``STATE_ALIASES``):
  the same tensors under the same names in another order are served; a tie broken, a
  tie moved to another tensor (same walk order, same first names: served with the
  captured tie before, a wrong answer), or two tensors tied, is refused; a forward that
  walks ``children()`` still refuses another order.

Every cell is captured here and served in ONE fresh process per tracer and model,
compared with eager on the changed model.
"""

from __future__ import annotations

import sys
import textwrap
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from precompile.capturing.bytecode_names import keyed_uses
from precompile.capturing.fx_lifting import lift_module_state
from precompile.runtime.single_graph_model_state import all_state_names
from tests.fixtures.walk_order import readd_fc1, reversed_modules
from tests.harness import capture_pair, run_json

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}

K = "a"
HAS = "h"
GET = "g"
ABSENT = "q"
NOT_A_KEY = 1.5
CFG: dict[str, Any] = {}


def _reset_globals() -> None:
    global K, HAS, GET, ABSENT, CFG
    K, HAS, GET, ABSENT = "a", "h", "g", "q"
    CFG = {"a": 2.0, "g": 3.0, "z": 1.0}


_reset_globals()


class ReadsGlobalKeys(nn.Module):
    """CFG read by keys that module globals hold, in each form the keyed rule knows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * CFG[K] + CFG.get(GET, 0.5)
        if HAS in CFG:
            y = y + 1
        return y


class GetsAbsentGlobalKey(nn.Module):
    """CFG ``get``s a key a module global holds and CFG does not: it depends on that
    key's absence (and on the global), not on CFG's other keys."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * CFG.get(ABSENT, 0.5)


class ChecksAttributeKey(nn.Module):
    """CFG tested with a key an attribute holds and CFG does not (Dynamo guards the
    attribute by value, so the key is pinned as a global's is)."""

    def __init__(self) -> None:
        super().__init__()
        self.key = "h"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        if self.key in CFG:
            y = y + 1
        return y


class Tied(nn.Module):
    """fc3's weight is fc1's: the tensor is lifted once, as ``fc1.weight``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)
        self.fc3 = nn.Linear(4, 4)
        self.fc3.weight = self.fc1.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class TiedWalk(Tied):
    """The same model, its forward applying the children in walk order."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for child in self.children():
            x = torch.relu(child(x))
        return x


def _set_global(name: str, value: Any) -> Callable[[nn.Module], None]:
    return lambda m: setattr(sys.modules[__name__], name, value)


def _cfg_set(key: str, value: Any) -> Callable[[nn.Module], None]:
    return lambda m: CFG.__setitem__(key, value)


def _cfg_del(key: str) -> Callable[[nn.Module], None]:
    return lambda m: CFG.__delitem__(key)


def _reversed_modules_ordered(m: nn.Module) -> None:
    m._modules = OrderedDict(reversed(list(m._modules.items())))


def _untie(m: nn.Module) -> None:
    m.fc3.weight = nn.Parameter(m.fc1.weight.detach() * 2)


def _readd_and_untie(m: nn.Module) -> None:
    readd_fc1(m)
    _untie(m)


def _tie_moved(m: nn.Module) -> None:
    # fc3 now shares fc2's weight: the same first names in the same walk order.
    m.fc3.weight = m.fc2.weight


def _tie_two_more(m: nn.Module) -> None:
    m.fc2.weight = m.fc1.weight


def _retied_reversed(m: nn.Module) -> None:
    # Another shared tensor under both names, in another walk order.
    reversed_modules(m)
    shared = nn.Parameter(m.fc1.weight.detach() * 3)
    m.fc1.weight = shared
    m.fc3.weight = shared


SERVED = ("served",)
TIED_DIFFERENTLY = "tied differently from the traced model's"
#: model -> case -> (change, before load?, expected per tracer: SERVED, or words the
#: refusal must hold; None: refused or served equal, either is right)
CASES: dict[str, dict[str, tuple[Callable[[nn.Module], None], bool, dict[str, Any]]]] = {
    "ReadsGlobalKeys": {
        # ``HAS in CFG`` with HAS absent: Dynamo guarded all of CFG's keys (and its
        # length) for a traced key not found; guarded as ``'h' not in CFG`` now.
        "unread key added (no-op)": (_cfg_set("new", 1.0), False, {"*": SERVED}),
        "unread key changed (no-op)": (_cfg_set("z", 5.0), False, {"*": SERVED}),
        "K rebound before load": (
            _set_global("K", "z"),
            True,
            {"make_fx": ("global K of module",), "dynamo": None},
        ),
        "K rebound": (_set_global("K", "z"), False, {"make_fx": ("global K",), "dynamo": None}),
        "read key's value changed": (
            _cfg_set("a", 5.0),
            False,
            {"make_fx": ("CFG['a']",), "dynamo": None},
        ),
        "tested key added": (
            _cfg_set("h", 0.0),
            False,
            {"make_fx": ("CFG['h']",), "dynamo": ("___dict_contains('h', CFG)",)},
        ),
        "HAS rebound to a key CFG holds": (
            _set_global("HAS", "a"),
            False,
            {"make_fx": ("global HAS",), "dynamo": ("`HAS` is not 'h'",)},
        ),
        "got key removed": (_cfg_del("g"), False, {"make_fx": ("CFG['g']",), "dynamo": None}),
        "GET rebound": (
            _set_global("GET", "z"),
            False,
            {"make_fx": ("global GET",), "dynamo": None},
        ),
    },
    "GetsAbsentGlobalKey": {
        "unread key added (no-op)": (_cfg_set("new", 1.0), False, {"*": SERVED}),
        "unread key added before load (no-op)": (_cfg_set("new", 1.0), True, {"*": SERVED}),
        "the got key added": (
            _cfg_set("q", 4.0),
            False,
            {"make_fx": ("CFG['q']",), "dynamo": ("___dict_contains('q', CFG)",)},
        ),
        "ABSENT rebound to a key CFG holds": (
            _set_global("ABSENT", "a"),
            False,
            {"make_fx": ("global ABSENT",), "dynamo": ("`ABSENT` is not 'q'",)},
        ),
        "unread key removed (no-op)": (_cfg_del("z"), False, {"*": SERVED}),
    },
    "ChecksAttributeKey": {
        # make_fx records the whole dict for a computed key (a needless refusal of its
        # own, not this rule's): either outcome is right there.
        "unread key added (no-op)": (
            _cfg_set("new", 1.0),
            False,
            {"make_fx": None, "dynamo": SERVED},
        ),
        "the tested key added": (
            _cfg_set("h", 4.0),
            False,
            {"make_fx": ("CFG",), "dynamo": ("___dict_contains('h', CFG)",)},
        ),
        "the attribute set to a key CFG holds": (
            lambda m: setattr(m, "key", "a"),
            False,
            {"make_fx": ("has key = 'a'",), "dynamo": ("`model.key` is not 'h'",)},
        ),
    },
    "Tied": {
        "fc1 deleted and set again (no-op)": (readd_fc1, False, {"*": SERVED}),
        "_modules reversed (no-op)": (reversed_modules, False, {"*": SERVED}),
        # Dynamo guards the exact type of ``_modules``: still refused (a needless
        # refusal), in words that name the table and say what replaced it.
        "_modules an OrderedDict reversed (no-op)": (
            _reversed_modules_ordered,
            False,
            {
                "make_fx": SERVED,
                "dynamo": (
                    "`model._modules` (the dict of `model`'s submodules) was replaced by an "
                    "OrderedDict",
                    "`model._modules = dict(model._modules)`",
                ),
            },
        ),
        "reordered before load (no-op)": (readd_fc1, True, {"*": SERVED}),
        "reversed, another tensor tied under both names": (_retied_reversed, False, {"*": SERVED}),
        "untied": (
            _untie,
            False,
            {"make_fx": (TIED_DIFFERENTLY, "'fc3.weight' is no longer"), "dynamo": None},
        ),
        "reordered then untied": (
            _readd_and_untie,
            False,
            {"make_fx": (TIED_DIFFERENTLY, "'fc3.weight' is no longer"), "dynamo": None},
        ),
        "tie moved to fc2's weight": (
            _tie_moved,
            False,
            {"make_fx": (TIED_DIFFERENTLY, "'fc3.weight' is no longer"), "dynamo": None},
        ),
        "two captured tensors tied": (
            _tie_two_more,
            False,
            {"make_fx": (TIED_DIFFERENTLY, "'fc2.weight' is now the same"), "dynamo": None},
        ),
    },
    "TiedWalk": {
        "children() walked, fc1 set again": (
            readd_fc1,
            False,
            {"make_fx": ("same names in another order", "_modules"), "dynamo": None},
        ),
    },
}

CHILD = """
import json, warnings
warnings.simplefilter("ignore")
from tests.core.runtime.test_const_key_and_tied_order import attack
print(json.dumps(attack({artifact!r}, {cache!r}, {model!r})))
"""


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return globals()[name]().eval()


def _example() -> torch.Tensor:
    return torch.arange(1.0, 9.0).reshape(2, 4)


def attack(artifact: str, cache: str, model_name: str) -> dict[str, Any]:
    """In the fresh process, per case: a new model, one served call (unless the change
    is made before load), the change, one call compared with eager; globals reset."""
    out: dict[str, Any] = {}
    x = _example()
    for case, (change, before_load, _) in CASES[model_name].items():
        _reset_globals()
        model = _model(model_name)
        with torch.no_grad():
            if before_load:
                change(model)
                run = precompile.load(artifact, cache)
            else:
                run = precompile.load(artifact, cache)
                torch.testing.assert_close(run(model, x), model(x))
                change(model)
            try:
                got = run(model, x)
                out[case] = ["served", bool(torch.equal(got, model(x)))]
            except precompile.PrecompileError as error:
                out[case] = ["refused", str(error)]
    _reset_globals()
    return out


_OUTCOMES: dict[tuple[str, str], dict[str, Any]] = {}


def _outcomes(tracer: str, model: str, factory: pytest.TempPathFactory) -> dict[str, Any]:
    if (tracer, model) not in _OUTCOMES:
        _reset_globals()
        with torch.no_grad():
            artifact, cache = capture_pair(
                serve,
                _model(model),
                _example(),
                directory=factory.mktemp(f"{tracer}_{model}"),
                tracer=TRACERS[tracer](),
            )
        child = CHILD.format(artifact=artifact, cache=cache, model=model)
        _OUTCOMES[tracer, model] = run_json(textwrap.dedent(child))
    return _OUTCOMES[tracer, model]


@pytest.mark.parametrize("tracer", sorted(TRACERS))
@pytest.mark.parametrize(
    ("model", "case"), [(model, case) for model, cases in CASES.items() for case in cases]
)
def test_global_key_and_tied_order_served_or_refused(
    tracer: str, model: str, case: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    kind, detail = _outcomes(tracer, model, tmp_path_factory)[case]
    expected = CASES[model][case][2]
    wanted = expected.get("*", expected.get(tracer))
    if wanted == SERVED:
        assert [kind, detail] == ["served", True], (tracer, case, detail)
    elif wanted is None:
        assert kind == "refused" or [kind, detail] == ["served", True], (tracer, case, detail)
    else:
        assert kind == "refused", (tracer, case, detail)
        assert detail.startswith("precompile:") and "(invariant" in detail, detail
        assert all(words in detail for words in wanted), (tracer, case, detail)


def _reads(code: Any, **scope: Any) -> frozenset[Any] | None:
    return keyed_uses(code, "CFG", {"CFG": {}, **scope})


def test_a_key_global_narrows_only_as_a_str_or_int_of_the_module() -> None:
    """Where ``K`` holds a key kind in the code's globals, its value is the key; a float,
    a name the module lacks (a builtin, or absent) or no globals at all keep the whole
    dict recorded."""
    code = ReadsGlobalKeys.forward.__code__
    assert _reads(code, K="a", GET="g", HAS="h") == {"a", "g", "h"}
    assert _reads(code, K=3, GET="g", HAS="h") == {3, "g", "h"}
    assert _reads(code, K=NOT_A_KEY, GET="g", HAS="h") is None
    assert _reads(code, K=True, GET="g", HAS="h") is None
    assert _reads(code, GET="g", HAS="h") is None
    assert keyed_uses(code, "CFG") is None

    def by_builtin(x: Any) -> Any:
        return CFG[len]

    assert _reads(by_builtin.__code__) is None


def test_capture_records_ties_as_the_runtime_finds_them() -> None:
    """``STATE_ALIASES`` (``LiftedState.tied_names``) and the runtime's every-name walk
    agree on which names share a tensor, across module arguments."""
    a, b = Tied(), nn.Sequential(nn.Linear(4, 4))
    b[0].weight = a.fc2.weight
    for mods in ([a], [a, b], [b, a]):
        everything = all_state_names(list(mods))
        groups: dict[int, list[str]] = {}
        for name, t in everything.items():
            groups.setdefault(id(t), []).append(name)
        assert [g for g in groups.values() if len(g) > 1] == lift_module_state(
            list(mods)
        ).tied_names()
