"""Record the library surface a trace went through (``LIBRARY_SURFACE``), for both
tracers: every torch (or installed library) function, method and module-class attribute
the trace called, by the path it was resolved through.

The tracers tell what was called -- make_fx by the profile hook of
``precompile.capturing.fx_watch`` (the builtins called and the library functions entered from
eager code: the user's, ``torch.nn``'s, an installed library's), Dynamo by its graphs'
targets and the code it inlined -- and this module finds where each was reached from:

- a module attribute (``torch.nn.functional.gelu``, ``torch.relu``): the library modules
  bound in the globals of the code that ran (``F`` in the user's module and in
  ``torch.nn.modules.activation``), and those code's own modules;
- a class attribute, looked up along the MRO (``torch.Tensor.softmax``, resolved on
  ``TensorBase``; ``torch.nn.LayerNorm.forward``): of ``torch.Tensor`` and of every
  library class of a module the trace reached;
- a registry entry: a key of a mapping a library module holds, a plain dict
  (``ACT2FN``-style) or a mapping object whose entries live in its own or its class's
  dicts (``transformers``' ``ALL_ATTENTION_FUNCTIONS["sdpa"]``, which
  ``AttentionInterface.register`` rebinds). Found by value: the function the trace ran
  is among the mapping's entries; checked by the mapping's own lookup, so a local
  override (``ALL_ATTENTION_FUNCTIONS["sdpa"] = k``) counts as much as a registration.

Each path is recorded with the key of the object there (``surface_checks.surface_key``),
which another process computes alike: a replacement made before load is refused at load,
one made later on the first call after it (``precompile.runtime.surface_checks``). Project code is
not recorded here: its own records (``GLOBAL_READS``, ``CLASS_STATE``, ``CLASS_ATTRS``)
check it.
"""

from __future__ import annotations

import dis
import functools
import inspect
import os
import sys
import types
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from precompile._compat.prelude import GLOBAL_MODULE_HOOK_NAMES, python_kernels_registry
from precompile.locations import is_project_file, is_user_file
from precompile.runtime.surface_checks import python_kernels, surface_key, surface_shown

_TORCH_DIR = os.path.dirname(torch.__file__)
#: torch's Python code that eager runs inside a model's forward as the trace does.
EAGER_LIBRARY = (
    os.path.join(_TORCH_DIR, "nn") + os.sep,
    os.path.join(_TORCH_DIR, "functional.py"),
    os.path.join(_TORCH_DIR, "_tensor.py"),
)
_eager_files: dict[str, bool] = {}


#: torch.nn's helpers of make_fx's functional call, which eager never runs.
_TRACING_HELPERS = (
    os.path.join(_TORCH_DIR, "nn", "utils", "stateless.py"),
    os.path.join(_TORCH_DIR, "nn", "utils", "_named_member_accessor.py"),
)


def is_eager_file(filename: str) -> bool:
    """Code eager runs in a served call as the trace ran it: the user's (a project's or
    an installed library's) and torch's module library -- not torch's tracing machinery
    (nor ``torch.func.functional_call``'s helpers in ``torch.nn.utils``) or precompile."""
    found = _eager_files.get(filename)
    if found is None:
        found = _eager_files[filename] = (
            filename.startswith(EAGER_LIBRARY) and not filename.startswith(_TRACING_HELPERS)
        ) or is_user_file(filename)
    return found


def _library_module(module: object) -> bool:
    """A module of torch or of an installed library (not the project's, whose globals
    are recorded by their own reads, nor the standard library's)."""
    if not isinstance(module, types.ModuleType):
        return False
    file = getattr(module, "__file__", None)
    name = getattr(module, "__name__", "")
    if not isinstance(name, str) or name == "__main__":
        return False
    if name == "torch" or name.startswith("torch."):
        return not name.startswith(("torch._dynamo", "torch.fx", "torch._inductor"))
    return isinstance(file, str) and is_user_file(file) and not is_project_file(file)


def _library_class(cls: object) -> bool:
    return isinstance(cls, type) and _library_module(sys.modules.get(cls.__module__))


def public_name(module: str, qualname: str) -> str:
    """The shortest dotted name the object is reached by from a package
    (``torch.nn.LayerNorm`` for ``torch.nn.modules.normalization.LayerNorm``)."""
    parts = module.split(".")
    head = qualname.split(".")[0]
    target = getattr(sys.modules.get(module), head, None)
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i])
        if any(p.startswith("_") for p in parts[:i]):
            break
        if target is not None and getattr(sys.modules.get(prefix), head, None) is target:
            return f"{prefix}.{qualname}"
    return f"{module}.{qualname}"


