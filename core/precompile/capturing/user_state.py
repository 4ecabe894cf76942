"""The user's Python state, taken before the capture runs fn in a way eager would not,
and put back after: a capture never leaves a trace-time object in it.

A make_fx trace runs fn's Python on fake tensors: a store it makes (``SEEN.append(y)``,
``TABLE[k] = y``, ``self.last = y``, a hook's ``seen.append(out)``) would leave the
user's object holding a FakeTensor after ``capture`` returned, whether the capture then
served or refused it. An artifact runs no Python, so no served call repeats such a
store: the state that matches what the capture produced is the state before the trace.
Dynamo's extra eager run of fn (``dynamo_refusals.compile_only_branch_check``) stores
for real a second time, where eager stores once: put back likewise.

``UserState`` records, by identity, the shallow contents of every mutable container
reachable from the roots (fn and its globals, its arguments, the globals of the
project's modules, the global module hooks): lists, deques, dicts (instance ``__dict__``
included, so attributes of modules and plain objects), sets, bytearrays, ``__slots__``
values, closure cells, and the attributes of the project's classes. ``restore`` puts
back, in place, each one whose contents changed (the user's objects keep their
identity), through the base types' own methods (a dict subclass may refuse deletes);
what the walk does not reach is not restored. An ``lru_cache`` the walk reaches that
stored a result meanwhile and now holds a trace's tensor is emptied: its entries cannot
be taken out one by one, and a make_fx trace's fake tensor would be what the next eager
call returned.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import operator
import os
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from precompile._compat import tracing
from precompile._compat.dynamo import self_deleting_globals
from precompile._compat.prelude import global_module_hooks
from precompile.capturing import c_object_state, collector, import_watch
from precompile.capturing.fx_tensor_attributes import python_attributes
from precompile.errors import PrecompileError
from precompile.locations import is_project_file, is_project_module

#: How deep the walk goes from a root, how many objects it records in all, and how
#: many items of one container it walks into (the container itself is recorded whole).
_DEPTH = 12
_BUDGET = 200_000
_WIDTH = 10_000
#: An empty closure cell.
_EMPTY = object()
#: Values that hold no user state the trace could store into.
_LEAVES = (types.ModuleType, str, bytes, int, float, complex, bool, type(None))
#: What ``nn.Module.__init__`` keeps on every module: the user's registrations
#: (parameters, buffers, submodules, which buffers are persistent, hooks), whichever
#: class the module is -- private names, but not a library's bookkeeping.
_MODULE_STATE = frozenset(vars(torch.nn.Module()))


def capture_roots(fn: Any, args: Any) -> list[Any]:
    """Where the user's state a capture can reach starts: fn, its arguments (the
    modules, with their hooks), fn's globals (a notebook's ``__main__`` has no file),
    the globals of the project's modules, the global module hooks and the global random
    generators outside torch (``c_object_state.global_generators``) -- each a ``Root``,
    named for a refusal."""
    # Tuples: walked into, not recorded (they are the walk's own).
    roots: list[Any] = [Root("fn", fn), Root("fn's arguments", tuple(args))]
    scope = getattr(getattr(fn, "__func__", fn), "__globals__", None)
    if isinstance(scope, dict):
        roots.append(Root(f"module {scope.get('__name__', '?')}", scope))
    roots += [_module_root(m) for m in list(sys.modules.values()) if is_project_module(m)]
    roots += [
        Root("the global module hooks", tuple(hooks.values())) for hooks in global_module_hooks()
    ]
    roots += [Root(name, generator) for name, generator in c_object_state.global_generators()]
    return roots


def _module_root(module: types.ModuleType) -> Root:
    """A project module's globals as a root of the walk."""
    return Root(f"module {module.__name__}", vars(module), _user_named(module.__name__))


class Root(tuple[str, Any, bool]):
    """A root of the walk with the words that name it (``module m``, ``fn's arguments``):
    what a refusal says a changed object was reached from; and whether it is the user's
    own (not the globals of a module in an installed library's namespace, such as the
    kernel modules Inductor writes to its cache folder, outside site-packages)."""

    def __new__(cls, name: str, value: Any, owned: bool = True) -> Root:
        return super().__new__(cls, (name, value, owned))


