"""Fingerprints of the Python state a single-graph trace read, computed the same way at
capture and when serving.

A make_fx trace runs the user's Python once and keeps only tensor operations: every
plain value it read on the way (a module's ``eps``, a user attribute, a module-level
float, the hooks on a module, which function an attribute holds) is baked into the
graph. The capture records a fingerprint of each such value; the artifact recomputes it
from the live objects whenever a watched dict changes and refuses a call whose state
differs. Both sides call these functions -- the capture imports this module, artifacts
carry its functions verbatim -- so "the same state" means the same thing to both.

A fingerprint is a literal (nested tuples of str, int, bool, None, bytes), so it renders
into the metadata section and compares with ``==``. Mutable containers are watched:
each dict reached is returned for its version tag to be watched; each other mutable
object (a list, a set, an object with ``__slots__``) is returned for a per-call identity
comparison of its direct contents (``shallow_contents``). Where two fingerprints differ,
in words, is ``fingerprint_differences``; names and code digests come from
``state_checks`` (``type_name``, ``code_fingerprint``), carried before this module.

Imports only the standard library at module level, and nothing but torch and the
standard library inside.
"""

from __future__ import annotations

from collections import ChainMap as _ChainMap
from collections import UserDict as _UserDict
from collections import UserList as _UserList
from collections import UserString as _UserString
from collections import deque as _deque
from contextvars import ContextVar as _ContextVar
from functools import cached_property as _cached_property
from functools import partial as _partial
from logging import Logger as _Logger
from queue import Queue as _Queue
from types import MappingProxyType as _MappingProxyType
from typing import Any
from weakref import WeakKeyDictionary as _WeakKeyDictionary
from weakref import WeakSet as _WeakSet
from weakref import WeakValueDictionary as _WeakValueDictionary
from weakref import ref as _weakref

# >>> not emitted: artifacts carry this module whole after state_checks, hook_kinds and
# hook_words, and their prelude binds the hook dicts' names
from precompile._compat.prelude import MODULE_HOOK_DICTS
from precompile.runtime.hook_kinds import inference_skip
from precompile.runtime.state_checks import code_fingerprint, type_name

# <<< not emitted


def new_context(names: Any, training: bool = True) -> dict[str, Any]:
    """What one fingerprinting pass needs and collects: the attribute names the trace's
    code reads (``names``), which module hooks count (backward hooks only when the
    capture ran a backward), and -- filled in -- the dicts to watch by version and the
    other mutable objects to compare by identity of their contents."""
    return {
        "names": names,
        "hook_dicts": MODULE_HOOK_DICTS if training else MODULE_HOOK_DICTS[:2],
        # An inference artifact leaves out forward hooks that only mark their output as
        # requiring grad (``marks_grad_only``): they change no value it computes.
        "training": training,
        "dicts": [],
        "shallow": [],
        # Objects whose instance ``__dict__`` is among ``dicts``: that dict can be
        # replaced whole (``m.__dict__ = d``) without a store into the watched one, so
        # the driver compares ``vars(holder)`` with it by identity too.
        "holders": [],
        "path": set(),
        # Objects told apart by identity only: id -> (their module-level name, the
        # object). Serving fills it with the names the capture recorded, resolved.
        "known": {},
        # Modules to look in first for such an object's name (capture: those of the
        # traced code), and the names found so far.
        "near": (),
        "named": {},
        # Whether this process's __main__ is the capture's, where such a name may be.
        "main": True,
        # Whether to look in every module (capture). Serving looks only where the
        # recorded names are: an object found nowhere there matches none of them.
        "everywhere": True,
        # User classes the fingerprints reached (a global class, the class of an object
        # an attribute holds): their class-level values are checked too
        # (``class_fingerprint``), a class attribute being as baked as an instance one.
        "classes": {},
        "contents": True,  # whether tensors in lists and dicts count (hooks_fingerprint)
    }


def shallow_contents(value: Any) -> tuple[Any, ...]:
    """The direct contents of a mutable object that has no version tag: compared by
    identity per call (nested mutables are watched on their own). Functions, which
    ``fingerprint`` collects too, are compared by the driver attribute by attribute. An
    OrderedDict (the only dicts collected here) by its keys in iteration order:
    ``move_to_end`` and ``popitem(last=False)`` reorder it without changing its version
    tag."""
    if isinstance(value, (list, _deque, set, bytearray, dict)):
        return tuple(value)
    missing = shallow_contents
    # Objects whose parts change in place with no store into any dict: a partial's
    # ``__setstate__``, a descriptor's ``__init__`` called again, a context variable's
    # ``set`` (or another thread's context), a weak reference's referent dying, an
    # array's elements or another library object's C state (``reduced_state``).
    if isinstance(value, _partial):
        return (value.func, value.args, value.keywords)
    if isinstance(value, property):
        return (value.fget, value.fset, value.fdel)
    if isinstance(value, (staticmethod, classmethod)):
        return (value.__func__,)
    if isinstance(value, _cached_property):
        return (value.func,)
    if isinstance(value, _ContextVar):
        return (value.get(missing),)
    if isinstance(value, _weakref):
        return (value(),)
    if isinstance(value, _Logger):
        return logger_state(value)
    if isinstance(value, memoryview):
        return (_view_bytes(value),)
    slots = _slots_of(type(value))
    if not slots and _declares_state(type(value)):
        state = reduced_state(value)
        if state is None:
            state = c_attributes(value)
        if state is not None:
            return _leaves(state)
    return tuple(getattr(value, slot, missing) for slot in slots)


