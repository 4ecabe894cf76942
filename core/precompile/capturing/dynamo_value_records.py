"""Values reached from fn's arguments (or module globals) whose serialized guard cannot
tell two of them apart, recorded at capture (``FLOAT_ZEROS``, ``ORDERED_DICTS``).
Checked per call by ``runtime.multigraph_argument_checks``.

- **Signed zeros**: Dynamo guards a number with ``==``, which does not tell ``0.0`` from
  ``-0.0``; the value the trace computed with is recorded as its literal fingerprint.
- **OrderedDict order**: Dynamo's key guard reads the order of the underlying dict, while
  iterating an OrderedDict follows its own links (``move_to_end`` reorders one and not
  the other); the path is recorded and every call checks that both orders agree.

A later frame's value is checked by its path from fn's arguments
(``dynamo_argument_paths``) or refused at capture.
"""

from __future__ import annotations

import collections
import sys
import types
from typing import Any

from precompile.capturing.dynamo_argument_paths import (
    ACCESS_ROOT,
    ArgumentPaths,
    computed_before_break,
    evaluates_to,
    path_to,
)
from precompile.errors import PrecompileError
from precompile.runtime.guard_text import frame_label, user_path
from precompile.runtime.value_fingerprints import literal_fingerprint


def _both_zeros(row: dict[str, Any], other: tuple[str, str]) -> tuple[str, str]:
    """The refusal of a capture whose calls gave a ``FLOAT_ZEROS`` path both signs of a
    zero (as its message and hint)."""
    return (
        f"`{row['shown']}` was {row['value'][1]} in one captured call and {other[1]} in "
        f"another; Dynamo's guards compare numbers with ==, which does not tell a zero "
        f"from the other sign's, so one compiled variant would serve both (and answer "
        f"the second with the first's sign)",
        "capture with one sign of zero per artifact",
    )