class UserState:
    """The shallow contents of every mutable container reachable from ``roots``, by
    identity, to put back with ``restore``."""

    def __init__(self, roots: list[Any]) -> None:
        self.records: list[tuple[Any, Any]] = []
        #: Per record, the index in ``trail`` of the object it was reached as.
        self.reached: list[int] = []
        #: Per object walked: (the index of the one it was reached from, or -1 for a
        #: root; the object; the key it was reached by, or a root's name): the path a
        #: refusal names, built only then.
        self.trail: list[tuple[int, Any, Any]] = []
        #: Per object walked: whether it is the user's own state (``_owned``), every
        #: object on its way from a root included.
        self.owned: list[bool] = []
        self._seen: set[int] = set()
        self._owned_roots: dict[int, bool] = {}
        #: The library's own bindings in module globals (``_library_bindings``).
        self._bound_by_library = self_deleting_globals()
        self._walk(roots)

    def _walk(self, roots: list[Any]) -> None:
        """Record what is reachable from ``roots`` that no earlier walk recorded."""
        level: list[tuple[Any, int, Any]] = []
        for root in roots:
            name, value, owned = root if isinstance(root, Root) else ("fn's state", root, True)
            self._owned_roots[id(value)] = owned
            level.append((value, -1, name))
        seen = self._seen
        for _ in range(_DEPTH):
            following: list[tuple[Any, int, Any]] = []
            for value, parent, key in level:
                if isinstance(value, _LEAVES) or id(value) in seen:
                    continue
                if isinstance(value, torch.Tensor) and not python_attributes(value):
                    continue  # no Python state; not counted against the budget
                if len(seen) >= _BUDGET:
                    return
                seen.add(id(value))
                at = len(self.trail)
                self.trail.append((parent, value, key))
                above = self._owned_roots.get(id(value), True) if parent < 0 else self.owned[parent]
                self.owned.append(
                    above and _owned(value, key, self.trail[parent][2] if parent >= 0 else None)
                )
                recorded = len(self.records)
                # Leaves filtered here, not at the next level: a module's globals or a
                # list of numbers would otherwise queue an entry per item to drop.
                following += [
                    (held, at, k)
                    for k, held in self._record(value)
                    if not isinstance(held, _LEAVES)
                ]
                self.reached += [at] * (len(self.records) - recorded)
            level = following

    @contextlib.contextmanager
    def recording_imports(self) -> Iterator[None]:
        """While the trace runs, walk each project module fn imports for the first time
        (or reloads), as its code has run (``import_watch``): what the trace then
        stores into it (``import stats; stats.CALLS.append(1)`` inside fn, or through
        ``importlib.import_module``) is a change from that state. Unrecorded, such a
        module's globals were neither checked nor put back: make_fx captured the
        store, and served calls did not repeat it."""
        lock = threading.Lock()  # another thread's import during the trace calls back too

        def loaded(module: types.ModuleType) -> None:
            with lock:
                self._walk([_module_root(module)])

        with import_watch.loaded_modules(loaded):
            yield

    def _record(self, value: Any) -> list[tuple[Any, Any]]:
        """Record ``value``'s shallow contents; the objects to walk into, each with the
        key it is held by."""
        if isinstance(value, torch.Tensor):
            # Its data is no Python state; a Python attribute set on it is
            # (``T.log = []``, appended to by fn).
            return [(_attrs_of(value, ""), python_attributes(value))]
        state = c_object_state.value_state(value)
        if state is not None:
            # Its C state by value; its Python attributes (a subclass's) walked on.
            self.records.append((value, state))
        if isinstance(value, (list, collections.deque, dict, set, bytearray)):
            contents = base_contents(value)
            self.records.append((value, contents))
            if isinstance(value, dict):
                if _module_globals(value):
                    # The import system's objects are not walked into: a test runner's
                    # import hook (pytest's, every module's ``__loader__``) holds the
                    # whole session, tens of thousands of objects at every capture.
                    return [kv for kv in contents[:_WIDTH] if kv[0] not in _IMPORT_SYSTEM]
                return contents[:_WIDTH]
            return [] if isinstance(value, (set, bytearray)) else list(enumerate(contents[:_WIDTH]))
        if isinstance(value, tuple):
            return list(enumerate(base_contents(value)[:_WIDTH]))
        if isinstance(value, types.CellType):
            try:
                held = value.cell_contents
            except ValueError:
                held = _EMPTY
            self.records.append((value, held))
            return [] if held is _EMPTY else [(_CONTENTS, held)]
        if _cache_info(value) is not None:
            # An lru_cache: what it holds is C state, not walked; a call that missed
            # stored its result (a make_fx trace's result is a fake tensor).
            self.records.append((value, _CacheFill(_cache_info(value).misses)))
            return [(_attrs_of(value, ""), getattr(value, "__dict__", {}))]
        if isinstance(value, types.FunctionType):
            cells = zip(value.__code__.co_freevars, value.__closure__ or ())
            return [
                *((_Cell(name), cell) for name, cell in cells),
                (_ATTRS, value.__dict__),
                (_Dot(".__defaults__"), value.__defaults__),
                (_Dot(".__kwdefaults__"), value.__kwdefaults__),
            ]
        if isinstance(value, types.MethodType):
            return [(_Dot(".__self__"), value.__self__), (_Dot(".__func__"), value.__func__)]
        if _bound_builtin(value):
            # ``self.log = history.append``, ``self.step = iter(xs).__next__``: what it
            # is bound to is what a call changes.
            return [(_Dot(".__self__"), value.__self__)]
        if isinstance(value, functools.partial):
            return [
                (_Dot(".func"), value.func),
                (_Dot(".args"), value.args),
                (_Dot(".keywords"), value.keywords),
                (_ATTRS, vars(value)),
            ]
        if isinstance(value, type):
            if not _project_class(value):
                return []
            attrs = {k: v for k, v in vars(value).items() if not k.startswith("__")}
            self.records.append((value, attrs))
            return [(_Dot(f".{k}"), v) for k, v in attrs.items()]
        slots = _slot_values(value)
        if slots:
            self.records.append((value, slots))
        slotted = [(_Dot(f".{slot.__name__}"), held) for slot, held in slots.items()]
        try:
            # Not getattr: a class's __getattr__ (a lazy proxy) runs no code here.
            held = object.__getattribute__(value, "__dict__")
        except Exception:
            return slotted
        if isinstance(value, torch.nn.Module):
            # Every submodule at once: a store deep in a model is as near as its root's.
            return [
                (_attrs_of(value, ""), held),
                *((_attrs_of(sub, name), vars(sub)) for name, sub in value.named_modules() if name),
            ]
        return [(_attrs_of(value, ""), held), *slotted] if isinstance(held, dict) else slotted

    def _library_bindings(self) -> dict[int, set[str]]:
        """Per globals dict (by id), the names Dynamo bound there for code it compiled,
        then or since the walk (``self_deleting_globals``): its own bookkeeping, which it
        deletes when the garbage collector frees that code -- during a trace as well
        as anywhere else. Its binding or deletion is no store of fn's, and never the
        walk's to put back or take out (``_appeared_or_vanished``); a store over it is."""
        self._bound_by_library |= self_deleting_globals()
        found: dict[int, set[str]] = collections.defaultdict(set)
        for scope, name in self._bound_by_library:
            found[scope].add(name)
        return found

    def changed(self) -> list[str]:
        """Where the user's own state (``_owned``) differs from what was recorded, by
        identity: a path from a root, with what changed (``module m: SEEN``,
        ``fn's arguments: [0].hook_calls``). A module bound under a new key of a dict
        (the import system binding a submodule imported for the first time) is no
        change, nor a name a library binds and deletes itself (``_library_bindings``).
        An installed library's objects are put back but not held against the
        trace: their caches fill as they are used (a logger's level cache, a
        ``transformers`` config's)."""
        found: list[str] = []
        library = self._library_bindings()
        for (obj, saved), at in zip(self.records, self.reached):
            if not self.owned[at] or isinstance(saved, _CacheFill):
                continue
            if _same(obj, saved, _same_value):
                continue
            if isinstance(obj, dict):
                # A module bound under a new key: the import system's binding of a
                # submodule imported for the first time (``_restore_dict`` keeps it).
                known = {k for k, _ in saved}
                imported = [
                    (k, v)
                    for k, v in _items(obj)
                    if k not in known and isinstance(v, types.ModuleType)
                ]
                if imported and _same(obj, [*saved, *imported]):
                    continue
            root, words, names = self._path(at)
            if isinstance(obj, dict):
                before, now = dict(saved), dict(_items(obj))
                holder_key = self.trail[at][2]
                if not isinstance(holder_key, _Attrs) and self.trail[at][0] < 0:
                    holder_key = _ATTRS  # a module's globals
                bound = _appeared_or_vanished(library.get(id(obj), set()), before, now)

                def users(k: Any, holder_key: Any = holder_key, bound: set[str] = bound) -> bool:
                    return _user_key(k, holder_key) and k not in bound

                keys = [
                    k
                    for k in {**before, **now}
                    if users(k) and not _same_value(before.get(k, _EMPTY), now.get(k, _EMPTY))
                ]
                if not keys and [k for k in before if users(k)] == [k for k in now if users(k)]:
                    continue
                for key in keys[:3] or [None]:
                    if key is None:
                        found.append(f"{root}: {words or 'a dict'} (its order)")
                    else:
                        shown = f".{key}" if names and isinstance(key, str) else f"[{key!r}]"
                        found.append(f"{root}: {(words + shown).lstrip('.')}")
            elif isinstance(saved, _Slots):
                now_slots = _slot_values(obj)
                for slot in [
                    k for k in saved if not _same_value(now_slots.get(k, _EMPTY), saved[k])
                ][:3]:
                    found.append(f"{root}: {(words + '.' + slot.__name__).lstrip('.')} (a slot)")
            else:
                found.append(f"{root}: {words.lstrip('.') or 'itself'} ({_named(obj)})")
        return found

    def _path(self, at: int) -> tuple[str, str, bool]:
        """The walked object at ``at`` in words: its root's name, the keys from there,
        and whether its own keys are names (a module's globals, an object's
        attributes)."""
        keys: list[Any] = []
        while True:
            parent, _value, key = self.trail[at]
            if parent < 0:
                break
            keys.append(key)
            at = parent
        words = ""
        # A root dict is a module's globals: its keys are names, as an object's are.
        previous: Any = _ATTRS if isinstance(self.trail[at][1], dict) else None
        for key in reversed(keys):
            if isinstance(key, _Attrs) and key:
                words += f".{key}"
            elif isinstance(key, _Cell):
                words += f" (closure cell {key})"
            elif isinstance(key, _Dot):
                words += key
            elif not (isinstance(key, _Attrs) or key is _CONTENTS):
                attribute = isinstance(previous, _Attrs) and isinstance(key, str)
                words += f".{key}" if attribute else f"[{key!r}]"
            previous = key
        return self.trail[at][2], words, isinstance(previous, _Attrs)

    def restore(self) -> None:
        """Put back, in place, every recorded object whose contents changed. One whose
        own rules refuse even the base types' methods is named in a PrecompileError,
        after every other object is put back: it may still hold what the trace stored
        (a make_fx trace stores fake tensors), and a capture must not leave that
        silently."""
        failed: list[str] = []
        library = self._library_bindings()
        for obj, saved in self.records:
            if _same(obj, saved):
                continue
            try:
                _put_back(obj, saved, library.get(id(obj), set()))
            except Exception as error:
                failed.append(f"{_named(obj)} ({type(error).__name__}: {error})")
        if failed:
            raise PrecompileError(
                "the capture could not put back what its trace stored into "
                + "; ".join(failed[:3])
                + ("" if len(failed) <= 3 else f" and {len(failed) - 3} more")
                + ": it may still hold a value of the trace, not of a real run",
                hint="rebuild that object (or restart the process) before using it, and "
                "keep fn from storing into it",
            )