#: Per C class, the names of the plain attributes it declares (``c_attributes``).
_C_ATTRIBUTES: dict[Any, tuple[str, ...]] = {}


def c_attributes(value: Any) -> tuple[tuple[str, Any], ...] | None:
    """A library object's public attributes that its C class declares (a
    ``struct.Struct``'s ``format`` and ``size``) and that hold literals: what tells
    apart one that can neither be copied nor holds an instance dict, and that
    ``__init__`` called again changes in place. None where there are none, and for
    the interpreter's own types (a generator's ``gi_running`` is bookkeeping)."""
    import types

    cls = type(value)
    if getattr(cls, "__module__", None) == "builtins":
        return None
    names = _C_ATTRIBUTES.get(cls)
    if names is None:
        kinds = (types.GetSetDescriptorType, types.MemberDescriptorType)
        names = tuple(
            sorted(
                {
                    name
                    for klass in cls.__mro__
                    for name, attr in vars(klass).items()
                    if isinstance(attr, kinds) and not name.startswith("_")
                }
            )
        )
        _C_ATTRIBUTES[cls] = names
    found = []
    for name in names:
        try:
            held = getattr(value, name)
        except Exception:
            continue
        if type(held) in _LITERAL_KINDS:
            found.append((name, held))
    return tuple(found) or None


def logger_state(logger: Any) -> tuple[Any, ...]:
    """What decides whether a logger logs: its effective level (its own or an
    ancestor's), its ``disabled`` flag and ``logging.disable``'s level."""
    return (logger.getEffectiveLevel(), logger.disabled, logger.manager.disable)


#: The names by which traced code asks a logger whether it logs (and branches on it).
_LOGGER_QUERIES = frozenset({"isEnabledFor", "getEffectiveLevel", "level", "disabled"})


def _view_bytes(view: memoryview) -> bytes | None:
    try:
        return view.tobytes()
    except ValueError:
        return None  # released


#: Per class, whether its instances hold state their class declares for a copy
#: (``_declares_state``): asked per call of a watched object, so answered once.
_DECLARES_STATE: dict[Any, bool] = {}


def _declares_state(cls: Any) -> bool:
    """Whether ``cls``'s instances may hold C state that ``reduced_state`` reads: a
    standard-library class, or a user class built on one (``class Gains(array)``, a
    ctypes ``Structure``) other than the containers compared element by element."""
    known = _DECLARES_STATE.get(cls)
    if known is None:
        known = _is_stdlib_class(cls) or any(
            _is_stdlib_class(base) and base not in _CONTAINER_KINDS and base is not object
            for base in getattr(cls, "__mro__", ())[1:]
        )
        _DECLARES_STATE[cls] = known
    return known


def same_contents(old: tuple[Any, ...], new: tuple[Any, ...]) -> bool:
    """Two ``shallow_contents`` the same, where an identity comparison said they were
    not: literals read out of C state (an array's bytes, a large int) are new objects
    on every read, and equal fingerprints are the same value."""
    return len(old) == len(new) and all(
        a is b or (type(a) in _LITERAL_KINDS and literal_fingerprint(a) == literal_fingerprint(b))
        for a, b in zip(old, new)
    )


def reduced_state(value: Any) -> Any:
    """What a library object's class says defines it, for a copy (its own
    ``__reduce_ex__`` or ``__getstate__``: an array's typecode and bytes, a ctypes
    value's bytes, a counter's next number, a StringIO's text, a decimal context's
    settings): state its methods read, much of it C state no dict holds. None where its
    class declares none of its own (the default copy of an instance dict: that dict is
    compared instead) or it cannot be copied (a lock, a thread-local, a file)."""
    import copyreg

    try:
        reduced = value.__reduce_ex__(4)
    except Exception:
        return None
    if not isinstance(reduced, tuple) or len(reduced) < 2:
        return None  # a global's name: the object is that global
    if reduced[0] in (copyreg.__newobj__, copyreg.__newobj_ex__, copyreg._reconstructor):  # type: ignore[attr-defined]
        # The default copy; the state is the class's own where it defines
        # ``__getstate__`` (a StringIO's text and position, an XML element's).
        if getattr(type(value), "__getstate__", None) is getattr(object, "__getstate__", None):
            return None
        return reduced[1:3]
    if type_name(type(value)) == "decimal.Context" and isinstance(reduced[1], tuple):
        # Its settings, not its flags (which arithmetic raises as it goes: bookkeeping).
        args = reduced[1]
        return (args[:6] + args[7:], None)
    return reduced[1:3]


def _leaves(value: Any) -> tuple[Any, ...]:
    if isinstance(value, (tuple, list)):
        return tuple(leaf for item in value for leaf in _leaves(item))
    if isinstance(value, dict):
        return tuple(leaf for pair in value.items() for leaf in _leaves(pair))
    return (value,)


def _slots_of(cls: Any) -> tuple[str, ...]:
    slots: list[str] = []
    for klass in getattr(cls, "__mro__", ()):
        declared = klass.__dict__.get("__slots__", ())
        if isinstance(declared, str):
            declared = (declared,)
        slots += [s for s in declared if s not in ("__dict__", "__weakref__")]
    return tuple(dict.fromkeys(slots))


def _is_library_class(cls: Any) -> bool:
    """A class of the standard library or of torch: pinned by their versions, and their
    large class dicts are not watched (a user's classes are)."""
    import sys

    top = str(getattr(cls, "__module__", "")).split(".")[0]
    return top == "torch" or top in sys.stdlib_module_names


