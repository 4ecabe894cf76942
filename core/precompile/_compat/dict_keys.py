"""Dict keys Dynamo names by position, seen at capture (the capture-side half of
``_compat.runtime.dict_keys_by_name``).

Dynamo names the keys of some dicts by position: every key of a dict *subclass* (a
library's registry, ``transformers``' ``_CAN_RECORD_REGISTRY``), and of a dict with
non-constant keys, is ``list(dict.keys(D))[i]``, and an entry read from it is
``dict.__getitem__(D, list(dict.keys(D))[i])``. A module-level dict filled as a process
goes (classes registering themselves as they are built) holds its keys in another order,
or other keys, in another process, and an artifact whose guards read it by position could
not be rebuilt there (an ``IndexError``), or would read another entry than the one traced.

Which of those positions the trace could depend on is decided here, from the guards of
each compiled variant (the guard filter's entries, with the values Dynamo saw):

- the dict's key order can matter only where Dynamo guarded it: a ``DICT_KEYS_MATCH``
  guard (the trace iterated the dict, took its length, keys, values or items, copied it),
  or any guard on the dict itself other than its type, identity, length and key
  membership; a key used as an object (an attribute of it guarded); a key that is not a
  constant any process can name (``str``, ``int``, ``bool``, ``None``, ``bytes``, a
  non-NaN ``float``, or a tuple of these);
- otherwise the trace looked entries up by key: the entries it read (a guard on
  ``dict.__getitem__(D, key i)``), and the keys a ``key in D`` with a traced key found
  (Dynamo realizes the key at that position and guards nothing else:
  ``recording_sourced_key_reads``), must be present, by key; the other keys Dynamo
  guarded only because it wrapped every key of the dict when it built it (their
  equality guards come from hashing them) and the dict's length it guarded for its
  positional accessors, neither of which a lookup by key reads.

The load rewrites the guards by that record before they are built (the positional key
and value sources become ``D[key]`` sources, the key guards a ``key in D`` guard for the
keys read, and the length guard goes); a dict whose order can matter keeps Dynamo's
positional guards, and the artifact refuses at load, naming the dict, when the process
holds other keys at those positions.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from typing import Any

from precompile._compat.patching import patched

#: Guards on the dict itself that a lookup by key keeps meaning: its type or identity,
#: its length (dropped: only Dynamo's positional accessors need it), key membership.
_ON_THE_DICT = {
    "TYPE_MATCH",
    "ID_MATCH",
    "CLASS_MATCH",
    "SEQUENCE_LENGTH",
    "DICT_CONTAINS",
    "DICT_NOT_CONTAINS",
    "NOT_PRESENT_IN_GENERIC_DICT",
}

#: Names of torch._dynamo.utils helpers with which Dynamo's transformed bytecode reads
#: a dict's key by position (reconstructing a value it traced from its source).
POSITIONAL_BYTECODE_HELPERS = ("dict_keys_getitem",)


def nameable_key(key: Any) -> bool:
    """Whether ``key`` is a constant every process names the same way (by value)."""
    if type(key) is tuple:
        return all(nameable_key(k) for k in key)
    if type(key) is float:
        return not math.isnan(key)
    return type(key) in (str, int, bool, bytes, type(None))


@contextlib.contextmanager
def recording_sourced_key_reads(sink: set[tuple[str, int | None]]) -> Iterator[None]:
    """While capturing: (source name, position) of every dict key a traced (not
    constant) key was found as by ``key in D`` (or ``D.pop(key)``): Dynamo realizes the
    key at that position then, and guards nothing else that says the trace needed it
    present. The position is None where it cannot be told (then every key counts)."""
    from torch._dynamo.variables.dicts import ConstDictVariable
    from torch._dynamo.variables.hashable import HashableTracker

    original = ConstDictVariable.realize_key_vt

    def realize_key_vt(self: Any, arg: Any) -> None:
        result = original(self, arg)
        source = getattr(self, "source", None)
        if source is not None:
            try:
                position: int | None = tuple(self.items.keys()).index(HashableTracker(arg))
            except Exception:
                position = None
            sink.add((source.name, position))
        return result

    ConstDictVariable.realize_key_vt = realize_key_vt  # type: ignore[method-assign]  # restored below
    try:
        yield
    finally:
        ConstDictVariable.realize_key_vt = original  # type: ignore[method-assign]  # restoring


#: Guards that pin a traced value to the one the capture saw (a key guarded by one of
#: these is as constant, for that variant, as a literal key).
_VALUE_GUARDS = frozenset({"CONSTANT_MATCH", "EQUALS_MATCH"})


def _value_guarded(tx: Any, source: Any) -> bool:
    """Whether the trace guarded ``source`` by its value (an equality guard on it)."""
    guards = getattr(getattr(tx, "output", None), "guards", None)
    by_source = getattr(guards, "source_to_guards", None)
    if by_source is None:
        return False
    return any(g.create_fn_name() in _VALUE_GUARDS for g in by_source.get(source, ()))


@contextlib.contextmanager
def guarding_absent_keys() -> Iterator[None]:
    """While capturing, every lookup that finds no key is guarded as ``key not in D``.

    ``D[key]`` that raises ``KeyError`` (caught by the traced code: ``try: v = CFG["k"]
    except KeyError: ...``, a ``Mapping.get`` over ``__getitem__``, ``os.environ.get``)
    installed no guard at all in torch 2.13 (``getitem_const_raise_exception_if_absent``
    raises without one), so a process that later held the key was served the branch
    of its absence. It is guarded as ``key in D`` and ``D.get(key)`` are.

    ``key in D`` (or ``D.get(key)``, ``D.pop(key, d)``) with a
    traced key -- one read from a global or an attribute, ``HAS in CFG`` -- that ``D``
    does not hold is guarded as ``key not in D``, as Dynamo guards a literal key, rather
    than by all of ``D``'s keys and its length (Dynamo's conservative ``DICT_KEYS_MATCH``
    for a traced key not found, which refuses any unread key added to ``D``).

    Sound only where the key itself is pinned: the key must be a constant every process
    names alike (``nameable_key``) and the trace must already guard its source by value,
    so that a variant's guards hold the key as the literal it was; otherwise Dynamo's
    guard stays. A key that ``D`` holds is left to Dynamo (it realizes that key only,
    ``recording_sourced_key_reads``), and so is a dict the trace changed."""
    from torch._dynamo.guards import install_guard
    from torch._dynamo.variables.dicts import ConstDictVariable

    original = ConstDictVariable.install_dict_contains_guard

    def install_dict_contains_guard(self: Any, tx: Any, args: list[Any]) -> None:
        if not args:
            return original(self, tx, args)
        key = args[0]
        source = getattr(key, "source", None)
        if (
            source is not None
            and getattr(self, "source", None) is not None
            and not tx.output.side_effects.is_modified(self)
            and key.is_python_constant()
            and nameable_key(key.as_python_constant())
            and key not in self
            and _value_guarded(tx, source)
        ):
            install_guard(
                self.make_guard(
                    functools.partial(type(self).NOT_CONTAINS_GUARD, key=key.as_python_constant())
                )
            )
            return None
        return original(self, tx, args)

    missing = ConstDictVariable.getitem_const_raise_exception_if_absent

    def getitem_const_raise_exception_if_absent(self: Any, tx: Any, arg: Any) -> Any:
        if arg not in self:
            self.install_dict_contains_guard(tx, [arg])
        return missing(self, tx, arg)

    with (
        patched(ConstDictVariable, "install_dict_contains_guard", install_dict_contains_guard),
        patched(
            ConstDictVariable,
            "getitem_const_raise_exception_if_absent",
            getitem_const_raise_exception_if_absent,
        ),
    ):
        yield


def _nested(source: Any) -> Iterator[tuple[Any, Any]]:
    """(parent, source) for ``source`` and every source nested in it (bases and
    indices), parents first; the outermost's parent is None."""
    import dataclasses

    from torch._guards import Source

    stack: list[tuple[Any, Any]] = [(None, source)]
    while stack:
        parent, node = stack.pop()
        yield parent, node
        if dataclasses.is_dataclass(node):
            for field in dataclasses.fields(node):
                value = getattr(node, field.name, None)
                if isinstance(value, Source):
                    stack.append((node, value))