def _put_back(obj: Any, saved: Any, library: set[str]) -> None:
    """Put ``saved`` (what ``UserState`` recorded of ``obj``) back into ``obj``, through
    the base types' own methods; in a dict, the names of ``library`` the library itself
    bound or deleted meanwhile left as they are (``_restore_dict``)."""
    if isinstance(saved, c_object_state.ValueState):
        saved.put_back(obj)
    elif isinstance(saved, _CacheFill):
        # No entry of an lru_cache can be taken out alone: where one holds a trace's
        # tensor, all go (a cache holds nothing a later call cannot compute again).
        # One that stored only real values is kept: the functions a cached maker
        # returned are the ones the capture's checks compare by identity next.
        if _holds_trace_value(obj):
            obj.cache_clear()
    elif isinstance(saved, _Slots):
        for slot, held in saved.items():
            if held is _EMPTY:
                with contextlib.suppress(AttributeError):
                    slot.__delete__(obj)
            else:
                slot.__set__(obj, held)
    elif isinstance(obj, collections.deque):
        collections.deque.clear(obj)
        collections.deque.extend(obj, saved)
    elif isinstance(obj, list):
        list.__setitem__(obj, slice(None), saved)
    elif isinstance(obj, bytearray):
        bytearray.__setitem__(obj, slice(None), saved)
    elif isinstance(obj, dict):
        _restore_dict(obj, saved, library)
    elif isinstance(obj, set):
        set.clear(obj)
        set.update(obj, saved)
    elif isinstance(obj, types.CellType):
        if saved is _EMPTY:
            del obj.cell_contents
        else:
            obj.cell_contents = saved
    elif isinstance(obj, type):
        # type's own methods: a metaclass's __setattr__ (a registry that forbids
        # writes) does not stop the put-back of a store that went around it.
        for name in [k for k in vars(obj) if not k.startswith("__")]:
            if name not in saved:
                type.__delattr__(obj, name)
        for name, held in saved.items():
            if vars(obj).get(name, _EMPTY) is not held:
                type.__setattr__(obj, name, held)


