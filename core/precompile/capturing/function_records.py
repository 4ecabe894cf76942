"""Records of the functions a capture ran through: module, qualified name, file (relative
to the artifact), first line and a digest of the function's own source.

Loading an artifact compares each with the live source, and the language server compares
them with the workspace to call an artifact stale; both use ``precompile.runtime.source_digest``,
so a change to another function in the same file is not a change to this one.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

from precompile.artifact.pair import artifact_relative
from precompile.locations import is_project_file
from precompile.runtime.source_digest import function_source, parse_module, source_digest


def _module_text(code: types.CodeType) -> tuple[str | None, str | None]:
    """The source of the module ``code`` was defined in, as this process loaded it."""
    module = inspect.getmodule(code)
    if module is None:
        return None, None
    try:
        return module.__name__, inspect.getsource(module)
    except (OSError, TypeError):
        return module.__name__, None


@functools.lru_cache(maxsize=32)
def _parsed(text: str) -> Any:
    """``parse_module(text)``, parsed once per process while the text is unchanged: a
    notebook or a language-server worker recaptures after each edit, mostly of modules
    the edit did not touch, and a long module takes tens of milliseconds to parse. The
    tree is only read (``function_source``)."""
    return parse_module(text)


def function_records(codes: list[types.CodeType], artifact_path: str) -> list[dict[str, Any]]:
    """One record per distinct project function among ``codes`` (torch is pinned by its
    version check; installed libraries change by version, not by edit)."""
    records: dict[tuple[str, str], dict[str, Any]] = {}
    trees: dict[str, Any] = {}  # per module: parsed once for all its functions
    for code in codes:
        if not is_project_file(code.co_filename):
            continue
        qualname = getattr(code, "co_qualname", code.co_name)
        key = (code.co_filename, qualname)
        if key in records:
            continue
        module, text = _module_text(code)
        if module is None or text is None:
            continue
        if module not in trees:
            trees[module] = _parsed(text)
        tree = trees[module]
        source = (
            None if tree is None else function_source(text, qualname, code.co_firstlineno, tree)
        )
        if source is None:
            continue
        records[key] = {
            "module": module,
            "function": qualname,
            "path": artifact_relative(code.co_filename, artifact_path),
            "line": code.co_firstlineno,
            "sha256": source_digest(source),
            # The whole module's: while it is unchanged, no function in it changed, and a
            # load need not parse it (``source_digest.changed_functions``).
            "module_sha256": source_digest(text or ""),
        }
    return sorted(records.values(), key=lambda r: (r["path"], r["line"]))


__all__ = ["function_records"]
