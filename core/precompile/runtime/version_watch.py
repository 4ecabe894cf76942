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

An unkeyed ``check`` also carries ``check.recorded()``: the dicts and the tags it last
verified, so that a driver can fold them into one comparison with other checks' dicts
(``single_graph``'s per-call epoch) and call ``check`` only when that comparison fails.

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

    if key is None:

        def check() -> None:
            if tuple(map(_dict_version, dicts)) != versions:
                refresh()

        def recorded() -> tuple[list[Any], Any]:
            # The dicts and the tags the last passing check verified (None before the
            # first when ``checked`` is False): a caller may compare them itself, as
            # part of one wider comparison, instead of calling ``check``.
            return dicts, versions

        check.recorded = recorded  # type: ignore[attr-defined]  # read by single_graph
        return check
    by = key

    def check_keyed() -> None:
        if tuple(map(_dict_version, dicts)) != versions or (
            items and tuple(map(by, items)) != keys
        ):
            refresh()

    return check_keyed