def _note_class(cls: Any, context: dict[str, Any]) -> None:
    """Record a user class whose class-level values the traced code may read, and its
    user metaclass: ``Cfg.K`` resolves through ``type(Cfg)`` where no class along
    ``Cfg``'s MRO defines ``K`` (and a data descriptor there answers first)."""
    if not _is_library_class(cls):
        context["classes"].setdefault(cls, None)
        meta = type(cls)
        if meta is not type and not _is_library_class(meta):
            context["classes"].setdefault(meta, None)


#: The standard library's wrappers of a mapping, sequence or queue: their data is in
#: their instance dict (``data``, ``maps``, ``queue``), read by their own methods
#: (``cfg["scale"]`` runs ``UserDict.__getitem__``, ``q.get()`` reads ``q.queue``),
#: never by name in the traced code, so all of it is compared, for a user's subclass
#: too (a queue's data only, ``_QUEUE_DATA``: its task count and locks are
#: bookkeeping). (A ``deque`` is compared like a list.)
_WRAPPERS = (
    _UserDict,
    _UserList,
    _UserString,
    _ChainMap,
    _Queue,
    _WeakKeyDictionary,
    _WeakValueDictionary,
    _WeakSet,
)


_QUEUE_DATA = frozenset({"queue", "maxsize"})


def _is_value(cls: Any) -> bool:
    """A class of immutable values: instances compare by value (``__eq__`` of its own)
    and are hashable, so their state never changes in place."""
    return cls.__eq__ is not object.__eq__ and cls.__hash__ is not None


def _is_stdlib_class(cls: Any) -> bool:
    """A standard-library class other than those that exist to hold data (namespaces,
    ``_WRAPPERS``, compared as a user's objects are): its objects are fingerprinted by
    what the class declares defines them (``reduced_state``) or their whole instance
    dict, their own methods being what reads it (``_fingerprint_object``)."""
    import sys
    import types

    if (
        cls in (types.SimpleNamespace,)
        or type_name(cls) == "argparse.Namespace"
        or issubclass(cls, _WRAPPERS)
    ):
        return False
    return str(getattr(cls, "__module__", "")).split(".")[0] in sys.stdlib_module_names


_LITERAL_KINDS = (type(None), bool, int, str, bytes, float, complex)


def literal_fingerprint(value: Any) -> tuple[str, Any]:
    """A Python literal's fingerprint: its exact type's name and its value, a float or
    complex by ``repr``, which tells apart what ``==`` does not (``0.0 == -0.0`` yet
    ``x / 0.0`` and ``x / -0.0`` differ; a NaN equals nothing, yet it is the NaN the
    capture saw) and has a literal form where the value has none (``nan``, ``inf``).
    Two fingerprints are equal exactly when the values are, and only for the same type.
    For a value of another type (a subclass of a literal type among them), a tag no
    literal's fingerprint equals."""
    kind = type(value)
    if kind is float or kind is complex:
        return (kind.__name__, repr(value))
    if kind in _LITERAL_KINDS:
        return (kind.__name__, value)
    return ("not a literal", type_name(kind))


def keyed_fingerprint(value: Any, keys: list[Any], context: dict[str, Any]) -> Any:
    """A global dict the traced code read only by the constant ``keys`` (``CFG["a"]``,
    ``"b" in CFG``, ``CFG.get("c")``; ``bytecode_names.keyed_uses`` at capture): a dict
    fingerprint of those keys alone, ``("absent",)`` for each it lacks. A key added
    that no traced code looks up, or another order, leaves it equal; one of ``keys``
    added, removed or given another value changes it. Watched by version like any
    dict (a store into it makes the driver compute this again). Any other value there
    now (the dict replaced by another type) is fingerprinted whole, which never equals
    this."""
    if type(value) is not dict:
        return fingerprint(value, context)
    context["dicts"].append(value)
    return (
        type_name(dict),
        tuple(
            (literal_fingerprint(k), fingerprint(value[k], context) if k in value else ("absent",))
            for k in keys
        ),
    )


def home_globals(fn: Any) -> bool:
    """Whether a function runs in its module's namespace (``fn.__globals__`` is
    ``sys.modules[fn.__module__].__dict__``): a fact equal in every process for the same
    function. The same code made in another namespace (``FunctionType(code, ns)``) reads
    other globals than the module's, which the checks of global reads watch: it must not
    look like the function it copies."""
    import sys

    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    return module is not None and getattr(fn, "__globals__", None) is getattr(
        module, "__dict__", None
    )


