"""The names a Dynamo trace's frames resolved, recorded at capture: module globals
(``GLOBAL_READS``), the classes it went through (``CLASS_ATTRS``) and the builtins
(``BUILTIN_READS``). Checked per call by ``runtime.multigraph_name_checks``.

- **Module-level functions and classes** the frames read (a helper, a namedtuple class,
  ``F.gelu``): Dynamo guards them by identity, and the guard is dropped (an identity does
  not survive a process). They are recorded by access path with the module and qualified
  name of what was bound there. Serving resolves each path and refuses one bound to
  something else; every call then checks the bindings by identity. Their code (the
  project's functions among them, with every function Dynamo traced) joins
  ``FUNCTION_SOURCES``, checked at load.
- **The classes the trace went through**: of every module it reached and of every
  method or property it inlined, with their bases. Dynamo resolves ``Net.__call__``,
  ``Net.forward``, ``Net.encode`` and a property's getter on the class and guards none
  of it, so a rebinding on the class would be served as traced. ``CLASS_ATTRS`` records
  each class by module and qualified name, with a project class's methods and
  descriptors (and, of a library class, the attributes bound to code the trace ran);
  serving checks them at load and per call.
- **Builtins** the traced code loaded (``len``, ``abs``): ``builtin_reads``.

``import_name`` and ``location`` (how another process names an object, and where a
function was defined) serve the other Dynamo recorders too.
"""

from __future__ import annotations

import builtins
import inspect
import os
import re
import sys
import types
from collections.abc import Iterable
from typing import Any

import torch

from precompile._compat import dynamo
from precompile.capturing.bytecode_names import global_loads
from precompile.capturing.live_functions import (
    cached_makers,
    live_functions,
    referrers_of,
    refuse_unwatched,
    unwatched_cached,
    unwatched_live,
)
from precompile.errors import PrecompileError
from precompile.locations import is_project_file
from precompile.runtime.class_fingerprints import ENTERED_ONLY_DUNDERS, PROTOCOL_DUNDERS
from precompile.runtime.guard_text import user_path
from precompile.runtime.multigraph_dependencies import (
    builtin_key,
    class_attrs,
    protocol_bindings,
)
from precompile.runtime.value_fingerprints import function_value, home_globals

#: The protocol dunders a library class's row compares (``class_rows``): those Python
#: calls to read, call or test an instance. ``__setattr__``/``__delattr__`` run only on
#: a store or a delete: a forward that stores nothing never runs them, and replacing them
#: on a library class must not refuse it (make_fx compares them only where the traced
#: call entered them; Dynamo records no entered dunders).
LOOKUP_DUNDERS = PROTOCOL_DUNDERS - ENTERED_ONLY_DUNDERS


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


def location(value: Any) -> str:
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


def import_name(value: Any) -> tuple[str, str] | None:
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


