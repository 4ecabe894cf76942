"""The live function objects running the code a trace ran, and which of them nothing
watches: one rule for both tracers, applied at capture.

A trace records code (Dynamo: the codes it traced or inlined; make_fx: the codes that ran
under it). What serving can watch is function objects: one it finds by a name, by an
access path, through a class or fn's arguments, or one a fingerprint holds (make_fx
compares a fingerprinted function's code by identity per call). A function that outlives
the call held only by something no recorded path reaches -- the result an
``functools.lru_cache``'d maker returned (the cache is C state), a
``weakref.WeakValueDictionary`` entry (a weak reference), any C-level holder -- is run by
eager on every call, and its ``__code__`` swapped would be served stale: such a function is
refused at capture (``refuse_unwatched``).

A code counts as watched when one of the live functions running it is watched: functions
with the same code are told apart only by identity, which a trace does not record (a
frame does not name its function object in CPython 3.11), and one factory's functions
kept in a registry share their code with the entry the trace read. Except for a code
made under an lru_cache'd maker the trace called (``cached_makers``): the function eager
calls next time is the one the cache holds, which no watched path reaches even where a
module-level function of the same factory is watched, so each function of that code the
cache holds must be watched itself, by identity (``unwatched_cached``); Dynamo, which
traced the maker as uncached and ran a function of its own, refuses such a code. A code
with no live function after the trace was made per call by traced code (a closure
defined in ``forward``), and its maker's code is what is watched.
"""

from __future__ import annotations

import functools
import gc
import types
import weakref
from collections.abc import Iterable
from typing import Any

from precompile.errors import PrecompileError
from precompile.locations import is_project_file
from precompile.runtime.guard_text import user_path

#: The type of a ``functools.lru_cache``/``functools.cache`` wrapper (C state: the results
#: it holds are reached by no attribute).
_LRU_CACHE: type = type(functools.lru_cache(maxsize=None)(len))


def referrers(*objects: Any) -> list[Any]:
    """``gc.get_referrers(*objects)``, the objects ``gc.freeze()`` moved to the permanent
    generation included: CPython's walk covers the three collected generations only, so
    in a process that froze its heap (a pre-forking server does, before it forks) every
    walk found nothing, and a function only C state holds went unrefused. Such a heap is
    unfrozen for the walk and frozen again after it (both are O(1) list splices); the
    freeze then also holds what was allocated since the user's freeze, which changes
    what the collector visits, never what a program computes. Every heap walk of a
    capture goes through here."""
    return _referrers(objects)


def _referrers(objects: tuple[Any, ...]) -> list[Any]:
    """``referrers``, but for ``objects`` itself: the walk's own tuple holds them all."""
    frozen = gc.get_freeze_count()
    if frozen:
        gc.unfreeze()
    try:
        return [held for held in gc.get_referrers(*objects) if held is not objects]
    finally:
        if frozen:
            gc.freeze()


def referrers_of(objects: list[Any]) -> dict[int, list[Any]]:
    """The objects that refer to each of ``objects``, by its id: one pass over the heap
    for all of them (``gc.get_referrers`` walks every tracked object per call, so one
    call per object made a capture's cost grow with the process's heap times the
    functions it traced). The caller's ``objects`` is among them; the walk's own tuple
    is not."""
    found: dict[int, list[Any]] = {id(o): [] for o in objects}
    if not found:
        return found
    for referrer in _referrers(tuple(objects)):
        for target in gc.get_referents(referrer):
            if id(target) in found:
                found[id(target)].append(referrer)
    return found


def live_functions(
    codes: Iterable[types.CodeType],
) -> dict[types.CodeType, list[types.FunctionType]]:
    """Per code of ``codes``, the function objects alive now running it (none: absent).
    One walk of the heap for all of them (``gc.get_referrers`` walks every object: a
    tenth of a second with torch loaded)."""
    wanted = set(codes)
    found: dict[types.CodeType, list[types.FunctionType]] = {}
    if not wanted:
        return found
    for fn in referrers(*wanted):
        if isinstance(fn, types.FunctionType) and fn.__code__ in wanted:
            found.setdefault(fn.__code__, []).append(fn)
    return found


def _unwatched(
    codes: Iterable[types.CodeType], watched: set[int]
) -> dict[types.CodeType, list[types.FunctionType]]:
    """Per code, its live functions that something other than a frame holds, where none
    of them is watched. A function only frames hold -- a local of the capturing code, a
    frame a traceback keeps -- is reached by nothing fn can read on a later call. One
    pass over the heap finds the holders of them all (one per function made a capture
    cost the heap's size times the functions it traced)."""
    running = live_functions(c for c in codes if is_project_file(c.co_filename))
    unwatched = {
        code: live for code, live in running.items() if not any(id(fn) in watched for fn in live)
    }
    every = [fn for live in unwatched.values() for fn in live]
    holders_of = referrers_of(every)
    own = {id(every), *map(id, running.values())}  # the lists here that hold the functions
    found: dict[types.CodeType, list[types.FunctionType]] = {}
    for code, live in unwatched.items():
        held = [
            fn
            for fn in live
            if any(
                not isinstance(holder, types.FrameType) and id(holder) not in own
                for holder in holders_of[id(fn)]
            )
        ]
        if held:
            found[code] = held
    return found


