"""A capture leaves the user's Python state as the real run it made, never holding a
trace-time object (docs/trust.md, "What a capture leaves in your state").

fn stores what it computes into state the user owns (``tests/fixtures/user_state_stores``):
a module-global list, a global dict, a module attribute (of the model, of a submodule
four levels down), a global hook's closure list,
the model's own hook's closure list, a global container nested deep, a closure cell,
a global deque, a global object with ``__slots__``, a global mapping that refuses
deletes, a submodule's registered buffer rebound, a global ChainMap.
Each store is prefilled with a real tensor, as an earlier call would have left it. After
the capture -- captured or refused -- every stored object is a plain real tensor, and:

- make_fx: the state is exactly the one before the capture (a make_fx trace runs fn on
  fake tensors, and an artifact runs no Python: its real run stores nothing). Before,
  every store left a FakeTensor behind, whether the capture was refused or not;
- Dynamo: the state is what one eager call leaves (Dynamo replays the store with the
  real values). Before, fn's extra eager run (the compile-only branch check) stored a
  second time where eager stores once.

A make_fx capture of an input that requires grad traces fn again for its backward:
that trace's stores are put back too. Captured artifacts serve eager's output in a
fresh process.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import is_fake

import precompile
from tests.fixtures import user_state_stores as u
from tests.harness import capture_pair, run_json

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}
#: What is refused at capture, with words of its message (the rest is captured).
#: make_fx refuses every store: an artifact runs no Python, so no served call repeats
#: it. The ones the snapshot of module globals and attributes does not name are named
#: by the walk of the user's state (``UserState.changed``), from where it reached them;
#: before, they were captured and silently not repeated.
STATE = "module tests.fixtures.user_state_stores: "
REFUSED = {
    ("make_fx", "list"): "global SEEN of module tests.fixtures.user_state_stores",
    ("make_fx", "dict"): "global TABLE of module tests.fixtures.user_state_stores",
    ("make_fx", "attribute"): "fn's arguments: [0].last",
    ("make_fx", "nested"): "fn's arguments: [0].0.0.0.0.last",
    ("make_fx", "global_hook"): "the global module hook `tests.fixtures.user_state_stores.",
    ("make_fx", "module_hook"): "(closure cell seen) (a list)",
    ("make_fx", "deep"): STATE + "NESTED['a']['b']['c']['d'] (a list)",
    ("make_fx", "closure"): STATE + "REMEMBER (closure cell last) (a cell)",
    ("make_fx", "deque"): STATE + "RECENT (a deque)",
    ("make_fx", "slots"): STATE + "SLOTTED.last (a slot)",
    ("make_fx", "mapping"): "global RESULTS of module tests.fixtures.user_state_stores",
    # The swap of the trace's tensors into the module put the captured buffer back over
    # the store, so nothing after the trace saw it: served calls kept the first mean.
    ("make_fx", "buffer"): "buffer '0.mean' rebound",
    # A ChainMap is a library's object: the walk stopped at it, and the store into the
    # dict it holds was captured and not repeated. A standard-library data class is
    # the user's own now.
    ("make_fx", "chainmap"): STATE + "CHAIN.maps[0]['out']",
    ("dynamo", "global_hook"): "the global module hook `tests.fixtures.user_state_stores.",
}
CELLS = [(tracer, kind) for tracer in sorted(TRACERS) for kind in u.KINDS]


def _real(value: Any) -> bool:
    return type(value) is torch.Tensor and not is_fake(value)


def _capture(tmp_path: Path, tracer: str, kind: str, grad_input: bool) -> dict[str, Any]:
    """Capture ``kind``'s fn from a prefilled state: what the state held before and
    after, the refusal's message (or None) and the pair."""
    u.reset()
    model, x, hook, handle = u.setup(kind, seed=0)
    u.prefill(kind, model, hook, torch.full((3, 4), 7.0))
    before = u.stored(kind, model, hook)
    grad = torch.enable_grad() if grad_input else torch.no_grad()
    refused, pair = None, None
    try:
        with grad:
            pair = capture_pair(
                u.FUNCTIONS[kind],
                model,
                x.requires_grad_(grad_input),
                directory=tmp_path,
                name=f"{tracer}-{kind}-{grad_input}",
                tracer=TRACERS[tracer](),
            )
    except precompile.PrecompileError as error:
        refused = str(error)
    finally:
        if handle is not None:
            handle.remove()
    return {
        "before": before,
        "after": u.stored(kind, model, hook),
        "refused": refused,
        "pair": pair,
    }