#: A module's globals that hold the import system's objects, not the user's state: its
#: loader (a test runner's import hook, holding the runner's session), its spec (which
#: holds the loader again) and the builtins. The bindings themselves are recorded and
#: put back like any global's; what they hold is not walked.
_IMPORT_SYSTEM = frozenset({"__loader__", "__spec__", "__builtins__"})


def _module_globals(value: dict[Any, Any]) -> bool:
    """Whether ``value`` is the globals dict of an imported module."""
    name = dict.get(value, "__name__")
    module = sys.modules.get(name) if isinstance(name, str) else None
    return module is not None and getattr(module, "__dict__", None) is value


def _named(obj: Any) -> str:
    """Words for a recorded object in a refusal: a class by its name, else its type's."""
    if isinstance(obj, type):
        return f"the class {obj.__module__}.{obj.__qualname__}"
    return f"a {type(obj).__qualname__}"


def _same(obj: Any, saved: Any, same: Callable[[Any, Any], bool] = operator.is_) -> bool:
    """Whether ``obj`` holds what ``saved`` recorded, each value compared by ``same``
    (identity; ``_same_value`` where the question is whether a served call would
    differ)."""
    if isinstance(saved, c_object_state.ValueState):
        return saved.same(obj)
    if isinstance(saved, _CacheFill):
        return _cache_info(obj).misses == saved
    if isinstance(saved, _Slots):
        now = _slot_values(obj)
        return now.keys() == saved.keys() and all(same(now[k], saved[k]) for k in saved)
    if isinstance(obj, (list, collections.deque)):
        now = base_contents(obj)
        return len(now) == len(saved) and all(map(same, now, saved))
    if isinstance(obj, dict):
        now = base_contents(obj)
        return len(now) == len(saved) and all(
            k is k2 and same(v, v2) for (k, v), (k2, v2) in zip(now, saved)
        )
    if isinstance(obj, set):
        now = base_contents(obj)
        return len(now) == len(saved) and set(map(id, now)) == set(map(id, saved))
    if isinstance(obj, bytearray):
        return bool(base_contents(obj) == saved)
    if isinstance(obj, types.CellType):
        try:
            held = obj.cell_contents
        except ValueError:
            held = _EMPTY
        return same(held, saved)
    if isinstance(obj, type):
        attrs = {k: v for k, v in vars(obj).items() if not k.startswith("__")}
        return attrs.keys() == saved.keys() and all(same(attrs[k], saved[k]) for k in attrs)
    return True