def _code_of(value: Any) -> types.CodeType | None:
    """The code of a function, method wrapper or property getter; None for anything
    else (never an attribute lookup on an arbitrary object: torch.classes answers
    every name with an error)."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    return value.__code__ if isinstance(value, types.FunctionType) else None


def _row(module: str, cls: str | None, name: str, value: Any) -> dict[str, Any]:
    owner = public_name(module, cls) if cls else module
    return {
        "module": module,
        "class": cls,
        "name": name,
        "key": surface_key(value),
        "shown": f"{owner}.{name}",
        "traced": surface_shown(value),
    }


#: The keys a registry row can name (a literal another process reads back).
_ENTRY_KEYS = (str, int)
#: torch's global module hooks are not a registry: they are keyed by handle ids, which
#: come from a per-process counter, and both tracers check them as hooks (by what each
#: hook is: ``value_fingerprints.hooks_fingerprint``).
_HOOKS_MODULE = "torch.nn.modules.module"


def _registry_tables(holder: Any) -> list[dict[Any, Any]]:
    """The plain dicts that hold a mapping's entries: a dict itself; of a library
    mapping object, the dicts among its own attributes and its classes' (looked at
    directly, never through the mapping's iteration, which may import or compute)."""
    if isinstance(holder, dict):
        return [holder]
    if not isinstance(holder, Mapping) or not _library_class(type(holder)):
        return []
    spaces = [getattr(holder, "__dict__", {})]
    spaces += [vars(c) for c in type(holder).__mro__ if c.__module__ != "builtins"]
    return [v for space in spaces for v in list(space.values()) if isinstance(v, dict)]


def _registry_rows(
    modules: dict[str, types.ModuleType], hit: Any
) -> dict[tuple[str, str | None, str], dict[str, Any]]:
    """A row per registry entry holding a function the trace ran: the mapping by the
    module attribute that holds it, the key, and the object the mapping's own lookup
    gives for it (a mapping whose lookup does not give that function is left out: the
    trace did not reach the function through it)."""
    rows: dict[tuple[str, str | None, str], dict[str, Any]] = {}
    for name, module in sorted(modules.items()):
        for attr, holder in list(vars(module).items()):
            if attr.startswith("__") or (
                name == _HOOKS_MODULE and attr in GLOBAL_MODULE_HOOK_NAMES
            ):
                continue
            for table in _registry_tables(holder):
                for entry, value in list(dict.items(table)):
                    if type(entry) not in _ENTRY_KEYS or not hit(value):
                        continue
                    try:
                        found = holder[entry]
                    except Exception:  # a lookup that fails is no path
                        continue
                    if found is not value:
                        continue
                    row = _row(name, None, attr, value)
                    row["entry"] = entry
                    row["shown"] = f"{public_name(name, attr)}[{entry!r}]"
                    rows[(name, None, f"{attr}[{entry!r}]")] = row
    return rows


#: Python's operators (``dis``'s words for them) and the Tensor dunders each may run,
#: on either side: ``a + b`` runs ``type(a).__add__`` or ``type(b).__radd__``.
_BINARY_DUNDERS = {
    "+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "%": "mod",
    "**": "pow", "@": "matmul", "<<": "lshift", ">>": "rshift", "&": "and", "|": "or",
    "^": "xor",
}  # fmt: skip
_COMPARE_DUNDERS = {
    "<": ("__lt__", "__gt__"), "<=": ("__le__", "__ge__"), ">": ("__gt__", "__lt__"),
    ">=": ("__ge__", "__le__"), "==": ("__eq__",), "!=": ("__ne__",),
}  # fmt: skip
_INSTRUCTION_DUNDERS = {
    "UNARY_NEGATIVE": ("__neg__",), "UNARY_POSITIVE": ("__pos__",),
    "UNARY_INVERT": ("__invert__",), "BINARY_SUBSCR": ("__getitem__",),
    "STORE_SUBSCR": ("__setitem__",), "DELETE_SUBSCR": ("__delitem__",),
    "CONTAINS_OP": ("__contains__",),
    # Iteration: ``for``, ``a, b = y``, ``[*y]``, ``f(*y)``, ``yield from y``.
    "GET_ITER": ("__iter__",), "UNPACK_SEQUENCE": ("__iter__",), "UNPACK_EX": ("__iter__",),
    "LIST_EXTEND": ("__iter__",), "SET_UPDATE": ("__iter__",),
    "CALL_FUNCTION_EX": ("__iter__",), "GET_YIELD_FROM_ITER": ("__iter__",),
}  # fmt: skip
#: Instructions whose argument is a name the code reads: an attribute (``y.T``), a
#: global or free variable (``from operator import mul``; a builtin such as ``sum``).
_NAME_READS = ("LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF")
#: Builtins that run an operand's dunders other than the one of their own name
#: (``sum`` adds, ``sorted`` iterates and compares); a builtin named as a dunder's word
#: (``abs``, ``len``, ``iter``, ``float``) is covered by the name rule below.
_CONSUMERS = ("__iter__", "__lt__", "__gt__")
_BUILTIN_DUNDERS = {
    "sum": ("__iter__", "__add__", "__radd__"), "min": _CONSUMERS, "max": _CONSUMERS,
    "sorted": _CONSUMERS, "list": ("__iter__",), "tuple": ("__iter__",),
    "set": ("__iter__",), "frozenset": ("__iter__",), "dict": ("__iter__",),
    "zip": ("__iter__",), "enumerate": ("__iter__",), "map": ("__iter__",),
    "filter": ("__iter__",), "any": ("__iter__", "__bool__"),
    "all": ("__iter__", "__bool__"), "divmod": ("__divmod__", "__rdivmod__"),
}  # fmt: skip
_MIRRORED = {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}


