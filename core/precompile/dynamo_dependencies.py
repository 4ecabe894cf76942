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

- **Objects compared by identity, reached from fn's arguments** (``model.act = torch.relu``,
  ``model.mode = Mode.A``, a class, a user function, a sentinel ``object()``): Dynamo
  guards them by id and the guard is dropped. They are recorded by a name another process
  can resolve -- a function, class or builtin by module and qualified name, an enum member
  by class and member name, a closure by its code, anything else by the module global it
  is bound to -- and every call compares the live object by identity
  (``ARG_IDENTITIES``). An object with no such name is refused at capture.
- **Grad mode read by the trace** (``torch.is_grad_enabled()``, in user or library code):
  the driver serves under the captured grad mode, so a call made in another grad mode is
  refused instead of being answered as the captured mode would (``GRAD_MODE_READ``).

The checks themselves are ``precompile.dependency_driver``, emitted into artifacts.

Messages name things in the user's words (``precompile.guard_text``).
"""

from __future__ import annotations

import enum
import inspect
import os
import re
import sys
import types
from typing import Any

import torch

from precompile import _compat
from precompile.dependency_driver import code_identity, global_hook_snapshot, hook_snapshot
from precompile.errors import PrecompileError
from precompile.guard_text import frame_label, user_path

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


#: Hook dicts: the functions in them are checked by name (``MODULE_HOOKS``).
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
#: Where a builtin whose ``__qualname__`` does not resolve (``torch.relu`` is
#: ``_VariableFunctionsClass.relu``) is looked up by its ``__name__``.
_BUILTIN_HOMES = (
    "torch",
    "torch.nn.functional",
    "torch.special",
    "torch.linalg",
    "torch.fft",
    "math",
    "operator",
    "builtins",
)


def _resolves(module: str, qualname: str, value: Any) -> bool:
    owner: Any = sys.modules.get(module)
    for part in qualname.split("."):
        owner = getattr(owner, part, None)
    return owner is value


def _import_name(value: Any) -> tuple[str, str] | None:
    """(module, qualname) by which another process imports ``value`` (a function, class
    or builtin), or None."""
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and _resolves(module, qualname, value):
        return module, qualname
    name = getattr(value, "__name__", None)
    if isinstance(name, str):
        for home in (module, *_BUILTIN_HOMES) if isinstance(module, str) else _BUILTIN_HOMES:
            if getattr(sys.modules.get(home), name, None) is value:
                return home, name
    return None


def _bound_global(value: Any, modules: list[str]) -> tuple[str, str] | None:
    """(module, name) of a module global bound to ``value``, searched in ``modules``."""
    for module_name in modules:
        for name, bound in list(vars(sys.modules.get(module_name) or types).items()):
            if bound is value and not name.startswith("__"):
                return module_name, name
    return None


def _shown(value: Any) -> str:
    """An identity-compared value in words (no addresses)."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    named = _import_name(value)
    if named is not None:
        return f"{named[0]}.{named[1]}"
    if isinstance(value, types.FunctionType):
        return f"function {value.__module__}.{value.__qualname__}"
    return f"a {type(value).__qualname__} object"


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
        #: The objects those global reads found (a continuation may carry one as a local).
        self.read_values: list[Any] = []
        #: Access path from an argument -> identity row (``ARG_IDENTITIES``), and the
        #: object the capture saw there (checked against the arguments after each call).
        self.identities: dict[str, dict[str, Any]] = {}
        self.identity_values: dict[str, Any] = {}
        #: Why the capture cannot be served: objects compared by identity and unnameable.
        self.refusals: list[tuple[str, str]] = []
        #: Whether a trace read the grad mode (``torch.is_grad_enabled()``).
        self.grad_mode_read = False

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
            self.read_values.append(e.value)
            read_code = getattr(getattr(e.value, "__func__", e.value), "__code__", None)
            if isinstance(read_code, types.CodeType):
                self.read_codes.setdefault(read_code, None)
        for e in entries:
            if not getattr(e, "has_value", False):
                continue
            if e.value is torch.is_grad_enabled:
                self.grad_mode_read = True
            numpy = re.fullmatch(r"___from_numpy\((.+)\)", e.name)
            if numpy is not None:
                # Dynamo guards a numpy scalar or array as a tensor it made from it, and
                # that guard does not survive serialization: every load would fail.
                self.refusals.append(
                    (
                        f"`{user_path(numpy.group(1))}` is a numpy value, which Dynamo guards "
                        f"in a form an artifact cannot load",
                        "store a Python number (float(...), int(...)) or a torch tensor "
                        "instead of a numpy value",
                    )
                )
        for e in entries:
            self._observe_identity(e, code, module_name, entries)

    def _observe_identity(
        self, e: Any, code: types.CodeType | None, module_name: str, entries: list[Any]
    ) -> None:
        """An argument-rooted guard that compares an identity (or a TYPE_MATCH on a bare
        ``object()``, which code can only compare by identity): record it by a name
        another process resolves, or refuse."""
        if not getattr(e, "has_value", False):
            return
        match = _ROOT.match(e.name)
        if match is None or not match.group("local") or any(h in e.name for h in _HOOK_DICTS):
            return
        value = e.value
        sentinel = e.guard_type == "TYPE_MATCH" and type(value) is object
        if not (sentinel or _compat.compares_identity(e)):
            return
        if value is None or isinstance(
            value, (bool, torch.nn.Module, torch.Tensor, types.ModuleType)
        ):
            return  # None and bools are kept as values; modules and tensors checked apart
        root = match.group("local")
        if e.name[len(root) : len(root) + 1] == "(":
            return  # a call (``dict(C.__dict__)``), not a local
        path = user_path(e.name)
        if code is not self.fn.__code__:
            if code is not None and not (
                root.startswith("___stack") or root in (*code.co_varnames, *code.co_cellvars)
            ):
                return
            if any(value is seen for seen in (*self.read_values, *self.identity_values.values())):
                # A global read, or an object fn's frame reached from its arguments,
                # carried across a graph break: checked where fn's frame read it.
                return
            self.refusals.append(
                (
                    f"`{path}` (a local of {frame_label(code.co_name if code else '?')}) "
                    f"holds {_shown(value)}, "
                    f"which the trace compared by identity; an artifact checks such objects "
                    f"only when fn's own frame reaches them from its arguments",
                    "read it in fn itself (before any graph break), or pass it as a plain " "value",
                )
            )
            return
        if match.group("local") not in self.signature.parameters:
            return
        row = self._identity_row(value, module_name, entries)
        if row is None:
            self.refusals.append(
                (
                    f"`{path}` holds {_shown(value)}, which the trace compared by identity "
                    f"(`is`, or a call of it), and no other process can name that object",
                    "bind it to a module-level name (MODE = object() at module level), use "
                    "an Enum member, or store a module-level function or class",
                )
            )
            return
        row |= {"param": match.group("local"), "path": e.name, "shown": path}
        self.identities.setdefault(e.name, row)
        self.identity_values.setdefault(e.name, value)

    def _identity_row(
        self, value: Any, module_name: str, entries: list[Any]
    ) -> dict[str, Any] | None:
        """How another process names ``value``: kind and the names to resolve."""
        if isinstance(value, enum.Enum):
            owner = _import_name(type(value))
            if owner is None:
                return None
            return {"kind": "enum", "module": owner[0], "qualname": owner[1], "member": value.name}
        if isinstance(value, types.FunctionType) and value.__closure__:
            # Dynamo compares a closure's code (its cells are guarded as values).
            return {
                "kind": "code",
                "module": value.__module__,
                "qualname": value.__code__.co_qualname,
                "code": code_identity(value.__code__),
            }
        named = _import_name(value)
        if named is not None:
            return {"kind": "named", "module": named[0], "qualname": named[1]}
        for other in entries:
            global_name = _ROOT.match(other.name)
            if (
                global_name is not None
                and global_name.group("global")
                and other.name == global_name.group(0)
                and getattr(other, "has_value", False)
                and other.value is value
            ):
                return {
                    "kind": "global",
                    "module": module_name,
                    "qualname": global_name.group("global"),
                }
        modules = [module_name, self.fn.__module__, getattr(type(value), "__module__", "")]
        bound = _bound_global(value, [m for m in dict.fromkeys(modules) if m])
        if bound is not None:
            return {"kind": "global", "module": bound[0], "qualname": bound[1]}
        if isinstance(value, types.FunctionType):
            return {
                "kind": "code",
                "module": value.__module__,
                "qualname": value.__code__.co_qualname,
                "code": code_identity(value.__code__),
            }
        return None

    def verify(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """After a captured call: every identity path must evaluate, from the arguments,
        to the object the capture saw (what serving evaluates); refuse one that cannot."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            return
        bound.apply_defaults()
        for path, row in self.identities.items():
            try:
                found = eval(compile(path, "<precompile>", "eval"), {}, dict(bound.arguments))
            except Exception:
                found = _MISSING
            if found is not self.identity_values[path]:
                self.refusals.append(
                    (
                        f"`{row['shown']}` holds {_shown(self.identity_values[path])}, which "
                        f"the trace compared by identity, and precompile cannot read that "
                        f"path again from fn's arguments to check it per call",
                        "store it where fn's arguments reach it plainly (an attribute of an "
                        "argument), or pass it as a plain value",
                    )
                )

    def metadata(self) -> dict[str, Any]:
        """``MODULE_HOOKS``, ``GLOBAL_READS``, ``ARG_IDENTITIES`` and ``GRAD_MODE_READ``,
        as artifact literals."""
        if self.refusals:
            message, hint = self.refusals[0]
            raise PrecompileError(message, hint=hint, invariant=1)
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
        identities = list(self.identities.values())
        return {
            "MODULE_HOOKS": {"roots": roots, "global": self.global_hooks or {}},
            "GLOBAL_READS": reads,
            "ARG_IDENTITIES": identities,
            "GRAD_MODE_READ": self.grad_mode_read,
        }


#: What a path that cannot be evaluated evaluates to.
_MISSING = object()