class NameRecorder:
    """The module globals, classes and code a trace's frames resolved by name."""

    def __init__(self) -> None:
        #: (frame module, access path) -> (module, qualname, location) of what was bound.
        self.reads: dict[tuple[str, str], tuple[str, str, str]] = {}
        #: (frame module, access path) -> the read in the words of the code that made
        #: it (``gm.F.gelu``), where Dynamo named it through another module's global.
        self.read_shown: dict[tuple[str, str], tuple[str, str]] = {}
        #: The code of every function read that way (its source is checked at load).
        self.read_codes: dict[types.CodeType, None] = {}
        #: (frame module, access path) -> the function read there: the path by which
        #: serving finds a function no import name reaches (``traced_function_rows``).
        self.read_functions: dict[tuple[str, str], types.FunctionType] = {}
        #: The classes of every module the trace reached (their methods, properties and
        #: ``__call__`` were resolved on the class while tracing; ``CLASS_ATTRS``).
        self.classes: dict[type, None] = {}
        #: Classes a guard reached whose metaclass is a project class: what Dynamo
        #: resolves through that metaclass, it guards not at all (``metaclass_refusal``).
        self.metaclassed: dict[type, type] = {}

    def observe_modules(self, modules: Iterable[torch.nn.Module]) -> None:
        """The classes of the modules a frame's guards reached, and of their submodules."""
        for module in modules:
            for sub in module.modules():
                self.classes.setdefault(type(sub), None)

    def observe(self, module_name: str, entries: list[Any]) -> None:
        """The module globals a frame of ``module_name`` read and compared by identity."""
        for e in entries:
            value = getattr(e, "value", None) if getattr(e, "has_value", False) else None
            if isinstance(value, type) and type(value) is not type:
                meta = type(value)
                source = getattr(sys.modules.get(meta.__module__), "__file__", None) or ""
                if is_project_file(source):
                    self.metaclassed.setdefault(value, meta)
            if not (getattr(e, "is_global", False) and getattr(e, "has_value", False)):
                continue
            if not dynamo.compares_identity(e) or "__builtins_dict__" in e.name:
                continue
            if dynamo.on_global_hooks(e):
                continue  # a global module hook: checked as one (MODULE_HOOKS["global"])
            qualified = _qualified(e.value)
            if qualified is None or not e.name.startswith("G["):
                continue
            self.reads.setdefault((module_name, e.name), (*qualified, location(e.value)))
            shown = _reached_as(e, module_name)
            if shown is not None:
                self.read_shown.setdefault((module_name, e.name), shown)
            read_code = getattr(getattr(e.value, "__func__", e.value), "__code__", None)
            if isinstance(read_code, types.CodeType):
                self.read_codes.setdefault(read_code, None)
            if isinstance(e.value, types.FunctionType):
                self.read_functions.setdefault((module_name, e.name), e.value)

    def class_rows(self, traced: list[types.CodeType]) -> list[dict[str, Any]]:
        """``CLASS_ATTRS``: the classes the trace went through -- of every module it
        reached, and those defining a method or property it inlined (``traced``, by
        qualified name) -- with their bases. A project class carries its methods and
        descriptors (``class_attrs``), compared at load and checked per call, all of
        them. A library class (torch, an installed package) changes by version: only
        the attributes bound to code the trace ran (``traced``: ``Module.__call__``,
        ``Linear.forward``) and the protocol dunders Python calls implicitly to read,
        call or test an instance (``LOOKUP_DUNDERS``: what they resolve to is compared
        at load, ``protocol``) are checked, from load on -- torch itself rebinds others
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
                named = import_name(base)
                if base.__module__ == "builtins" or named is None or named in rows:
                    continue
                source = getattr(sys.modules.get(base.__module__), "__file__", None) or ""
                project = is_project_file(source)
                rows[named] = {
                    "module": named[0],
                    "qualname": named[1],
                    "attrs": class_attrs(base) if project else None,
                    # The protocol dunders too: Python calls them implicitly, and
                    # Dynamo inlined what they do (its own attribute lookup stands in
                    # for ``Module.__getattr__``): one set on a library class later
                    # (``nn.Linear.__getattr__ = f``) changes what eager computes.
                    "traced": sorted(
                        {
                            *(n for n, value in vars(base).items() if _code_of(value) in ran),
                            *LOOKUP_DUNDERS,
                        }
                    ),
                }
                if not project:
                    rows[named]["protocol"] = protocol_bindings(base, LOOKUP_DUNDERS)
                if project and base in forwarding:
                    rows[named]["names"] = sorted(vars(base))
                if project:
                    # What it defines itself: a name set on it later that a base
                    # defines shadows the base's value, which Dynamo guarded on the
                    # base alone (``Sub.SCALE = 10.0`` over ``Base.SCALE``).
                    rows[named]["defines"] = sorted(k for k in vars(base) if isinstance(k, str))
        return list(rows.values())

    def metaclass_refusal(self, traced: list[types.CodeType]) -> tuple[str, str] | None:
        """A refusal (message, hint) where the traced code may have read an attribute
        through a project metaclass: ``Cfg.K`` with ``K`` defined on ``type(Cfg)`` (or
        answered by its ``__getattr__``). Dynamo guards only ``Cfg``'s identity there,
        so the metaclass's value changed, or ``K`` set on ``Cfg`` itself, would be
        served as traced (torch 2.13); make_fx records the metaclass with the class."""
        names: set[str] = set()
        for code in [*traced, *_nested_codes(traced)]:
            names.update(code.co_names)
        for cls, meta in self.metaclassed.items():
            for klass in meta.__mro__:
                if klass is type or klass is object:
                    continue
                hit = sorted(
                    n
                    for n in vars(klass)
                    if (n in names and not n.startswith("__"))
                    or n in ("__getattr__", "__getattribute__")
                )
                if hit:
                    where = f"{klass.__module__}.{klass.__qualname__}"
                    return (
                        f"`{cls.__qualname__}.{hit[0]}` may resolve through the metaclass "
                        f"{where}, which defines `{hit[0]}`; Dynamo guards only which class "
                        f"`{cls.__qualname__}` is there, so a change of that value (or "
                        f"`{hit[0]}` set on `{cls.__qualname__}` itself) would be served as "
                        f"traced",
                        f"define `{hit[0]}` on `{cls.__qualname__}` itself rather than on its "
                        f"metaclass, or capture with precompile.MakeFxTracer(), which checks it",
                    )
        return None

    def rows(self) -> list[dict[str, Any]]:
        """``GLOBAL_READS``, as artifact literals. A function read whose code, defaults
        and closure values are plain values carries them (``value``: another function
        with the same value found there later computes the same, and is served); every
        function read carries whether it runs in its module's globals (``home``)."""
        rows = []
        for (scope, path), (m, q, where) in sorted(self.reads.items()):
            row: dict[str, Any] = {
                "scope": scope,
                "path": path,
                "module": m,
                "qualname": q,
                "location": where,
            }
            if (scope, path) in self.read_shown:
                row |= dict(zip(("shown", "reader"), self.read_shown[scope, path]))
            fn = self.read_functions.get((scope, path))
            value = function_value(fn)
            if value is not None:
                row["value"] = value
            if fn is not None:
                # Which globals it runs in: a load finds it by name, and the same code
                # made in another namespace reads other globals than the checked ones.
                row["home"] = home_globals(fn)
            rows.append(row)
        return rows


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


