"""Calls back as each project module's import ends, however it was imported.

A capture records the user's state before the trace runs fn; a project module fn
imports for the first time did not exist then, and a store fn makes into it
(``stats.CALLS.append(1)``) would be a change from nothing recorded. ``loaded_modules``
hands each such module over as its code has run, before fn goes on: an ``import``
statement, ``importlib.import_module`` and ``importlib.reload`` all find a module
through ``sys.meta_path``, where a finder here wraps the loader of a project module
for the length of its execution.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from precompile.locations import is_project_file


class _Finder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: asks the finders after it, and wraps the loader of a
    project module it is asked for."""

    def __init__(self, loaded: Callable[[types.ModuleType], None]) -> None:
        self.loaded = loaded

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if isinstance(finder, _Finder) or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if (
            loader is not None
            and hasattr(loader, "exec_module")
            and isinstance(spec.origin, str)
            and is_project_file(spec.origin)
        ):
            spec.loader = _Loader(loader, self.loaded)
        return spec


class _Loader(importlib.abc.Loader):
    """The module's own loader, handing the module over once its code has run and
    leaving the module's ``__loader__`` and ``__spec__.loader`` its own again."""

    def __init__(self, real: Any, loaded: Callable[[types.ModuleType], None]) -> None:
        self._real = real
        self._loaded = loaded

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        module: types.ModuleType | None = self._real.create_module(spec)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        try:
            self._real.exec_module(module)
        finally:
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._real
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._real
        self._loaded(module)


@contextlib.contextmanager
def loaded_modules(loaded: Callable[[types.ModuleType], None]) -> Iterator[None]:
    """Call ``loaded`` with each project module whose code runs in the block."""
    finder = _Finder(loaded)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)
