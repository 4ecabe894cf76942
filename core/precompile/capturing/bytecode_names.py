"""The global names a code object loads, rebinds or deletes, read off its bytecode: the one
scanner both tracers' recorders use (make_fx's global reads and library builtins,
Dynamo's builtin reads), with one decoding.

The raw instruction stream is decoded here (``co_code``, two bytes an instruction,
``EXTENDED_ARG`` folded in), not through ``dis.get_instructions``, which builds an object
per instruction and costs a fifth of a second over the torch code a trace enters. Cache
entries (opcode ``CACHE``) match no opcode asked for. A code object's nested code
(comprehensions, lambdas) is its own: callers walk ``co_consts`` where they need it.
"""

from __future__ import annotations

import builtins
import dis
import sys
import types
from collections.abc import Iterable, Mapping
from typing import Any

_LOAD_GLOBAL = dis.opmap["LOAD_GLOBAL"]
_STORE_GLOBAL = dis.opmap["STORE_GLOBAL"]
_DELETE_GLOBAL = dis.opmap["DELETE_GLOBAL"]
#: From Python 3.11 LOAD_GLOBAL's argument is the name index shifted left by one (the
#: low bit says whether a NULL is pushed first).
_LOAD_SHIFT = 1 if sys.version_info >= (3, 11) else 0


def _names(code: types.CodeType, ops: Iterable[int]) -> tuple[str, ...]:
    """The names the instructions ``ops`` of ``code`` take, first use first, once each."""
    wanted = frozenset(ops)
    names = code.co_names
    raw = code.co_code
    found: dict[str, None] = {}
    extended = 0
    for i in range(0, len(raw), 2):
        op, arg = raw[i], raw[i + 1] | extended
        extended = arg << 8 if op == dis.EXTENDED_ARG else 0
        if op in wanted:
            found[names[arg >> _LOAD_SHIFT if op == _LOAD_GLOBAL else arg]] = None
    return tuple(found)


def global_loads(code: types.CodeType) -> tuple[str, ...]:
    """The names ``code`` loads as globals (a module global or, absent one, a builtin)."""
    return _names(code, (_LOAD_GLOBAL,))


def global_names(code: types.CodeType) -> tuple[str, ...]:
    """The globals ``code`` reads, rebinds or deletes."""
    return _names(code, (_LOAD_GLOBAL, _STORE_GLOBAL, _DELETE_GLOBAL))


#: Library code objects (which live as long as their modules) -> the builtins' names
#: they load: a worker captures many times over the same library code.
_builtin_loads_cache: dict[types.CodeType, tuple[str, ...]] = {}


def builtin_loads(code: types.CodeType) -> tuple[str, ...]:
    """The builtins' (non-dunder) names ``code`` loads as globals; only a code that names
    a builtin at all is scanned, and each code once."""
    found = _builtin_loads_cache.get(code)
    if found is None:
        table = vars(builtins)
        if not any(n in table and not n.startswith("__") for n in code.co_names):
            found = ()
        else:
            found = tuple(n for n in global_loads(code) if n in table and not n.startswith("__"))
        _builtin_loads_cache[code] = found
    return found


#: Names by which code may reach a module's globals dict other than by loading a global
#: of it: ``globals()``, ``vars(mod)``, ``mod.__dict__``, ``sys.modules[...]``,
#: ``getattr(mod, name)`` (a name not known at capture), a function's ``__globals__``, a
#: frame's ``f_globals``, ``eval``/``exec``, an import of the module by name
#: (``importlib.import_module``, ``__import__``), ``inspect.getmodule``.
GLOBALS_REACHING_NAMES = frozenset(
    {
        "globals",
        "vars",
        "__dict__",
        "modules",
        "getattr",
        "__globals__",
        "f_globals",
        "eval",
        "exec",
        "__import__",
        "import_module",
        "getmodule",
    }
)


def reaches_globals(code: types.CodeType) -> bool:
    """Whether ``code`` (or code nested in it) names a way to reach a module's globals
    dict other than a global load (``GLOBALS_REACHING_NAMES``): a keyed read of a global
    dict (``keyed_uses``) accounts for every use of it only where no traced code does.
    By name, so conservative: ``getattr(self, "k")`` counts as well."""
    if not GLOBALS_REACHING_NAMES.isdisjoint(code.co_names):
        return True
    return any(isinstance(c, types.CodeType) and reaches_globals(c) for c in code.co_consts)


#: The keys a keyed read may name: those an artifact's metadata holds as literals.
_KEY_KINDS = (str, int)