def _dunders_named(name: str) -> set[str]:
    """What a name a code reads may reach on a tensor: the attribute of that name (``T``
    read by ``y.T``, by ``getattr(y, "T")`` or ``attrgetter("T")``), and the dunders of
    that word (``operator.mul`` and ``mul`` run ``__mul__``, ``__rmul__``; ``iadd``
    ``__iadd__`` then ``__add__``; ``abs`` ``__abs__``; ``lt`` ``__lt__`` or the mirrored
    ``__gt__``), plus the dunders the builtins that consume operands run."""
    base = name.strip("_")
    found = {name, f"__{base}__", f"__r{base}__", f"__i{base}__"}
    if base.startswith("i"):
        found |= {f"__{base[1:]}__", f"__r{base[1:]}__"}
    if base in _MIRRORED:
        found.add(f"__{_MIRRORED[base]}__")
    found.update(_BUILTIN_DUNDERS.get(name, ()))
    return found


@functools.lru_cache(maxsize=4096)
def _names_reached_without_a_call(code: types.CodeType) -> frozenset[str]:
    """The attribute names ``code`` may reach on its operands with no call a profiler
    or a graph shows, read from the bytecode (every branch counts: more to check, never
    less): the dunders of its operators, subscripts and iterations (through the type's
    slots), and of every name it reads or holds as a string constant -- an attribute
    read (``y.mT``), a function of ``operator`` or a builtin that runs a dunder from C
    (``operator.mul``, ``sum``, ``getattr(y, "T")``: ``_dunders_named``)."""
    names: set[str] = set()
    for ins in dis.get_instructions(code):
        if ins.opname == "BINARY_OP":
            word = str(ins.argrepr)
            base = _BINARY_DUNDERS.get(word.removesuffix("="))
            if base is not None:
                names.update((f"__{base}__", f"__r{base}__"))
                if word.endswith("="):
                    names.add(f"__i{base}__")
        elif ins.opname == "COMPARE_OP":
            names.update(_COMPARE_DUNDERS.get(str(ins.argval), ()))
        elif ins.opname in _INSTRUCTION_DUNDERS:
            names.update(_INSTRUCTION_DUNDERS[ins.opname])
        elif ins.opname in _NAME_READS and isinstance(ins.argval, str):
            names |= _dunders_named(ins.argval)
    for const in code.co_consts:
        if isinstance(const, str) and const.isidentifier():
            names |= _dunders_named(const)
    return frozenset(names)


def tensor_attributes_reached(codes: Iterable[types.CodeType]) -> set[str]:
    """The ``torch.Tensor`` attributes the eager code among ``codes`` may reach without a
    call the tracers see: ``a + b`` on tensors runs ``Tensor.__add__`` through the
    type's slot and ``x.T`` reads a property, so a replacement of either
    (``torch.Tensor.__add__ = ...``) changes what eager computes while the graph keeps
    the operation the trace baked in."""
    names: set[str] = set()
    for code in codes:
        if is_eager_file(code.co_filename):
            names |= _names_reached_without_a_call(code)
    return {name for name in names if hasattr(torch.Tensor, name)}