def unwatched_live(
    codes: Iterable[types.CodeType], watched: Iterable[Any]
) -> dict[types.CodeType, list[types.FunctionType]]:
    """Per project code among ``codes``: the live functions running it, where it has some
    and none of them is among ``watched`` (function objects, compared by identity).

    A function only frames hold is not counted (nothing fn reads reaches it). Garbage
    not yet collected (a recursive closure made per call keeps itself alive in a
    cycle) is collected before a code is held against the capture."""
    functions = [fn for fn in watched if isinstance(fn, types.FunctionType)]
    ids = {id(fn) for fn in functions}
    # A code a watched function runs is watched (that function is alive: ``watched``
    # holds it). Only the others need the heap walk, and most captures have none.
    covered = {fn.__code__ for fn in functions}
    codes = [code for code in codes if code not in covered]
    if not codes:
        return {}
    found = _unwatched(codes, ids)
    if found:
        again = list(found)
        found.clear()  # its lists hold the functions
        gc.collect()
        found = _unwatched(again, ids)
    return found


def _cache_of(code: types.CodeType, module: Any) -> Any:
    """The lru_cache wrapper that a project code's qualified name resolves to in its
    module, wrapping a function of that code (``@functools.cache def cached_act``), or
    None. By name, not by a heap walk: this runs for every traced code."""
    qualname = getattr(code, "co_qualname", code.co_name)
    if "<locals>" in qualname:
        return None
    owner: Any = module
    for part in qualname.split("."):
        owner = getattr(owner, part, None)
    wrapped = getattr(owner, "__wrapped__", None)
    if isinstance(owner, _LRU_CACHE) and getattr(wrapped, "__code__", None) is code:
        return owner
    return None


def cached_makers(
    codes: Iterable[types.CodeType], scopes: dict[types.CodeType, dict[str, Any]] | None = None
) -> dict[types.CodeType, list[Any]]:
    """Per code, the lru_cache wrappers it is made under, per call: the nested code of a
    cached function the trace ran (its code is among ``codes``: Dynamo traces it) or
    called (a code among ``codes`` loads the cache by global name, in its module or in
    ``scopes``: make_fx runs nothing of the maker on a cache hit), and (transitively)
    that of the project functions it loads by global name.

    Eager keeps the maker's result in the cache and calls it again: the function a
    served call must watch is the cache's, not a module-level function of the same
    factory the trace may also have read. The call tree is approximated by global names
    (``cached_act`` calls ``make_act``, whose nested ``act`` it returns)."""
    import inspect

    from precompile.capturing.bytecode_names import global_loads

    wrappers: dict[int, Any] = {}
    for code in codes:
        if not is_project_file(code.co_filename):
            continue
        module = inspect.getmodule(code)
        own = _cache_of(code, module)
        if own is not None:
            wrappers[id(own)] = own
        scope = (scopes or {}).get(code) or (vars(module) if module is not None else {})
        for name in global_loads(code):
            value = scope.get(name)
            if isinstance(value, _LRU_CACHE) and isinstance(
                getattr(value, "__wrapped__", None), types.FunctionType
            ):
                wrappers[id(value)] = value
    found: dict[types.CodeType, list[Any]] = {}
    for wrapper in wrappers.values():
        maker = wrapper.__wrapped__
        pending: list[tuple[types.CodeType, dict[str, Any]]] = [(maker.__code__, maker.__globals__)]
        seen: set[types.CodeType] = set()
        while pending:
            at, scope = pending.pop()
            if at in seen:
                continue
            seen.add(at)
            for const in at.co_consts:
                if isinstance(const, types.CodeType):
                    found.setdefault(const, []).append(wrapper)
                    pending.append((const, scope))
            for name in global_loads(at):
                callee = scope.get(name)
                if isinstance(callee, types.FunctionType) and is_project_file(
                    callee.__code__.co_filename
                ):
                    pending.append((callee.__code__, callee.__globals__))
    return found


def _cached_functions(wrapper: Any) -> list[types.FunctionType]:
    """The functions ``wrapper``'s cache holds: its results (the cache is a dict the
    wrapper alone holds; a bounded one keeps each result in a link list), what tuples,
    lists and dicts among them hold, and the functions their closure cells hold."""
    found: list[Any] = []
    pending: list[tuple[Any, int]] = [(held, 0) for held in gc.get_referents(wrapper)]
    seen: set[int] = set()
    while pending:
        value, depth = pending.pop()
        if id(value) in seen or depth > 4:
            continue
        seen.add(id(value))
        if isinstance(value, types.FunctionType):
            if value is not wrapper.__wrapped__:
                found.append(value)
        elif isinstance(value, (dict, list, tuple)):
            items = value.values() if isinstance(value, dict) else value
            pending += [(item, depth + 1) for item in items]
    return closure_functions(found)


