"""State fn advances in C: a draw from numpy's random generators, ``next()`` of an
iterator the model holds. make_fx refuses it at capture (and puts it back where Python
can); Dynamo refuses it or serves it as eager does; a generator or iterator the model
holds but fn never advances is served.

make_fx baked the value its trace drew into the graph and served it on every call
(``np.random.rand()``, a held ``RandomState``, ``Generator`` or bit generator,
``next(self.steps)`` of an ``itertools.count``, a generator, a list iterator): a silent
wrong answer from the second call (from the first where the global generator stood
elsewhere). Their state is in C, where the walk of the user's Python containers saw
nothing: it is recorded by value now (``capturing/c_object_state.py``), numpy's global
generator as a root of the walk, and a change is refused like any other store into the
user's state. A count's or a generator's position cannot be set back: the capture then
says so, and the refusal is the error's context."""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch

import precompile
from tests.fixtures import iterator_positions as it
from tests.fixtures import numpy_generators as npg
from tests.harness import capture_pair, run_json

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}
FIXTURES: dict[str, ModuleType] = {"numpy_generators": npg, "iterator_positions": it}
#: (fixture, model) cells that change state in C, and the ones that hold such state idle.
CHANGING = [("numpy_generators", n) for n in npg.DRAWING] + [
    ("iterator_positions", n) for n in it.ADVANCING
]
IDLE = [("numpy_generators", "HeldUnused"), ("iterator_positions", "HeldIdle")]


@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize(("fixture", "name"), CHANGING)
def test_make_fx_refuses_state_advanced_in_c(
    tmp_path: Path, fixture: str, name: str, backend: str
) -> None:
    f = FIXTURES[fixture]
    model = f.build(name)
    before = f.state_of(model)
    with pytest.raises(precompile.PrecompileError) as refused:
        capture_pair(f.step, model, torch.ones(3), directory=tmp_path, backend=backend)
    words = str(refused.value)
    if name in f.UNSETTABLE:
        # Advanced for good: the capture says so, with the refusal as its context.
        assert "could not put back what its trace stored into a " in words, words
        assert "cannot be set back" in words
        assert "fn changed state in Python while it was traced" in str(refused.value.__context__)
        return
    assert "fn changed state in Python while it was traced" in words
    kinds = ("RandomState", "Generator", "PCG64", "list_iterator", "list_reverseiterator")
    assert any(kind in words for kind in kinds), words
    # The trace's draw is put back (a make_fx capture makes no real call).
    assert f.state_of(model) == before


_SERVE = """
import importlib, json, warnings
warnings.simplefilter("ignore")
import torch, precompile
from tests.fixtures import numpy_generators as npg
out = {{}}
for key, (fixture, name, artifact, cache) in {pairs!r}.items():
    f = importlib.import_module("tests.fixtures." + fixture)
    served, eager = f.build(name), f.build(name)
    calls = []
    run = precompile.load(artifact, cache)
    for _ in range(3):
        # Both sides start each call from the same global generator state.
        state = npg.np.random.get_state()
        want = f.step(eager, torch.ones(3))
        after_eager = f.state_of(eager)
        npg.np.random.set_state(state)
        try:
            got = run(served, torch.ones(3))
        except precompile.PrecompileError:
            # The end of this model's play: a Dynamo artifact may refuse after part of
            # the call ran (the draw before a graph break), so no eager call can stand
            # in for it (docs/serving.md).
            calls.append("refused")
            break
        calls.append(bool(torch.equal(got, want)) and f.state_of(served) == after_eager)
    getattr(run, "unload", lambda: None)()  # an installed Dynamo artifact holds `step`
    out[key] = calls
print(json.dumps(out))
"""


@pytest.mark.parametrize("tracer", ["make_fx", "dynamo"])
def test_state_advanced_in_c_is_refused_or_served_as_eager_and_idle_state_served(
    tmp_path: Path, tracer: str
) -> None:
    pairs: dict[str, tuple[str, str, str, str]] = {}
    refused: list[str] = []
    for k, (fixture, name) in enumerate(CHANGING + IDLE):
        f = FIXTURES[fixture]
        try:
            artifact, cache = capture_pair(
                f.step,
                f.build(name),
                torch.ones(3),
                directory=tmp_path,
                name=f"m{k}",
                tracer=TRACERS[tracer](),
            )
        except precompile.PrecompileError:
            refused.append(name)
            continue
        pairs[name] = (fixture, name, artifact, cache)
    assert {"HeldUnused", "HeldIdle"} <= set(pairs), refused
    outcomes = run_json(textwrap.dedent(_SERVE.format(pairs=pairs)))
    for name in ("HeldUnused", "HeldIdle"):
        assert outcomes[name] == [True, True, True], (name, outcomes[name])
    for name, calls in outcomes.items():
        # Every call served as eager (its answer and the state it leaves), or refused.
        assert all(c is True or c == "refused" for c in calls), (name, calls)
    if tracer == "make_fx":
        assert sorted(refused) == sorted(name for _, name in CHANGING)