def _eager_state(kind: str) -> list[Any]:
    """What one eager call leaves in ``kind``'s state, from the same prefilled start."""
    u.reset()
    model, x, hook, handle = u.setup(kind, seed=0)
    u.prefill(kind, model, hook, torch.full((3, 4), 7.0))
    try:
        with torch.no_grad():
            u.FUNCTIONS[kind](model, x)
    finally:
        if handle is not None:
            handle.remove()
    return u.stored(kind, model, hook)


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    directory = tmp_path_factory.mktemp("user_state")
    try:
        return {(t, k): _capture(directory, t, k, grad_input=False) for t, k in CELLS}
    finally:
        u.reset()


@pytest.mark.parametrize(("tracer", "kind"), CELLS)
def test_a_capture_leaves_real_tensors_and_the_state_of_its_real_run(
    captured: dict[tuple[str, str], dict[str, Any]], tracer: str, kind: str
) -> None:
    cell = captured[tracer, kind]
    words = REFUSED.get((tracer, kind))
    if words is None:
        assert cell["refused"] is None, cell["refused"]
    else:
        assert cell["refused"] is not None and words in cell["refused"], cell["refused"]
    after = cell["after"]
    assert all(_real(t) for t in after), [type(t).__name__ for t in after]
    if tracer == "make_fx":
        # The state before the capture, the very objects.
        assert len(after) == len(cell["before"]) == 1, after
        assert all(a is b for a, b in zip(after, cell["before"]))
    else:
        expected = _eager_state(kind)
        u.reset()
        assert len(after) == len(expected), (len(after), len(expected))
        assert all(torch.equal(a, e) for a, e in zip(after, expected))


@pytest.mark.parametrize("kind", ["module_hook", "deep", "closure"])
def test_make_fx_backward_trace_of_an_input_that_requires_grad_leaves_the_state(
    tmp_path: Path, kind: str
) -> None:
    """An input that requires grad: the backward is traced from fn again (AOTAutograd),
    whose stores are put back as the first trace's are; the store is refused, as
    without grad."""
    try:
        cell = _capture(tmp_path, "make_fx", kind, grad_input=True)
    finally:
        u.reset()
    assert cell["refused"] is not None and REFUSED["make_fx", kind] in cell["refused"]
    after = cell["after"]
    assert all(_real(t) for t in after), [type(t).__name__ for t in after]
    assert len(after) == 1 and after[0] is cell["before"][0]


CHILD = """
import json, warnings, torch, precompile
warnings.simplefilter("ignore")
from tests.fixtures import user_state_stores as u
out = {{}}
def start(kind):
    u.reset()
    model, x, hook, _ = u.setup(kind, seed=0)
    u.prefill(kind, model, hook, torch.full((3, 4), 7.0))
    return model, x, hook
for key, kind, artifact, cache in {entries!r}:
    # The state as the capture found it, then the load (a Dynamo artifact reads the
    # globals' key order at load).
    model, x, hook = start(kind)
    run = precompile.load(artifact, cache)
    with torch.no_grad():
        served = run(model, x)
        left = u.stored(kind, model, hook)
        model, x, hook = start(kind)
        want = u.FUNCTIONS[kind](model, x)
        eager = u.stored(kind, model, hook)
    same = len(left) == len(eager) and all(map(torch.equal, left, eager))
    out[key] = [bool(torch.equal(served, want)), same]
print(json.dumps(out))
"""


def test_captured_artifacts_serve_eager_in_a_fresh_process(
    captured: dict[tuple[str, str], dict[str, Any]],
) -> None:
    entries = [
        (f"{tracer}/{kind}", kind, *cell["pair"])
        for (tracer, kind), cell in captured.items()
        if cell["pair"] is not None
    ]
    assert len(entries) == len(CELLS) - len(REFUSED)
    result = run_json(textwrap.dedent(CHILD.format(entries=entries)))
    assert result == {key: [True, True] for key, *_ in entries}, json.dumps(result)