def _same_value(a: object, b: object) -> bool:
    """``a is b``, or both an equal int, float, str, bytes or bool: storing ``300`` over an
    equal ``300`` (a new int object each time) changes nothing a served call would
    show."""
    if a is b:
        return True
    if type(a) is not type(b) or type(a) not in (int, float, str, bytes, bool):
        return False
    # Floats by their spelling: -0.0 is not 0.0 (1 / x tells them apart), nan is nan.
    return repr(a) == repr(b) if type(a) is float else a == b


def _user_named(module: str) -> bool:
    """Whether a module's name is the user's: its top-level package is not an installed
    library's (``torch._inductor.runtime.compile_tasks.c3x...`` is Inductor's kernel
    module, loaded from its cache folder)."""
    top = module.partition(".")[0]
    package = sys.modules.get(top)
    if top == "__main__" or is_project_module(package):
        return True
    # A namespace package (no __init__.py) has no file: its folders say whose it is.
    folders = (
        getattr(package, "__path__", None) if getattr(package, "__file__", None) is None else None
    )
    return any(is_project_file(os.path.join(folder, "__init__.py")) for folder in folders or ())


def _user_key(key: Any, holder_key: Any) -> bool:
    """Whether what ``key`` holds in the dict ``holder_key`` reached can be the user's:
    not a name with two leading underscores (the interpreter's ``__loader__``,
    ``__spec__``, ``__warningregistry__``; Dynamo's ``__compiled_fn_3`` it binds in a
    module's globals), nor an installed library's private attribute
    (``nn.LSTM._flat_weights``, rebuilt when the capture sets the traced tensors into
    the module and back) other than a module's hook dicts and what ``nn.Module`` keeps
    on every module (``_MODULE_STATE``: the user's registrations) -- on the library's
    objects, and on the project's objects whose class inherits the
    attribute's use from a library base (``class MyLSTM(nn.LSTM)``)."""
    if not isinstance(key, str):
        return True
    if key.startswith("__"):
        return False
    if not key.startswith("_") or key.endswith("hooks") or key in _MODULE_STATE:
        return True
    return not (
        isinstance(holder_key, _LibraryAttrs) or key in getattr(holder_key, "inherited", ())
    )


