"""Capture side: records every call Dynamo's guard builder makes on the C++ guard managers.

``guard_translation.plain_guard_program`` rebuilds a variant's guard tree through
Dynamo's own ``load_guard_manager`` while a ``GuardRecorder`` is active: the pybind
methods that make child managers (accessors), add leaf guards, and install relational
guards are patched for the duration, and each call is logged with its arguments and
the manager it made, under a lock (the patches are process-wide).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

_recording = threading.Lock()


class GuardRecorder:
    """Every call Dynamo's guard builder makes on the C++ managers while it is active
    (methods patched on the pybind classes, restored on exit)."""

    def __init__(self) -> None:
        self.log: list[tuple[int | None, str, tuple[Any, ...], dict[str, Any], int | None, str]]
        self.log = []
        self._ids: dict[int, int] = {}
        self._alive: list[Any] = []
        self._saved: list[tuple[Any, str, Any]] = []

    @property
    def ids(self) -> dict[int, int]:
        """Recorder node id by ``id()`` of each manager it saw."""
        return self._ids

    def node(self, manager: Any) -> int:
        if id(manager) not in self._ids:
            self._ids[id(manager)] = len(self._ids)
            self._alive.append(manager)  # ids stay unique while the record lives
        return self._ids[id(manager)]

    def _patch(self, owner: Any, name: str) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        classes = torch._C._dynamo.guards

        def recorded(this: Any, *args: Any, **kwargs: Any) -> Any:
            made = original(this, *args, **kwargs)
            child = self.node(made) if isinstance(made, classes.GuardManager) else None
            self.log.append((self.node(this), name, args, kwargs, child, type(made).__name__))
            return made

        setattr(owner, name, recorded)

    def _patch_free(self, module: Any, name: str) -> None:
        original = getattr(module, name)
        self._saved.append((module, name, original))

        classes = torch._C._dynamo.guards

        def as_nodes(value: Any) -> Any:
            if isinstance(value, classes.GuardManager):
                return ("node", self.node(value))
            if isinstance(value, list):
                return [as_nodes(v) for v in value]
            return value

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.log.append((None, name, tuple(as_nodes(a) for a in args), kwargs, None, ""))
            return original(*args, **kwargs)

        setattr(module, name, recorded)

    @contextlib.contextmanager
    def active(self) -> Iterator[GuardRecorder]:
        import torch._dynamo.guards as dynamo_guards

        classes = torch._C._dynamo.guards
        with _recording:
            try:
                for name in dir(classes.GuardManager):
                    if name.startswith(("add_", "mark_")) or (
                        name.endswith("_manager") and name != "get_child_managers"
                    ):
                        self._patch(classes.GuardManager, name)
                for name in ("get_key_manager", "get_value_manager"):
                    self._patch(classes.DictGuardManager, name)
                self._patch(classes.RootGuardManager, "add_epilogue_lambda_guard")
                for name in dir(dynamo_guards):
                    if name.startswith("install_") and name.endswith("_guard"):
                        self._patch_free(dynamo_guards, name)
                yield self
            finally:
                for owner, name, original in reversed(self._saved):
                    setattr(owner, name, original)
                self._saved.clear()