def function_value(fn: Any, depth: int = 0) -> str | None:
    """What a plain function computes with, as text equal for two functions exactly
    when calling either computes the same: its module, qualified name, code digest,
    defaults, keyword defaults, closure cells' contents and the own attributes its code
    names (``fn.k``, read through its global name or a cell holding itself). None where
    one of those is not a plain value (a literal, a tuple of them, or such a function) or
    the function runs in other globals than its module's: an object is told apart by identity
    only, so no other function stands for one that holds it.

    Two functions one maker made with the same values (``make_act(2.0)`` called again,
    a registry filled again at import or after a reload) are the same value: a check
    of a function reached by an access path compares this where it would compare
    identity (``multigraph_name_checks``)."""
    import types

    def value(v: Any, level: int, outer: tuple[Any, ...]) -> Any:
        if type(v) in _LITERAL_KINDS:
            return literal_fingerprint(v)
        if type(v) is tuple:
            items = [value(item, level + 1, outer) for item in v]
            return None if None in items else ("tuple", tuple(items))
        if type(v) is dict and all(type(k) is str for k in v):
            pairs = [(k, value(item, level + 1, outer)) for k, item in sorted(v.items())]
            return None if any(p[1] is None for p in pairs) else ("dict", tuple(pairs))
        if isinstance(v, types.FunctionType):
            for back, enclosing in enumerate(reversed(outer)):
                if enclosing is v:
                    # A function reached again from itself (a recursive inner
                    # function's cell holds it): which enclosing one, not its value
                    # again -- two such functions one maker made are the same value.
                    return ("enclosing function", back)
            return described(v, level + 1, outer)
        return None

    def described(f: types.FunctionType, level: int, outer: tuple[Any, ...] = ()) -> Any:
        if level > 8 or not home_globals(f):
            return None
        inner = (*outer, f)
        cells = []
        for cell in f.__closure__ or ():
            try:
                cells.append(value(cell.cell_contents, level, inner))
            except ValueError:
                cells.append(("empty cell",))
        parts = [value(f.__defaults__, level, inner), value(f.__kwdefaults__, level, inner)]
        parts += cells
        if f.__dict__:
            # Its own attributes its code may read (``scaled.scale``): one it cannot
            # name (a registry's tag) decides nothing it computes.
            read = code_read_names(f)
            parts.append(value({k: v for k, v in f.__dict__.items() if k in read}, level, inner))
        if None in parts:
            return None
        return ("function", f.__module__, f.__qualname__, code_fingerprint(f.__code__), *parts)

    if not isinstance(fn, types.FunctionType):
        return None
    found = described(fn, depth)
    return None if found is None else repr(found)


def fingerprint(value: Any, context: dict[str, Any], depth: int = 0) -> Any:
    """A literal that changes whenever ``value`` would make the traced code behave
    differently, as far as a Python value can: literals by type and exact value
    (floats by ``repr``), containers element by element, functions by module, name and
    code, classes and modules by name, objects by type and the attributes the trace's
    code reads, tensors by their metadata (their values are graph inputs, or were
    refused at capture as constants)."""
    import enum
    import types

    import torch

    kind = type(value)
    if kind in _LITERAL_KINDS:
        return literal_fingerprint(value)
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return ("torch", kind.__name__, str(value))
    if isinstance(value, torch.nn.Parameter):
        # A module attribute holding parameters is often a cache of its own (an LSTM's
        # _flat_weights): by metadata, and by requires_grad only where the traced code
        # reads that name -- otherwise a parameter's flag is checked with the parameter,
        # where the graph depends on it (single_graph.requires_grad_is_captured), so
        # requires_grad_(False) before serving an inference artifact is served.
        meta = ("parameter", tuple(value.shape), str(value.dtype), str(value.device))
        return (*meta, bool(value.requires_grad)) if "requires_grad" in context["names"] else meta
    if isinstance(value, torch.Tensor):
        # By metadata only: a tensor's values reach the graph as an input (buffers,
        # checked on their own) or were refused at capture as a constant.
        return (
            "tensor",
            tuple(value.shape),
            str(value.dtype),
            str(value.device),
            bool(value.requires_grad),
        )
    if isinstance(value, type):
        # By name here; the values the trace may read through it (``Settings.k``) are
        # checked with its class record.
        _note_class(value, context)
        return ("class", type_name(value))
    if isinstance(value, types.ModuleType):
        if not _is_project_module(value):
            return ("module", value.__name__)
        # A project module held as a value (``self.cfg = cfgmod``): the attributes the
        # trace may read through it are its state, as a global module's would be.
        state = vars(value)
        context["dicts"].append(state)
        read = sorted(k for k in state if k in context["names"] and not k.startswith("__"))
        return (
            "module",
            value.__name__,
            tuple((k, fingerprint(state[k], context, depth + 1)) for k in read),
        )
    if isinstance(value, enum.Enum):
        # By name and value: a member's value is what ``.value`` reads, and it changes
        # with the class's source (``A = 2.0`` -> ``A = 3.0``) while its name does not.
        member_value = getattr(value, "_value_", None)
        return ("enum", type_name(kind), value.name, fingerprint(member_value, context, depth + 1))
    if depth > 8 or id(value) in context["path"]:
        return ("deep", type_name(kind))
    context["path"].add(id(value))
    try:
        return _fingerprint_container(value, kind, context, depth + 1)
    finally:
        context["path"].discard(id(value))


#: The builtin containers fingerprinted element by element; a subclass's class is noted.
_CONTAINER_KINDS = (list, tuple, dict, set, frozenset, _deque)