def unwatched_cached(
    codes: Iterable[types.CodeType], cached: dict[types.CodeType, list[Any]], watched: Iterable[Any]
) -> dict[types.CodeType, list[types.FunctionType]]:
    """For the codes among ``codes`` made under an lru_cache'd maker (``cached``): the
    functions of that code a cache holds that are not among ``watched`` (by identity)."""
    ids = {id(fn) for fn in watched}
    found: dict[types.CodeType, list[types.FunctionType]] = {}
    for code in codes:
        held = [fn for w in cached.get(code, ()) for fn in _cached_functions(w)]
        unwatched = [fn for fn in held if fn.__code__ is code and id(fn) not in ids]
        if unwatched:
            found[code] = unwatched
    return found


def closure_functions(functions: Iterable[Any]) -> list[types.FunctionType]:
    """``functions`` and every function their closure cells hold, transitively (a
    watched function's cells are watched with it)."""
    found: dict[int, types.FunctionType] = {}
    pending = [f for f in functions if isinstance(f, types.FunctionType)]
    while pending:
        fn = pending.pop()
        if id(fn) in found:
            continue
        found[id(fn)] = fn
        for cell in fn.__closure__ or ():
            try:
                held = cell.cell_contents
            except ValueError:
                continue
            if isinstance(held, types.FunctionType):
                pending.append(held)
    return list(found.values())


def _describe(holder: Any, depth: int = 0) -> str | None:
    """Words for one object holding a function (``gc.get_referrers``), or None."""
    if isinstance(holder, _LRU_CACHE):
        return f"the lru_cache of {getattr(holder, '__qualname__', '?')}"
    if isinstance(holder, types.CellType):
        return "a closure cell"
    if isinstance(holder, types.FrameType):
        return None
    if depth < 2 and isinstance(holder, (dict, list, tuple)):
        # The lru_cache keeps its results in a dict (and, bounded, in link lists) that
        # only the wrapper holds: name the wrapper.
        for outer in referrers(holder):
            if isinstance(outer, _LRU_CACHE):
                return _describe(outer, depth + 1)
    if isinstance(holder, dict):
        return "a dict"
    if isinstance(holder, list):
        return "a list"
    if isinstance(holder, tuple):
        return "a tuple"
    return f"a {type(holder).__qualname__} object"


def holders(fn: types.FunctionType, ignore: Iterable[Any] = ()) -> list[str]:
    """What holds ``fn``, in words, as far as can be said cheaply: its strong referrers
    (an lru_cache, a list, a dict) other than ``ignore`` (this module's own lists), and
    the weak dictionaries that name it."""
    skip = {id(o) for o in ignore}
    words: dict[str, None] = {}
    for ref in weakref.getweakrefs(fn):
        key = getattr(ref, "key", None)
        if isinstance(ref, weakref.KeyedRef):
            words[f"a WeakValueDictionary (entry {key!r})"] = None
    for held in referrers(fn):
        if id(held) in skip:
            continue
        said = _describe(held)
        if said is not None:
            words[said] = None
    return list(words)[:3]


def refuse_unwatched(
    found: dict[types.CodeType, list[types.FunctionType]],
    where: Any = None,
    cached: dict[types.CodeType, str] | None = None,
) -> None:
    """Refuse the first code of ``found`` (``unwatched_live``) or of ``cached``
    (``cached_makers``, codes no watched path reaches), naming the function, where it is
    defined and what holds it, with the fix."""
    held: list[str]
    if found:
        code, live = next(iter(found.items()))
        held = [word for fn in live for word in holders(fn, found.values())]
    elif cached:
        code, maker = next(iter(cached.items()))
        held = [f"the lru_cache of {maker} in eager, which keeps what {maker} returned"]
    else:
        return
    qualname = getattr(code, "co_qualname", code.co_name)
    said = f", held by {', '.join(dict.fromkeys(held))}" if held else ""
    raise PrecompileError(
        f"the trace ran function {qualname} ({user_path(code.co_filename)}:"
        f"{code.co_firstlineno}), a function object that outlives the call{said}, "
        f"which no name another process imports, no module global the trace read, no "
        f"argument of fn and no watched function reaches: a serving process cannot watch "
        f"it, and eager calls that very object again, so its code replaced (a hot patch, "
        f"IPython's autoreload) or the holder's entry changed would be served as traced",
        hint="bind it to a module-level name (ACT = make_act(2.0)) or a module "
        "attribute fn reads (self.act = ...), or make it per call in the traced code",
        invariant=1,
        location=where,
    )


__all__ = [
    "cached_makers",
    "closure_functions",
    "holders",
    "live_functions",
    "referrers",
    "referrers_of",
    "refuse_unwatched",
    "unwatched_cached",
    "unwatched_live",
]
