"""Objects a Dynamo trace compared by identity, reached from fn's arguments, recorded at
capture (``ARG_IDENTITIES``, ``ARG_RELATIONS``). Checked per call by
``runtime.multigraph_argument_checks``.

- **Objects with a name** (``model.act = torch.relu``, ``model.mode = Mode.A``, a class,
  a user function, a sentinel ``object()``): Dynamo guards them by id and the guard is
  dropped. They are recorded by a name another process can resolve -- a function, class
  or builtin by module and qualified name, an enum member by class and member name, a
  closure by its code, anything else by the module global it is bound to -- and every
  call compares the live object by identity (``ARG_IDENTITIES``). One read in a later
  frame is checked by its path from fn's arguments (``dynamo_argument_paths``); one with
  no such path is refused at capture: an equal object read elsewhere checks nothing.
- **Objects without one** (a config object, a container): what the trace learnt from
  their identity is which paths held one object. Those paths, and the ones Dynamo found
  holding one object (``DUPLICATE_INPUT``) or traced as distinct, are recorded with the
  grouping of the captured calls (``ARG_RELATIONS``), and every call checks the grouping.
  Any other object compared by identity and named by nothing is refused at capture.
"""

from __future__ import annotations

import enum
import sys
import types
from typing import Any

import torch

from precompile._compat import dynamo
from precompile._compat.prelude import MODULE_HOOK_DICTS
from precompile.capturing.dynamo_argument_paths import (
    ACCESS_ROOT,
    ArgumentPaths,
    computed_before_break,
)
from precompile.capturing.dynamo_name_records import NameRecorder, import_name, location
from precompile.runtime.guard_text import frame_label, user_path
from precompile.runtime.state_checks import code_fingerprint


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
    named = import_name(value)
    if named is not None:
        return f"{named[0]}.{named[1]}"
    if isinstance(value, types.FunctionType):
        return f"function {value.__module__}.{value.__qualname__}"
    return f"a {type(value).__qualname__} object"


class IdentityRecorder:
    """Identity and relation rows of what fn's arguments reach, per compiled variant."""

    def __init__(
        self, paths: ArgumentPaths, names: NameRecorder, refusals: list[tuple[str, str]]
    ) -> None:
        self.paths = paths
        #: Where an object a later frame re-enters is read from (a module global).
        self.names = names
        #: Why the capture cannot be served (shared by every recorder, in order).
        self.refusals = refusals
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

    def observe(
        self, code: types.CodeType | None, module_name: str, is_entry: bool, entries: list[Any]
    ) -> None:
        """The identity comparisons of one frame's guards, then its relations."""
        for e in entries:
            self._observe_identity(e, code, module_name, entries)
        for e in entries:
            self._observe_duplicate(e, is_entry)
            self._observe_distinct(e, is_entry)

    def _observe_identity(
        self, e: Any, code: types.CodeType | None, module_name: str, entries: list[Any]
    ) -> None:
        """An argument-rooted guard that compares an identity (or a TYPE_MATCH on a bare
        ``object()``, which code can only compare by identity): record it by a name
        another process resolves, or refuse."""
        if not getattr(e, "has_value", False):
            return
        match = ACCESS_ROOT.match(e.name)
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
        if code is not self.paths.fn.__code__:
            if code is not None and not (
                root.startswith("___stack") or root in (*code.co_varnames, *code.co_cellvars)
            ):
                return
            if computed_before_break(code, e.name, root):
                # A local carried into a continuation, computed by the traced code
                # before the break: its own identity reads are checked (or refused)
                # where that code read them.
                return
            if e.name == root and root in dynamo.reentered_contexts(code):
                named = import_name(value)
                if named is not None and "." not in named[1]:
                    # The context manager class Dynamo's resume code calls to re-enter
                    # the interrupted ``with`` block (``no_grad`` as
                    # ``set_grad_enabled``): the artifact's own code passes it, read
                    # from its module; that binding is checked per call.
                    key = (named[0], f"G[{named[1]!r}]")
                    self.names.reads.setdefault(key, (*named, location(value)))
                    return
            mapped, why, hint = self.paths.from_arguments(code, root, entries)
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
        if root not in self.paths.signature.parameters:
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
            match = ACCESS_ROOT.match(path)
            if match is None or match.group("local") not in self.paths.signature.parameters:
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
        match = ACCESS_ROOT.match(e.name)
        if match is None or match.group("local") not in self.paths.signature.parameters:
            return
        if e.name.endswith(".__dict__"):
            return  # an instance dict goes with its owner, whose path is checked
        owner_path, _, attr = e.name.rpartition(".")
        if attr.startswith("_") and isinstance(
            _evaluate_row({"path": owner_path}, self.paths.arguments), torch.nn.Module
        ):
            # A module's own bookkeeping (``_modules``, ``_parameters``, hook dicts):
            # checked with the module's structure, never shared by two modules.
            return
        self._record_relation(e.name, value, None)

    def _record_relation(self, path: str, value: Any, module: str | None) -> None:
        """A relation row for ``path`` (over fn's parameters, or a global of ``module``)
        holding ``value``."""
        key = path if module is None else f"{module}:{path}"
        param = ACCESS_ROOT.match(path)
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
        param = ACCESS_ROOT.match(path)
        row |= {"param": param.group("local") if param else "", "path": path, "shown": shown}
        self.identities.setdefault(path, row)
        self.identity_values.setdefault(path, value)

    def _identity_row(
        self, value: Any, module_name: str, entries: list[Any]
    ) -> dict[str, Any] | None:
        """How another process names ``value``: kind and the names to resolve."""
        if isinstance(value, enum.Enum):
            owner = import_name(type(value))
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
        named = import_name(value)
        if named is not None:
            return {"kind": "named", "module": named[0], "qualname": named[1]}
        for other in entries:
            global_name = ACCESS_ROOT.match(other.name)
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
        modules = [module_name, self.paths.fn.__module__, getattr(type(value), "__module__", "")]
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

    def verify(self, arguments: dict[str, Any]) -> None:
        """After a captured call: every identity path must evaluate, from the arguments,
        to the object the capture saw (what serving evaluates); refuse one that cannot.
        Then the relations (``verify_relations``)."""
        for path, row in self.identities.items():
            try:
                found = eval(compile(path, "<precompile>", "eval"), {}, dict(arguments))
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

        self.verify_relations(dict(arguments))

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

    def code_functions(self) -> list[types.FunctionType]:
        """The functions fn's arguments held whose code ``ARG_IDENTITIES`` compares per
        call (rows of kind ``code``), as the capture saw them."""
        return [
            self.identity_values[path]
            for path, row in self.identities.items()
            if row.get("kind") == "code"
        ]

    def rows(self) -> dict[str, list[dict[str, Any]]]:
        """``ARG_IDENTITIES`` and ``ARG_RELATIONS``, as artifact literals."""
        identities = list(self.identities.values())
        groups = self.relation_groups or []
        relations = [
            {**row, "group": groups[i]}
            for i, row in enumerate(self.relations.values())
            if i < len(groups)
        ]
        return {"ARG_IDENTITIES": identities, "ARG_RELATIONS": relations}


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


#: What a path that cannot be evaluated evaluates to.
_MISSING = object()