@pytest.mark.parametrize("kind", ["list", "module_hook", "closure"])
def test_a_dynamo_capture_of_several_calls_leaves_what_as_many_eager_calls_leave(
    tmp_path: Path, kind: str
) -> None:
    """Two captured calls at two shapes (a recompile): the state holds what two eager
    calls leave, each store once."""

    def run(call: Any) -> list[Any]:
        u.reset()
        model, x, hook, handle = u.setup(kind, seed=0)
        u.prefill(kind, model, hook, torch.full((3, 4), 7.0))
        try:
            with torch.no_grad():
                call(model, x)
                call(model, torch.cat([x, x + 1]))
        finally:
            if handle is not None:
                handle.remove()
        return u.stored(kind, model, hook)

    try:
        with precompile.capture(
            u.FUNCTIONS[kind],
            artifact_path=str(tmp_path / "a.py"),
            cache_path=str(tmp_path / "a.cache"),
            tracer=precompile.DynamoTracer(),
            backend="eager",
        ) as cap:
            after = run(cap)
        expected = run(u.FUNCTIONS[kind])
    finally:
        u.reset()
    assert all(_real(t) for t in after), [type(t).__name__ for t in after]
    assert [t.shape for t in after] == [t.shape for t in expected]
    assert all(torch.equal(a, e) for a, e in zip(after, expected))


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_a_module_imported_during_the_capture_stays_bound_in_its_package(
    tmp_path: Path, tracer: str
) -> None:
    """fn imports a submodule of a project package for the first time: the import binds
    it in the package's globals, which the capture records. That binding is the import
    system's, not a store of the trace: it stays (``import pkg.sub; pkg.sub.f()`` keeps
    working after the capture)."""
    import sys

    from tests.fixtures import user_state_lazy

    sys.modules.pop("tests.fixtures.user_state_lazy.sub", None)
    vars(user_state_lazy).pop("sub", None)
    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 4), torch.randn(3, 4)
    with torch.no_grad():
        capture_pair(user_state_lazy.lazy, model, x, directory=tmp_path, tracer=TRACERS[tracer]())
    assert "tests.fixtures.user_state_lazy.sub" in sys.modules
    assert user_state_lazy.sub is sys.modules["tests.fixtures.user_state_lazy.sub"]


@pytest.mark.parametrize(
    ("fn", "stats"), [("lazy_store", "stats"), ("lazy_store_by_name", "stats_by_name")]
)
def test_make_fx_refuses_a_store_into_a_module_the_trace_imported_first(
    tmp_path: Path, fn: str, stats: str
) -> None:
    """fn imports a project module for the first time (an import statement, or
    ``importlib.import_module``) and appends to its global list. The walk had not seen
    the module (it did not exist when the walk ran): make_fx captured the store, served
    calls did not repeat it (eager multiplies by 1, 2, 3; the artifact by 1 every call),
    and the capture left the trace's append behind. The module is walked as its import
    ends: the store is refused, and put back."""
    import sys

    from tests.fixtures import user_state_lazy

    name = f"tests.fixtures.user_state_lazy.{stats}"
    sys.modules.pop(name, None)
    vars(user_state_lazy).pop(stats, None)
    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 4), torch.randn(3, 4)
    with torch.no_grad(), pytest.raises(precompile.PrecompileError) as refused:
        capture_pair(getattr(user_state_lazy, fn), model, x, directory=tmp_path)
    assert f"module {name}: CALLS" in str(refused.value)
    assert sys.modules[name].CALLS == []
    # The module keeps its own loader.
    assert type(sys.modules[name].__loader__).__name__ == "SourceFileLoader"


