"""The one per-call watch of dicts by version tag (``runtime.version_watch.watch_dicts``),
which the library-surface check and Dynamo's global-hook, class and builtin checks all
build their per-call check from: run as an artifact runs it (its emitted text, over the
artifact prelude's ``_dict_version``), a check rechecks exactly when a watched dict was
stored into, or what the tags cannot see (an OrderedDict's order, a class's MRO)
changed, and never otherwise; a recheck that refuses refuses again on the next call."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from precompile._compat.prelude import ARTIFACT_PRELUDE
from precompile.capturing.emit import _source_of
from precompile.runtime import version_watch


def _watch_dicts() -> Callable[..., Callable[[], None]]:
    namespace: dict[str, Any] = {}
    exec(ARTIFACT_PRELUDE, namespace)
    exec(
        compile(
            "from __future__ import annotations\n" + _source_of(version_watch),
            "<artifact>",
            "exec",
        ),
        namespace,
    )
    return namespace["watch_dicts"]  # type: ignore[no-any-return]


class Refused(Exception):
    pass


def test_a_check_rechecks_only_when_a_watched_dict_is_stored_into() -> None:
    watch_dicts = _watch_dicts()
    scope: dict[str, Any] = {"k": 1}
    rechecks: list[int] = []
    check = watch_dicts(lambda: [scope], lambda: rechecks.append(1))
    for _ in range(3):
        check()
    assert rechecks == []
    scope["k"] = 2  # a store: the tag changes, the recheck decides
    check()
    check()
    assert rechecks == [1]


def test_a_refusing_recheck_refuses_on_every_call_until_the_change_is_undone() -> None:
    watch_dicts = _watch_dicts()
    scope: dict[str, Any] = {"k": 1}

    def recheck() -> None:
        if scope["k"] != 1:
            raise Refused(scope["k"])

    check = watch_dicts(lambda: [scope], recheck)
    scope["k"] = 2
    for _ in range(2):
        try:
            check()
        except Refused:
            pass
        else:
            raise AssertionError("a changed dict was served")
    scope["k"] = 1
    check()


def test_an_unchecked_state_is_rechecked_at_the_first_call_and_what_to_watch_is_asked_again() -> (
    None
):
    watch_dicts = _watch_dicts()
    holder: dict[str, Any] = {"table": {}}
    rechecks: list[int] = []
    check = watch_dicts(lambda: [holder["table"]], lambda: rechecks.append(1), False)
    check()
    assert rechecks == [1]
    old, holder["table"] = holder["table"], {"new": 1}
    check()  # the replaced dict is not stored into: unnoticed until the watched one is
    assert rechecks == [1]
    old["x"] = 1
    check()
    assert rechecks == [1, 1]
    holder["table"]["y"] = 2  # now the new dict is the one watched
    check()
    assert rechecks == [1, 1, 1]


def test_what_a_version_tag_cannot_see_is_compared_by_key() -> None:
    watch_dicts = _watch_dicts()
    hooks: collections.OrderedDict[int, str] = collections.OrderedDict([(1, "a"), (2, "b")])
    rechecks: list[int] = []
    check = watch_dicts(lambda: [hooks], lambda: rechecks.append(1), True, tuple, lambda d: d)
    check()
    assert rechecks == []
    hooks.move_to_end(1)  # reorders without a store the tag sees
    check()
    check()
    assert rechecks == [1]