class ValueRecorder:
    """Signed-zero and OrderedDict rows of what fn's arguments reach, per compiled
    variant."""

    def __init__(self, paths: ArgumentPaths, refusals: list[tuple[str, str]]) -> None:
        self.paths = paths
        #: Why the capture cannot be served (shared by every recorder, in order).
        self.refusals = refusals
        #: Access path from an argument -> the signed zero (a float, or a complex with a
        #: zero part) guarded there, as its literal fingerprint (``FLOAT_ZEROS``).
        self.float_zeros: dict[str, dict[str, Any]] = {}
        #: Access path (``module:path`` for a global) -> an OrderedDict whose keys the
        #: guards compare by position (``ORDERED_DICTS``).
        self.ordered_dicts: dict[str, dict[str, Any]] = {}

    def check_zero_signs(self) -> None:
        """Before each captured call (its arguments bound in ``paths``): refuse one that
        gives a ``FLOAT_ZEROS`` path the other sign of its zero."""
        for row in self.float_zeros.values():
            # The variant compiled for one sign of a zero passes the other (its guard is
            # ==) and would answer this call with the captured sign: refuse before it runs.
            path = row["path"]
            try:
                if row["module"] is None:
                    value = eval(path, {}, self.paths.arguments)
                else:
                    value = eval("__G" + path[1:], {"__G": vars(sys.modules[row["module"]])})
            except Exception:
                continue
            kind = type(value)
            if (
                kind in (float, complex)
                and kind.__name__ == row["value"][0]
                and value == kind(row["value"][1])
            ):
                found = literal_fingerprint(value)
                if found != row["value"]:
                    message, hint = _both_zeros(row, found)
                    raise PrecompileError(message, invariant=3, hint=hint)

    def observe(
        self, code: types.CodeType | None, module_name: str, is_entry: bool, entries: list[Any]
    ) -> None:
        """The signed zeros of one frame's guards, then its ordered dicts."""
        for e in entries:
            self._observe_zero_float(e, module_name if not is_entry else None, code)
        for e in entries:
            self._observe_ordered_dict(e, code, module_name, is_entry, entries)

    def _observe_ordered_dict(
        self,
        e: Any,
        code: types.CodeType | None,
        module_name: str,
        is_entry: bool,
        entries: list[Any],
    ) -> None:
        """An OrderedDict whose keys a guard compares by position (``DICT_KEYS_MATCH``):
        the guard reads the order of the underlying dict, while iterating an
        OrderedDict follows its own links, which ``move_to_end`` (or ``popitem`` and a
        re-insert) reorders without touching the dict's order -- so the guard passes a
        reordered OrderedDict that eager iterates in the new order. Its access path is
        recorded (``ORDERED_DICTS``; from fn's arguments or a module global) and every
        call checks that both orders agree; one reached only in a later frame by no
        such path is refused."""
        if not getattr(e, "has_value", False) or not isinstance(e.value, collections.OrderedDict):
            return
        kinds = {e.guard_type, *(getattr(e, "derived_guard_types", None) or ())}
        if "DICT_KEYS_MATCH" not in kinds:
            return
        match = ACCESS_ROOT.match(e.name)
        if match is None:
            return
        path, module = e.name, None
        if match.group("global"):
            module = module_name or self.paths.fn.__module__
        elif not is_entry:
            if any(
                row["module"] is None and evaluates_to(row["path"], self.paths.arguments, e.value)
                for row in self.ordered_dicts.values()
            ):
                return  # the very object the entry's row checks
            root = match.group("local")
            found = path_to(e.value, self.paths.arguments)
            if found is not None:
                # The very object an argument holds (``od = cfg`` before the break).
                self.ordered_dicts.setdefault(
                    found, {"path": found, "shown": user_path(found), "module": None}
                )
                return
            if computed_before_break(code, e.name, root):
                # Built by the traced code before the break, which Dynamo rebuilds in
                # its order (a new OrderedDict, whose links follow the dict's order).
                return
            mapped, why, hint = self.paths.from_arguments(code, root, entries)
            if mapped is None:
                self.refusals.append(
                    (
                        f"`{user_path(e.name)}` (a local of "
                        f"{frame_label(code.co_name if code else '?')}) is an OrderedDict "
                        f"whose key order the trace depends on; an artifact checks that order "
                        f"per call by its path from fn's arguments, and {why}",
                        "iterate it before any graph break, or pass a plain dict",
                    )
                )
                return
            path = mapped + e.name[len(root) :]
        elif match.group("local") not in self.paths.signature.parameters:
            return
        key = path if module is None else f"{module}:{path}"
        self.ordered_dicts.setdefault(
            key, {"path": path, "shown": user_path(path), "module": module}
        )

    def _observe_zero_float(
        self, e: Any, later_frame_module: str | None, code: types.CodeType | None
    ) -> None:
        """A number guarded equal to a signed zero -- a float equal to 0.0, a complex
        with a zero part -- at a path from fn's arguments, or from a module global (in
        any frame): Dynamo's guard is ``==``, which the other sign passes too, so the
        value the trace computed with is recorded as its literal fingerprint
        (``FLOAT_ZEROS``) and checked per call. A later frame's local (a continuation
        after a graph break, a helper frame) is refused unless it is the very object at
        a path from fn's arguments that is checked so (passed down unchanged): it may
        hold a value computed at run time (``t.item()``), which no check sees."""
        if not getattr(e, "has_value", False):
            return
        value = e.value
        if type(value) is float:
            if value != 0.0:
                return
        elif type(value) is complex:
            if value.real != 0.0 and value.imag != 0.0:
                return
        else:
            return
        match = ACCESS_ROOT.match(e.name)
        if match is None:
            return
        module = None
        if match.group("global"):
            module = later_frame_module or self.paths.fn.__module__
        elif later_frame_module is not None:
            if self._checked_argument(value):
                return
            frame = frame_label(code.co_name if code else "?")
            self.refusals.append(
                (
                    f"`{user_path(e.name)}` in {frame} (a frame after a graph break, or a "
                    f"helper frame) was {literal_fingerprint(value)[1]} when captured; "
                    f"Dynamo's guard compares it with ==, which does not tell a zero from "
                    f"the other sign's, and the artifact can check the sign only of fn's "
                    f"arguments and module globals, so a call whose value there has the "
                    f"other sign would be answered with the captured one",
                    "keep the value a tensor (no .item() / .tolist() before the break), or "
                    "keep the code that uses it in fn's own graph (no graph break before it)",
                )
            )
            return
        elif match.group("local") not in self.paths.signature.parameters:
            return
        captured = literal_fingerprint(value)
        key = e.name if module is None else f"{module}:{e.name}"
        row = self.float_zeros.setdefault(
            key, {"path": e.name, "shown": user_path(e.name), "value": captured, "module": module}
        )
        if row["value"] != captured:
            self.refusals.append(_both_zeros(row, captured))

    def _checked_argument(self, value: Any) -> bool:
        """Whether ``value`` is, in the call being captured, the very object at a path
        from fn's arguments whose sign ``FLOAT_ZEROS`` checks per call."""
        for row in self.float_zeros.values():
            if row["module"] is None:
                try:
                    if eval(row["path"], {}, self.paths.arguments) is value:
                        return True
                except Exception:
                    continue
        return False

    def verify_ordered_dicts(self, arguments: dict[str, Any]) -> None:
        """After a captured call: each argument-rooted ``ORDERED_DICTS`` path must
        evaluate, from the arguments, to an OrderedDict (what serving evaluates)."""
        for row in self.ordered_dicts.values():
            if row["module"] is not None:
                continue
            try:
                found = eval(compile(row["path"], "<precompile>", "eval"), {}, dict(arguments))
            except Exception:
                found = None
            if not isinstance(found, collections.OrderedDict):
                self.refusals.append(
                    (
                        f"`{row['shown']}` is an OrderedDict whose key order the trace "
                        f"depends on, and precompile cannot read that path again from fn's "
                        f"arguments to check the order per call",
                        "pass a plain dict, or one reached plainly from fn's arguments",
                    )
                )

    def rows(self) -> dict[str, list[dict[str, Any]]]:
        """``FLOAT_ZEROS`` and ``ORDERED_DICTS``, as artifact literals."""
        return {
            "FLOAT_ZEROS": list(self.float_zeros.values()),
            "ORDERED_DICTS": list(self.ordered_dicts.values()),
        }