def keyed_uses(
    code: types.CodeType, name: str, scope: Mapping[str, Any] | None = None, called: bool = False
) -> frozenset[Any] | None:
    """The constant keys by which ``code`` reads the global ``name``, where every load
    of it is one of ``name[k]``, ``k in name`` / ``k not in name`` and
    ``name.get(k)`` / ``name.get(k, constant)``, each with a ``str`` or ``int``
    constant ``k``: what such code computes depends on those keys' presence and
    values, and on nothing else of the dict (its other keys, its order). None where
    it uses the name any other way -- iterates it, takes its ``len``, passes it on,
    binds it to a local, stores into it, looks up a key that is not a constant -- and
    so may depend on the whole dict.

    A key may be a literal (``CFG["a"]``) or a global of the module (``CFG[K]``,
    ``K = "a"``) that holds a ``str`` or ``int`` in ``scope`` (``code``'s globals): the
    key is then the value ``K`` held at capture. That is as constant as a literal only
    because ``K`` is itself a global load of ``code``, so the capture records it whole
    with the other global reads and every call checks it (``K`` rebound is refused);
    and a trace that rebinds it is refused at capture (``fx_side_effects``). A builtin
    or an absent name is no key.

    With ``called``, the dict is what calling the global ``name`` with no arguments
    returns: ``globals()["K"]``, ``globals().get("K")``, ``"K" in globals()``.

    Decoded with ``dis`` (cache entries skipped): only the few project codes that load
    a global dict are asked."""
    instructions = list(dis.get_instructions(code))

    def constant(ins: dis.Instruction) -> tuple[bool, Any]:
        # A literal key, or a module global naming one (see the docstring).
        if ins.opname == "LOAD_CONST":
            return True, ins.argval
        if ins.opname == "LOAD_GLOBAL" and scope is not None and ins.argval != name:
            if ins.argval in scope and type(scope[ins.argval]) in _KEY_KINDS:
                return True, scope[ins.argval]
        return False, None

    keys: set[Any] = set()
    for start, ins in enumerate(instructions):
        if ins.opname != "LOAD_GLOBAL" or ins.argval != name:
            continue
        j = start
        if called:
            # ``globals()``: the dict is the call's result, the call of no arguments.
            ops = [i.opname for i in instructions[start + 1 : start + 3]]
            if ops == ["PRECALL", "CALL"] and instructions[start + 2].argval == 0:
                j = start + 2
            elif ops[:1] == ["CALL"] and instructions[start + 1].argval == 0:
                j = start + 1
            else:
                return None
        after = [i.opname for i in instructions[j + 1 : j + 6]]
        before = instructions[start - 1] if start else None
        if after[1:2] == ["BINARY_SUBSCR"] and constant(instructions[j + 1])[0]:
            key = constant(instructions[j + 1])[1]
        elif after[:1] == ["CONTAINS_OP"] and before is not None and constant(before)[0]:
            key = constant(before)[1]
        elif after[:1] in (["LOAD_METHOD"], ["LOAD_ATTR"]) and instructions[j + 1].argval == "get":
            # name.get(k) or name.get(k, constant): the key (a literal or a global, as
            # above), a literal default, a PRECALL (3.11), then the call of exactly
            # those arguments.
            rest = instructions[j + 2 : j + 7]
            loaded = []
            if rest and constant(rest[0])[0]:
                loaded.append(constant(rest.pop(0))[1])
                while rest and rest[0].opname == "LOAD_CONST":
                    loaded.append(rest.pop(0).argval)
            if rest and rest[0].opname == "PRECALL":
                rest.pop(0)
            if not (1 <= len(loaded) <= 2 and rest and rest[0].opname == "CALL"):
                return None
            if rest[0].argval != len(loaded):
                return None
            key = loaded[0]
        else:
            return None
        if type(key) not in _KEY_KINDS:
            return None
        keys.add(key)
    return frozenset(keys)


_STORES = frozenset({"STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF"})
_ROOTS = frozenset({"LOAD_GLOBAL", "LOAD_FAST", "LOAD_DEREF", "LOAD_NAME"})
_ATTRIBUTES = frozenset({"LOAD_ATTR", "LOAD_METHOD"})


def attribute_chains(code: types.CodeType) -> list[tuple[str, str, tuple[str, ...]]]:
    """The attribute chains ``code`` reads off a name: ``("global", "sys", ("argv",))``
    for ``sys.argv`` with ``sys`` a global, and ``("import", "os.path", ("sep",))`` where
    the name was bound by an import in ``code`` itself (``import os.path as p; p.sep``);
    an import is itself a chain (``from sys import argv``: ``("import", "sys",
    ("argv",))``; ``import sys``: ``("import", "sys", ())``). What the names resolve to
    is the caller's to decide. Decoded with ``dis``: only project codes are asked."""
    instructions = list(dis.get_instructions(code))
    count = len(instructions)
    chains: list[tuple[str, str, tuple[str, ...]]] = []
    imported: dict[str, str] = {}  # a name this code bound by an import -> its module
    for k, ins in enumerate(instructions):
        if ins.opname == "IMPORT_NAME":
            module = str(ins.argval)
            after = k + 1
            if after < count and instructions[after].opname in _STORES:  # import a.b: binds a
                imported[str(instructions[after].argval)] = module.partition(".")[0]
                chains.append(("import", module, ()))
            while after + 1 < count and instructions[after].opname == "IMPORT_FROM":
                name = str(instructions[after].argval)
                chains.append(("import", module, (name,)))
                if instructions[after + 1].opname in _STORES:
                    imported[str(instructions[after + 1].argval)] = f"{module}.{name}"
                after += 2
        elif ins.opname in _ROOTS:
            end = k + 1
            while end < count and instructions[end].opname in _ATTRIBUTES:
                end += 1
            attributes = tuple(str(i.argval) for i in instructions[k + 1 : end])
            if ins.opname == "LOAD_GLOBAL":
                chains.append(("global", str(ins.argval), attributes))
            elif str(ins.argval) in imported:
                chains.append(("import", imported[str(ins.argval)], attributes))
    return chains