def test_make_fx_refuses_a_store_into_a_namespace_packages_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module of a namespace package (a folder without ``__init__.py``) is the
    project's: its package has no file, which counted as not the user's, and a store
    into it was put back but captured (served wrong from the second call)."""
    import importlib
    import sys

    root = tmp_path / "ns"
    (root / "nspkg_state").mkdir(parents=True)
    (root / "nspkg_state" / "leaf.py").write_text("CALLS = []\n")
    (root / "ns_model.py").write_text(
        "def fn(model, x):\n"
        "    import nspkg_state.leaf\n"
        "    nspkg_state.leaf.CALLS.append(1)\n"
        "    return model(x) * len(nspkg_state.leaf.CALLS)\n"
    )
    monkeypatch.syspath_prepend(str(root))
    try:
        fn = importlib.import_module("ns_model").fn
        importlib.import_module("nspkg_state.leaf")
        model, x = torch.nn.Linear(4, 4), torch.randn(3, 4)
        with torch.no_grad(), pytest.raises(precompile.PrecompileError) as refused:
            capture_pair(fn, model, x, directory=tmp_path)
        assert "module nspkg_state.leaf: CALLS" in str(refused.value)
        assert sys.modules["nspkg_state.leaf"].CALLS == []
    finally:
        for name in ("ns_model", "nspkg_state.leaf", "nspkg_state"):
            sys.modules.pop(name, None)


class _Stored:
    __slots__ = ("_value",)


class _Computed(_Stored):
    """mpmath's shape: a property over a base class's slot, with no setter (a capture
    through the wheel walked mpmath, and the put-back raised "property '_value' of
    '_Computed' object has no setter", failing the capture)."""

    __slots__ = ()

    @property
    def _value(self) -> Any:
        return _Stored._value.__get__(self, _Stored)  # type: ignore[attr-defined]


def test_a_slot_behind_a_property_without_a_setter_is_put_back() -> None:
    from precompile.capturing.user_state import UserState

    held = _Computed()
    _Stored._value.__set__(held, "before")  # type: ignore[attr-defined]
    state = UserState([[held]])
    _Stored._value.__set__(held, "stored by the trace")  # type: ignore[attr-defined]
    state.restore()
    assert held._value == "before"


def test_the_walk_does_not_go_through_the_test_runners_import_hook() -> None:
    """Under pytest every project module's ``__loader__`` is pytest's assertion-rewriting
    hook, which holds the session: every collected test, its fixtures' requests and
    values. The walk went through it at every capture (58,000 objects of 85,000 a walk,
    late in the full suite: a third of the suite's time). The import system's objects
    in a module's globals are not walked into; the user's globals still are."""
    from precompile.capturing.user_state import UserState, capture_roots

    module = sys.modules[__name__]
    assert type(module.__loader__).__name__ == "AssertionRewritingHook"
    state = UserState(capture_roots(u.append_global, (torch.nn.Linear(2, 2),)))
    walked = {id(value) for _, value, _ in state.trail}
    assert id(module.__loader__) not in walked and id(module.__spec__) not in walked
    session = ("Session", "Config", "Function")  # a fixture or a mark is a module's own
    assert not [
        v
        for _, v, _ in state.trail
        if type(v).__module__.startswith("_pytest") and type(v).__name__ in session
    ]
    assert id(u.SEEN) in walked  # a project module's own global


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_a_class_whose_metaclass_forbids_writes_is_put_back(tmp_path: Path, tracer: str) -> None:
    """fn stores into a registry class around its metaclass's ``__setattr__`` (which
    forbids writes). The put-back used ``setattr``, which the metaclass refused, and the
    refusal was skipped: after a make_fx capture the class held a FakeTensor. Now type's
    own methods put it back: make_fx leaves the value from before the capture (and
    refuses the store, which no served call would repeat), Dynamo what one eager call
    stores."""
    from tests.fixtures import user_state_frozen_class as f

    before = torch.zeros(1)
    type.__setattr__(f.Registry, "last", before)
    x = torch.ones(2)
    with torch.no_grad():
        if tracer == "make_fx":
            with pytest.raises(precompile.PrecompileError, match="Registry .the class"):
                capture_pair(f.serve, f.Stores(), x, directory=tmp_path, tracer=TRACERS[tracer]())
        else:
            capture_pair(f.serve, f.Stores(), x, directory=tmp_path, tracer=TRACERS[tracer]())
    after = vars(f.Registry)["last"]
    assert _real(after), type(after)
    if tracer == "make_fx":
        assert after is before
    else:
        assert torch.equal(after, x * 2)


def test_a_dict_subclass_whose_methods_run_code_is_read_through_dict(tmp_path: Path) -> None:
    """The walk read a dict subclass through its own ``items`` (and a list's, deque's
    and set's through theirs): transformers' ``MODEL_MAPPING`` in a project module's
    globals imports every model on ``items()``, and raised out of every make_fx capture
    (a ValueError, not a refusal). The builtin bases' methods run no user code: the
    capture serves, and the mapping is neither read through its methods nor changed."""
    from tests.fixtures import user_state_library_shapes as lazy

    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 4), torch.randn(3, 4)
    with torch.no_grad():
        artifact, cache = capture_pair(lazy.serve, model, x, directory=tmp_path)
        served = precompile.load(artifact, cache)(model, x)
        assert torch.equal(served, lazy.serve(model, x))
    assert list(dict.items(lazy.MAPPING)) == [("gpt2", "GPT2Model")]


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_an_lru_cache_the_trace_filled_holds_no_trace_time_value(
    tmp_path: Path, tracer: str
) -> None:
    """fn calls an ``lru_cache``d helper that builds a tensor. A make_fx trace calls it
    with fake tensors around: the cache kept a FakeTensor, which every later eager call
    of the helper returned (an eager forward after the capture answered with a
    FakeTensor). The capture empties a cache that stored a result meanwhile; the
    artifact serves eager's answer in a fresh process."""
    from tests.fixtures import user_state_library_shapes as shapes

    shapes.causal_mask.cache_clear()
    torch.manual_seed(0)
    model, x = torch.nn.Linear(6, 6), torch.randn(6, 6)
    with torch.no_grad():
        artifact, cache = capture_pair(
            shapes.masked, model, x, directory=tmp_path, tracer=TRACERS[tracer]()
        )
        after = shapes.masked(model, x)
    assert _real(shapes.causal_mask(6)), type(shapes.causal_mask(6))
    assert _real(after), type(after)
    result = run_json(
        textwrap.dedent(
            f"""
            import json, torch, precompile
            from tests.fixtures import user_state_library_shapes as shapes
            torch.manual_seed(0)
            model, x = torch.nn.Linear(6, 6), torch.randn(6, 6)
            with torch.no_grad():
                served = precompile.load({artifact!r}, {cache!r})(model, x)
                print(json.dumps(torch.equal(served, shapes.masked(model, x))))
            """
        )
    )
    assert result is True