def record_surface(
    called: Iterable[Any],
    codes: Iterable[types.CodeType],
    scopes: Iterable[dict[str, Any]],
    classes: Iterable[Any],
    methods: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """``LIBRARY_SURFACE``: where each of ``called`` (objects the trace called: builtins,
    bound builtin methods) and ``codes`` (library functions it ran) was resolved, among
    the library modules bound in ``scopes`` (the globals of the code that ran) and the
    attributes of ``torch.Tensor`` and the library ``classes`` (of the modules the trace
    reached) along their MROs; ``methods`` names Tensor methods called (Dynamo's
    ``call_method``)."""
    codes = list(codes)
    called = list(called)
    called_ids: set[int] = set()
    tensor_methods = set(methods) | tensor_attributes_reached(codes)
    for value in called:
        held = getattr(value, "__self__", None)
        if isinstance(held, torch.Tensor):
            tensor_methods.add(str(getattr(value, "__name__", "")))
        elif held is not None and not isinstance(held, (type, types.ModuleType)):
            continue  # a bound method of an object: checked by its class, if a library's
        else:
            called_ids.add(id(value))
    ran = {c for c in codes if not is_project_file(c.co_filename)}

    def hit(value: Any) -> bool:
        if id(value) in called_ids:
            return True
        code = _code_of(value)
        return code is not None and code in ran

    every = set(codes)

    def hit_entry(value: Any) -> bool:
        # A registry may hold the project's own kernel: registered at capture, it
        # must stay the one registered.
        code = _code_of(value)
        return id(value) in called_ids or (code is not None and code in every)

    rows: dict[tuple[str, str | None, str], dict[str, Any]] = {}
    modules: dict[str, types.ModuleType] = {}
    for scope in scopes:
        own = sys.modules.get(str(scope.get("__name__")))
        for value in [own, *list(scope.values())]:
            if _library_module(value):
                modules.setdefault(value.__name__, value)
    # The module a called builtin belongs to (``torch._C._nn`` of the ``hardtanh``
    # ``F.hardtanh`` calls through ``torch._C._nn``), which no scope binds: its
    # attributes, and each step of its dotted path (``torch._C``'s ``_nn``), where a
    # replacement changes what the call reaches.
    for value in called:
        held = getattr(value, "__self__", None)
        if isinstance(held, types.ModuleType) and _library_module(held):
            if held.__name__ not in modules:
                modules[held.__name__] = held
                path = held.__name__.split(".")
                for depth in range(1, len(path)):
                    parent = sys.modules.get(".".join(path[:depth]))
                    child = sys.modules.get(".".join(path[: depth + 1]))
                    if parent is not None and child is not None:
                        if vars(parent).get(path[depth]) is child:
                            key = (parent.__name__, None, path[depth])
                            rows[key] = _row(parent.__name__, None, path[depth], child)
    for name, module in sorted(modules.items()):
        for attr, value in list(vars(module).items()):
            if not attr.startswith("__") and hit(value):
                rows[(name, None, attr)] = _row(name, None, attr, value)
    # The first step of such a path: the name a library module's code reached that module
    # by (``F`` in ``torch.nn.modules.linear``, for ``F.linear``). Rebound
    # (``torch.nn.modules.linear.F = other``), nn.Linear's forward calls something else.
    # Recorded: each module global that code of that module which ran names
    # (``torch.nn.functional._VF``, ``math``: modules with no row of their own), and
    # each that holds a module with rows (``torch`` in torch.nn.functional, reached by
    # code a profile does not attribute to it: a ``boolean_dispatch`` pool). Never a
    # package's own submodule (``torch.nn.attention``'s ``flex_attention``, bound by
    # the import system when anything imported it; ``torch._dynamo``, which torch
    # imports on first use): a fresh process that has not imported it yet lacks the
    # binding, and its code imports it when it needs it.
    used = {module for module, _cls, _attr in rows}
    named: dict[str, set[str]] = {}
    for code in [*codes, *filter(None, map(_code_of, called))]:
        named.setdefault(code.co_filename, set()).update(code.co_names)
    for scope in scopes:
        own = sys.modules.get(str(scope.get("__name__")))
        if own is None or not _library_module(own):
            continue
        names = named.get(str(getattr(own, "__file__", None)), set())
        for attr, value in list(scope.items()):
            if not isinstance(value, types.ModuleType) or attr.startswith("__"):
                continue
            held = getattr(value, "__name__", None)
            submodule = held == f"{own.__name__}.{attr}"
            if not submodule and (attr in names or held in used):
                rows[(own.__name__, None, attr)] = _row(own.__name__, None, attr, value)
    rows.update(_registry_rows(modules, hit_entry))
    # A parameter is a Tensor subclass: ``nn.Parameter.__mul__ = f`` changes what
    # ``self.p * x`` runs, as ``torch.Tensor.__mul__ = f`` does for a plain tensor.
    tensor_classes = (torch.Tensor, torch.nn.Parameter)
    leaves = [*tensor_classes, *dict.fromkeys(c for c in classes if _library_class(c))]
    for leaf in leaves:
        seen: set[str] = set()
        for base in leaf.__mro__:
            if base.__module__ == "builtins":
                continue
            for attr, value in list(vars(base).items()):
                if attr in seen:
                    continue
                seen.add(attr)
                wanted = leaf in tensor_classes and attr in tensor_methods
                if wanted or hit(value):
                    key = (leaf.__module__, leaf.__qualname__, attr)
                    rows[key] = _row(leaf.__module__, leaf.__qualname__, attr, value)
    # torch's registry of kernels: those registered from Python for aten operators.
    kernels = {"kernels": python_kernels(python_kernels_registry())}
    return [*(rows[k] for k in sorted(rows, key=lambda k: (k[0], k[1] or "", k[2]))), kernels]


def body_calls(target: Any) -> list[Any]:
    """What a library Python function's own body names through its module globals,
    one level deep: each ``module.attr`` (``torch.relu`` in ``F.relu``) and each global
    bound to a library callable. Read from the bytecode, so every branch counts (more
    to check, never less)."""
    code = _code_of(target)
    scope = getattr(target, "__globals__", None)
    if code is None or scope is None or is_project_file(code.co_filename):
        return []
    found: list[Any] = []
    # A wrapper that picks among functions it closes over (``F.max_pool1d``, torch's
    # ``boolean_dispatch``): each of them, and what its own body names.
    for cell in getattr(target, "__closure__", None) or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(inner, types.FunctionType) and inner is not target:
            if not is_project_file(inner.__code__.co_filename) and inner.__closure__ is None:
                found += [inner, *body_calls(inner)]
    held: Any = None
    for ins in dis.get_instructions(code):
        if ins.opname == "LOAD_GLOBAL":
            held = scope.get(ins.argval)
            if (
                callable(held)
                and not isinstance(held, type)
                and _library_module(sys.modules.get(str(getattr(held, "__module__", ""))))
            ):
                found.append(held)
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and isinstance(held, types.ModuleType):
            if _library_module(held):
                value = getattr(held, str(ins.argval), None)
                if callable(value):
                    found.append(value)
            held = None
        else:
            held = None
    return found


def record_dynamo_surface(
    fn: types.FunctionType,
    graphs: Iterable[torch.fx.GraphModule],
    codes: Iterable[types.CodeType],
    classes: Iterable[Any],
    lowered: Iterable[torch.fx.GraphModule] = (),
) -> list[dict[str, Any]]:
    """``LIBRARY_SURFACE`` of a Dynamo trace: the torch functions its graphs call
    (``call_function`` targets), the Tensor methods they call (``call_method``) and the
    library functions Dynamo inlined (``codes``), resolved among the library modules
    the globals of fn and of the inlined code hold and the classes of the modules the
    trace reached (``classes``); for the ``lowered`` graphs also what the bodies of the
    torch Python functions they call name (``body_calls``)."""
    called: list[Any] = []
    methods: set[str] = set()
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op == "call_function":
                called.append(node.target)
            elif node.op == "call_method":
                methods.add(str(node.target))
    # A lowered graph (Inductor) bakes what a torch Python function in it did at capture,
    # down to the torch functions its body calls (``F.relu`` calls ``torch.relu``); an
    # eager graph calls the function itself, which resolves them per call.
    for gm in lowered:
        for node in gm.graph.nodes:
            if node.op == "call_function":
                called += body_calls(node.target)
    codes = list(codes)
    classes = list(classes)
    if any(isinstance(c, type) and issubclass(c, torch.nn.Module) for c in classes):
        # Dynamo calls a module by its own rules, which are those of nn.Module's call
        # machinery (hooks, then forward); the graph bakes them, so that machinery is
        # code the trace ran: replaced (``nn.Module._call_impl = f``), eager runs f.
        base = torch.nn.Module
        codes += [base._wrapped_call_impl.__code__, base._call_impl.__code__]
        classes.append(base)
    scopes = {id(fn.__globals__): fn.__globals__}
    for code in [*codes, *filter(None, map(_code_of, called))]:
        module = inspect.getmodule(code)
        if module is not None and is_eager_file(code.co_filename):
            scopes.setdefault(id(vars(module)), vars(module))
    return record_surface(called, codes, scopes.values(), classes, methods)
