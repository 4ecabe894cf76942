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
  (``ARG_IDENTITIES``). An object with no such name is refused at capture. One read in a
  later frame (a continuation after a graph break, a child module's frame) is checked by
  its path from fn's arguments: a continuation's parameter of fn that it never rebinds,
  or a frame's ``self`` that is the one module of its classes reachable from them. One
  with no such path is refused at capture: an equal object read elsewhere checks nothing.
- **The classes the trace went through**: of every module it reached and of every
  method or property it inlined, with their bases. Dynamo resolves ``Net.__call__``,
  ``Net.forward``, ``Net.encode`` and a property's getter on the class and guards none
  of it, so a rebinding on the class would be served as traced. ``CLASS_ATTRS`` records
  each class by module and qualified name, with a project class's methods and
  descriptors (and, of a library class, the attributes bound to code the trace ran);
  serving checks them at load and per call.
- **Grad mode read by the user's code** (``torch.is_grad_enabled()``, or
  ``.requires_grad`` / ``.grad_fn`` / ``.is_leaf`` of a tensor the trace computed, which
  Dynamo bakes from the capture's grad mode, in fn or any non-torch code it ran): the
  driver serves under the captured grad mode, so a call made in another grad mode is
  refused instead of being answered as the captured mode would (``GRAD_MODE_READ`` says
  what was read). torch's own reads (a fast-path test) pick how to compute, not what:
  they are evaluated against the grad mode the graphs run under, as make_fx's are.

The checks themselves are ``precompile.runtime.multigraph_dependencies``, emitted into artifacts.

Messages name things in the user's words (``precompile.runtime.guard_text``).
"""

from __future__ import annotations

import builtins
import collections
import dis
import enum
import inspect
import os
import re
import sys
import types
from typing import Any

import torch

from precompile._compat import dynamo
from precompile._compat.prelude import MODULE_HOOK_DICTS
from precompile.capturing.bytecode_names import global_loads
from precompile.errors import PrecompileError
from precompile.locations import is_project_file
from precompile.runtime.guard_text import frame_label, user_path
from precompile.runtime.multigraph_dependencies import (
    builtin_key,
    class_attrs,
    global_hook_snapshot,
    hook_snapshot,
)
from precompile.runtime.state_checks import code_fingerprint, literal_fingerprint

#: Dynamo names a guard's access path from its root: a frame local by its name
#: (``model._modules['fc']``), a global as ``G['name']``.
_ROOT = re.compile(r"^(?:G\[(['\"])(?P<global>.+?)\1\]|(?P<local>[A-Za-z_]\w*))")


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
        #: (frame module, access path) -> the read in the words of the code that made
        #: it (``gm.F.gelu``), where Dynamo named it through another module's global.
        self.read_shown: dict[tuple[str, str], tuple[str, str]] = {}
        #: The code of every function read that way (its source is checked at load).
        self.read_codes: dict[types.CodeType, None] = {}
        #: Access path from an argument -> identity row (``ARG_IDENTITIES``), and the
        #: object the capture saw there (checked against the arguments after each call).
        self.identities: dict[str, dict[str, Any]] = {}
        self.identity_values: dict[str, Any] = {}
        #: Access path (``module:path`` for a global) -> relation row
        #: (``ARG_RELATIONS``): an object the trace compared by identity that no other
        #: process can name, or one Dynamo found at two paths. What the trace learnt
        #: from its identity is which of these paths held one object; the object
        #: the capture saw at each, and the grouping of the last captured call.
        self.relations: dict[str, dict[str, Any]] = {}
        self.relation_values: dict[str, Any] = {}
        self.relation_groups: list[int] | None = None
        #: Access path from an argument -> the signed zero (a float, or a complex with a
        #: zero part) guarded there, as its literal fingerprint (``FLOAT_ZEROS``).
        self.float_zeros: dict[str, dict[str, Any]] = {}
        #: Access path (``module:path`` for a global) -> an OrderedDict whose keys the
        #: guards compare by position (``ORDERED_DICTS``).
        self.ordered_dicts: dict[str, dict[str, Any]] = {}
        #: Why the capture cannot be served: objects compared by identity and unnameable.
        self.refusals: list[tuple[str, str]] = []
        #: What a trace read that depends on the grad mode ('' for nothing): the
        #: ``torch.is_grad_enabled()`` guard, or grad-dependent tensor attributes.
        self.grad_mode_read = ""
        #: The grad-mode reads the user's code made (``torch.is_grad_enabled()``,
        #: grad-dependent attributes), appended while tracing
        #: (``_compat.dynamo.recording_grad_dependent_reads``).
        self.grad_reads: list[str] = []
        #: Those made in torch's own code (nn.MultiheadAttention's fast-path test, say):
        #: evaluated against the grad mode the graphs run under, never a refusal.
        self.library_grad_reads: list[str] = []
        #: The user's reads of ``.requires_grad`` (``.grad_fn``, ``.is_leaf``) of a
        #: tensor fn was passed: they make those flags part of what it computes.
        self.grad_flag_reads: list[str] = []
        #: Per module argument (its position, or its keyword), the names of its
        #: parameters that required grad at capture; None once two captured calls
        #: disagree (``GRAD_FLAGS``).
        self.param_grad_flags: dict[str, list[str]] | None = {}
        #: fn's arguments in the captured call being traced (later frames' identity
        #: reads are mapped to paths from them).
        self.arguments: dict[str, Any] = {}
        #: Modules the trace read from module globals, by how fn names them.
        self.global_modules: dict[str, torch.nn.Module] = {}
        #: A later frame's ``self`` mapped to its path from the arguments: (path, the
        #: module, its classes). Sound only if no module fn reads from a global is
        #: another instance of those classes (checked once every frame is observed).
        self.frame_owners: list[tuple[str, torch.nn.Module, tuple[type, ...]]] = []
        #: The classes of every module the trace reached (their methods, properties and
        #: ``__call__`` were resolved on the class while tracing; ``CLASS_ATTRS``).
        self.classes: dict[type, None] = {}
        #: Root key -> {dotted path of a submodule whose class defines its own
        #: ``__getattr__``: the names its instance ``__dict__`` held at every trace}.
        self.open_keys: dict[tuple[str, str, str], dict[str, set[str]]] = {}

    def calling(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Before each captured call: remember its arguments by parameter name."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            self.arguments = {}
            return
        bound.apply_defaults()
        self.arguments = dict(bound.arguments)
        flags = {
            str(key): sorted(n for n, p in value.named_parameters() if p.requires_grad)
            for key, value in [*enumerate(args), *kwargs.items()]
            if isinstance(value, torch.nn.Module)
        }
        if self.param_grad_flags is not None:
            seen = self.param_grad_flags
            if any(seen.get(key, names) != names for key, names in flags.items()):
                self.param_grad_flags = None
            else:
                seen.update(flags)
        for row in self.float_zeros.values():
            # The variant compiled for one sign of a zero passes the other (its guard is
            # ==) and would answer this call with the captured sign: refuse before it runs.
            path = row["path"]
            try:
                if row["module"] is None:
                    value = eval(path, {}, self.arguments)
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

    def observe(self, code: types.CodeType | None, module_name: str, entries: list[Any]) -> None:
        is_entry = code is self.fn.__code__
        modules = {
            e.name: e.value
            for e in entries
            if getattr(e, "has_value", False) and isinstance(e.value, torch.nn.Module)
        }
        for module in modules.values():
            for sub in module.modules():
                self.classes.setdefault(type(sub), None)
        for name, module in modules.items():
            if any(name.startswith((other + ".", other + "[")) for other in modules):
                continue  # reached from a module already recorded
            match = _ROOT.match(name)
            if match is None or (match.group("local") and not is_entry):
                continue  # a continuation's locals: reached from the entry's arguments
            kind = "local" if match.group("local") else "global"
            key = (kind, match.group("local") if kind == "local" else module_name, name)
            if kind == "global":
                self.global_modules[user_path(name)] = module
            self._observe_open_modules(key, module)
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
            if not dynamo.compares_identity(e) or "__builtins_dict__" in e.name:
                continue
            qualified = _qualified(e.value)
            if qualified is None or not e.name.startswith("G["):
                continue
            self.reads.setdefault((module_name, e.name), (*qualified, _location(e.value)))
            shown = _reached_as(e, module_name)
            if shown is not None:
                self.read_shown.setdefault((module_name, e.name), shown)
            read_code = getattr(getattr(e.value, "__func__", e.value), "__code__", None)
            if isinstance(read_code, types.CodeType):
                self.read_codes.setdefault(read_code, None)
        for e in entries:
            if not getattr(e, "has_value", False):
                continue
            if e.value is torch.is_grad_enabled and not self.grad_mode_read:
                self.grad_mode_read = "torch.is_grad_enabled()"
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
        for e in entries:
            self._observe_duplicate(e, is_entry)
            self._observe_distinct(e, is_entry)
        for e in entries:
            self._observe_zero_float(e, module_name if not is_entry else None, code)
        for e in entries:
            self._observe_ordered_dict(e, code, module_name, is_entry, entries)

    def _observe_open_modules(self, key: tuple[str, str, str], module: torch.nn.Module) -> None:
        """Record the instance ``__dict__`` names of each submodule whose class defines
        its own ``__getattr__`` (forwarding to an inner module, say): the trace resolved
        some names through it, and Dynamo guards what it returned, not that the name is
        still missing from the instance ``__dict__``. Names held at every trace are safe;
        ``check_shadowing`` refuses any other."""
        found = {
            dotted: set(vars(sub))
            for dotted, sub in module.named_modules()
            if type(sub).__getattr__ is not torch.nn.Module.__getattr__
        }
        known = self.open_keys.setdefault(key, found)
        for dotted, names in found.items():
            known[dotted] = known.get(dotted, names) & names

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
        match = _ROOT.match(e.name)
        if match is None:
            return
        path, module = e.name, None
        if match.group("global"):
            module = module_name or self.fn.__module__
        elif not is_entry:
            if any(
                row["module"] is None and _evaluates_to(row["path"], self.arguments, e.value)
                for row in self.ordered_dicts.values()
            ):
                return  # the very object the entry's row checks
            root = match.group("local")
            found = _path_to(e.value, self.arguments)
            if found is not None:
                # The very object an argument holds (``od = cfg`` before the break).
                self.ordered_dicts.setdefault(
                    found, {"path": found, "shown": user_path(found), "module": None}
                )
                return
            if _computed_before_break(code, e.name, root):
                # Built by the traced code before the break, which Dynamo rebuilds in
                # its order (a new OrderedDict, whose links follow the dict's order).
                return
            mapped, why, hint = self._path_from_arguments(code, root, entries)
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
        elif match.group("local") not in self.signature.parameters:
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
        match = _ROOT.match(e.name)
        if match is None:
            return
        module = None
        if match.group("global"):
            module = later_frame_module or self.fn.__module__
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
        elif match.group("local") not in self.signature.parameters:
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
                    if eval(row["path"], {}, self.arguments) is value:
                        return True
                except Exception:
                    continue
        return False

    def _observe_identity(
        self, e: Any, code: types.CodeType | None, module_name: str, entries: list[Any]
    ) -> None:
        """An argument-rooted guard that compares an identity (or a TYPE_MATCH on a bare
        ``object()``, which code can only compare by identity): record it by a name
        another process resolves, or refuse."""
        if not getattr(e, "has_value", False):
            return
        match = _ROOT.match(e.name)
        if match is None or not match.group("local") or any(h in e.name for h in MODULE_HOOK_DICTS):
            return
        value = e.value
        sentinel = e.guard_type == "TYPE_MATCH" and type(value) is object
        if not (sentinel or dynamo.compares_identity(e)):
            return
        if value is None or isinstance(
            value, (bool, torch.nn.Module, torch.Tensor, types.ModuleType)
        ):
            return  # None and bools are kept as values; modules and tensors checked apart
        root = match.group("local")
        if e.name[len(root) : len(root) + 1] == "(":
            return  # a call (``dict(C.__dict__)``), not a local
        if code is not self.fn.__code__:
            if code is not None and not (
                root.startswith("___stack") or root in (*code.co_varnames, *code.co_cellvars)
            ):
                return
            if _computed_before_break(code, e.name, root):
                # A local carried into a continuation, computed by the traced code
                # before the break: its own identity reads are checked (or refused)
                # where that code read them.
                return
            if e.name == root and root in dynamo.reentered_contexts(code):
                named = _import_name(value)
                if named is not None and "." not in named[1]:
                    # The context manager class Dynamo's resume code calls to re-enter
                    # the interrupted ``with`` block (``no_grad`` as
                    # ``set_grad_enabled``): the artifact's own code passes it, read
                    # from its module; that binding is checked per call.
                    key = (named[0], f"G[{named[1]!r}]")
                    self.reads.setdefault(key, (*named, _location(value)))
                    return
            mapped, why, hint = self._path_from_arguments(code, root, entries)
            if mapped is None:
                self.refusals.append(
                    (
                        f"`{user_path(e.name)}` (a local of "
                        f"{frame_label(code.co_name if code else '?')}) holds {_shown(value)}, "
                        f"which the trace compared by identity; an artifact checks such an "
                        f"object per call by its path from fn's arguments, and {why}",
                        hint,
                    )
                )
                return
            self._record_identity(mapped + e.name[len(root) :], value, module_name, entries, e.name)
            return
        if root not in self.signature.parameters:
            return
        self._record_identity(e.name, value, module_name, entries)

    def _observe_duplicate(self, e: Any, is_entry: bool) -> None:
        """Dynamo found one object at two access paths from fn's arguments
        (``model.decoder.config`` is ``model.config``) and guards that they stay one
        (``DUPLICATE_INPUT``): both paths join the relation check, which refuses a
        call where they are two objects, naming both."""
        other = dynamo.duplicate_of(e)
        if other is None or not is_entry or not getattr(e, "has_value", False):
            return
        if not _relatable(e.value) or isinstance(e.value, _ATOMS):
            return
        for path in (e.name, other):
            match = _ROOT.match(path)
            if match is None or match.group("local") not in self.signature.parameters:
                return
        for path in (e.name, other):
            self._record_relation(path, e.value, None)

    def _observe_distinct(self, e: Any, is_entry: bool) -> None:
        """A mutable object fn's frame read at a path from its arguments (its type is
        guarded, ``TYPE_MATCH``): Dynamo traced objects found at different paths as
        different objects -- ``self.child.cfg is self.cfg`` was decided False with no
        guard at all, and a write through one would not show through the other -- so
        the path joins the relation check, which refuses a call where two such paths
        hold one object."""
        if not is_entry or e.guard_type != "TYPE_MATCH" or not getattr(e, "has_value", False):
            return
        value = e.value
        if isinstance(value, _BY_VALUE) or not _relatable(value):
            return
        match = _ROOT.match(e.name)
        if match is None or match.group("local") not in self.signature.parameters:
            return
        if e.name.endswith(".__dict__"):
            return  # an instance dict goes with its owner, whose path is checked
        owner_path, _, attr = e.name.rpartition(".")
        if attr.startswith("_") and isinstance(
            _evaluate_row({"path": owner_path}, self.arguments), torch.nn.Module
        ):
            # A module's own bookkeeping (``_modules``, ``_parameters``, hook dicts):
            # checked with the module's structure, never shared by two modules.
            return
        self._record_relation(e.name, value, None)

    def _record_relation(self, path: str, value: Any, module: str | None) -> None:
        """A relation row for ``path`` (over fn's parameters, or a global of ``module``)
        holding ``value``."""
        key = path if module is None else f"{module}:{path}"
        param = _ROOT.match(path)
        self.relations.setdefault(
            key,
            {
                "path": path,
                "shown": user_path(path),
                "module": module,
                "param": param.group("local") or "" if param else "",
            },
        )
        self.relation_values.setdefault(key, value)

    def _record_identity(
        self,
        path: str,
        value: Any,
        module_name: str,
        entries: list[Any],
        guarded: str | None = None,
    ) -> None:
        """An identity row for ``path`` (an expression over fn's parameters); when no
        other process can name ``value``, a relation row (``ARG_RELATIONS``) for an
        object whose identity can only have told the trace which paths held one object,
        or a refusal. ``guarded`` is the guard's own name (a later frame's local),
        where a value guard on an immutable number or string is looked for."""
        shown = user_path(path)
        row = self._identity_row(value, module_name, entries)
        if row is None and isinstance(value, _ATOMS):
            name = guarded or path
            if any(
                o.name == name and o.guard_type in ("EQUALS_MATCH", "CONSTANT_MATCH")
                for o in entries
            ):
                # Its value is guarded; Python interns such values at will, so no
                # result may depend on which object holds one (``is`` on them is a
                # SyntaxWarning): only its value counts.
                return
        if row is None and _relatable(value):
            self._record_relation(path, value, None)
            return
        if row is None:
            self.refusals.append(
                (
                    f"`{shown}` holds {_shown(value)}, which the trace compared by identity "
                    f"(`is`, or a call of it), and no other process can name that object",
                    "bind it to a module-level name (MODE = object() at module level), use "
                    "an Enum member, or store a module-level function or class",
                )
            )
            return
        param = _ROOT.match(path)
        row |= {"param": param.group("local") if param else "", "path": path, "shown": shown}
        self.identities.setdefault(path, row)
        self.identity_values.setdefault(path, value)

    def _path_from_arguments(
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

    def _shared_frames(self) -> tuple[str, str] | None:
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
                "code": code_fingerprint(value.__code__),
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
                "code": code_fingerprint(value.__code__),
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
        self.verify_ordered_dicts(dict(bound.arguments))
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

        self.verify_relations(dict(bound.arguments))

    def verify_relations(self, arguments: dict[str, Any]) -> None:
        """After a captured call: each relation path must evaluate, from the arguments
        (or its module's globals), to the object the trace saw there, and which paths
        hold one object must be the same in every captured call (one artifact serves
        one such grouping)."""
        found: list[Any] = []
        for key, row in self.relations.items():
            value = _evaluate_row(row, arguments)
            # A row observed while this call compiled must lead to the very object the
            # trace saw; one observed in an earlier call, to some object.
            expected = self.relation_values.pop(key, value)
            if value is _MISSING or value is not expected:
                self.refusals.append(
                    (
                        f"`{row['shown']}` holds {_shown(expected)}, which "
                        f"the trace compared by identity, and precompile cannot read that "
                        f"path again from fn's arguments to check per call which other "
                        f"paths hold the same object",
                        "store it where fn's arguments reach it plainly (an attribute of an "
                        "argument), or pass it as a plain value",
                    )
                )
                return
            found.append(value)
        groups = _groups(found)
        rows = list(self.relations.values())
        if (
            self.relation_groups is not None
            and self.relation_groups != groups[: len(self.relation_groups)]
        ):
            for i, j in _changed_pair(self.relation_groups, groups):
                same = self.relation_groups[i] == self.relation_groups[j]
                self.refusals.append(
                    (
                        f"`{rows[i]['shown']}` and `{rows[j]['shown']}` were "
                        f"{'one object' if same else 'two objects'} in one captured call "
                        f"and {'two objects' if same else 'one object'} in another; the "
                        f"trace compared them by identity, and one artifact serves one "
                        f"such grouping",
                        "capture each grouping into its own artifact",
                    )
                )
                return
        self.relation_groups = groups

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

    def class_rows(self, traced: list[types.CodeType]) -> list[dict[str, Any]]:
        """``CLASS_ATTRS``: the classes the trace went through -- of every module it
        reached, and those defining a method or property it inlined (``traced``, by
        qualified name) -- with their bases. A project class carries its methods and
        descriptors (``class_attrs``), compared at load and checked per call, all of
        them. A library class (torch, an installed package) changes by version: only
        the attributes bound to code the trace ran (``traced``: ``Module.__call__``,
        ``Linear.forward``) are checked, from load on -- torch itself rebinds others
        (Dynamo patches ``Module.__init__`` when its frame evaluator first runs). A class
        defined inside a function has no name another process resolves, and is left
        out."""
        classes = dict(self.classes)
        ran = set(traced)
        for code in traced:
            owner = _code_class(code)
            if owner is not None:
                classes.setdefault(owner, None)
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        # A class defining its own __getattr__ resolves the names it lacks through it;
        # a plain value set later on it or a base would be read instead, and is guarded
        # by nothing: all the names of its classes are recorded ("names").
        forwarding = {
            base
            for cls in classes
            if isinstance(cls, type)
            and issubclass(cls, torch.nn.Module)
            and cls.__getattr__ is not torch.nn.Module.__getattr__
            for base in cls.__mro__
        }
        for cls in classes:
            for base in cls.__mro__:
                named = _import_name(base)
                if base.__module__ == "builtins" or named is None or named in rows:
                    continue
                source = getattr(sys.modules.get(base.__module__), "__file__", None) or ""
                project = is_project_file(source)
                rows[named] = {
                    "module": named[0],
                    "qualname": named[1],
                    "attrs": class_attrs(base) if project else None,
                    "traced": sorted(
                        name for name, value in vars(base).items() if _code_of(value) in ran
                    ),
                }
                if project and base in forwarding:
                    rows[named]["names"] = sorted(vars(base))
        return list(rows.values())

    def metadata(self, traced: list[types.CodeType] | None = None) -> dict[str, Any]:
        """``MODULE_HOOKS``, ``GLOBAL_READS``, ``ARG_IDENTITIES``, ``GRAD_MODE_READ`` and
        ``CLASS_ATTRS`` (``traced``: the code of every function the trace ran), as
        artifact literals."""
        shared = self._shared_frames()
        if self.refusals or shared:
            message, hint = self.refusals[0] if self.refusals else shared  # type: ignore[misc]  # one of them is set
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
            open_keys = self.open_keys.get((kind, owner, path))
            if open_keys:
                row["open"] = {dotted: sorted(names) for dotted, names in open_keys.items()}
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
            | (
                dict(zip(("shown", "reader"), self.read_shown[scope, path]))
                if (scope, path) in self.read_shown
                else {}
            )
            for (scope, path), (m, q, where) in sorted(self.reads.items())
        ]
        identities = list(self.identities.values())
        groups = self.relation_groups or []
        relations = [
            {**row, "group": groups[i]}
            for i, row in enumerate(self.relations.values())
            if i < len(groups)
        ]
        return {
            "MODULE_HOOKS": {"roots": roots, "global": self.global_hooks or {}},
            "GLOBAL_READS": reads,
            "ARG_IDENTITIES": identities,
            "ARG_RELATIONS": relations,
            "FLOAT_ZEROS": list(self.float_zeros.values()),
            "ORDERED_DICTS": list(self.ordered_dicts.values()),
            "CLASS_ATTRS": self.class_rows(list(traced or ())),
            "BUILTIN_READS": builtin_reads([self.fn.__code__, *(traced or ())]),
            # A read in the user's code; the guard alone (no call the trace recorded,
            # so no place to tell torch's reads from the user's) counts as one.
            "GRAD_MODE_READ": self.grad_reads[0]
            if self.grad_reads
            else ("" if self.library_grad_reads else self.grad_mode_read),
            # What serving needs to pass a call whose tensors' requires_grad differ
            # from the capture's to an inference artifact (multigraph_driver).
            "GRAD_FLAGS": {
                "params": self.param_grad_flags,
                "read": self.grad_flag_reads[0] if self.grad_flag_reads else "",
            },
        }


def builtin_reads(codes: list[types.CodeType]) -> list[dict[str, Any]]:
    """``BUILTIN_READS``: per module, the names its traced code (``codes`` and the code
    nested in it: comprehensions, lambdas) loads as globals and that resolved through
    the builtins at capture (absent from the module's globals), with what the builtins
    dict held (``builtin_key``). Dynamo baked what each did -- ``len(xs)`` became a
    constant, ``abs`` ran at trace time -- and its identity guard on the builtins dict
    entry is not serialized, so serving checks the names itself."""
    by_module: dict[str, dict[str, list[str]]] = {}
    pending = list(codes)
    seen: set[types.CodeType] = set()
    while pending:
        code = pending.pop()
        if code in seen:
            continue
        seen.add(code)
        pending.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        module = inspect.getmodule(code)
        name = getattr(module, "__name__", None)
        if module is None or not isinstance(name, str) or name == "__main__":
            continue
        if name == "torch._dynamo" or name.startswith("torch._dynamo."):
            # Dynamo's polyfills stand in for builtins while tracing; eager never runs
            # them (the user's code that called the builtin is recorded itself).
            continue
        scope = vars(module)
        held = scope.get("__builtins__", builtins)
        table = held if isinstance(held, dict) else vars(held)
        for loaded in global_loads(code):
            if loaded in scope or loaded not in table:
                continue
            by_module.setdefault(name, {})[loaded] = builtin_key(table[loaded])
    return [
        {"module": module, "names": dict(sorted(names.items()))}
        for module, names in sorted(by_module.items())
    ]


def _path_to(target: Any, arguments: dict[str, Any], depth: int = 4) -> str | None:
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


#: Immutable numbers and strings: one whose value a guard checks is not compared by
#: identity (Python interns them at will).
_ATOMS = (int, float, complex, str, bytes)
#: Immutable values compared by value (their items are guarded): whether two paths
#: hold one of them changes nothing a trace computes.
_BY_VALUE = (*_ATOMS, tuple, frozenset, types.UnionType, types.GenericAlias)
#: ``Py_TPFLAGS_HEAPTYPE``: a class defined in Python (not a C type).
_HEAPTYPE = 1 << 9


def _relatable(value: Any) -> bool:
    """Whether the identity of ``value`` (reached from fn's arguments, compared by
    identity, named by nothing another process can resolve) can have told the trace
    only which paths held one object: a container, an immutable value, a type union,
    or an instance of a class defined in Python (whose attributes Dynamo guards where
    the trace read them). Functions, classes, modules and tensors are checked apart;
    an opaque C object (a generator, a stream) or a bare ``object()`` is not."""
    if isinstance(
        value,
        (
            type,
            types.ModuleType,
            types.FunctionType,
            types.BuiltinFunctionType,
            types.MethodType,
            torch.Tensor,
            torch.nn.Module,
        ),
    ):
        return False
    if isinstance(
        value,
        (dict, list, tuple, set, frozenset, *_ATOMS, types.UnionType, types.GenericAlias),
    ):
        return True
    return bool(type(value).__flags__ & _HEAPTYPE)


def _evaluate_row(row: dict[str, Any], arguments: dict[str, Any]) -> Any:
    """What a relation row's path holds now: over fn's ``arguments``, or over its
    module's globals."""
    try:
        if row.get("module") is None:
            return eval(compile(row["path"], "<precompile>", "eval"), {}, dict(arguments))
        scope = {"__G": vars(sys.modules[row["module"]])}
        return eval(compile("__G" + row["path"][1:], "<precompile>", "eval"), scope)
    except Exception:
        return _MISSING


def _groups(values: list[Any]) -> list[int]:
    """Per value, the index of the first value that is the same object."""
    first: dict[int, int] = {}
    return [first.setdefault(id(v), i) for i, v in enumerate(values)]


def _changed_pair(before: list[int], after: list[int]) -> list[tuple[int, int]]:
    """The first pair of positions grouped differently in ``before`` and ``after``."""
    for j in range(min(len(before), len(after))):
        for i in range(j):
            if (before[i] == before[j]) != (after[i] == after[j]):
                return [(i, j)]
    return []


def _reached_as(entry: Any, frame_module: str) -> tuple[str, str] | None:
    """A module-global read in the words of the code that made it.

    Dynamo names an object by the first path it met it through: ``F.gelu`` read in the
    user's module after ``Linear.forward`` read ``F.linear`` is guarded as
    ``torch.nn.modules.linear.F.gelu`` (one module object, two globals named ``F``).
    The user's line (the guard's user stack) says which module read it; a global of
    that module bound to the object at the path's first step names it as the user's
    code reached it (``gm.F.gelu``), with that module's name. None when the path is
    already that module's, or no such global exists."""
    stack = getattr(getattr(entry, "orig_guard", None), "user_stack", None)
    if not stack:
        return None
    filename = getattr(stack[-1], "filename", None)
    reader = next(
        (
            m
            for m in list(sys.modules.values())
            if isinstance(getattr(m, "__file__", None), str) and m.__file__ == filename
        ),
        None,
    )
    match = re.match(r"G\[(['\"])(?P<name>.+?)\1\](?P<first>\.\w+)?(?P<rest>.*)$", entry.name)
    frame = sys.modules.get(frame_module)
    if reader is None or match is None or frame is None or not match.group("first"):
        return None
    root = vars(frame).get(match.group("name"))
    if root is reader:
        return None  # named through the reading module already
    held = getattr(root, match.group("first")[1:], _MISSING)
    for name, bound in list(vars(reader).items()):
        if bound is held and held is not _MISSING and not name.startswith("__"):
            return f"{reader.__name__}.{name}{user_path(match.group('rest'))}", reader.__name__
    return None


def _literal_key(key: Any) -> bool:
    """Whether a dict key reads back from its repr (a str, int or bool)."""
    return type(key) in (str, int, bool)


def _computed_before_break(code: types.CodeType | None, name: str, root: str) -> bool:
    """Whether the guarded ``name`` is a continuation's local ``root`` itself, computed
    by the traced code before the graph break (not the result of an eager call)."""
    resumes = code is not None and dynamo.resumed_code(code) is not code
    return resumes and name == root and code is not None and not _eager_result(code, root)


def _evaluates_to(path: str, arguments: dict[str, Any], value: Any) -> bool:
    """Whether ``path`` evaluates, over fn's ``arguments``, to ``value`` itself."""
    try:
        return eval(compile(path, "<precompile>", "eval"), {}, dict(arguments)) is value
    except Exception:
        return False


def _code_of(value: Any) -> types.CodeType | None:
    """The code a class attribute runs: a function's, a static or class method's, a
    property getter's."""
    target = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
    code = getattr(target, "__code__", None)
    return code if isinstance(code, types.CodeType) else None


def _code_class(code: types.CodeType) -> type | None:
    """The class a method's (or a property accessor's) code was defined in, by its
    qualified name (``Net.encode`` -> ``Net``); None for a function outside a class."""
    qualname = getattr(code, "co_qualname", code.co_name)
    owner_name, _, _ = qualname.rpartition(".")
    if not owner_name or "<locals>" in owner_name:
        return None
    module = inspect.getmodule(code)
    owner: Any = module
    for part in owner_name.split("."):
        owner = getattr(owner, part, None)
    return owner if isinstance(owner, type) else None


#: What a path that cannot be evaluated evaluates to.
_MISSING = object()

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