def _fingerprint_container(value: Any, kind: Any, context: dict[str, Any], depth: int) -> Any:
    import collections
    import functools
    import numbers
    import types

    import torch

    def fp(v: Any) -> Any:
        return fingerprint(v, context, depth)

    if isinstance(value, _CONTAINER_KINDS) and kind not in _CONTAINER_KINDS:
        # A subclass (``class Table(dict)`` with ``__missing__``): its lookups run its
        # class's code, checked with its class record like an object's class.
        _note_class(kind, context)
    if not context["contents"] and isinstance(value, (list, _deque, dict)):
        # Less the tensors a hook stores (activations): they change with every call.
        # Still watched (a dict by version, a list by its contents), so that what the
        # hook reads there (``box[0]``, ``table["act"]``) changed is seen per call; a
        # tensor stored makes the driver compare the fingerprint again, not refuse.
        if isinstance(value, dict):
            context["dicts"].append(value)
        context["shallow"].append(value)
        pairs = value.items() if isinstance(value, dict) else ((None, v) for v in value)
        kept = tuple((fp(k), fp(v)) for k, v in pairs if not isinstance(v, torch.Tensor))
        return (type_name(kind), kept)
    if isinstance(value, (list, tuple, _deque)):
        # A deque too: a standard-library class, yet its elements are the data read
        # (``self.window[0]``), not bookkeeping; compared per call like a list's.
        if not isinstance(value, tuple):
            context["shallow"].append(value)
        return (type_name(kind), tuple(fp(v) for v in value))
    if isinstance(value, dict):
        context["dicts"].append(value)
        if isinstance(value, collections.OrderedDict):
            context["shallow"].append(value)
        return (type_name(kind), tuple((fp(k), fp(v)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        if isinstance(value, set):
            context["shallow"].append(value)
        return (type_name(kind), tuple(sorted((fp(v) for v in value), key=repr)))
    if isinstance(value, (bytearray, range, slice)):
        if isinstance(value, bytearray):
            context["shallow"].append(value)
        return (type_name(kind), repr(value))
    if isinstance(value, types.FunctionType):
        # Its code, defaults and cells are attributes no watched dict holds: the
        # driver compares them per call by identity. Its own attributes the trace's code
        # may read (``act.scale``, through a cell holding itself) are in its __dict__,
        # watched by version like any dict; and which globals it runs in is part of it
        # (the same code in another namespace reads other globals than those checked).
        context["shallow"].append(value)
        own = value.__dict__
        context["dicts"].append(own)
        read = sorted(k for k in own if type(k) is str and k in context["names"])
        cells = []
        for name, cell in zip(value.__code__.co_freevars, value.__closure__ or ()):
            try:
                cells.append((name, fp(cell.cell_contents)))
            except ValueError:
                cells.append((name, ("empty cell",)))
        return (
            "function",
            str(value.__module__),
            value.__qualname__,
            code_fingerprint(value.__code__),
            fp(value.__defaults__),
            fp(value.__kwdefaults__),
            tuple(cells),
            ("globals", "module" if home_globals(value) else "other"),
            tuple((k, fp(own[k])) for k in read),
        )
    if isinstance(value, functools._lru_cache_wrapper) and isinstance(
        value.__wrapped__, types.FunctionType
    ):
        # An lru_cache runs its wrapped function on a miss (a cleared cache): that
        # function's code, defaults and cells are watched like a global function's.
        return ("lru_cache", fp(value.__wrapped__))
    if isinstance(value, types.MethodType):
        return ("method", fp(value.__func__), fp(value.__self__))
    if isinstance(value, (property, staticmethod, classmethod, _cached_property, _partial)):
        # Their parts are C slots no dict holds, replaced in place by ``__init__``
        # called again or a partial's ``__setstate__``: compared per call
        # (``shallow_contents``) as well.
        context["shallow"].append(value)
    if isinstance(value, property):
        # A property's behaviour is its functions: one replaced by another property
        # of the same type must not look the same.
        return ("property", fp(value.fget), fp(value.fset), fp(value.fdel))
    if isinstance(value, (staticmethod, classmethod)):
        return (type(value).__name__, fp(value.__func__))
    if isinstance(value, functools.cached_property):
        return ("cached_property", fp(value.func))
    if isinstance(value, functools.partial):
        return ("partial", fp(value.func), fp(value.args), fp(value.keywords))
    if isinstance(value, memoryview):
        # A view of another object's buffer, written through it or the object.
        context["shallow"].append(value)
        try:
            shape = (value.format, value.shape)
        except ValueError:
            shape = None
        return ("memoryview", repr(shape), _view_bytes(value))
    if isinstance(value, _weakref):
        # Read by calling it: what it refers to now, or that it died. One to a tensor
        # is a cache's (an LSTM's ``_flat_weight_refs``, compared with its parameters
        # to refresh ``_flat_weights``): a tensor's values are graph inputs, so one
        # referring to another tensor, or to none since its parameter was replaced,
        # computes the same.
        context["shallow"].append(value)
        referent = value()
        if referent is None or isinstance(referent, torch.Tensor):
            return ("weakref", ("a tensor or dead",))
        return ("weakref", fp(referent))
    if isinstance(value, _ContextVar):
        # Read by ``get()``: the value in the calling context, which ``set`` (or
        # another thread's or task's context) changes with no store into any dict.
        context["shallow"].append(value)
        try:
            current = fp(value.get())
        except LookupError:
            current = ("unset",)
        return ("context variable", value.name, current)
    if isinstance(value, _MappingProxyType):
        # A read-only view of a mapping that its owner changes: that mapping.
        import gc

        return ("mappingproxy", tuple(map(fp, gc.get_referents(value))))
    if type_name(kind) in ("torch._ops.OpOverload", "torch._ops.OpOverloadPacket"):
        return ("op", str(value))
    if callable(value) and not hasattr(value, "__dict__") and hasattr(value, "__qualname__"):
        # Builtins, method descriptors, torch ops: named by where they live.
        owner = getattr(value, "__module__", None) or type_name(
            type(getattr(value, "__self__", None))
        )
        return ("builtin", str(owner), value.__qualname__)
    if isinstance(value, numbers.Number):
        return ("number", type_name(kind), repr(value))
    if isinstance(value, torch.nn.Module):
        _note_class(kind, context)
        return ("nn.Module", *module_fingerprint(value, context, depth))
    return _fingerprint_object(value, kind, context, depth)


def _is_project_module(module: Any) -> bool:
    """A module of the user's project: not torch's, not the standard library's or an
    installed package's (which change by version, not by edit)."""
    import sys

    path = getattr(module, "__file__", None)
    if not path or module.__name__.split(".")[0] == "torch":
        return False
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return "site-packages" not in path and not any(path.startswith(r) for r in roots if r)


def identity_name(value: Any, context: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The one module-level name (module, name) by which another process finds an object
    that only its identity tells apart (a sentinel such as ``FAST = object()``,
    ``dataclasses.MISSING``), or ``()`` when no module binds it.

    Serving looks it up among the names the capture recorded, resolved in this process
    (``context["known"]``): the check is that the recorded name still holds this very
    object. Otherwise -- at capture, or for an object that is not the one recorded --
    the name is searched for, in an order that does not depend on the process: the
    module that defines its class, the modules of the traced code (serving: of the
    recorded names), every other module by name (capture only), and ``__main__`` last
    (a script importing ``FAST`` binds it there too, and another process runs another
    ``__main__``)."""
    import sys

    hit = context["known"].get(id(value))
    if hit is not None and hit[1] is value:
        return (hit[0],)
    named = context["named"]
    found = named.get(id(value))
    if found is not None and found[1] is value:
        return found[0]
    modules = sys.modules
    first = [str(getattr(type(value), "__module__", "")), *context["near"]]
    rest = sorted(n for n in list(modules) if n not in first) if context["everywhere"] else []
    result: tuple[tuple[str, str], ...] = ()
    main = modules.get("__main__")
    for module_name in [*first, *rest]:
        module = modules.get(module_name)
        if module_name == "__main__" or module is main:  # __mp_main__ is __main__
            continue
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict):
            keys = sorted(k for k, v in list(namespace.items()) if v is value)
            if keys:
                result = ((module_name, keys[0]),)
                break
    if not result and context["main"]:
        # Serving looks in __main__ only when it is the script captured from.
        namespace = getattr(modules.get("__main__"), "__dict__", None) or {}
        keys = sorted(k for k, v in list(namespace.items()) if v is value)
        result = (("__main__", keys[0]),) if keys else ()
    named[id(value)] = (result, value)
    return result


def _fingerprint_object(value: Any, kind: Any, context: dict[str, Any], depth: int) -> Any:
    names = context["names"]
    if kind is object or (
        getattr(value, "__dict__", None) is None
        and "__slots__" in getattr(kind, "__dict__", {})
        and not _slots_of(kind)
    ):
        # No state at all: only its identity tells it apart, named by the module
        # global bound to it. One that no global holds is refused at capture.
        return ("sentinel", type_name(kind), identity_name(value, context))
    if _is_stdlib_class(kind) and _is_value(kind):
        # An immutable value (a timedelta, a path, a compiled pattern): by its repr,
        # which names its value; ``m.delay = timedelta(seconds=5)`` replaces it.
        text = repr(value)
        if " at 0x" not in text:  # a repr by identity differs in every process
            return ("value", type_name(kind), text)
    if isinstance(value, _Logger):
        # By name (``getLogger`` finds it again) and, where the traced code asks it
        # whether it logs (``isEnabledFor``), by what decides that; its level cache and
        # handlers are bookkeeping, and ``log.debug(...)`` alone decides nothing.
        context["shallow"].append(value)
        if any(query in names for query in _LOGGER_QUERIES):
            return ("logger", value.name, tuple(map(literal_fingerprint, logger_state(value))))
        return ("logger", value.name)
    if _is_stdlib_class(kind):
        state = reduced_state(value)
        if state is not None:
            # The state its class declares (``reduced_state``), compared per call:
            # ``self.arr[0] = 3.0`` changes an array with no store into any dict.
            context["shallow"].append(value)
            # The words for a refusal, where short, naming no address, and showing only
            # what the state holds (a decimal context's repr shows its flags too).
            text = repr(value)
            plain = len(text) <= 120 and " at 0x" not in text
            shown = text if plain else ""
            if type_name(kind) == "decimal.Context":
                shown = "a decimal context with " + ", ".join(
                    f"{name}={getattr(value, name)}"
                    for name in ("prec", "rounding", "Emin", "Emax", "capitals", "clamp")
                )
            return ("library object", type_name(kind), fingerprint(state, context, depth), shown)
        if getattr(value, "__dict__", None) is None:
            declared = c_attributes(value)
            if declared is not None:
                # What its C class declares readable (a ``struct.Struct``'s format):
                # ``__init__`` called again changes it in place.
                context["shallow"].append(value)
                return (
                    "library object",
                    type_name(kind),
                    fingerprint(declared, context, depth),
                    "",
                )
            # No state it declares or holds in a dict (a lock): one a module-level name
            # holds (dataclasses.MISSING) is told apart by that name.
            named = identity_name(value, context)
            return ("sentinel", type_name(kind), named) if named else ("object", type_name(kind))
        # Otherwise its whole instance dict (below): its own methods read it
        # (``Template.substitute`` its ``template``, a ``partialmethod`` its
        # ``keywords``), never by name in the traced code.
    # Its class-level values (a config's ``scale = 2.0``, a method) are read through it.
    _note_class(kind, context)
    attrs: list[Any] = []
    if isinstance(value, (str, bytes)):
        # A user class on str or bytes (``class Tag(str)``): the text it is, which
        # ``self.mode == "fast"`` reads (a slice is of the base type: no user code runs).
        attrs.append(("<its value>", literal_fingerprint(value[:])))
    if _declares_state(kind) and not _is_stdlib_class(kind):
        # A user class built on a library one (``class Gains(array.array)``, a ctypes
        # ``Structure``): the C state its base declares, compared per call.
        held = reduced_state(value)
        if held is not None:
            context["shallow"].append(value)
            attrs.append(("<its C state>", fingerprint(held, context, depth)))
    state = getattr(value, "__dict__", None)
    if isinstance(state, dict):
        context["dicts"].append(state)
        context["holders"].append(value)
        whole = isinstance(value, _WRAPPERS) or _is_stdlib_class(kind)
        data = _QUEUE_DATA if isinstance(value, _Queue) else None
        attrs += [
            (k, fingerprint(v, context, depth))
            for k, v in state.items()
            if (whole and (data is None or k in data)) or k in names
        ]
    slots = [s for s in _slots_of(kind) if s in names]
    if slots:
        context["shallow"].append(value)
        for slot in slots:
            if hasattr(value, slot):
                attrs.append((slot, fingerprint(getattr(value, slot), context, depth)))
    if not attrs:
        # The trace read none of its state, so it can only have compared it by
        # identity (``self.mode is FAST`` with ``class Marker: pass``): one a
        # module-level name holds is told apart by that name. One no name holds is
        # never the object a global names, at capture or when served.
        named = identity_name(value, context)
        if named:
            return ("sentinel", type_name(kind), named)
    return ("object", type_name(kind), tuple(sorted(attrs)))


#: Instance attributes every nn.Module has: its bookkeeping, each checked on its own
#: (parameters, buffers, children and training flags by the model checks, hooks by
#: ``hooks_fingerprint``) or irrelevant to what a call computes.
_MODULE_BOOKKEEPING = frozenset(
    {
        "training",
        "_parameters",
        "_buffers",
        "_non_persistent_buffers_set",
        *MODULE_HOOK_DICTS,
        "_is_full_backward_hook",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks_with_kwargs",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
        "_modules",
        "_compiled_call_impl",
    }
)


def hook_dict(holder: Any, dict_name: str) -> Any:
    return holder[dict_name] if isinstance(holder, dict) else getattr(holder, dict_name, None) or {}


def hooks_fingerprint(
    holder: Any,
    dict_names: tuple[str, ...],
    flags: Any,
    path: Any = (),
    contents: bool = True,
    skip: Any = None,
    outer: dict[str, Any] | None = None,
) -> Any:
    """The hooks in ``holder``'s hook dicts, in order, each by function identity
    (``fingerprint``: code, closure, defaults) and its registration flags (with kwargs,
    always called), not by handle id (a per-process counter): how both tracers identify
    a hook. ``path``: objects being fingerprinted already (a hook bound to its own module
    reaches it again). ``contents`` False (Dynamo): the tensors in lists and dicts a hook
    reaches are left out -- a hook storing activations into one stays the same hook.
    ``skip(dict name, hook)`` leaves a hook out (``inference_skip``). ``outer``: the
    fingerprinting pass of the module holding the hooks (``module_fingerprint``): the
    hooks are fingerprinted in it -- by the attribute names the trace's code reads (a
    callable object's or a bound method's ``self.k``) -- and the mutable objects they
    reach (a closure's list, a partial's arguments) join the ones that pass watches, so
    the serving driver's per-call fast path sees them change as it sees the model's."""
    if outer is not None:
        context = outer
    else:
        # No trace-level read names (Dynamo): the names the hooks' own code reads.
        context = new_context(hook_read_names(holder, dict_names))
        context["path"] = set(path)
        context["contents"] = contents
    result = []
    for dict_name in dict_names:
        hooks = hook_dict(holder, dict_name)
        result.append(
            tuple(
                (fingerprint(hook, context), tuple(bool(f.get(key)) for f in flags(dict_name)))
                for key, hook in hooks.items()
                if skip is None or not skip(dict_name, hook)
            )
        )
    return tuple(result)


def code_read_names(value: Any, seen: set[int] | None = None) -> set[str]:
    """The attribute names code reachable from a hook may read: the names and string
    constants of its code (nested code too), of a bound method's or partial's function,
    and of the functions a callable object's user class defines (its ``__call__`` and
    the methods that may call). What ``fx_watch.read_names`` is for a make_fx trace,
    for a tracer that records no read names: a hook's ``self.k`` counts, an attribute
    none of its code names does not."""
    import functools
    import types

    seen = set() if seen is None else seen
    if id(value) in seen:
        return set()
    seen.add(id(value))
    names: set[str] = set()
    if isinstance(value, types.CodeType):
        names.update(value.co_names)
        for const in value.co_consts:
            if isinstance(const, str) and const.isidentifier():
                names.add(const)
            elif isinstance(const, types.CodeType):
                names |= code_read_names(const, seen)
        return names
    if isinstance(value, types.FunctionType):
        return code_read_names(value.__code__, seen)
    if isinstance(value, types.MethodType):
        return code_read_names(value.__func__, seen) | code_read_names(value.__self__, seen)
    if isinstance(value, functools.partial):
        return code_read_names(value.func, seen)
    for klass in type(value).__mro__[:-1]:
        if _is_library_class(klass):
            continue
        for member in list(vars(klass).values()):
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if isinstance(member, property):
                member = member.fget
            if isinstance(member, types.FunctionType):
                names |= code_read_names(member, seen)
    return names


def hook_read_names(holder: Any, dict_names: tuple[str, ...]) -> frozenset[str]:
    """``code_read_names`` of every hook in ``holder``'s hook dicts."""
    names: set[str] = set()
    for dict_name in dict_names:
        for hook in list(hook_dict(holder, dict_name).values()):
            names |= code_read_names(hook)
    return frozenset(names)


def module_hook_flags(module: Any) -> Any:
    """``flags(dict_name)``: the dicts holding a module's hooks' registration flags."""

    def flags(dict_name: str) -> tuple[dict[Any, Any], ...]:
        if dict_name == "_forward_hooks":
            return (module._forward_hooks_with_kwargs, module._forward_hooks_always_called)
        if dict_name == "_forward_pre_hooks":
            return (module._forward_pre_hooks_with_kwargs,)
        return ()

    return flags


#: Types whose truth test (``bool(x)``) is pure and total, by exact type: it stores
#: nothing, raises nothing and answers for every value (a container's is its length). A
#: flag read only as ``x.flag and x.training`` decides nothing in eval *after* its truth
#: test, which eager runs first: served with any value of these types, checked by type
#: otherwise (a subclass may define ``__bool__`` or ``__len__``; a many-valued tensor's
#: or an array's raises; any object's may store). Shared by both tracers.
PURE_TRUTH_TYPES = frozenset(
    {type(None), bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset}
)

#: How ``MODULE_READS`` writes a name the trace read only for its truth test, under
#: ``training`` (``neutral_reads.settle_training_only_reads``): ``[TRUTH_ONLY, name]``.
TRUTH_ONLY = "truth only"


def truth_kind(value: Any) -> tuple[str, str]:
    """What a flag read only for its truth test is checked by: "pure" for a value of a
    ``PURE_TRUTH_TYPES`` type, else its type's name (a change of it refuses)."""
    kind = type(value)
    return ("truth test", "pure" if kind in PURE_TRUTH_TYPES else type_name(kind))


def truth_refusal(where: str, attr: str, kind: str) -> str:
    """The refusal of a flag read only for its truth test (``truth_kind``) that now holds
    a value of type ``kind`` outside ``PURE_TRUTH_TYPES``, ``where`` naming its module:
    one text for both tracers (make_fx's module state check, Dynamo's module check)."""
    return (
        f"precompile: {where} has {attr} set to a {kind}: the traced code reads {attr} "
        f"only as `{attr} and training`, which decides nothing in eval, but eager runs "
        f"{attr}'s truth test before it reads `training`, and a {kind} is not a type whose "
        f"truth test is known to be pure (it may store, raise, or be ambiguous as a "
        f"many-valued tensor's is). Set {attr} to a bool, or capture again (re-emit the "
        f"artifact)"
    )


def truth_deleted_refusal(where: str, attr: str) -> str:
    """The refusal of a flag read only for its truth test that the module (or a class
    of its MRO) held at capture and no longer holds: eager's plain read of it raises.
    One text for both tracers."""
    return (
        f"precompile: {where} has no attribute {attr!r} (deleted since capture, when it "
        f"held one): the traced code reads {attr} as `{attr} and training`, and eager's "
        f"read of it may now raise. Restore it (a bool), or capture again (re-emit the "
        f"artifact)"
    )


def split_reads(row: Any) -> tuple[frozenset[str] | None, dict[str, bool]]:
    """One submodule's ``MODULE_READS`` entry as (the names whose values the trace read,
    or None where its reads were not seen; the names it read only for their truth
    test, each with whether the module or its class held it at capture:
    ``[TRUTH_ONLY, name, True]``; one absent then was read by ``getattr`` with a
    default, which stays served absent)."""
    if row is None:
        return None, {}
    names = frozenset(n for n in row if isinstance(n, str))
    truth = {
        n[1]: len(n) > 2 and bool(n[2])
        for n in row
        if not isinstance(n, str) and n[0] == TRUTH_ONLY
    }
    return names, truth


def module_fingerprint(
    module: Any,
    context: dict[str, Any],
    depth: int = 0,
    children: bool = True,
    own: Any = None,
    truth: Any = None,
) -> tuple[Any, ...]:
    """One module's own state as a trace depends on it: its type, the attributes the
    trace read on it (``own``, when the capture saw its reads) or else those whose names
    the trace's code reads (``context``), and its hooks. Its children are
    fingerprinted on their own (``children=False``) when the module is a module
    argument; for a module held any other way (a global, an attribute) they are
    included, with the names of its parameters and buffers. ``truth``: names read only
    for their truth test (each with whether it was held at capture: ``split_reads``),
    each fingerprinted by ``truth_kind`` (absent from the instance, it is read from the
    class, whose value is checked with the class); one held at capture and now held
    nowhere is "absent" (eager's plain read raises)."""
    state = vars(module)
    hook_dicts = context["hook_dicts"]
    context["holders"].append(module)
    # Hook dicts are OrderedDicts: their order is the order the hooks run in.
    context["shallow"] += [d for d in map(vars(module).get, hook_dicts) if d]
    context["dicts"] += [
        state,
        module._parameters,
        module._buffers,
        module._modules,
        *(getattr(module, name) for name in hook_dicts),
    ]
    names = context["names"] if own is None else own
    attrs = tuple(
        (k, fingerprint(v, context, depth))
        for k, v in state.items()
        if k in names and k not in _MODULE_BOOKKEEPING
    )
    if truth:
        attrs += tuple(
            (
                k,
                truth_kind(state[k])
                if k in state
                else ("truth test", "absent")
                if truth[k] and not any(k in vars(c) for c in type(module).__mro__)
                else ("truth test", "pure"),
            )
            for k in sorted(truth)
        )

    hooks = hooks_fingerprint(
        module,
        hook_dicts,
        module_hook_flags(module),
        context["path"],
        skip=inference_skip(context.get("training", True)),
        outer=context,
    )
    if not children:
        return (type_name(type(module)), attrs, hooks)
    kids = tuple(
        (name, None if child is None else fingerprint(child, context, depth))
        for name, child in module._modules.items()
    )
    tensors = (tuple(module._parameters), tuple(module._buffers))
    return (type_name(type(module)), attrs, hooks, kids, tensors)