def _owned(value: Any, key: Any, holder_key: Any) -> bool:
    """Whether ``value``, reached by ``key`` from what ``holder_key`` reached, is the
    user's own state: under a key that can be the user's (``_user_key``), and a
    builtin container, a closure cell, a project function (with its cells and
    attributes), a method or partial of one, a project class, an instance of one, an
    ``nn.Module``, a tensor (its Python attributes), a standard-library data class's
    instance (``_DATA_CLASSES``) or an object that keeps its state in C
    (``c_object_state``: a ``random.Random``, an ``array.array``, a numpy array)."""
    if not _user_key(key, holder_key):
        return False
    if isinstance(value, (list, collections.deque, dict, set, bytearray, tuple, types.CellType)):
        return True
    if isinstance(value, (types.MethodType, functools.partial, torch.nn.Module, torch.Tensor)):
        return True
    if _bound_builtin(value):
        return True
    if c_object_state.holds_c_state(value):
        return True
    if isinstance(value, types.FunctionType):
        return is_project_file(value.__code__.co_filename)
    return _users_class(value if isinstance(value, type) else type(value))


#: The standard library's classes whose instances are only data the user put there,
#: kept in public attributes (a ChainMap's ``maps``, a UserDict's ``data``, a
#: namespace's fields): the user's own, as a dict is. (A logger, or any other library
#: object, keeps caches it fills as it is used: not the user's.)
_DATA_CLASSES = frozenset(
    {
        ("collections", "ChainMap"),
        ("collections", "UserDict"),
        ("collections", "UserList"),
        ("types", "SimpleNamespace"),
        ("argparse", "Namespace"),
    }
)


def _bound_builtin(value: Any) -> bool:
    """Whether ``value`` is a builtin method bound to an object (``lst.append``,
    ``it.__next__``), not to a module or a class (``torch.relu``, ``dict.fromkeys``)."""
    return isinstance(value, (types.BuiltinMethodType, types.MethodWrapperType)) and not (
        isinstance(getattr(value, "__self__", None), (types.ModuleType, type))
    )


def _users_class(kind: type) -> bool:
    """Whether instances of ``kind`` hold the user's own state: a project class, or a
    standard-library data class."""
    return _project_class(kind) or (kind.__module__, kind.__qualname__) in _DATA_CLASSES


def _project_class(owner: type) -> bool:
    """Whether ``owner`` is defined in the project (or in ``__main__``: a notebook)."""
    return owner.__module__ == "__main__" or is_project_module(sys.modules.get(owner.__module__))


class _Attrs(str):
    """The key of an object's attribute dict (a submodule's, by its name in the model),
    with the private names its class's library bases use (``inherited``)."""

    inherited: frozenset[str] = frozenset()


class _LibraryAttrs(_Attrs):
    """The key of the attribute dict of an installed library's object."""