def positional_dicts(
    entries: list[Any], sourced_reads: set[tuple[str, int | None]]
) -> list[dict[str, Any]]:
    """One record per dict whose keys this variant's guards name by position:
    ``{"dict": its source name, "keys": [[position, key], ...], "read": [positions the
    trace read by key], "order": whether its key order can matter (see the module
    docstring), "why": what made it matter}``."""
    from torch._dynamo.source import (
        ConstDictKeySource,
        DictGetItemSource,
        DictSubclassGetItemSource,
    )

    getitem = (DictGetItemSource, DictSubclassGetItemSource)
    records: dict[str, dict[str, Any]] = {}
    bases: dict[str, Any] = {}

    def record(base: Any) -> dict[str, Any]:
        bases[base.name] = base
        return records.setdefault(
            base.name, {"dict": base.name, "keys": {}, "read": set(), "order": False, "why": ""}
        )

    def matters(found: dict[str, Any], why: str) -> None:
        if not found["order"]:
            found["order"], found["why"] = True, why

    for entry in entries:
        guard = getattr(entry, "orig_guard", None)
        source = getattr(guard, "originating_source", None)
        if source is None:
            continue
        for parent, node in _nested(source):
            if not isinstance(node, ConstDictKeySource):
                continue
            found = record(node.base)
            position = node.index
            if parent is None:  # a guard on the key itself
                if getattr(entry, "has_value", False) and nameable_key(entry.value):
                    known = found["keys"].setdefault(position, entry.value)
                    if known != entry.value or type(known) is not type(entry.value):
                        matters(found, f"key {position} was guarded as two values")
                else:
                    matters(found, f"its key at position {position} is not a constant")
            elif isinstance(parent, getitem) and parent.index is node and parent.base == node.base:
                found["read"].add(position)
            else:
                matters(found, f"its key at position {position} is used as an object")
    # Guards on the dict itself (seen once every positional dict is known).
    for entry in entries:
        guard = getattr(entry, "orig_guard", None)
        source = getattr(guard, "originating_source", None)
        name = getattr(source, "name", None)
        if name in records and entry.guard_type not in _ON_THE_DICT:
            matters(
                records[name],
                "the trace iterated it, or took its length, keys, values or items"
                if entry.guard_type == "DICT_KEYS_MATCH"
                else f"a {entry.guard_type} guard on the whole dict",
            )
    result = []
    for name, found in records.items():
        positions = set(found["read"])
        for read_name, position in sourced_reads:
            if read_name == name:
                positions |= set(found["keys"]) if position is None else {position}
        if any(p not in found["keys"] for p in positions):
            matters(found, "an entry read by position has no constant key")
        result.append(
            {
                "dict": name,
                "keys": sorted([p, k] for p, k in found["keys"].items()),
                "read": sorted(positions),
                "order": found["order"],
                "why": found["why"],
            }
        )
    return sorted(result, key=lambda r: r["dict"])


def reads_keys_positionally(code: Any) -> bool:
    """Whether Dynamo's transformed bytecode (a code object or Dynamo's serialized code)
    itself reads a dict's key by position."""
    names = set(getattr(code, "co_names", ()) or ())
    if names & set(POSITIONAL_BYTECODE_HELPERS):
        return True
    for const in getattr(code, "co_consts", ()) or ():
        if hasattr(const, "co_names") and reads_keys_positionally(const):
            return True
    return False
