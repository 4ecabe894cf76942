"""What a single-graph trace itself changed in Python: side effects an artifact, which
runs no Python, would not repeat, refused at capture.

``Snapshot`` holds the state before the trace (module attributes and training flags,
the globals of the project's modules, by the identity of what they hold);
``ArgumentWatch`` holds fn's arguments as the trace passed them (containers appended
to, a tensor's ``requires_grad`` flipped, a parameter or buffer rebound).
``refuse_trace_side_effects`` names every change found.
"""

from __future__ import annotations

import logging
import sys
import types
from typing import Any

import torch

from precompile._compat import tracing
from precompile.capturing.bytecode_names import global_names
from precompile.capturing.fx_tensor_attributes import python_attributes
from precompile.capturing.fx_watch import CallLog
from precompile.capturing.user_state import base_contents
from precompile.errors import PrecompileError
from precompile.locations import is_project_module
from precompile.runtime import value_fingerprints


class _Everything:
    """A name set that holds every name: fingerprints everything an object has."""

    def __contains__(self, name: object) -> bool:
        return True


class Snapshot:
    """The state before a trace, to tell what the trace itself changed: Python side
    effects that an artifact, which runs no Python, would not repeat -- module
    attributes and training flags, and the globals of the project's modules (the ones
    the traced code read or wrote are compared afterwards, with the objects they hold)."""

    def __init__(self, modules: list[torch.nn.Module]) -> None:
        self.modules = [
            [(name, _attr_fps(sub)) for name, sub in m.named_modules()] for m in modules
        ]
        self.training = [[(n, sub.training) for n, sub in m.named_modules()] for m in modules]
        self.scopes = {
            id(vars(module)): (name, _scope_contents(vars(module)))
            for name, module in list(sys.modules.items())
            if is_project_module(module)
        }

    def changed_during(
        self, modules: list[torch.nn.Module], names: frozenset[str], log: CallLog | None = None
    ) -> list[str]:
        changes = []
        multi = len(modules) > 1
        for mi, (m, before) in enumerate(zip(modules, self.modules)):
            prefix = f"m{mi}." if multi else ""
            after = [(name, _attr_fps(sub)) for name, sub in m.named_modules()]
            for (name, old), (_, new) in zip(before, after):
                for attr in sorted((old.keys() | new.keys()) & names):
                    if old.get(attr) != new.get(attr):
                        owner = prefix + name
                        changes.append(f"{owner + '.' if owner else ''}{attr}")
            for (name, flag), (_, sub) in zip(self.training[mi], m.named_modules()):
                owner = prefix + name
                where = f"{owner + '.' if owner else ''}training"
                if sub.training != flag and where not in changes:
                    changes.append(where)
        if log is not None:
            changes += self._globals_changed(log)
        return changes

    def _globals_changed(self, log: CallLog) -> list[str]:
        """The module globals the traced project code named that the trace rebound, or
        whose list, dict, set or plain object it changed in place, each with the
        functions whose code names it (a hook that fills a list is named, not the
        ``Module._call_impl`` that ran it)."""
        changes: list[str] = []
        named_by: dict[str, list[str]] = {}
        for code in log.project_codes():
            scope = log.scopes.get(code)
            recorded = self.scopes.get(id(scope)) if scope is not None else None
            if scope is None or recorded is None:
                continue
            module, before = recorded
            for name in global_names(code):
                if name.startswith("__"):
                    continue  # the import system's (``__name__``): not snapshotted
                where = f"global {name} of module {module}"
                by = f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"
                if where in changes:
                    named_by[where].append(by)
                    continue
                if name not in before and name not in scope:
                    continue
                if (
                    name not in before
                    or name not in scope
                    or _contents(scope[name], _DEPTH) != before[name]
                ):
                    changes.append(where)
                    named_by[where] = [by]
        return [f"{where}, named by {' and '.join(named_by[where])}" for where in changes]


#: How deep a global's contents are compared (CALLS[0], CFG.stats["n"]).
_DEPTH = 3
#: Containers longer than this are compared by identity and length only.
_WIDTH = 10_000


def _scope_contents(scope: dict[str, Any]) -> dict[str, Any]:
    return {
        name: _contents(value, _DEPTH)
        for name, value in base_contents(scope)
        if not name.startswith("__")
    }


