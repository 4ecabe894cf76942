"""Where a value a Dynamo trace read lives, as an access path from fn's arguments: shared by
the recorders of what the arguments reach (``dynamo_identity_records``,
``dynamo_value_records``), whose rows an artifact evaluates from the arguments on every
call (``runtime.multigraph_argument_checks``).

Dynamo names what a guard reads by its access path from the guarded frame's locals
(``ACCESS_ROOT``). fn's own frame is rooted at fn's parameters; a later frame (a
continuation after a graph break, a child module's ``forward``) is rooted at its own
locals, which an artifact never sees. ``ArgumentPaths`` holds the arguments of the call
being captured and maps such a local to the one expression over fn's parameters that
holds it on every call -- a parameter a continuation never rebinds, or the one module of
its classes reachable from the arguments -- or says why there is none.
"""

from __future__ import annotations

import dis
import inspect
import re
import types
from typing import Any

import torch

from precompile._compat import dynamo
from precompile.runtime.guard_text import user_path

#: Dynamo names a guard's access path from its root: a frame local by its name
#: (``model._modules['fc']``), a global as ``G['name']``.
ACCESS_ROOT = re.compile(r"^(?:G\[(['\"])(?P<global>.+?)\1\]|(?P<local>[A-Za-z_]\w*))")

#: What a path that cannot be evaluated evaluates to.
_MISSING = object()


class ArgumentPaths:
    """fn's arguments in the captured call, and the later frames' locals mapped to paths
    from them."""

    def __init__(self, fn: types.FunctionType) -> None:
        self.fn = fn
        self.signature = inspect.signature(fn)
        #: fn's arguments in the captured call being traced (later frames' identity
        #: reads are mapped to paths from them).
        self.arguments: dict[str, Any] = {}
        #: Modules the trace read from module globals, by how fn names them.
        self.global_modules: dict[str, torch.nn.Module] = {}
        #: A later frame's ``self`` mapped to its path from the arguments: (path, the
        #: module, its classes). Sound only if no module fn reads from a global is
        #: another instance of those classes (checked once every frame is observed).
        self.frame_owners: list[tuple[str, torch.nn.Module, tuple[type, ...]]] = []

    def from_arguments(
        self, code: types.CodeType | None, root: str, entries: list[Any]
    ) -> tuple[str | None, str, str]:
        """The expression over fn's parameters that evaluates, on every call, to what the
        local ``root`` of a later frame holds -- or None with why not and a hint.

        A continuation of fn's own frame: a parameter fn never rebinds, holding the
        argument. Any other frame (a child module's ``forward``, its continuations):
        a module that is the only one of its classes reachable from fn's module
        arguments, at one path (a frame runs for every instance of its class, and one
        captured variant serves them all)."""
        held = next(
            (
                getattr(e, "value", None)
                for e in entries
                if e.name == root and getattr(e, "has_value", False)
            ),
            _MISSING,
        )
        if code is not None and dynamo.resumed_code(code) is self.fn.__code__:
            if root not in self.signature.parameters:
                return (
                    None,
                    f"`{user_path(root)}` is not one of fn's parameters",
                    "read it from fn's arguments after the graph break, or pass it as a "
                    "plain value",
                )
            if _rebinds(self.fn.__code__, root):
                return (
                    None,
                    f"fn rebinds its parameter `{root}`, so after the graph break it need "
                    f"not be the argument",
                    f"give the new value another name than `{root}`",
                )
            if held is _MISSING or held is not self.arguments.get(root, _MISSING):
                return (
                    None,
                    f"`{root}` no longer held fn's argument after the graph break",
                    f"give the new value another name than `{root}`",
                )
            return root, "", ""
        hint = (
            "read it in fn itself, from its arguments, before any graph break; or keep one "
            "module of each class whose forward breaks the graph; or pass it as a plain value"
        )
        if root.startswith("___stack") or not isinstance(held, torch.nn.Module):
            return None, "that local is not a module reachable from fn's arguments", hint
        classes = tuple(c for c in type(held).__mro__ if c not in torch.nn.Module.__mro__)
        found: list[str] = []
        others: list[str] = []
        for name, argument in self.arguments.items():
            if not isinstance(argument, torch.nn.Module):
                continue
            for dotted, module in argument.named_modules(remove_duplicate=False):
                path = name + "".join(f"._modules[{part!r}]" for part in dotted.split(".") if part)
                if module is held:
                    found.append(path)
                elif classes and isinstance(module, classes):
                    others.append(path)
        if len(found) != 1:
            why = (
                "that module is not reachable from fn's arguments"
                if not found
                else f"that module is reachable at {len(found)} paths from fn's arguments"
            )
            return None, why, hint
        if others:
            return (
                None,
                f"`{user_path(found[0])}` and `{user_path(others[0])}` are modules of one "
                f"class, which run one captured frame",
                hint,
            )
        self.frame_owners.append((found[0], held, classes))
        return found[0], "", ""

    def shared_frames(self) -> tuple[str, str] | None:
        """A mapped frame owner with a twin fn reads from a module global: the captured
        frame serves both, and only the owner's path is checked per call."""
        for path, owner, classes in self.frame_owners:
            for name, root in self.global_modules.items():
                for dotted, module in root.named_modules(remove_duplicate=False):
                    if module is not owner and classes and isinstance(module, classes):
                        twin = ".".join(part for part in (name, dotted) if part)
                        return (
                            f"`{user_path(path)}` and the module-level `{twin}` are modules "
                            f"of one class, which run one captured frame",
                            "read such attributes in fn itself, from its arguments, before "
                            "any graph break; or pass the module-level module as an argument",
                        )
        return None


