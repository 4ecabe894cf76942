"""What a Dynamo trace depended on that its serialized guards cannot check, recorded at
capture so an artifact can check it when serving.

Dynamo's own guards on these are identity checks (dropped: an identity does not survive
a process) or skipped altogether (``skip_nnmodule_hook_guards``):

- **Module hooks.** The forward, forward-pre, backward and backward-pre hooks of every
  module the trace reached (found from the guards on module-valued access paths, walked
  to every submodule) and torch's global module hooks: a hook added or removed after
  capture changes the answer, so the artifact records which hooks were there (by
  ``module.qualname``) and refuses a call that meets others.
- **Module-level functions and classes** the frames read (a helper, a namedtuple class,
  ``F.gelu``): recorded by access path with the module and qualified name of what was
  bound there. Serving resolves each path and refuses one bound to something else; every
  call then checks the bindings by identity. Their code (the project's functions among
  them, with every function Dynamo traced) joins ``FUNCTION_SOURCES``, checked at load.

The checks themselves are ``precompile.dependency_driver``, emitted into artifacts.

Messages name things in the user's words (``precompile.guard_text``).
"""

from __future__ import annotations

import inspect
import os
import re
import types
from typing import Any

import torch

from precompile import _compat
from precompile.dependency_driver import global_hook_snapshot, hook_snapshot
from precompile.errors import PrecompileError
from precompile.guard_text import user_path

#: Dynamo names a guard's access path from its root: a frame local by its name
#: (``model._modules['fc']``), a global as ``G['name']``.
_ROOT = re.compile(r"^(?:G\[(['\"])(?P<global>.+?)\1\]|(?P<local>[A-Za-z_]\w*))")


def _qualified(value: Any) -> tuple[str, str] | None:
    """(module, qualname) of a function, class or builtin; None for anything else."""
    if isinstance(value, types.ModuleType):
        return None
    if not isinstance(
        value, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
    ) and not callable(value):
        return None
    target = getattr(value, "__func__", value)
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    return module, qualname


def _location(value: Any) -> str:
    """``file.py:line`` of a function's definition ('' for a class or builtin)."""
    code = getattr(getattr(value, "__func__", value), "__code__", None)
    if code is None:
        return ""
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


class DependencyRecorder:
    """Fed every guard entry Dynamo offers the guard filter, per compiled variant."""

    def __init__(self, fn: types.FunctionType) -> None:
        self.fn = fn
        self.signature = inspect.signature(fn)
        #: (root kind, module or parameter, access path) -> hook snapshot.
        self.roots: dict[tuple[str, str, str], dict[str, dict[str, list[str]]]] = {}
        self.global_hooks: dict[str, list[str]] | None = None
        #: (frame module, access path) -> (module, qualname, location) of what was bound.
        self.reads: dict[tuple[str, str], tuple[str, str, str]] = {}
        self.conflicts: list[str] = []
        #: The code of every function read that way (its source is checked at load).
        self.read_codes: dict[types.CodeType, None] = {}

    def observe(self, code: types.CodeType | None, module_name: str, entries: list[Any]) -> None:
        is_entry = code is self.fn.__code__
        modules = {
            e.name: e.value
            for e in entries
            if getattr(e, "has_value", False) and isinstance(e.value, torch.nn.Module)
        }
        for name, module in modules.items():
            if any(name.startswith((other + ".", other + "[")) for other in modules):
                continue  # reached from a module already recorded
            match = _ROOT.match(name)
            if match is None or (match.group("local") and not is_entry):
                continue  # a continuation's locals: reached from the entry's arguments
            kind = "local" if match.group("local") else "global"
            key = (kind, match.group("local") if kind == "local" else module_name, name)
            snapshot = hook_snapshot(module)
            if self.roots.setdefault(key, snapshot) != snapshot:
                self.conflicts.append(
                    f"the hooks on `{user_path(name)}` changed between captured calls"
                )
        global_snapshot = global_hook_snapshot()
        if self.global_hooks is None:
            self.global_hooks = global_snapshot
        elif self.global_hooks != global_snapshot:
            self.conflicts.append("torch's global module hooks changed between captured calls")
        for e in entries:
            if not (getattr(e, "is_global", False) and getattr(e, "has_value", False)):
                continue
            if not _compat.compares_identity(e) or "__builtins_dict__" in e.name:
                continue
            qualified = _qualified(e.value)
            if qualified is None or not e.name.startswith("G["):
                continue
            self.reads.setdefault((module_name, e.name), (*qualified, _location(e.value)))
            code = getattr(getattr(e.value, "__func__", e.value), "__code__", None)
            if isinstance(code, types.CodeType):
                self.read_codes.setdefault(code, None)

    def metadata(self) -> dict[str, Any]:
        """``MODULE_HOOKS`` and ``GLOBAL_READS``, as artifact literals."""
        if self.conflicts:
            raise PrecompileError(
                f"{self.conflicts[0]}; one artifact serves one set of hooks",
                hint="register the hooks before the first captured call and keep them, or "
                "capture each configuration into its own artifact",
            )
        params = list(self.signature.parameters.values())
        roots = []
        for (kind, owner, path), hooks in sorted(self.roots.items()):
            row: dict[str, Any] = {"kind": kind, "path": path, "hooks": hooks}
            if kind == "local":
                param = self.signature.parameters.get(owner)
                if param is None:
                    continue
                row["param"] = owner
                row["index"] = (
                    params.index(param)
                    if param.kind
                    in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                    else None
                )
                row["variadic"] = param.kind in (
                    inspect.Parameter.VAR_POSITIONAL,
                    inspect.Parameter.VAR_KEYWORD,
                )
            else:
                row["module"] = owner
            roots.append(row)
        reads = [
            {"scope": scope, "path": path, "module": m, "qualname": q, "location": where}
            for (scope, path), (m, q, where) in sorted(self.reads.items())
        ]
        return {
            "MODULE_HOOKS": {"roots": roots, "global": self.global_hooks or {}},
            "GLOBAL_READS": reads,
        }