def _attrs_of(value: Any, name: str) -> _Attrs:
    """The key of ``value``'s attribute dict: ``_LibraryAttrs`` where its class is an
    installed library's."""
    kind = type(value)
    if not _users_class(kind):
        return _LibraryAttrs(name)
    key = _Attrs(name)
    key.inherited = _inherited_private_names(kind)
    return key


#: ``_inherited_private_names`` per class, for as long as the class lives.
_INHERITED: weakref.WeakKeyDictionary[type, frozenset[str]] = weakref.WeakKeyDictionary()


def _inherited_private_names(kind: type) -> frozenset[str]:
    """The single-underscore names the code of ``kind``'s library bases reads or
    stores (``nn.RNNBase``'s ``_flat_weights``): what an object of a project subclass
    holds under those names is the library's bookkeeping, not the user's."""
    known = _INHERITED.get(kind)
    if known is not None:
        return known
    names: set[str] = set()
    codes = [
        code
        for base in kind.__mro__
        if base is not object and not _users_class(base)
        for attr in vars(base).values()
        for code in _codes_of(attr)
    ]
    while codes:
        code = codes.pop()
        names.update(n for n in code.co_names if n.startswith("_") and not n.startswith("__"))
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    found = _INHERITED[kind] = frozenset(names)
    return found


def _codes_of(attr: Any) -> list[types.CodeType]:
    """The code objects of a class attribute: a function's, a static or class method's,
    a property's accessors'."""
    if isinstance(attr, (staticmethod, classmethod)):
        attr = attr.__func__
    functions = [attr.fget, attr.fset, attr.fdel] if isinstance(attr, property) else [attr]
    return [f.__code__ for f in functions if isinstance(f, types.FunctionType)]


def _holds_trace_value(wrapper: Any) -> bool:
    """Whether an lru_cache holds a tensor only a trace makes, among its results and
    what tuples, lists and dicts among them hold (read through the garbage collector's
    referents: the cache is a dict the wrapper alone holds, a bounded one keeping each
    result in a link list)."""
    pending = [(held, 0) for held in gc.get_referents(wrapper)]
    seen: set[int] = set()
    while pending:
        value, depth = pending.pop()
        if id(value) in seen or depth > 4 or len(seen) > 100_000:
            continue
        seen.add(id(value))
        if tracing.is_trace_value(value):
            return True
        if isinstance(value, (dict, list, tuple)):
            items = base_contents(value)
            pending += [(item, depth + 1) for item in items]
    return False


class _CacheFill(int):
    """What an lru_cache's record keeps: its count of misses (each a stored result)."""


#: The type of what ``functools.lru_cache`` and ``functools.cache`` return.
_LRU_CACHE = type(functools.lru_cache(maxsize=None)(lambda: None))


def _cache_info(value: Any) -> Any:
    """An lru_cache's ``cache_info()`` (``functools.lru_cache`` or ``cache``), or None
    for anything else (by exact type: ``FakeTensorMode`` has a ``cache_info`` of its
    own, a class method)."""
    return value.cache_info() if type(value) is _LRU_CACHE else None


class _Cell(str):
    """The key of a closure cell: the name of its free variable."""


class _Dot(str):
    """The key of an attribute read directly (``.__self__``, a slot, a class's)."""


#: The keys of an object's own ``__dict__`` and of a cell's contents in a path.
_ATTRS = _Attrs("")
_CONTENTS = object()


class _Slots(dict[Any, Any]):
    """An object's ``__slots__`` values by attribute name, ``_EMPTY`` where unset."""


def _slot_values(value: Any) -> _Slots:
    """``value``'s slot values (its class's and its bases' ``__slots__``), keyed by the
    slot's own member descriptor: read and put back through it, so a property of the
    same name further down the MRO (which may compute, or refuse a set) is not used."""
    found = _Slots()
    for klass in type(value).__mro__:
        names = vars(klass).get("__slots__", ())
        for name in (names,) if isinstance(names, str) else names:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{klass.__name__.lstrip('_')}{name}"  # as Python mangles it
            slot = vars(klass).get(name)
            if not isinstance(slot, types.MemberDescriptorType):
                continue
            try:
                found[slot] = slot.__get__(value, klass)
            except AttributeError:
                found[slot] = _EMPTY
    return found


