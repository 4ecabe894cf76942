"""The one per-call watch of dicts by their version tags, authored as code and emitted
whole into every artifact (make_fx and Dynamo alike), before the checks that use it.

Several checks depend on what dicts hold (a module's globals, a class's own dict, torch's
global hook dicts, the dicts a library path resolves through) and would be too slow to
compare entry by entry on every call. Each asks ``watch_dicts`` for its per-call
``check()``: one C-level ``map`` of the dicts' version tags (any store into a dict
changes its tag), compared with those of the last check that passed; only a difference
runs the check's own ``recheck()``, which refuses a real change and otherwise returns,
after which the dicts to watch are asked for again and their tags kept. What a tag does
not see (the order of an OrderedDict's keys, which ``move_to_end`` changes without a
store; a class's MRO) is compared per call too, as ``key`` of each of the ``keyed``
objects.

Each ``check`` also carries ``check.snapshot()``: what it last verified (the dicts, their
tags, and its keyed objects with their keys), so that a driver can fold several checks
into one comparison and call them only when it fails: ``watch_together`` for Dynamo
artifacts, ``single_graph``'s per-call epoch (which folds in the model-state fast path's
dicts too) for make_fx ones.

Nothing here imports precompile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Bound by the artifact prelude (precompile._compat.prelude).
    _dict_version: Callable[[dict[str, Any]], int] = len


def watch_dicts(
    watched: Callable[[], list[Any]],
    recheck: Callable[[], None],
    checked: bool = True,
    key: Callable[[Any], Any] | None = None,
    keyed: Callable[[list[Any]], Any] | None = None,
) -> Callable[[], None]:
    """``check()``: per call, compare the version tags of the dicts ``watched()`` returns
    (and, with ``key``, ``key`` of each of ``keyed(dicts)``) with those last seen, and
    call ``recheck()`` only when one differs; after a recheck that returns, ``watched()``
    is asked again (a recheck may find other dicts to watch) and their tags kept.
    ``checked``: whether the state now, at load, is known to be the captured one (the
    builder compared it); when not, the first call rechecks."""
    dicts = watched()
    versions: Any = tuple(map(_dict_version, dicts)) if checked else None
    items = keyed(dicts) if keyed is not None else ()
    keys = tuple(map(key, items)) if key is not None else ()

    def refresh() -> None:
        nonlocal dicts, versions, items, keys
        recheck()
        dicts = watched()
        versions = tuple(map(_dict_version, dicts))
        if key is not None and keyed is not None:
            items = keyed(dicts)
            keys = tuple(map(key, items))

    def snapshot() -> tuple[Any, ...]:
        """What the last passing check saw (for ``watch_together``): the dicts, their
        tags (None: not yet checked), and ``key`` with the keyed objects and their keys."""
        return dicts, versions, key, items, keys

    if key is None:

        def check() -> None:
            if tuple(map(_dict_version, dicts)) != versions:
                refresh()

        check.snapshot = snapshot  # type: ignore[attr-defined]
        return check
    by = key

    def check_keyed() -> None:
        if tuple(map(_dict_version, dicts)) != versions or (
            items and tuple(map(by, items)) != keys
        ):
            refresh()

    check_keyed.snapshot = snapshot  # type: ignore[attr-defined]
    return check_keyed


def watch_together(checks: list[Callable[[], None]]) -> Callable[[], None]:
    """``check()``: the ``watch_dicts`` checks ``checks`` as one. Per call, the tags of
    all their dicts are read in one C-level ``map`` and compared with the concatenation of
    what each check last saw (and each keyed object's key with its own): equal, every
    one of the checks would have found nothing changed, so none is called. Otherwise
    each is called, in order (each rechecks what changed of its own and refuses as it
    would alone), and the combined snapshot is taken again from theirs."""
    if len(checks) == 1:
        return checks[0]
    dicts: list[Any] = []
    versions: Any = None
    keyed: list[tuple[Any, Any, Any]] = []

    def take() -> None:
        nonlocal versions
        dicts.clear()
        keyed.clear()
        seen: list[Any] = []
        for check in checks:
            own_dicts, own_versions, key, items, keys = check.snapshot()  # type: ignore[attr-defined]
            if own_versions is None:  # not checked yet: the next call calls it
                versions = None
                return
            dicts.extend(own_dicts)
            seen.extend(own_versions)
            if key is not None and items:
                keyed.append((key, items, keys))
        versions = tuple(seen)

    take()

    def check() -> None:
        if tuple(map(_dict_version, dicts)) == versions and (
            not keyed or all(tuple(map(key, items)) == keys for key, items, keys in keyed)
        ):
            return
        for each in checks:
            each()
        take()

    return check
