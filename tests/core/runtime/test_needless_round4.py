"""Round 4's needless refusals (issue 26: "check what the graph depends on, not
everything that was touched"), each served where the change cannot alter the answer and
still refused where the same kind of change does:

- the walk order of submodules: ``del model.fc1; model.fc1 = fc1`` moves ``fc1`` last in
  ``_modules`` and in ``parameters()``; a forward that reads each submodule by name is
  served (make_fx keys the lifted tensors by name), one that loops over ``children()``
  or reads ``parameters()`` in order is refused, naming what it read;
- a registry filled again after load by the same maker (``REGISTRY["act"] =
  make_act(2.0)``): another function with the same code and closure values is served
  (Dynamo compares a function found at a read path by its value, ``function_value``);
  one with another closure value is refused, and so is the adopted function's code
  swapped later; the same where the registry was empty at load and filled after (a
  function of the captured name with other code used to be served: a wrong answer);
- a key added to a global dict that the traced code read only by constant keys
  (``CFG["a"]``, ``"b" in CFG``, ``CFG.get("c", d)``), or its entries in another
  order: served (make_fx fingerprints those keys alone, ``keyed_fingerprint``); one of
  those keys added or changed, or any key added where the code took ``len()`` or
  iterated it, is refused.

Every cell is captured here and served in ONE fresh process per tracer, compared with
eager on the changed model.
"""

from __future__ import annotations

import textwrap
from typing import Any, NamedTuple

import pytest
import torch

import precompile
from tests.fixtures import needless_round4 as nr
from tests.harness import capture_pair, run_json

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


class Cell(NamedTuple):
    #: ``nr.<model>()`` is captured and served
    model: str
    #: ``nr.<change>(model)`` is made after one served call
    change: str
    #: per tracer: "served" (and equal to eager), or words the refusal must hold
    expected: dict[str, tuple[str, ...]]
    #: ``nr.<then>(model)`` made after one more served call, before the last
    then: str | None = None
    #: ``nr.<before_load>(model)`` made before ``load`` (no call before the change)
    before_load: str | None = None


SERVED = ("served",)
CELLS: dict[str, Cell] = {
    "walk order: read by name, fc1 set again (no-op)": Cell(
        "ByName", "readd_fc1", {"make_fx": SERVED, "dynamo": SERVED}
    ),
    "walk order: children() looped, fc1 set again": Cell(
        "LoopsChildren",
        "readd_fc1",
        {
            "make_fx": ("same names in another order", "['_modules']"),
            "dynamo": ("key number 0", "named_children"),
        },
    ),
    "walk order: parameters() read in order, fc1 set again": Cell(
        "CatsParameters",
        "readd_fc1",
        {
            "make_fx": ("same names in another order", "'_parameters'"),
            "dynamo": ("key number 0", "named_modules"),
        },
    ),
    "registry filled again by the same maker (no-op)": Cell(
        "UsesRegistry", "refill_same", {"make_fx": SERVED, "dynamo": SERVED}
    ),
    "registry filled again with another closure value": Cell(
        "UsesRegistry",
        "refill_other",
        {"make_fx": ("REGISTRY", "3.0"), "dynamo": ("REGISTRY['act']", "closure values differ")},
    ),
    "registry filled again, then its function's code swapped": Cell(
        "UsesRegistry",
        "refill_same",
        {"make_fx": ("REGISTRY",), "dynamo": ("make_act.<locals>.act", "__code__")},
        then="swap_code",
    ),
    "registry empty at load, filled by the same maker (no-op)": Cell(
        "UsesRegistry",
        "refill_same",
        {"make_fx": SERVED, "dynamo": SERVED},
        before_load="empty_registry",
    ),
    "registry empty at load, filled with a code-swapped function": Cell(
        "UsesRegistry",
        "refill_swapped",
        {"make_fx": ("REGISTRY",), "dynamo": ("REGISTRY['act']", "closure values differ")},
        before_load="empty_registry",
    ),
    "registry empty at load, filled, then its function's code swapped": Cell(
        "UsesRegistry",
        "refill_same",
        {"make_fx": ("REGISTRY",), "dynamo": ("make_act.<locals>.act", "__code__")},
        then="swap_code",
        before_load="empty_registry",
    ),
    "global dict: a key no traced code looks up added (no-op)": Cell(
        "ReadsKeys", "add_unread_key", {"make_fx": SERVED, "dynamo": SERVED}
    ),
    "global dict: the same entries in another order (no-op)": Cell(
        "ReadsKeys", "reorder_keys", {"make_fx": SERVED, "dynamo": SERVED}
    ),
    "global dict: the key tested added": Cell(
        "ReadsKeys",
        "add_tested_key",
        {"make_fx": ("global CFG['b']", "read no such key"), "dynamo": ("CFG",)},
    ),
    "global dict: the key got with a default added": Cell(
        "ReadsKeys",
        "add_got_key",
        {"make_fx": ("global CFG['c']", "read no such key"), "dynamo": ("CFG",)},
    ),
    "global dict: the key read changed": Cell(
        "ReadsKeys", "change_read_key", {"make_fx": ("global CFG['a']",), "dynamo": ("CFG",)}
    ),
    "global dict: len() read, a key added": Cell(
        "CountsKeys", "add_unread_key", {"make_fx": ("global CFG",), "dynamo": ("CFG",)}
    ),
    "global dict: items() looped, a key added": Cell(
        "IteratesKeys", "add_unread_key", {"make_fx": ("global CFG",), "dynamo": ("CFG",)}
    ),
}