def traced_function_rows(
    codes: Iterable[types.CodeType],
    reads: dict[tuple[str, str], types.FunctionType] | None = None,
    argument_functions: Iterable[types.FunctionType] = (),
    hooks: Iterable[Any] = (),
) -> list[dict[str, Any]]:
    """``TRACED_FUNCS``: every project function whose code the trace ran (frames, what
    Dynamo inlined: helpers, methods, functions reached through attributes or closures),
    with the digest of its code (``code_fingerprint``). Dynamo guards a function by
    identity, never its ``__code__``: serving compares each one's code with this digest
    at load and watches its code by identity per call
    (``multigraph_name_checks.build_code_check``).

    A function another process imports by module and qualified name is recorded by it.
    One no name reaches (a factory made it: ``ACTS = {"gelu": make_act(1.7)}``, a class
    attribute, a library's registry) is ``nameless``, recorded with the access paths
    from module globals the trace read it at (``reads``: Dynamo's sources of the
    identity guards it dropped, ``G['ACTS']['gelu']``), which serving evaluates. One
    needs no path where something else watches it: reached from fn's arguments
    (``argument_functions``: ``ARG_IDENTITIES`` compares their code per call), a module hook
    or global hook (``hooks``: the hook checks identify a hook by its code and closure),
    held in a closure cell of a watched function (watched with it), or made per call by
    traced code (its maker's digest includes its code) -- only where no function object
    running it outlived the trace (``live_functions``: the result an lru_cache'd maker
    returned is held by the cache, and eager calls it again). Any other is refused here: nothing in
    another process could find it, and its code swapped (IPython's autoreload) would be
    served as traced."""

    from precompile.runtime.state_checks import code_fingerprint

    traced = list(dict.fromkeys(codes))
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    watched: list[types.FunctionType] = []
    nameless: dict[types.CodeType, str] = {}
    project = [code for code in traced if is_project_file(code.co_filename)]
    running = live_functions(project)
    for code in project:
        digest = code_fingerprint(code)
        for holder in running.get(code, []):
            named = import_name(holder) or _global_name(holder)
            if named is None or named in rows:
                continue
            watched.append(holder)
            rows[named] = {
                "module": named[0],
                "qualname": named[1],
                "code": digest,
                "location": location(holder),
            }
        if not any(row["code"] == digest for row in rows.values()):
            nameless[code] = digest
    # Its lists hold the functions: dropped before the check of what holds them.
    del running
    by_name = {id(fn) for fn in watched}
    traced_project = set(project)
    paths: dict[types.CodeType, list[dict[str, str]]] = {}
    for (scope, path), fn in sorted((reads or {}).items()):
        # A function read at a path is watched there, unless it is the named function
        # itself: one of a code a named function also runs (one factory made a
        # module-level function and a registry's entries) is another object, whose
        # ``__code__`` swapped the named row would not see.
        if fn.__code__ in nameless or (fn.__code__ in traced_project and id(fn) not in by_name):
            nameless.setdefault(fn.__code__, code_fingerprint(fn.__code__))
            watched.append(fn)
            paths.setdefault(fn.__code__, []).append({"scope": scope, "path": path})
    for code, found in _class_paths(list(nameless)).items():
        for scope, path, fn in found:
            watched.append(fn)
            paths.setdefault(code, []).append({"scope": scope, "path": path})
    hook_functions = [fn for hook in hooks for fn in _functions_of(hook)]
    watched += hook_functions
    covered = _closure_codes(watched) | {fn.__code__ for fn in hook_functions}
    arguments = list(argument_functions)
    digests = {code_fingerprint(fn.__code__) for fn in arguments}
    # A function made per call by traced code is covered by its maker's digest only
    # while no function object running its code outlives the trace: one something holds
    # (an lru_cache, a weak dictionary) is what eager calls next time, and nothing
    # watches it (``live_functions``).
    unreached = [
        code
        for code, digest in nameless.items()
        if code not in paths and digest not in digests and code not in covered
    ]
    # A function an lru_cache holds is what eager calls next time. Dynamo traced the
    # maker as uncached and ran a function of its own: the one eager calls is the
    # cache's entry for that call's arguments, which nothing recorded tells apart from
    # the cache's other entries (a watched one for other arguments proves nothing), nor
    # finds while the cache is empty. So a code made under a cached maker is refused:
    # naming an unwatched function the cache holds, else the cache.
    cached = cached_makers(traced)
    by_cache = unwatched_cached(project, cached, [*watched, *arguments])
    made = {c: cached[c][0].__wrapped__.__qualname__ for c in project if c in cached}
    refuse_unwatched(
        by_cache or unwatched_live([c for c in unreached if c not in made], watched),
        cached=made,
    )
    covered |= _nested_codes(traced)
    for code, digest in nameless.items():
        qualname = getattr(code, "co_qualname", code.co_name)
        where = f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"
        if code not in paths and digest not in digests and code not in covered:
            raise PrecompileError(
                f"the trace ran function {qualname} ({user_path(code.co_filename)}:"
                f"{code.co_firstlineno}), which no name another process imports reaches, "
                f"and which the trace did not read from a module global or from fn's "
                f"arguments: a serving process cannot find it to watch its code, and a "
                f"change to it (its __code__ replaced by a hot patch or IPython's "
                f"autoreload) would be served as traced",
                hint="make it importable by name (bind it to a module-level name), or "
                "pass it through an argument (an attribute of a module fn takes)",
                invariant=1,
            )
        row = rows.setdefault(
            ("", f"{qualname}@{digest}"),
            {
                "module": "",
                "qualname": qualname,
                "code": digest,
                "location": where,
                "nameless": "1",
            },
        )
        if code in paths:
            row["reads"] = [*row.get("reads", []), *paths[code]]
    return list(rows.values())