def _contents(value: Any, depth: int) -> Any:
    """What a global holds, by identity: the object, and for a list, tuple, dict, set,
    bytearray or plain object (its ``__dict__``) the objects inside, ``depth`` levels
    down. Equal results mean no rebinding and no in-place change the trace could make
    through Python (a tensor's data is not Python state: it is read as a constant).
    Read through the builtin bases' methods (``base_contents``): a subclass's own run
    code."""
    if depth <= 0 or isinstance(value, (types.ModuleType, type, types.FunctionType, torch.Tensor)):
        return id(value)
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        held = base_contents(value)
        if len(held) > _WIDTH:
            return (id(value), len(held))
        if isinstance(value, dict):
            return (id(value), tuple((k, _contents(v, depth - 1)) for k, v in held))
        if isinstance(held, set):
            return (id(value), frozenset(map(id, held)))
        return (id(value), tuple(_contents(v, depth - 1) for v in held))
    if isinstance(value, bytearray):
        return (id(value), bytes(value))
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict) and isinstance(value, logging.Logger):
        # ``LOG.debug(...)`` fills the logger's level cache: bookkeeping, not a store
        # the traced code made (a level set is one).
        kept = [(k, v) for k, v in base_contents(attrs) if k != "_cache"]
        return (id(value), tuple((k, _contents(v, depth - 2)) for k, v in kept))
    if isinstance(attrs, dict) and not isinstance(value, torch.nn.Module):
        return (id(value), _contents(attrs, depth - 1))
    return id(value)


class ArgumentWatch:
    """fn's arguments as the trace passed them, to tell what fn's Python did to them: a
    list appended to or a dict stored into (the trace passes containers rebuilt from
    the caller's, so the caller's are never changed at capture, and an artifact would
    not change them either), a tensor's ``requires_grad`` flipped (a parameter's, an
    input's: the trace flips its stand-in)."""

    def __init__(
        self,
        tensors: list[tuple[str, torch.Tensor]],
        arguments: list[tuple[int, Any]],
        slots: list[tuple[str, torch.nn.Module, str, torch.Tensor]],
    ) -> None:
        self.tensors = tensors
        self.flags = [bool(t.requires_grad) for _, t in tensors]
        # The names of the stand-ins' public Python attributes: torch's own (a fake
        # tensor's ``fake_mode``); a real tensor's are not copied onto its stand-in.
        self.attributes = [frozenset(_public_attributes(t)) for _, t in tensors]
        self.arguments = arguments
        self.before = [tracing.pytree.tree_flatten(value) for _, value in arguments]
        #: (label, module, qualified name, the tensor the trace swapped in there).
        self.slots = slots

    def changes(self) -> list[str]:
        """What fn's Python did to its arguments; read while the trace's tensors are
        still swapped into the modules: ``self.mean = f(self.mean)`` rebinds a buffer
        in the module, and the swap's exit puts the original back over it, so after
        the trace neither the module nor any snapshot shows the store (an artifact
        would serve every call from the captured buffer)."""
        found = [
            f"{label}.requires_grad"
            for (label, t), flag in zip(self.tensors, self.flags)
            if bool(t.requires_grad) != flag
        ]
        found += [
            f"{label}.{name} (a Python attribute set on the trace's stand-in)"
            for (label, t), before in zip(self.tensors, self.attributes)
            for name in sorted(_public_attributes(t).keys() - before)
        ]
        found += [
            f"{label} rebound (fn set it to another object)"
            for label, module, name, swapped in self.slots
            if _slot(module, name) is not swapped
        ]
        for (position, value), (leaves, spec) in zip(self.arguments, self.before):
            now, now_spec = tracing.pytree.tree_flatten(value)
            if now_spec != spec or len(now) != len(leaves) or any(map(_is_not, now, leaves)):
                found.append(f"the {type(value).__name__} passed as fn's argument {position}")
        return found


def _public_attributes(tensor: torch.Tensor) -> dict[str, Any]:
    """A tensor's Python attributes whose names are not private (torch keeps its own
    bookkeeping on a fake tensor under private names)."""
    return {k: v for k, v in python_attributes(tensor).items() if not k.startswith("_")}


def _slot(module: torch.nn.Module, name: str) -> object:
    """What ``module``'s dotted ``name`` holds now (None where it is gone: a submodule
    on its path replaced or deleted counts as the slot rebound)."""
    prefix, _, leaf = name.rpartition(".")
    try:
        return getattr(module.get_submodule(prefix), leaf)
    except AttributeError:
        return None


def _is_not(a: object, b: object) -> bool:
    return a is not b


def _attr_fps(module: torch.nn.Module) -> dict[str, Any]:
    context = value_fingerprints.new_context(_Everything())
    record = value_fingerprints.module_fingerprint(module, context, children=False)
    return dict(record[1]) | {"<hooks>": record[2], "<type>": record[0]}


def refuse_trace_side_effects(changes: list[str], where: Any) -> None:
    if changes:
        raise PrecompileError(
            f"fn changed state in Python while it was traced ({', '.join(changes)}); an "
            f"artifact runs no Python, so served calls would not repeat that change",
            invariant=4,
            location=where,
            hint="return the value from fn instead of storing it (into an argument or a "
            "global), keep per-call state in tensors (a registered buffer updated in "
            "place), make the change outside fn, or capture with precompile.DynamoTracer(), "
            "which repeats a store it can replay and refuses one it cannot",
        )