def path_to(target: Any, arguments: dict[str, Any], depth: int = 4) -> str | None:
    """An expression over fn's ``arguments`` that evaluates to ``target`` itself,
    through dict items, list and tuple items, and module or object attributes (at most
    ``depth`` steps); None when there is none."""
    pending: list[tuple[str, Any, int]] = [(name, value, 0) for name, value in arguments.items()]
    seen: set[int] = set()
    while pending:
        path, value, steps = pending.pop(0)
        if value is target:
            return path
        if id(value) in seen or steps >= depth or isinstance(value, (torch.Tensor, type)):
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            children = [(f"{path}[{k!r}]", v) for k, v in value.items() if _literal_key(k)]
        elif isinstance(value, (list, tuple)):
            children = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, torch.nn.Module):
            children = [(f"{path}.{n}", v) for n, v in vars(value).items() if n.isidentifier()]
            children += [(f"{path}.{n}", v) for n, v in value._modules.items() if n.isidentifier()]
        elif hasattr(value, "__dict__") and not isinstance(value, types.ModuleType):
            attrs = getattr(value, "__dict__", None)
            children = [
                (f"{path}.{n}", v)
                for n, v in (attrs.items() if isinstance(attrs, dict) else ())
                if isinstance(n, str) and n.isidentifier()
            ]
        else:
            continue
        pending.extend((p, v, steps + 1) for p, v in children)
    return None


def _literal_key(key: Any) -> bool:
    """Whether a dict key reads back from its repr (a str, int or bool)."""
    return type(key) in (str, int, bool)


def computed_before_break(code: types.CodeType | None, name: str, root: str) -> bool:
    """Whether the guarded ``name`` is a continuation's local ``root`` itself, computed
    by the traced code before the graph break (not the result of an eager call)."""
    resumes = code is not None and dynamo.resumed_code(code) is not code
    return resumes and name == root and code is not None and not _eager_result(code, root)


def evaluates_to(path: str, arguments: dict[str, Any], value: Any) -> bool:
    """Whether ``path`` evaluates, over fn's ``arguments``, to ``value`` itself."""
    try:
        return eval(compile(path, "<precompile>", "eval"), {}, dict(arguments)) is value
    except Exception:
        return False


#: Instructions that rebind (or unbind) a local or a cell.
_REBINDING = frozenset({"STORE_FAST", "DELETE_FAST", "STORE_DEREF", "DELETE_DEREF"})


def _rebinds(code: types.CodeType, name: str) -> bool:
    """Whether ``code`` (or a function nested in it, through a shared cell) rebinds the
    local ``name``."""
    if any(i.opname in _REBINDING and i.argval == name for i in dis.get_instructions(code)):
        return True
    return name in code.co_cellvars and any(
        isinstance(const, types.CodeType) and name in const.co_freevars and _rebinds(const, name)
        for const in code.co_consts
    )


def _eager_result(code: types.CodeType | None, root: str) -> bool:
    """Whether a continuation's local ``root`` is the value the instruction that broke
    the graph produced, which ran as plain Python (the top of the carried stack): not
    computed by traced code, so nothing read before the break vouches for it."""
    if code is None or not root.startswith("___stack"):
        return False
    stack = [n for n in code.co_varnames[: code.co_argcount] if n.startswith("___stack")]
    return bool(stack) and root == stack[-1]
