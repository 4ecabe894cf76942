"""Classes as a trace depends on them, for both artifact kinds: the class-level values the
traced code may read through an instance or the class itself (``class_fingerprint``), and
every class a fingerprinting pass reached (``reached_classes``). A class's values are
fingerprinted like any other value (``value_fingerprints.fingerprint``); what is
class-specific is which names count: those the trace reads, and the special methods
Python calls implicitly (``PROTOCOL_DUNDERS``).

Emitted verbatim into both artifact kinds after ``value_fingerprints``
(``capturing.carried``).
"""

from __future__ import annotations

from typing import Any

# >>> not emitted: artifacts carry state_checks and value_fingerprints before this module
from precompile.runtime.state_checks import type_name
from precompile.runtime.value_fingerprints import fingerprint, truth_kind

# <<< not emitted


#: Special methods Python calls implicitly (no traced code names them): how an instance
#: is called, how its attributes resolve, its truth and container protocol (a dict
#: subclass's ``__missing__``, which ``dict.__getitem__`` calls for an absent key).
PROTOCOL_DUNDERS = frozenset(
    {
        "__call__",
        "__getattr__",
        "__getattribute__",
        "__setattr__",
        "__delattr__",
        "__get__",
        "__bool__",
        "__len__",
        "__getitem__",
        "__missing__",
        "__contains__",
        "__iter__",
        "__eq__",
        "__hash__",
    }
)


#: Protocol dunders Python calls only on a store or a delete of an attribute: where the
#: read names say which of them the traced call entered (``ENTERED_RECORDED`` among
#: them: the make_fx capture records every Python function the traced call entered),
#: one that never ran is left out of the class records. No traced call stored or
#: deleted through it, so replacing it changes no traced call (a forward that starts to
#: store has new code, which is compared). A C-level one (no ``__code__``: entering it
#: shows no Python frame) is always kept.
ENTERED_ONLY_DUNDERS = frozenset({"__setattr__", "__delattr__"})
#: The read name that says the names record which ``ENTERED_ONLY_DUNDERS`` ran (not an
#: identifier: no attribute has this name). Without it (Dynamo) every dunder counts.
ENTERED_RECORDED = "<protocol dunders entered>"


def _unentered(key: str, value: Any, names: Any) -> bool:
    """Whether ``key`` is a store/delete dunder the traced call is known not to have
    entered (see ``ENTERED_ONLY_DUNDERS``)."""
    return (
        key in ENTERED_ONLY_DUNDERS
        and key not in names
        and ENTERED_RECORDED in names
        and hasattr(value, "__code__")
    )


#: The key of a context (``value_fingerprints.new_context``) that holds, by class name
#: (``type_name``), the class-level names the traced code read only for their truth
#: test: the capture's (``neutral_reads.class_truth_names``), or at serving time those
#: the class records hold as truth kinds (``class_truth_of``).
CLASS_TRUTH = "class_truth"


def is_truth_record(fp: Any) -> bool:
    """Whether a class record's entry is a truth kind (``truth_kind``), not a value's
    fingerprint (whose first item is a type name, never ``"truth test"``)."""
    return type(fp) in (tuple, list) and len(fp) == 2 and fp[0] == "truth test"


def class_truth_of(records: Any) -> dict[str, frozenset[str]]:
    """``CLASS_TRUTH`` as the recorded class records tell it: per class, the names
    recorded by their truth kind."""
    return {
        cls: frozenset(name for name, fp in record if is_truth_record(fp))
        for cls, record in records
    }


def class_fingerprint(cls: Any, context: dict[str, Any]) -> tuple[Any, ...]:
    """The class-level values the traced code may read through an instance of ``cls``
    or through ``cls`` itself (a method, a class attribute ``scale = 2.0``, a property,
    ``__call__``), first match along the MRO, by the names in ``context`` and the
    special methods Python calls implicitly. Each class's own dict is watched: a method
    monkeypatched or a class attribute set at run time changes its version.

    A name the traced code read only for its truth test, through instances of ``cls``
    in eval (``x.flag and x.training``: the capture's ``CLASS_TRUTH``, see
    ``neutral_reads.class_truth_names``), is fingerprinted by ``truth_kind``, as the
    same flag held by the instance is: any value of a pure-truth type decides nothing."""
    import gc

    names = context["names"]
    truth = context[CLASS_TRUTH].get(type_name(cls), ()) if CLASS_TRUTH in context else ()
    found: dict[str, Any] = {}
    for klass in cls.__mro__[:-1]:  # every class but object
        namespace = vars(klass)
        context["dicts"] += [r for r in gc.get_referents(namespace) if isinstance(r, dict)]
        for key, value in namespace.items():
            if key in found:
                continue
            if (key in PROTOCOL_DUNDERS and not _unentered(key, value, names)) or (
                key in names and not key.startswith("__")
            ):
                found[key] = value
    return tuple(
        (key, truth_kind(value) if key in truth else fingerprint(value, context))
        for key, value in sorted(found.items())
    )


def reached_classes(start: Any, context: dict[str, Any]) -> list[tuple[Any, Any]]:
    """Each class of ``start`` (the submodules' classes) and each user class the
    fingerprints in ``context`` reached -- a class attribute holding an object reaches
    its class too -- with its ``class_fingerprint``, in the order first reached."""
    order = list(dict.fromkeys([*start, *context["classes"]]))
    records = []
    i = 0
    while i < len(order):
        cls = order[i]
        i += 1
        records.append((cls, class_fingerprint(cls, context)))
        order += [c for c in context["classes"] if c not in order]
    return records
