"""The names a Dynamo trace's frames resolved, checked per call: module globals
(``GLOBAL_READS``), the classes' methods and descriptors (``CLASS_ATTRS``) and the
builtins (``BUILTIN_READS``). Sub-builders of
``multigraph_dependencies.build_dependency_check``, emitted verbatim into multi-graph
artifacts (``capturing.carried.MultiGraph.driver``).

Dynamo resolved each of these at capture and guards none of them in its serialized
guards. A load resolves every recorded name and refuses one bound to another object
than the capture saw; every call compares what it cheaply can (identities in one
generated function, dict version tags, MROs) and only a change names what changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    # Bound by the artifact prelude (precompile._compat.prelude).
    GLOBAL_READS: list[dict[str, str]] = []
    CLASS_ATTRS: list[dict[str, Any]] = []
    BUILTIN_READS: list[dict[str, Any]] = []
    TRACED_FUNCS: list[dict[str, Any]] = []

    # precompile.runtime.state_checks, emitted before this module.
    def code_fingerprint(code: Any) -> str: ...

    # precompile.runtime.value_fingerprints, emitted before this module.
    def function_value(fn: Any, depth: int = 0) -> str | None: ...

    def home_globals(fn: Any) -> bool: ...

    # precompile.runtime.refusal and the multi-graph driver's helpers, emitted with it.
    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...

    def import_user_module(name: str) -> Any: ...

    def user_path(text: str) -> str: ...

    # precompile.runtime.multigraph_dependencies, emitted with this module.
    def builtin_name(value: Any) -> str: ...

    def builtin_key(value: Any) -> list[str]: ...

    def is_class_behaviour(value: Any) -> bool: ...

    def class_attrs(cls: Any) -> dict[str, str]: ...

    def protocol_bindings(cls: Any, names: Any) -> dict[str, str]: ...

    # precompile.runtime.version_watch, emitted before this module.
    def watch_dicts(
        watched: Callable[[], list[Any]],
        recheck: Callable[[], None],
        checked: bool = True,
        key: Callable[[Any], Any] | None = None,
        keyed: Callable[[list[Any]], Any] | None = None,
    ) -> Callable[[], None]: ...


def build_global_read_check(
    adopters: list[Callable[[Any, Any], None]] | None = None,
) -> Callable[[], None] | None:
    """``global_reads_ok()``: refuse when a module-level function or class the frames
    read (``GLOBAL_READS``) is bound to another than the capture traced. A load
    resolves each access path; every call compares the bindings by identity in one
    generated function, and only a miss names the change. None without global reads.

    A miss on a function whose code, defaults and closure values the capture recorded
    as plain values (``value``: ``function_value``) finds another function there with
    the same value -- the same maker called again with the same arguments, a registry
    filled again -- computes what the trace did: it is adopted (compared by identity
    from then on), and each of ``adopters`` is told ``(old, new)`` so that what watches
    the old function's code watches the new one's."""
    # Global reads: resolved now, compared by identity per call in one generated function.
    # A path that does not resolve to what the capture saw yet (state a library fills
    # later) is resolved again when a call misses, and adopted once it does -- by its
    # value where the capture recorded one (``value``), else by its name; a path
    # resolved here stays bound to that object, or to another of the same value.
    scopes: list[dict[str, Any]] = []
    scope_index: dict[str, int] = {}
    terms = []
    for i, read in enumerate(GLOBAL_READS):
        if read["scope"] not in scope_index:
            scope_index[read["scope"]] = len(scopes)
            scopes.append(vars(import_user_module(read["scope"])))
        terms.append(f"({_scoped(read['path'], scope_index[read['scope']])}) is __E[{i}]")
    source = "def __reads_ok({}):\n    try:\n        return {}\n    except Exception:\n        return False\n".format(
        ", ".join([*(f"__S{i}" for i in range(len(scopes))), "__E"]),
        " and ".join(terms) or "True",
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, "<precompile global reads>", "exec"), namespace)
    reads_ok = namespace["__reads_ok"]

    def bound_now(read: dict[str, str]) -> Any:
        try:
            index = scope_index[read["scope"]]
            return eval(_scoped(read["path"], index), {f"__S{index}": scopes[index]})
        except Exception:
            return None

    def same_name(read: dict[str, Any], bound: Any) -> bool:
        target = getattr(bound, "__func__", bound)
        return (getattr(target, "__module__", None), getattr(target, "__qualname__", None)) == (
            read["module"],
            read["qualname"],
        )

    def captured_one(read: dict[str, Any], bound: Any) -> bool:
        # The same name, and the same kind of namespace its code reads globals from
        # (``home``: the same code made in another namespace reads other globals).
        return same_name(read, bound) and (
            "home" not in read or home_globals(getattr(bound, "__func__", bound)) == read["home"]
        )

    def loaded_one(read: dict[str, Any], bound: Any) -> bool:
        # At load no identity is known: a function whose value the capture recorded is
        # taken only with that value (one replaced before load by another is refused
        # on the first call, as one replaced after load is).
        return captured_one(read, bound) and (
            read.get("value") is None
            or function_value(getattr(bound, "__func__", bound)) == read["value"]
        )

    unresolved = object()
    expected = [
        bound if loaded_one(read, bound) else unresolved
        for read, bound in ((read, bound_now(read)) for read in GLOBAL_READS)
    ]
    reads_args = [(*scopes, tuple(expected))]

    def recheck_reads() -> None:
        for i, read in enumerate(GLOBAL_READS):
            bound = bound_now(read)
            if bound is expected[i]:
                continue
            if (
                expected[i] is unresolved
                and captured_one(read, bound)
                and read.get("value") is None
            ):
                expected[i] = bound
                continue
            if (
                read.get("value") is not None
                and captured_one(read, bound)
                and function_value(getattr(bound, "__func__", bound)) == read["value"]
            ):
                # Unresolved at load (filled later) or another object than at load:
                # the same value either way, watched from now on like the one read.
                was = expected[i]
                old = None if was is unresolved else getattr(was, "__func__", was)
                expected[i] = bound
                for adopt in adopters or ():
                    adopt(old, getattr(bound, "__func__", bound))
                continue
            captured = f"{read['module']}.{read['qualname']}"
            if read.get("location"):
                captured += f" ({read['location']})"
            target = getattr(bound, "__func__", bound)
            code = getattr(target, "__code__", None)
            if bound is None:
                now = "nothing (it is not defined)"
            else:
                now = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(bound).__qualname__)}"
                if code is not None:
                    now += f" ({code.co_filename}:{code.co_firstlineno})"
                if same_name(read, bound) and not captured_one(read, bound):
                    now += (
                        ", a function of that name running in other globals than its module's"
                        if read["home"]
                        else ", a function of that name running in its module's globals"
                    )
                elif captured_one(read, bound):
                    # The same name: another function, made by the same code.
                    now += (
                        ", another function of that name whose code, defaults, attributes or "
                        "closure values differ from the traced one's"
                        if read.get("value") is not None
                        else ", another function of that name (what it holds is told "
                        "apart by identity only)"
                    )
            refuse(
                f"precompile: `{read.get('shown') or user_path(read['path'])}` (read by module "
                f"{read.get('reader') or read['scope']}) is "
                f"bound to {now} in this process; the capture traced {captured}, and this "
                f"artifact serves only that. Restore it, or capture again with the new one "
                f"(re-emit the artifact)"
            )
        reads_args[0] = (*scopes, tuple(expected))

    def global_reads_ok() -> None:
        if not reads_ok(*reads_args[0]):
            recheck_reads()

    return global_reads_ok if GLOBAL_READS else None


def build_code_check() -> Callable[[], None] | None:
    """``code_ok()``: refuse when a function the trace ran (``TRACED_FUNCS``: helpers,
    methods, functions held in attributes, and the functions their closure cells hold)
    has other code than the trace saw. Dynamo guards a function by identity, and
    ``f.__code__ = g.__code__`` (IPython's autoreload, a hot patch) keeps the identity.

    At load each function is resolved by module and qualified name, and its code
    compared with the capture's digest (a swap made before load, the source file
    unchanged). Per call, one generated expression compares their ``__code__`` by
    identity with the code last verified; only a miss compares digests (the same code recompiled is adopted).
    None when the trace ran no such function."""
    found: dict[int, tuple[Any, dict[str, Any]]] = {}
    # The digests of every project function the trace ran, named or not: a function a
    # closure cell holds is watched only where the trace ran its code.
    traced = {row["code"] for row in TRACED_FUNCS}
    nameless = {row["qualname"]: row["location"] for row in TRACED_FUNCS if row.get("nameless")}

    def resolve(row: dict[str, Any]) -> Any:
        try:
            owner: Any = import_user_module(row["module"])
            for part in row["qualname"].split("."):
                owner = (
                    vars(owner).get(part, None) if isinstance(owner, type) else getattr(owner, part)
                )
        except Exception:
            return None
        owner = getattr(owner, "__func__", owner)
        return owner if hasattr(owner, "__code__") and hasattr(owner, "__closure__") else None

    def add(fn: Any, row: dict[str, Any]) -> None:
        if id(fn) in found:
            return
        found[id(fn)] = (fn, row)
        # A function a closure cell holds runs with what it holds, as its maker does.
        for cell in fn.__closure__ or ():
            try:
                held = cell.cell_contents
            except ValueError:
                continue
            if not (hasattr(held, "__code__") and hasattr(held, "__closure__")):
                continue
            digest = code_fingerprint(held.__code__)
            if digest in traced:
                add(held, {**row, "qualname": held.__qualname__, "code": digest})
            elif held.__qualname__ in nameless:
                # The trace ran a function of that name held there, with other code.
                changed(
                    {**row, "qualname": held.__qualname__, "location": nameless[held.__qualname__]}
                )

    def named(row: dict[str, Any]) -> str:
        where = f" ({row['location']})" if row.get("location") else ""
        if row.get("reached"):
            where += f", reached as `{row['reached']}`"
        return f"function {row['module']}.{row['qualname']}{where}"

    def reached(row: dict[str, Any]) -> list[tuple[Any, dict[str, Any]]]:
        # A function no import name reaches, by the access paths from module globals
        # the trace read it at; one bound to another function there now is the global
        # read check's to refuse.
        held = []
        for read in row.get("reads") or ():
            try:
                scope = {"__S0": vars(import_user_module(read["scope"]))}
                fn = eval(_scoped(read["path"], 0), scope)
            except Exception:
                continue
            fn = getattr(fn, "__func__", fn)
            if getattr(fn, "__qualname__", None) == row["qualname"] and hasattr(fn, "__code__"):
                shown = {"module": fn.__module__, "reached": user_path(read["path"])}
                held.append((fn, {**row, **shown}))
        return held

    def changed(row: dict[str, Any]) -> None:
        refuse(
            f"precompile: {named(row)} has other code in this process than the capture "
            f"traced, and its source file was not edited since: its __code__ was replaced "
            f"(a hot patch, IPython's autoreload), or Python imported it from a stale "
            f"__pycache__ .pyc (an edit that kept the file's size, saved within the second "
            f"of an earlier import: delete that __pycache__ folder); this artifact serves "
            f"only the traced code. Restore the function, or capture again with the new "
            f"code (re-emit the artifact)"
        )

    for row in TRACED_FUNCS:
        if row.get("nameless"):
            for fn, where in reached(row):
                if code_fingerprint(fn.__code__) != row["code"]:
                    changed(where)
                add(fn, where)
            continue
        fn = resolve(row)
        if fn is None:
            continue  # the name checks refuse a name that is gone
        if code_fingerprint(fn.__code__) != row["code"]:
            changed(row)
        add(fn, row)
    if not found:
        return None

    # Only the code: Dynamo's own guards compare what an inlined call read of its
    # defaults, keyword defaults and cells by value (each read has a source, and is
    # guarded there), but a function only by identity, which ``f.__code__ = ...`` keeps.
    functions = [fn for fn, _row in found.values()]
    rows = [row for _fn, row in found.values()]

    def recheck() -> None:
        for fn, row in zip(functions, rows):
            # The same code compiled again (autoreload recompiles every function of a
            # saved file, edited or not) computes what the trace did: adopted.
            if code_fingerprint(fn.__code__) != row["code"]:
                refuse(
                    f"precompile: {named(row)}, which the trace ran, has had its code "
                    f"replaced in place (__code__) since the capture; eager would run the "
                    f"new code and this artifact serves only the traced code. Restore it, "
                    f"or capture again with the new code (re-emit the artifact)"
                )
        bind()

    # One generated function compares every ``f.__code__`` with the code last verified
    # (bound as its defaults: no map, no tuple built per call); a miss rechecks.
    def generated(count: int) -> Any:
        source = "def __code_ok(__R, {}):\n    if not ({}):\n        __R()\n".format(
            ", ".join(f"__F{i}, __C{i}" for i in range(count)),
            " and ".join(f"__F{i}.__code__ is __C{i}" for i in range(count)),
        )
        namespace: dict[str, Any] = {}
        exec(compile(source, "<precompile traced code>", "exec"), namespace)
        return namespace["__code_ok"]

    code_ok = generated(len(functions))

    def bind() -> None:
        bound: list[Any] = [recheck]
        for fn in functions:
            bound += [fn, fn.__code__]
        code_ok.__defaults__ = tuple(bound)

    def adopt(old: Any, new: Any) -> None:
        # Another function with the same value stands where ``old`` was read
        # (``build_global_read_check``): watch its code, and its cells' functions',
        # in place of the old ones'. ``old`` None: nothing stood there at load (a
        # registry filled later): watch it from now on, as if found at load.
        if old is None:
            digest = code_fingerprint(new.__code__)
            row = next(
                (r for r in TRACED_FUNCS if r.get("nameless") and r["code"] == digest),
                {"module": new.__module__, "qualname": new.__qualname__, "code": digest},
            )
            add(new, {**row, "module": new.__module__, "qualname": new.__qualname__})
            functions[:] = [fn for fn, _row in found.values()]
            rows[:] = [row for _fn, row in found.values()]
            # Same arity of globals (none): the generated comparison of one more
            # function replaces the code of the one every caller holds.
            code_ok.__code__ = generated(len(functions)).__code__
            bind()
            return
        pairs = [(old, new)]
        # A recursive function's cell holds the function itself: each pair once.
        seen: set[tuple[int, int]] = set()
        while pairs:
            was, now = pairs.pop()
            if (id(was), id(now)) in seen:
                continue
            seen.add((id(was), id(now)))
            functions[:] = [now if fn is was else fn for fn in functions]
            for then_cell, now_cell in zip(was.__closure__ or (), now.__closure__ or ()):
                try:
                    held, holds = then_cell.cell_contents, now_cell.cell_contents
                except ValueError:
                    continue
                if held is not holds and hasattr(held, "__code__") and hasattr(holds, "__code__"):
                    pairs.append((held, holds))
        bind()

    bind()
    code_ok.adopt = adopt  # read by multigraph_dependencies.build_dependency_check
    return code_ok


def _scoped(path: str, index: int) -> str:
    """A global read's access path with every ``G[...]`` (the module's globals, in
    Dynamo's naming) read from ``__S{index}``: a path may name the globals more than
    once (a dict entry keyed by the n-th key of a global dict,
    ``G['m'].D[list(dict.keys(G['m'].D))[7]]``)."""
    import re

    return re.sub(r"(?<![\w.\]'\"])G\[", f"__S{index}[", path)


def build_class_check() -> Any:
    """``check()`` for ``CLASS_ATTRS``, or None when there are none: the classes the
    trace went through must hold the methods and descriptors it ran.

    At load, each project class recorded with its attributes is compared with the
    capture by name (``class_attrs``): one rebound before load is refused here. Per call,
    the version tags of every class dict along the classes' MROs (any assignment to a
    class attribute gives its dict a new tag) and the MROs themselves are compared with
    those at load: two C-level ``map``s. Only when one changed are the methods and
    descriptors compared by identity with those at load (of a library class, those
    that held code the trace ran); an unchanged set (a plain class-level value
    assigned, a method rebound back to the loaded object) is adopted."""
    import gc
    import operator

    if not CLASS_ATTRS:
        return None
    leaves = []
    # A class of a module whose class defines __getattr__ (or one of its bases) -> its
    # names at capture: a new one may shadow a name the trace resolved through it.
    forwarded: dict[Any, frozenset[str]] = {}

    def check_forwarded(cls: Any) -> None:
        new = sorted(set(vars(cls)) - forwarded[cls])
        if new:
            where = f"{cls.__module__}.{cls.__qualname__}"
            refuse(
                f"precompile: class {where} has an attribute {new[0]!r} it did not have at "
                f"capture; it is (or is a base of) a module class that defines __getattr__, "
                f"through which the trace may have resolved `.{new[0]}` (eager now reads "
                f"the class attribute, and no guard compares it). Remove it (del "
                f"{cls.__qualname__}.{new[0]}), or capture again with it (re-emit the "
                f"artifact)",
                2,
            )

    # A project class -> the names it defined at capture (``defines``).
    defined: dict[Any, frozenset[str]] = {}

    def check_shadowing(leaf: Any) -> None:
        """A name a project class along ``leaf``'s MRO did not define at capture, now
        set on it while a class after it defines it: the trace read the later class's
        value, the only one Dynamo guarded (a plain class attribute is guarded on the
        class that held it, not by its absence from the ones before)."""
        mro = leaf.__mro__
        for i, cls in enumerate(mro):
            had = defined.get(cls)
            if had is None:
                continue
            # Dunders are left to the checks of what they bind (``__annotations__``
            # appears in a class's dict the first time anything reads it).
            for name in sorted(
                k
                for k in list(vars(cls))
                if isinstance(k, str) and k not in had and not k.startswith("__")
            ):
                base = next((b for b in mro[i + 1 :] if name in vars(b)), None)
                if base is not None and base is not object:
                    refuse(
                        f"precompile: `{cls.__qualname__}.{name}` is set on class "
                        f"{cls.__module__}.{cls.__qualname__} in this process, shadowing "
                        f"`{base.__qualname__}.{name}`, which the trace read (Dynamo "
                        f"guarded the value on {base.__qualname__} alone). Remove it (del "
                        f"{cls.__qualname__}.{name}), or capture again with it (re-emit the "
                        f"artifact)",
                        2,
                    )

    for row in CLASS_ATTRS:
        where = f"{row['module']}.{row['qualname']}"
        try:
            cls = operator.attrgetter(row["qualname"])(import_user_module(row["module"]))
        except AttributeError:
            cls = None
        if not isinstance(cls, type):
            refuse(
                f"precompile: the class {where}, which the trace ran the methods of, is not "
                f"defined in this process. Restore it, or capture again (re-emit the "
                f"artifact)",
                2,
            )
        captured = row.get("attrs")
        if captured is not None:
            now = class_attrs(cls)
            for name in sorted(set(captured) | set(now)):
                if captured.get(name) == now.get(name):
                    continue
                if name not in captured:
                    at_capture = (
                        f"class {where} did not define it at capture: the trace ran the one "
                        f"it inherits"
                    )
                else:
                    at_capture = f"the capture traced {captured[name]} there"
                refuse(
                    f"precompile: `{cls.__qualname__}.{name}` is "
                    f"{now.get(name, 'not defined')} in this process; {at_capture} (Dynamo "
                    f"resolved it on the class while tracing), and this artifact serves only "
                    f"that. Restore it, or capture again with the new one (re-emit the "
                    f"artifact)",
                    2,
                )
        protocol = row.get("protocol")
        if protocol is not None:
            # A library class: its protocol dunders resolve as at capture.
            now = protocol_bindings(cls, protocol)
            for name in sorted(protocol):
                if protocol[name] != now[name]:
                    refuse(
                        f"precompile: `{cls.__qualname__}.{name}` resolves to "
                        f"{now[name] or 'the builtin one'} in this process; the capture "
                        f"resolved it to {protocol[name] or 'the builtin one'}. Python "
                        f"calls it implicitly, and Dynamo traced what the capture's does. "
                        f"Restore it, or capture again with it (re-emit the artifact)",
                        2,
                    )
        names = row.get("names")
        if names is not None:
            forwarded[cls] = frozenset(names)
            check_forwarded(cls)
        if row.get("defines") is not None:
            defined[cls] = frozenset(row["defines"])
        leaves.append(cls)
    for leaf in leaves:
        check_shadowing(leaf)
    # Every class along the MROs, once; ``object`` and other builtins cannot change.
    checked = list(
        dict.fromkeys(c for leaf in leaves for c in leaf.__mro__ if c.__module__ != "builtins")
    )

    # A project class: every method and descriptor. A library class: the attributes
    # that held code the trace ran, on any class (a ``__call__`` set on ``Linear``
    # shadows ``Module.__call__``).
    project = {cls for cls, row in zip(leaves, CLASS_ATTRS) if row.get("attrs") is not None}
    traced = frozenset(name for row in CLASS_ATTRS for name in row.get("traced") or ())

    def own(cls: Any) -> dict[str, Any]:
        return {
            n: v
            for n, v in list(vars(cls).items())
            if is_class_behaviour(v) and (cls in project or n in traced)
        }

    # A type's __dict__ is a read-only proxy of the dict the class keeps its attributes
    # in; the proxy refers to that dict, whose version tag any assignment changes.
    dicts = []
    for cls in checked:
        held = [d for d in gc.get_referents(vars(cls)) if isinstance(d, dict)]
        dicts.append(held[0] if len(held) == 1 else {})
    loaded = [own(cls) for cls in checked]
    mros = tuple(cls.__mro__ for cls in leaves)
    missing = object()

    def parts(value: Any) -> Any:
        # What a class's MRO is, and a descriptor's functions are: slots no version
        # tag sees (``P.__dict__['k'].__init__(other)`` re-initialises a property in
        # place, keeping its identity), compared per call as keys.
        if isinstance(value, type):
            return value.__mro__
        if isinstance(value, property):
            return (value.fget, value.fset, value.fdel)
        return (getattr(value, "__func__", None),)

    # The descriptors loaded (one set or rebound later is refused, so these are the
    # only ones a served call can run); without any, the MROs alone, by a C getter.
    descriptors = [
        v
        for at_load in loaded
        for v in at_load.values()
        if isinstance(v, (property, staticmethod, classmethod))
    ]
    key = parts if descriptors else operator.attrgetter("__mro__")
    keyed = [*leaves, *descriptors]
    loaded_parts = [{n: parts(v) for n, v in at_load.items()} for at_load in loaded]

    def shown(value: Any) -> str:
        if value is missing:
            return "not defined (deleted)"
        target = getattr(value, "fget", None) or getattr(value, "__func__", value)
        code = getattr(target, "__code__", None)
        kind = "a property" if isinstance(value, property) else type(value).__name__
        name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}"
        where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
        return f"{kind} {name}{where}"

    def inherited(cls: Any, name: str) -> str:
        for base in cls.__mro__[1:]:
            if name in vars(base):
                return f"the one it inherits, {shown(vars(base)[name])}"
        return "nothing (it was not defined)"

    loaded_words = [{n: shown(v) for n, v in at_load.items()} for at_load in loaded]

    def recheck() -> None:
        for cls, at_load, load_parts, words in zip(checked, loaded, loaded_parts, loaded_words):
            now = own(cls)
            for name in sorted(set(at_load) | set(now)):
                before, after = at_load.get(name, missing), now.get(name, missing)
                if after is before and (after is missing or parts(after) == load_parts[name]):
                    continue
                ran = words[name] if before is not missing else inherited(cls, name)
                how = "set" if before is missing else "rebound"
                refuse(
                    f"precompile: `{cls.__qualname__}.{name}` was "
                    f"{how if after is not before else 're-initialised in place'} on class "
                    f"{cls.__module__}.{cls.__qualname__} after this artifact was loaded: it "
                    f"is {shown(after)} now, and the trace ran {ran} (Dynamo resolved it "
                    f"on the class at capture; the artifact does not look it up again). "
                    f"Restore it, or capture again with the new one (re-emit the artifact)",
                    2,
                )
        for cls in forwarded:
            check_forwarded(cls)
        for leaf in leaves:
            check_shadowing(leaf)
        for cls, mro in zip(leaves, mros):
            if cls.__mro__ != mro:
                refuse(
                    f"precompile: the bases of class {cls.__module__}.{cls.__qualname__} "
                    f"changed after this artifact was loaded ({cls.__mro__} now); the trace "
                    f"ran the methods its bases had. Restore them, or capture again (re-emit "
                    f"the artifact)",
                    2,
                )

    return watch_dicts(lambda: dicts, recheck, True, key, lambda _dicts: keyed)


def build_builtin_check() -> Any:
    """``check()`` for ``BUILTIN_READS``, or None when there are none: every name the
    traced code resolved through the builtins (``len``, ``abs``, ``max``) must still
    resolve there. Dynamo baked what the builtin did (its guard on the builtins dict
    entry is an identity check, dropped from serialized guards), so a module global of
    that name bound later (``mymodule.len = ...``), or ``builtins.abs`` patched, changes
    eager's answer and not the artifact's.

    Per call, the version tags of the modules' globals and builtins dicts are compared
    with those last found as captured (one C-level ``map``); only when one changed are
    the names looked up: absent from the module's globals, and in the builtins dict the
    object loaded (or, when load found another, one named as at capture)."""
    import builtins as builtins_module

    if not BUILTIN_READS:
        return None
    missing = object()
    rows = []
    for row in BUILTIN_READS:
        scope = vars(import_user_module(row["module"]))
        held = scope.get("__builtins__", builtins_module)
        table = held if isinstance(held, dict) else vars(held)
        rows.append((row, scope, table))
    # (id of a builtins dict, name) -> the object found there as captured.
    expected: dict[tuple[int, str], Any] = {}
    for row, _scope, table in rows:
        for name, captured in row["names"].items():
            found = table.get(name, missing)
            if found is not missing and builtin_key(found) == captured:
                expected.setdefault((id(table), name), found)
    watched = list({id(d): d for _row, scope, table in rows for d in (scope, table)}.values())

    def recheck() -> None:
        for row, scope, table in rows:
            for name, captured in row["names"].items():
                if name in scope:
                    bound = scope[name]
                    refuse(
                        f"precompile: module {row['module']} binds the global `{name}` (to "
                        f"{builtin_name(bound)}) in this process; its traced code resolved "
                        f"`{name}` to the builtin {captured[0]} at capture, and the artifact "
                        f"runs what that builtin did. Remove the global (del "
                        f"{row['module']}.{name}), or capture again with it bound (re-emit "
                        f"the artifact)",
                        2,
                    )
                now = table.get(name, missing)
                key = (id(table), name)
                if now is expected.get(key, missing) and now is not missing:
                    continue
                if key not in expected and now is not missing and builtin_key(now) == captured:
                    expected[key] = now
                    continue
                shown = "not defined" if now is missing else builtin_name(now)
                refuse(
                    f"precompile: builtins.{name} is {shown} in this process; the code of "
                    f"module {row['module']} the trace ran resolved `{name}` to {captured[0]}, "
                    f"and the artifact runs what that builtin did. Restore builtins.{name}, "
                    f"or capture again with the new one (re-emit the artifact)",
                    2,
                )

    # Not compared at load: the first call does.
    return watch_dicts(lambda: watched, recheck, False)