CHILD = """
import json, warnings
import torch, precompile
from tests.fixtures import needless_round4 as nr
warnings.simplefilter("ignore")
out = {{}}
for name, (model, change, then, before_load, (artifact, cache)) in {cells!r}.items():
    nr.reset()
    torch.manual_seed(0)
    m = getattr(nr, model)().eval()
    x = torch.randn(3, 4)
    if before_load:
        getattr(nr, before_load)(m)
    run = precompile.load(artifact, cache)
    with torch.no_grad():
        if not before_load:
            first = run(m, x)
            assert torch.equal(first, m(x)), name
        getattr(nr, change)(m)
        try:
            if then:
                assert torch.allclose(run(m, x), m(x)), name
                getattr(nr, then)(m)
            got = run(m, x)
        except precompile.PrecompileError as error:
            out[name] = ["refused", str(error)]
        else:
            out[name] = ["served", bool(torch.allclose(got, m(x)))]
    nr.reset()
print(json.dumps(out))
"""


@pytest.fixture(scope="module", params=sorted(TRACERS))
def served(request: pytest.FixtureRequest, tmp_path_factory: Any) -> tuple[str, dict[str, Any]]:
    """Every cell captured by one tracer, and its outcome in one fresh process."""
    tracer = request.param
    directory = tmp_path_factory.mktemp(tracer)
    cells: dict[str, Any] = {}
    for k, (name, cell) in enumerate(CELLS.items()):
        nr.reset()
        torch.manual_seed(0)
        with torch.no_grad():
            pair = capture_pair(
                nr.serve,
                getattr(nr, cell.model)().eval(),
                torch.randn(3, 4),
                directory=directory,
                name=f"cell{k}",
                tracer=TRACERS[tracer](),
            )
        cells[name] = (cell.model, cell.change, cell.then, cell.before_load, pair)
    nr.reset()
    return tracer, run_json(textwrap.dedent(CHILD.format(cells=cells)))


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_served_where_it_cannot_change_the_answer(
    served: tuple[str, dict[str, Any]], cell: str
) -> None:
    tracer, outcomes = served
    expected = CELLS[cell].expected[tracer]
    kind, *detail = outcomes[cell]
    if expected == SERVED:
        # Served and equal to eager on the changed model.
        assert [kind, detail[0]] == ["served", True], (tracer, cell, outcomes[cell])
    else:
        assert kind == "refused", (tracer, cell, outcomes[cell])
        for words in expected:
            assert words in detail[0], (tracer, cell, words, detail[0])