def _class_paths(
    codes: list[types.CodeType],
) -> dict[types.CodeType, list[tuple[str, str, types.FunctionType]]]:
    """Per code, (module, access path, function) of each function running it that a
    class another process imports holds in its dict, itself or as a descriptor's
    function: a method a decorator replaced with its wrapper
    (``G['Net'].__dict__['encode']``), a property's getter, setter or deleter, a static
    or class method's (``G['Encoder'].__dict__['scale'].fget``). Their qualified names
    resolve elsewhere (the decorator's ``wrapper``) or to the descriptor, not to the
    function. Four passes over the heap in all (``referrers_of``)."""
    running = live_functions(codes)
    functions = {code: running.get(code, []) for code in codes}
    every = list({id(fn): fn for fns in functions.values() for fn in fns}.values())
    held_by = referrers_of(every)
    holders: dict[int, list[tuple[Any, str]]] = {}
    for fn in every:
        holders[id(fn)] = [(fn, "")]
        for held in held_by[id(fn)]:
            for accessor in ("fget", "fset", "fdel", "__func__"):
                if getattr(held, accessor, None) is fn:
                    holders[id(fn)].append((held, f".{accessor}"))
    values = list({id(v): v for hs in holders.values() for v, _a in hs}.values())
    tables_of = {
        key: [t for t in refs if isinstance(t, dict)] for key, refs in referrers_of(values).items()
    }
    tables = list({id(t): t for ts in tables_of.values() for t in ts}.values())
    owners_of = referrers_of(tables)
    found: dict[types.CodeType, list[tuple[str, str, types.FunctionType]]] = {}
    for code, fns in functions.items():
        paths = found.setdefault(code, [])
        for fn in fns:
            for value, accessor in holders[id(fn)]:
                for table in tables_of[id(value)]:
                    for owner in owners_of[id(table)]:
                        named = import_name(owner) if isinstance(owner, type) else None
                        if named is None or vars(owner) != table:
                            continue
                        root, *rest = named[1].split(".")
                        base = f"G[{root!r}]" + "".join(f".{part}" for part in rest)
                        for name, bound in list(table.items()):
                            if bound is value:
                                path = f"{base}.__dict__[{name!r}]{accessor}"
                                paths.append((named[0], path, fn))
    return found