def test_a_library_base_classs_bookkeeping_and_an_equal_value_stored_are_served(
    tmp_path: Path,
) -> None:
    """Two needless make_fx refusals. A project's ``class MyLSTM(nn.LSTM)``: the
    library's private ``_flat_weights`` list, rebuilt when the capture swaps tensors in
    and back, counted as the user's store because the class is the project's (the
    private names a library base uses are the library's now). ``self.rows = 300`` over
    an equal ``300`` (a new int object) counted as a change (an equal int, str, bytes or
    bool is no change now). Both serve eager's answer in a fresh process."""
    from tests.fixtures import user_state_library_shapes as shapes

    torch.manual_seed(0)
    model, x = shapes.Rows(), torch.randn(300, 2, 4)
    with torch.no_grad():
        artifact, cache = capture_pair(shapes.run_rows, model, x, directory=tmp_path)
    result = run_json(
        textwrap.dedent(
            f"""
            import json, torch, precompile
            from tests.fixtures import user_state_library_shapes as shapes
            torch.manual_seed(0)
            model, x = shapes.Rows(), torch.randn(300, 2, 4)
            with torch.no_grad():
                served = precompile.load({artifact!r}, {cache!r})(model, x)
                print(json.dumps(torch.equal(served, shapes.run_rows(model, x))))
            """
        )
    )
    assert result is True


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ("AddsSubmodule", "fn's arguments: [0]._modules['s0']"),
        ("GrowsModuleList", "fn's arguments: [0].hist._modules['0']"),
        ("MarksNonPersistent", "fn's arguments: [0]._non_persistent_buffers_set"),
        ("LogsOnATensor", "module tests.fixtures.module_registrations: LOGGED.log"),
        ("DrawsFromRandom", "fn's arguments: [0].rng (a Random)"),
        ("DrawsFromCountingRandom", "fn's arguments: [0].rng (a CountingRandom)"),
        ("CountsInArray", "fn's arguments: [0].counts (a array)"),
        ("CountsInNumpy", "fn's arguments: [0].counts (a ndarray)"),
    ],
)
def test_make_fx_refuses_a_store_into_a_modules_registrations_or_a_tensors_attributes(
    tmp_path: Path, model: str, words: str
) -> None:
    """What ``nn.Module`` keeps on every module (``_modules``, ``_parameters``,
    ``_buffers``, ``_non_persistent_buffers_set``) is the user's registrations, even
    under a private name on a library's container (``nn.ModuleList``); a tensor's Python
    attributes are the user's too, and so is an object's C state Python can read (a
    ``random.Random``'s, an ``array.array``'s, a numpy array's: ``c_object_state``).
    Each store was captured and served wrong from the second call (the tensor's list
    also kept the trace's FakeTensor): now refused, and the state is put back."""
    from tests.fixtures import module_registrations as r

    r.LOGGED.log.clear()  # type: ignore[attr-defined]
    instance = getattr(r, model)()
    before = {k: (v, dict(v) if isinstance(v, dict) else None) for k, v in vars(instance).items()}
    saved = {k: _state_words(v) for k, v in vars(instance).items()}
    with torch.no_grad(), pytest.raises(precompile.PrecompileError) as refused:
        capture_pair(r.call, instance, torch.randn(4, 3), directory=tmp_path)
    assert words in str(refused.value), str(refused.value)
    assert r.LOGGED.log == []  # type: ignore[attr-defined]
    for key, (value, contents) in before.items():
        assert vars(instance)[key] is value
        assert contents is None or dict(vars(instance)[key]) == contents
        assert _state_words(vars(instance)[key]) == saved[key]
    if model == "DrawsFromCountingRandom":  # its Python attribute too, not only its C state
        assert instance.rng.k == 0