def _appeared_or_vanished(
    library: set[str], before: dict[Any, Any], now: dict[Any, Any]
) -> set[str]:
    """The names of ``library`` (a library's own bindings in a dict) that were bound only
    before or only now: the library bound or deleted them itself. One bound on both
    sides to different objects was rebound by someone else (the library never rebinds
    one), fn's store like any other: held against it and put back."""
    return {k for k in library if (k in before) != (k in now)}


def _restore_dict(obj: dict[Any, Any], saved: list[tuple[Any, Any]], library: set[str]) -> None:
    """Put ``saved``'s items back into ``obj``: the keys the trace added removed and the
    values it rebound set back, so the dict is never empty meanwhile (a module's
    globals); cleared and refilled only where its order still differs. A module bound
    under a new key stays: the import system binds a submodule imported for the first
    time in its package's globals (``sys.modules`` keeps it, and ``pkg.sub`` must
    find it), which is no store of the trace. The names of ``library`` (a library's
    own bindings, ``UserState._library_bindings``) bound on one side of the trace only
    (``_appeared_or_vanished``) are left as they are now: put back, a deleted one would
    outlive its code; taken out, a new one would leave that code a name it cannot load
    and the library's cleanup a key it cannot delete."""
    # The builtin base's methods (an OrderedDict keeps its order in its own links).
    base: Any = collections.OrderedDict if isinstance(obj, collections.OrderedDict) else dict
    library = _appeared_or_vanished(library, dict(saved), dict(_items(obj)))
    saved = [(k, v) for k, v in saved if k not in library]
    keep = dict(saved)
    now = list(_items(obj))
    imported = {k: v for k, v in now if k not in keep and isinstance(v, types.ModuleType)}
    for key, _ in now:
        if key not in keep and key not in imported and key not in library:
            base.__delitem__(obj, key)
    for key, value in saved:
        if base.get(obj, key, _EMPTY) is not value:
            base.__setitem__(obj, key, value)
    expected = [*saved, *imported.items()]
    now = [(k, v) for k, v in _items(obj) if k not in library]
    if len(now) != len(expected) or not all(
        k is k2 and v is v2 for (k, v), (k2, v2) in zip(now, expected)
    ):
        bound = {k: v for k, v in _items(obj) if k in library}
        base.clear(obj)
        base.update(obj, expected)
        base.update(obj, bound)


def base_contents(value: Any) -> Any:
    """A copy of a container's contents through its builtin base's own methods: a
    subclass's ``items``, ``__iter__`` or ``__len__`` may run code (transformers'
    ``MODEL_MAPPING`` imports every model it names, and raises where one is missing).
    A list of the items of a list, tuple or deque, of the (key, value) pairs of a dict;
    a set of a set's or frozenset's; a bytearray's bytes."""
    if isinstance(value, list):
        return list.copy(value)
    if isinstance(value, tuple):
        return list(tuple.__iter__(value))
    if isinstance(value, collections.deque):
        return list(collections.deque.__iter__(value))
    if isinstance(value, dict):
        return list(_items(value))
    if isinstance(value, set):
        return set.copy(value)
    if isinstance(value, frozenset):
        return set(frozenset.__iter__(value))
    return bytearray.copy(value)


def _items(obj: dict[Any, Any]) -> Any:
    """``obj``'s items through its builtin base (a subclass may override ``items``)."""
    if isinstance(obj, collections.OrderedDict):
        return collections.OrderedDict.items(obj)
    return dict.items(obj)


@contextlib.contextmanager
def restored(roots: list[Any]) -> Iterator[UserState]:
    """Take the user's state reachable from ``roots``, and put it back on exit, however
    the body ends; the collector paused meanwhile (``collector``)."""
    with collector.paused():
        state = UserState(roots)
        try:
            yield state
        finally:
            state.restore()


@contextlib.contextmanager
def restored_on_error(state: UserState) -> Iterator[UserState]:
    """Put ``state`` back if the body raises (a refusal inside the trace); a body that
    ends normally leaves it to the caller, which compares the state first."""
    try:
        yield state
    except BaseException:
        state.restore()
        raise


def restoring(fn: Callable[..., Any], roots: list[Any]) -> Callable[..., Any]:
    """``fn``, each call of which leaves the state reachable from ``roots`` as it found
    it (a later trace of the same function: AOTAutograd's joint trace)."""

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        with restored(roots):
            return fn(*args)

    return call