def _functions_of(hook: Any) -> list[types.FunctionType]:
    """The Python functions a hook runs: itself, a bound method's, a partial's, a
    callable object's ``__call__``."""
    found = []
    for candidate in (
        hook,
        getattr(hook, "__func__", None),
        getattr(hook, "func", None),
        next((vars(c)["__call__"] for c in type(hook).__mro__ if "__call__" in vars(c)), None),
    ):
        if isinstance(candidate, types.FunctionType):
            found.append(candidate)
    return found


def module_hooks(roots: Iterable[torch.nn.Module]) -> list[Any]:
    """Every hook registered on ``roots`` and their submodules (each ``*_hooks`` dict of
    a module), and torch's global module hooks."""
    from torch.nn.modules import module as module_module

    dicts = [
        value
        for name, value in list(vars(module_module).items())
        if name.startswith("_global_") and name.endswith("hooks") and isinstance(value, dict)
    ]
    for root in roots:
        for sub in root.modules():
            dicts += [
                value
                for name, value in list(vars(sub).items())
                if name.endswith("_hooks") and isinstance(value, dict)
            ]
    return [hook for d in dicts for hook in list(d.values())]


def _closure_codes(functions: Iterable[types.FunctionType]) -> set[types.CodeType]:
    """The code of every function the closure cells of ``functions`` hold, transitively:
    serving watches those with the function that holds them."""
    found: set[types.CodeType] = set()
    pending = list(functions)
    seen: set[int] = set()
    while pending:
        fn = pending.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        for cell in fn.__closure__ or ():
            try:
                held = cell.cell_contents
            except ValueError:
                continue
            if isinstance(held, types.FunctionType):
                found.add(held.__code__)
                pending.append(held)
    return found


def _nested_codes(codes: Iterable[types.CodeType]) -> set[types.CodeType]:
    """The code nested in ``codes`` (functions, lambdas, comprehensions they define): a
    function made per call by traced code is covered by its maker's digest."""
    found: set[types.CodeType] = set()
    pending = [c for code in codes for c in code.co_consts if isinstance(c, types.CodeType)]
    while pending:
        code = pending.pop()
        if code not in found:
            found.add(code)
            pending.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return found


def _global_name(fn: types.FunctionType) -> tuple[str, str] | None:
    """(module, global name) of a function its module binds under another name than
    its qualified name (one a factory made: ``add = make_adder(0.5)``), or None."""
    scope = vars(sys.modules.get(fn.__module__) or types.ModuleType("_"))
    for name, bound in list(scope.items()):
        if bound is fn:
            return fn.__module__, name
    return None