def _state_words(value: Any) -> str:
    """What ``value`` holds, in words to compare (a Random by its generator state)."""
    return repr(value.getstate() if hasattr(value, "getstate") else value)


def test_an_equal_float_stored_is_served(tmp_path: Path) -> None:
    """``self.scale = float(x.shape[1])`` storing 3.0 over an equal 3.0 was refused as a
    change (a new float object)."""
    from tests.fixtures import module_registrations as r

    x = torch.randn(4, 3)
    with torch.no_grad():
        artifact, cache = capture_pair(r.call, r.StoresItsWidth(), x, directory=tmp_path)
        served = precompile.load(artifact, cache)(r.StoresItsWidth(), x)
    assert torch.equal(served, x * 3.0)


def test_a_put_back_that_still_fails_is_a_refusal_naming_it(monkeypatch: Any) -> None:
    """Where an object's own rules refuse even the base types' methods, the capture does
    not go on silently with what the trace stored there: the refusal names the object,
    after every other object was put back."""
    from precompile.capturing import user_state

    seen, other = [torch.zeros(1)], [torch.ones(1)]
    state = user_state.UserState([[seen, other]])
    seen[0], other[0] = torch.full((1,), 5.0), torch.full((1,), 6.0)
    real_put_back = user_state._put_back

    def put_back(obj: Any, saved: Any, *rest: Any) -> None:
        if obj is seen:
            raise RuntimeError("this list refuses")
        real_put_back(obj, saved, *rest)

    monkeypatch.setattr(user_state, "_put_back", put_back)
    with pytest.raises(precompile.PrecompileError, match="a list .RuntimeError: this list refuses"):
        state.restore()
    assert other[0].item() == 1.0


class _CompiledCode:
    """Stands in for a code object Dynamo compiled, which keys its cleanup hooks: one
    that only the garbage collector frees (a cycle), as compiled code left by an
    earlier ``torch.compile`` often is."""

    def __init__(self) -> None:
        self.cycle = self


def _dynamo_binds(name: str, value: Any) -> _CompiledCode:
    """Bind ``name`` to ``value`` in the fixture module's globals as Dynamo binds a global
    its compiled code loads (``OutputGraph.install_global_by_id``: ``_<id>_c<n>``),
    with Dynamo's own cleanup hook, which deletes it when the returned code dies."""
    from torch._dynamo.utils import CleanupHook, CleanupManager

    code = _CompiledCode()
    CleanupManager.instance[code] = [CleanupHook.create(vars(u), name, value)]
    return code


def test_a_global_dynamo_deletes_when_the_collector_frees_its_code_is_no_store_of_fn(
    tmp_path: Path,
) -> None:
    """A full run of the suite refused a make_fx capture for "changing" ``module
    tests.fixtures.training_flag_models: _140678844627952_c150``: a global Dynamo had
    bound there when an earlier test compiled that module's code, deleted by Dynamo's
    cleanup hook when the collector freed the compiled code in the middle of the trace.
    A library's own binding is no store of fn's: not held against the trace, and not
    put back after its owner deleted it."""
    import gc

    name = f"_{id(torch)}_c900001"
    gc.disable()  # the compiled code dies at the collection inside fn, not before
    try:
        code = _dynamo_binds(name, torch)  # what ``type(x)`` of a tensor binds
        del code
        assert name in vars(u)
        capture_pair(u.collecting, torch.nn.Linear(2, 2), torch.ones(2), directory=tmp_path)
    finally:
        gc.enable()
    assert name not in vars(u)


def test_a_global_dynamo_binds_during_a_trace_is_left_bound_and_its_own() -> None:
    """Dynamo may bind a global while fn is traced (fn calls code it compiles): the walk
    neither holds it against the trace nor takes it out -- taken out, the compiled code
    could not load it, and Dynamo's cleanup would fail to delete it."""
    import gc
    import weakref

    from precompile.capturing.user_state import UserState, capture_roots

    bound = weakref.ref(torch.nn.Linear)  # what ``store_global_weakref_by_id`` binds
    name = f"_{id(bound)}_c900002"
    state = UserState(capture_roots(u.plain, (torch.nn.Linear(2, 2), torch.ones(2))))
    code = _dynamo_binds(name, bound)
    assert state.changed() == []
    state.restore()
    assert vars(u)[name] is bound
    errors: list[Any] = []
    hook = sys.unraisablehook
    sys.unraisablehook = errors.append
    try:
        del code
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert name not in vars(u) and errors == []


def test_no_collection_starts_while_a_make_fx_capture_watches_the_users_state(
    tmp_path: Path,
) -> None:
    """A collection that lands between the walk of the user's state and its comparison
    runs finalizers and weakref callbacks (Dynamo's cleanup hook, a ``__del__``), whose
    changes the capture would hold against fn; and the walk's allocation bursts made
    such collections frequent, each traversing the whole heap (two thirds of the walk's
    time in the full suite). The make_fx trace runs with the collector paused
    (``precompile.capturing.collector``): with thresholds that would collect every ten
    allocations, collections run during the capture, but none inside the trace."""
    import gc

    inside: list[int] = []
    started: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase != "start":
            return
        started.append(info["generation"])
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_name == "trace_single_graph":
                inside.append(info["generation"])
                return
            frame = frame.f_back  # type: ignore[assignment]

    thresholds = gc.get_threshold()
    gc.set_threshold(10, 1, 1)
    gc.callbacks.append(note)
    try:
        capture_pair(u.plain, torch.nn.Linear(2, 2), torch.ones(2), directory=tmp_path)
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*thresholds)
    assert started and inside == [], (len(started), inside)
    assert gc.isenabled()


@pytest.mark.parametrize("enabled", [True, False])
def test_a_capture_leaves_the_collector_as_it_found_it(tmp_path: Path, enabled: bool) -> None:
    """A capture that pauses the collector enables it again only where the user had it
    enabled: one who disabled it (a latency-critical server) keeps it disabled, also
    after a capture refused for a store its trace made."""
    import gc

    x = torch.ones(2)
    if not enabled:
        gc.disable()
    try:
        capture_pair(u.plain, torch.nn.Linear(2, 2), x, directory=tmp_path)
        assert gc.isenabled() is enabled
        with pytest.raises(precompile.PrecompileError):
            capture_pair(u.append_global, torch.nn.Linear(2, 2), x, directory=tmp_path, name="b")
        assert gc.isenabled() is enabled
    finally:
        gc.enable()


def test_a_store_over_a_global_dynamo_bound_is_held_and_put_back() -> None:
    """Only a library's own binding and deletion are its own: fn storing over a global
    Dynamo bound (its compiled code would then load fn's value) is a store like any
    other, named and put back -- left in place, the compiled function failed on its next
    call (an independent attack found it)."""
    import weakref

    from precompile.capturing.user_state import UserState, capture_roots

    bound = weakref.ref(torch.nn.Linear)
    name = f"_{id(bound)}_c900003"
    code = _dynamo_binds(name, bound)
    try:
        state = UserState(capture_roots(u.plain, (torch.nn.Linear(2, 2), torch.ones(2))))
        vars(u)[name] = None  # what a trace storing over it leaves
        assert state.changed() == [f"module tests.fixtures.user_state_stores: {name}"]
        state.restore()
        assert vars(u)[name] is bound
    finally:
        del code
