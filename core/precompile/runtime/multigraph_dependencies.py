"""The per-call checks of what a Dynamo trace depended on beyond its serialized guards,
authored as code, emitted verbatim into multi-graph artifacts (standalone and installed).

``precompile.capturing.dynamo_dependencies`` records, at capture, the hooks on every module the
trace reached and torch's global module hooks (``MODULE_HOOKS``), and the module-level
functions and classes the frames read (``GLOBAL_READS``). Here, every call checks them:

- Hooks, cheaply: the version tags of the hook dicts (and of each module's
  ``_modules``, so a swapped submodule is walked again) are compared on the fast path;
  only when a tag changed are the hooks walked and compared by name.
- Global reads: a load resolves each access path and refuses one bound to another
  function or class than the capture saw (by module and qualified name; the code of
  project functions is checked by ``FUNCTION_SOURCES``); every call then compares the
  bindings by identity, in one generated function.

- Objects compared by identity, reached from the arguments (``ARG_IDENTITIES``): a load
  resolves each by its name (module and qualified name, enum class and member, module
  global); every call evaluates the access paths from the arguments and compares by
  identity (a closure is compared by its code). Signed zeros the trace computed with
  (``FLOAT_ZEROS``: floats, complex parts) are checked in the same generated function, which binds fn's
  parameters once per call; only a miss runs the row-by-row pass that names it.
- The classes the trace went through (``CLASS_ATTRS``: the classes of the modules it
  reached and of the methods, properties and ``__call__`` it inlined, with their bases):
  Dynamo resolved ``Net.__call__``, ``Net.forward``, a property's getter on the class at
  capture and guards none of it. A load compares each project class's methods and
  descriptors with the capture's by name (``Net.encode`` rebound before load); every
  call compares the version tags of the class dicts (any attribute assignment on a class
  changes its tag) and the MROs, and only when one changed compares the methods and
  descriptors by identity with those at load.

A mismatch raises PrecompileError naming what changed, where, and the fix. Nothing
here imports precompile: the hook helpers are also what the capture records with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

# >>> not emitted: Dynamo artifacts carry these functions of state_checks among their own,
# and their prelude binds the hook dicts' names
from precompile._compat.prelude import GLOBAL_HOOK_DICTS, MODULE_HOOK_DICTS
from precompile.runtime.state_checks import code_fingerprint, watches_only

# <<< not emitted

if TYPE_CHECKING:
    # Bound by the artifact prelude (precompile._compat.prelude).
    _dict_version: Callable[[dict[str, Any]], int] = len
    FN_NAME: str = ""
    FN_MODULE: str = ""
    MODULE_HOOKS: dict[str, Any] = {}
    GLOBAL_READS: list[dict[str, str]] = []
    ARG_IDENTITIES: list[dict[str, Any]] = []
    ARG_RELATIONS: list[dict[str, Any]] = []
    FLOAT_ZEROS: list[dict[str, Any]] = []
    ORDERED_DICTS: list[dict[str, Any]] = []
    CLASS_ATTRS: list[dict[str, Any]] = []
    BUILTIN_READS: list[dict[str, Any]] = []

    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...

    def import_user_module(name: str) -> Any: ...

    def user_path(text: str) -> str: ...

    # precompile.runtime.surface_checks, emitted before this module.
    def _build_surface_check() -> Any: ...


def hook_name(hook: Any) -> str:
    """``module.qualname`` of a hook (of the function a partial or bound method wraps)."""
    target = getattr(hook, "func", hook)
    target = getattr(target, "__func__", target)
    if not hasattr(target, "__qualname__"):
        target = type(target)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}"


def hook_locations(modules: Any, attrs: Any) -> dict[str, str]:
    """Hook name -> ``file:line`` of its definition, for the hooks on ``modules``."""
    found = {}
    for module in modules:
        for attr in attrs:
            for hook in (getattr(module, attr, None) or {}).values():
                target = getattr(hook, "func", hook)
                code = getattr(getattr(target, "__func__", target), "__code__", None)
                if code is not None:
                    found[hook_name(hook)] = f"{code.co_filename}:{code.co_firstlineno}"
    return found


def hook_snapshot(root: Any) -> dict[str, dict[str, list[str]]]:
    """Submodule path -> hook dict -> hook names, for the hooks present under ``root``
    (the forward, forward-pre, backward and backward-pre hooks of every submodule)."""
    found: dict[str, dict[str, list[str]]] = {}
    for path, module in root.named_modules():
        for attr in MODULE_HOOK_DICTS:
            hooks = getattr(module, attr, None)
            if hooks:
                found.setdefault(path, {})[attr] = [hook_name(h) for h in hooks.values()]
    return found


def global_hook_snapshot() -> dict[str, list[str]]:
    """torch's global module hooks present: hook dict -> hook names."""
    from torch.nn.modules import module as nn_module

    found = {}
    for attr in GLOBAL_HOOK_DICTS:
        hooks = getattr(nn_module, attr, None)
        # torch's module trackers' hooks only watch (state_checks.watches_only).
        names = [hook_name(h) for h in (hooks or {}).values() if not watches_only(h)]
        if names:
            found[attr] = names
    return found


def builtin_name(value: Any) -> str:
    """``module.qualname`` of what a builtins dict holds (of its type for an instance
    such as ``exit``), in words."""
    target = value if hasattr(value, "__qualname__") else type(value)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}"


def builtin_key(value: Any) -> list[str]:
    """What capture records of a builtin and serving compares, in every process: its
    name and its type's (a wrapper that copies ``__qualname__`` is not a builtin)."""
    kind = type(value)
    return [builtin_name(value), f"{kind.__module__}.{kind.__qualname__}"]


def is_class_behaviour(value: Any) -> bool:
    """Whether a class attribute is code a call may run (a method, a descriptor such as a
    property, a nested class, any callable), not a plain class-level value."""
    return callable(value) or hasattr(type(value), "__get__")


def class_attrs(cls: Any) -> dict[str, str]:
    """The methods and descriptors in ``cls``'s own ``__dict__`` (functions, properties,
    static and class methods, nested classes, anything with ``__get__`` or callable),
    each described by what names it in every process: its module and qualified name (a
    property by its accessors). Plain class-level values are left out: Dynamo guards the
    values it read, and they may change between calls. Computed alike at capture and at
    load, so the two compare."""

    def named(value: Any) -> str:
        target = getattr(value, "__func__", value)
        module = getattr(target, "__module__", None)
        qualname = getattr(target, "__qualname__", None)
        if isinstance(module, str) and isinstance(qualname, str):
            return f"{module}.{qualname}"
        return f"a {type(value).__module__}.{type(value).__qualname__}"

    found = {}
    for name, value in list(vars(cls).items()):
        kind = type(value)
        if not is_class_behaviour(value):
            continue
        if isinstance(value, property):
            accessors = (value.fget, value.fset, value.fdel)
            found[name] = "property({})".format(
                ", ".join("-" if f is None else named(f) for f in accessors)
            )
        elif isinstance(value, (staticmethod, classmethod)):
            found[name] = f"{kind.__name__}({named(value.__func__)})"
        elif isinstance(value, type):
            found[name] = f"class {named(value)}"
        elif hasattr(value, "__code__"):
            found[name] = f"function {named(value)}"
        else:
            found[name] = f"a {kind.__module__}.{kind.__qualname__}"
    return found


def _hook_change(
    captured: dict[str, list[str]],
    now: dict[str, list[str]],
    where: str,
    located: dict[str, str] | None = None,
) -> str:
    """The first hook difference between two snapshots of one module, in words
    (``located``: where the hooks present now are defined)."""
    words = {
        "_forward_pre_hooks": "forward pre-hook",
        "_forward_hooks": "forward hook",
        "_backward_pre_hooks": "backward pre-hook",
        "_backward_hooks": "backward hook",
    }
    for attr in sorted(set(captured) | set(now)):
        kind = words.get(attr.replace("_global", ""), attr)
        before, after = captured.get(attr, []), now.get(attr, [])
        added = [h for h in after if h not in before]
        removed = [h for h in before if h not in after]
        if added:
            at = (located or {}).get(added[0])
            return (
                f"a {kind} `{added[0]}`{f' ({at})' if at else ''} was added to {where} after "
                f"capture; the artifact did "
                f"not trace it, so it cannot serve it. Remove the hook, or capture with the "
                f"hook registered (re-emit the artifact)"
            )
        if removed:
            return (
                f"the {kind} `{removed[0]}` that {where} had at capture is gone; the artifact "
                f"runs it as traced. Register it again, or capture without it (re-emit the "
                f"artifact)"
            )
        if before != after:
            return (
                f"the {kind}s of {where} run in another order than at capture "
                f"({', '.join(after)}; captured: {', '.join(before)}). Register them as at "
                f"capture, or re-emit the artifact"
            )
    return ""


def build_dependency_check() -> Any:
    """``check(args, kwargs)``: raise PrecompileError when a call's modules carry other
    hooks than at capture, torch's global module hooks changed, or a module-level
    function or class the frames read is bound to something else. Call it after the
    frames' import aliases are bound (global reads go through them)."""
    import inspect
    import operator
    import weakref

    from torch.nn.modules import module as nn_module

    # First: a library function replaced before load (at import) is named as such, not
    # as the global read or class attribute its replacement also changes.
    surface_ok = _build_surface_check()
    module_type = nn_module.Module
    instance_dict = operator.attrgetter("__dict__")  # vars(), a third cheaper per call
    attrs = MODULE_HOOK_DICTS
    global_attrs = GLOBAL_HOOK_DICTS
    captured_global = MODULE_HOOKS.get("global") or {}
    # torch reads the global hook dicts as globals of its module: one replaced there
    # (a store into that module's dict) is fetched again. Non-empty ones are compared by
    # their keys in order too (``move_to_end`` changes no version).
    nn_scope = vars(nn_module)
    global_dicts = [nn_scope, *(getattr(nn_module, attr) for attr in global_attrs)]
    global_versions: list[Any] = [None]
    global_order: list[Any] = [(), ()]

    def check_global_hooks() -> None:
        now = global_hook_snapshot()
        for attr in sorted(set(captured_global) | set(now)):
            if captured_global.get(attr, []) != now.get(attr, []):
                change = _hook_change(
                    {attr.replace("_global", ""): captured_global.get(attr, [])},
                    {attr.replace("_global", ""): now.get(attr, [])},
                    "every module (a global hook, torch.nn.modules.module.register_module_*)",
                    hook_locations([nn_module], global_attrs),
                )
                refuse(f"precompile: {change}")
        global_dicts[1:] = [getattr(nn_module, attr) for attr in global_attrs]
        global_versions[0] = tuple(map(_dict_version, global_dicts))
        ordered = tuple(d for d in global_dicts[1:] if d)
        global_order[:] = [ordered, tuple(map(tuple, ordered))]

    entry_fn = operator.attrgetter(FN_NAME)(import_user_module(FN_MODULE))
    signature = inspect.signature(entry_fn)
    # (root, id(module)) -> (weakref to the module, its hook and _modules dicts, their
    # version tags when last found as captured): one module may stand for two roots.
    # Then the (path, submodule) pairs, their instance dicts and those dicts' version
    # tags when last checked (one-element list: updated in place), the submodules, the
    # non-empty hook dicts and their keys in order.
    cache: dict[tuple[int, int], tuple[Any, ...]] = {}
    fetchers = []
    for number, root in enumerate(MODULE_HOOKS.get("roots") or []):
        # "open": the instance dict names, at capture, of submodules whose class has its
        # own __getattr__ (check_shadowing refuses any other name).
        open_keys = {dotted: frozenset(names) for dotted, names in root.get("open", {}).items()}
        root = {**root, "number": number, "open": open_keys}
        path = root["path"]
        # Each kind of root binds what it reads as defaults; all are called (args, kwargs).
        fetch: Callable[[Any, Any], Any]
        if root["kind"] == "global":
            scope = vars(import_user_module(root["module"]))
            code = compile(root["path"].replace("G[", "__G[", 1), "<precompile>", "eval")

            def fetch(args: Any, kwargs: Any, code: Any = code, scope: Any = scope) -> Any:
                return eval(code, {"__G": scope})

        elif root["index"] is not None and path == root["param"] and not root["variadic"]:
            param = signature.parameters[root["param"]]
            default = None if param.default is inspect.Parameter.empty else param.default

            def fetch(
                args: Any, kwargs: Any, i: int = root["index"], name: str = path, d: Any = default
            ) -> Any:
                return args[i] if i < len(args) else kwargs.get(name, d)

        else:
            code = compile(path, "<precompile>", "eval")

            def fetch(args: Any, kwargs: Any, code: Any = code) -> Any:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                return eval(code, {}, dict(bound.arguments))

        fetchers.append((fetch, root))

    def check_module(root: dict[str, Any], module: Any) -> None:
        now = hook_snapshot(module)
        captured = root["hooks"]
        for sub in sorted(set(captured) | set(now)):
            where = user_path(root["path"]) + (f".{sub}" if sub else "")
            change = _hook_change(
                captured.get(sub, {}),
                now.get(sub, {}),
                f"`{where}`",
                hook_locations([m for _p, m in module.named_modules()], attrs),
            )
            if change:
                refuse(f"precompile: {change}")
        dicts: list[Any] = []
        subs = []
        for _path, sub_module in module.named_modules():
            dicts.append(sub_module._modules)
            dicts.extend(getattr(sub_module, attr) for attr in attrs)
            subs.append((_path, sub_module))
        check_shadowing(root, subs)
        if len(cache) > 64:
            cache.clear()
        # Every submodule's instance dict is watched: by identity (``m.__dict__ = d``
        # swaps it whole), and by version (``m._modules = {...}`` or a hook dict
        # replaced is a store into it). Non-empty hook dicts are OrderedDicts whose
        # order is the order the hooks run in: compared by their keys too, as
        # ``move_to_end`` reorders them without a version change.
        modules = [sub_module for _path, sub_module in subs]
        instance_dicts: list[Any] = list(map(vars, modules))
        ordered = [d for d in dicts if d and type(d) is not dict]
        cache[root["number"], id(module)] = (
            weakref.ref(module),
            dicts,
            tuple(map(_dict_version, dicts)),
            subs,
            instance_dicts,
            [tuple(map(_dict_version, instance_dicts))],
            modules,
            ordered,
            tuple(map(tuple, ordered)),
        )

    def attribute_dicts_same(cached: Any) -> bool:
        """Whether each submodule still holds the ``_modules`` and hook dicts watched."""
        now = []
        for sub_module in cached[6]:
            now.append(sub_module._modules)
            now.extend(getattr(sub_module, attr) for attr in attrs)
        return len(now) == len(cached[1]) and all(map(operator.is_, now, cached[1]))

    def check_shadowing(root: dict[str, Any], subs: list[tuple[str, Any]]) -> None:
        """Refuse a module whose instance ``__dict__`` holds a name of one of its
        submodules, parameters or buffers: Python reads the instance entry first
        (``nn.Module.__getattr__`` is asked only when it is absent), while the trace ran
        the submodule, and Dynamo's guards reach it through ``_modules`` only. Of a
        module whose class defines its own ``__getattr__``, refuse any name its instance
        ``__dict__`` did not hold at capture: the trace may have resolved that name
        through ``__getattr__`` (to an inner module's attribute), which eager no longer
        asks, and no guard says the name was missing."""
        for dotted, sub_module in subs:
            own = vars(sub_module)
            captured = root["open"].get(dotted)
            if captured is not None and not own.keys() <= captured:
                name = sorted(own.keys() - captured)[0]
                where = user_path(root["path"]) + (f".{dotted}" if dotted else "")
                cls = type(sub_module)
                refuse(
                    f"precompile: `{where}` has an attribute {name!r} (a "
                    f"{type(own[name]).__qualname__}) in its instance __dict__ that it did "
                    f"not have at capture; its class {cls.__qualname__} defines __getattr__, "
                    f"through which the trace may have resolved `{where}.{name}` (eager now "
                    f"reads the __dict__ entry, and no guard compares it). Remove the entry "
                    f"(del vars({where})[{name!r}]), or capture again with it (re-emit the "
                    f"artifact)",
                    2,
                )
            for kind, held in (
                ("submodule", sub_module._modules),
                ("parameter", sub_module._parameters),
                ("buffer", sub_module._buffers),
            ):
                clash = own.keys() & held.keys()
                if not clash:
                    continue
                name = sorted(clash)[0]
                where = user_path(root["path"]) + (f".{dotted}" if dotted else "")
                refuse(
                    f"precompile: `{where}.{name}` is shadowed: the instance __dict__ of "
                    f"`{where}` holds {name!r} (a {type(own[name]).__qualname__}), which "
                    f"Python reads before the {kind} `{name}` the trace ran (nn.Module finds "
                    f"its {kind}s only when the instance __dict__ has no such name), so eager "
                    f"would run the __dict__ entry and the artifact the {kind}. Remove the "
                    f"entry (del vars({where})[{name!r}]), or assign through the module "
                    f"(`{where}.{name} = ...` replaces the {kind}) and capture again "
                    f"(re-emit the artifact)",
                    2,
                )

    # Global reads: resolved now, compared by identity per call in one generated function.
    # A path that does not resolve to what the capture saw yet (state a library fills
    # later) is resolved again when a call misses, and adopted once it does; a path
    # resolved here stays bound to that object.
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

    def captured_one(read: dict[str, str], bound: Any) -> bool:
        target = getattr(bound, "__func__", bound)
        return (getattr(target, "__module__", None), getattr(target, "__qualname__", None)) == (
            read["module"],
            read["qualname"],
        )

    unresolved = object()
    expected = [
        bound if captured_one(read, bound) else unresolved
        for read, bound in ((read, bound_now(read)) for read in GLOBAL_READS)
    ]
    reads_args = [(*scopes, tuple(expected))]

    def recheck_reads() -> None:
        for i, read in enumerate(GLOBAL_READS):
            bound = bound_now(read)
            if bound is expected[i]:
                continue
            if expected[i] is unresolved and captured_one(read, bound):
                expected[i] = bound
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
            refuse(
                f"precompile: `{read.get('shown') or user_path(read['path'])}` (read by module "
                f"{read.get('reader') or read['scope']}) is "
                f"bound to {now} in this process; the capture traced {captured}, and this "
                f"artifact serves only that. Restore it, or capture again with the new one "
                f"(re-emit the artifact)"
            )
        reads_args[0] = (*scopes, tuple(expected))

    arguments_ok = _build_argument_check(signature)
    classes_ok = _build_class_check()
    builtins_ok = _build_builtin_check()

    def check(args: Any, kwargs: Any) -> None:
        if surface_ok is not None:
            surface_ok()
        if classes_ok is not None:
            classes_ok()
        if builtins_ok is not None:
            builtins_ok()
        if arguments_ok is not None:
            arguments_ok(args, kwargs)
        if tuple(map(_dict_version, global_dicts)) != global_versions[0] or (
            global_order[0] and tuple(map(tuple, global_order[0])) != global_order[1]
        ):
            check_global_hooks()
        for fetch, root in fetchers:
            try:
                module = fetch(args, kwargs)
            except Exception:
                continue  # the call's own guards refuse what is missing
            if not isinstance(module, module_type):
                continue
            cached = cache.get((root["number"], id(module)))
            if (
                cached is None
                or cached[0]() is not module
                or tuple(map(_dict_version, cached[1])) != cached[2]
                or not all(map(operator.is_, map(instance_dict, cached[6]), cached[4]))
                or (cached[7] and tuple(map(tuple, cached[7])) != cached[8])
            ):
                check_module(root, module)
                continue
            # An instance dict changes whenever an attribute is set (often: a module
            # that records a step count): only the shadowing check runs again then,
            # unless a watched dict itself was replaced.
            versions = tuple(map(_dict_version, cached[4]))
            if versions != cached[5][0]:
                if not attribute_dicts_same(cached):
                    check_module(root, module)
                    continue
                check_shadowing(root, cached[3])
                cached[5][0] = versions
        if not reads_ok(*reads_args[0]):
            recheck_reads()

    return check


def _scoped(path: str, index: int) -> str:
    """A global read's access path with every ``G[...]`` (the module's globals, in
    Dynamo's naming) read from ``__S{index}``: a path may name the globals more than
    once (a dict entry keyed by the n-th key of a global dict,
    ``G['m'].D[list(dict.keys(G['m'].D))[7]]``)."""
    import re

    return re.sub(r"(?<![\w.\]'\"])G\[", f"__S{index}[", path)


def _binding_source(signature: Any, missing: Any) -> tuple[list[str], dict[str, Any]]:
    """Lines that bind fn's parameters as locals from ``__a`` (args) and ``__k``
    (kwargs), without inspect, and the namespace they read (``__D``, ``__N``)."""
    import inspect

    params = list(signature.parameters.values())
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    defaults = [missing if p.default is inspect.Parameter.empty else p.default for p in params]
    lines = []
    for i, p in enumerate(params):
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            lines.append(f"{p.name} = __a[{len(positional)}:]")
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            lines.append(f"{p.name} = {{k: v for k, v in __k.items() if k not in __N}}")
        elif p in positional:
            j = positional.index(p)
            lines.append(
                f"{p.name} = __a[{j}] if len(__a) > {j} else __k.get({p.name!r}, __D[{i}])"
            )
        else:
            lines.append(f"{p.name} = __k.get({p.name!r}, __D[{i}])")
    return lines, {"__D": defaults, "__N": frozenset(p.name for p in params)}


def _build_argument_check(signature: Any) -> Any:
    """``check(args, kwargs)`` for what a call's arguments must hold beyond Dynamo's
    guards, or None when nothing (no per-call work): ``ARG_IDENTITIES`` and
    ``FLOAT_ZEROS``. One generated function binds fn's parameters once and evaluates
    every row's access path; only when it fails does the row-by-row pass run, which
    adopts what resolves now and raises PrecompileError naming the path, what is there
    and what was traced."""
    if not ARG_IDENTITIES and not FLOAT_ZEROS and not ORDERED_DICTS and not ARG_RELATIONS:
        return None
    missing = object()
    lines, namespace = _binding_source(signature, missing)
    identity_terms, identities_state, recheck_identities = _identity_rows(missing)
    zero_terms, recheck_zeros = _float_zero_rows(namespace)
    order_terms, recheck_orders = _ordered_dict_rows(namespace)
    relation_terms, recheck_relations = _relation_rows(namespace, missing)
    source = "def __arguments_ok(__a, __k, __E):\n    try:\n{}\n        return {}\n    except Exception:\n        return False\n".format(
        "\n".join("        " + line for line in lines),
        " and ".join([*identity_terms, *zero_terms, *order_terms, *relation_terms]),
    )
    exec(compile(source, "<precompile argument checks>", "exec"), namespace)
    arguments_ok = namespace["__arguments_ok"]

    def check(args: Any, kwargs: Any) -> None:
        if arguments_ok(args, kwargs, identities_state[0]):
            return
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return  # the call itself fails as eager would
        bound.apply_defaults()
        scope = dict(bound.arguments)
        recheck_identities(scope)
        recheck_zeros(scope)
        recheck_orders(scope)
        recheck_relations(scope)

    return check


def _relation_rows(namespace: dict[str, Any], missing: Any) -> tuple[list[str], Any]:
    """The term of ``ARG_RELATIONS`` for the generated check (binding what it reads
    into ``namespace``), and the row-by-row pass over a call's bound arguments.

    Each row is an access path from fn's arguments (or a module global) to an object
    the trace compared by identity that no other process can name (a config object
    ``copy.deepcopy`` keyed by ``id``), or one Dynamo found at two paths
    (``model.decoder.config`` is ``model.config``). What the trace learnt from those
    identities is which of the paths held one object, so every call checks exactly
    that: the objects at paths of one captured group are one object, and those of
    different groups are not."""
    if not ARG_RELATIONS:
        return [], lambda scope: None
    groups = tuple(row["group"] for row in ARG_RELATIONS)
    count = len(set(groups))
    paths = []
    for i, row in enumerate(ARG_RELATIONS):
        path = row["path"]
        if row.get("module"):
            namespace[f"__R{i}"] = vars(import_user_module(row["module"]))
            path = f"__R{i}" + path[1:]
        paths.append(path)
    compiled = [compile(path, "<precompile relation>", "eval") for path in paths]

    def grouped_as_captured(*values: Any) -> bool:
        seen: dict[int, int] = {}
        for value, group in zip(values, groups):
            if seen.setdefault(id(value), group) != group:
                return False
        return len(seen) == count

    namespace["__REL"] = grouped_as_captured
    term = "__REL({})".format(", ".join(f"({path})" for path in paths))

    def recheck(scope: dict[str, Any]) -> None:
        values = []
        for code in compiled:
            try:
                values.append(eval(code, namespace, scope))
            except Exception:
                values.append(missing)
        if grouped_as_captured(*values):
            return
        for j in range(len(values)):
            for i in range(j):
                same = groups[i] == groups[j]
                if (values[i] is values[j]) == same:
                    continue
                a, b = ARG_RELATIONS[i]["shown"], ARG_RELATIONS[j]["shown"]
                if values[i] is missing or values[j] is missing:
                    return  # the call's own guards refuse what is not there
                now = "two different objects" if same else "one object"
                then = "one object" if same else "two different objects"
                refuse(
                    f"precompile: `{a}` and `{b}` are {now} in this call; at capture they "
                    f"were {then}, and the trace compared them by identity (code such as "
                    f"`copy.deepcopy` or an `is` test depends on which paths hold one "
                    f"object), so this artifact serves only calls where they are {then}. "
                    + (
                        f"Make `{a}` the same object as `{b}` again (assign it, do not " f"copy it)"
                        if same
                        else f"Give `{a}` and `{b}` objects of their own"
                    )
                    + ", or capture again with them as they are now (re-emit the artifact)",
                    1,
                )

    return [term], recheck


def _float_zero_rows(namespace: dict[str, Any]) -> tuple[list[str], Any]:
    """The terms of ``FLOAT_ZEROS`` for the generated check (binding what they read into
    ``namespace``), and the row-by-row pass over a call's bound arguments: a number
    reached from an argument (or a module global) that was a signed zero at capture (a
    float equal to 0.0, a complex with a zero part) must be that very zero, compared by
    its literal fingerprint (``repr``). Dynamo's guard is ``==``, which the other sign
    passes, and ``x / s`` or ``copysign`` tell them apart. A value that differs
    otherwise is left to the guards."""
    kinds = {"float": float, "complex": complex}
    rows = []
    terms = []
    for i, row in enumerate(FLOAT_ZEROS):
        # A global's path (``G['EPS']``) reads that module's live globals, bound at load.
        path = row["path"]
        if row.get("module"):
            namespace[f"__G{i}"] = vars(import_user_module(row["module"]))
            path = f"__G{i}" + path[1:]
        kind = kinds[row["value"][0]]
        value = kind(row["value"][1])
        rows.append((row, compile(path, "<precompile signed zero>", "eval"), kind, value))
        terms.append(
            f"(type(__z := ({path})) is not __Z[{i}][0] or __z != __Z[{i}][1] "
            f"or repr(__z) == {row['value'][1]!r})"
        )
    namespace["__Z"] = tuple((kind, value) for _, _, kind, value in rows)

    def recheck(scope: dict[str, Any]) -> None:
        for row, path, kind, captured in rows:
            try:
                value = eval(path, namespace, scope)
            except Exception:
                continue  # the call's own guards refuse what is not there
            if type(value) is kind and value == captured and repr(value) != row["value"][1]:
                refuse(
                    f"precompile: `{row['shown']}` is {value!r} in this call but was "
                    f"{captured!r} at capture; the trace computed with {captured!r} (the "
                    f"sign of a zero reaches results: 1 / 0.0 is inf, 1 / -0.0 is -inf), "
                    f"and Dynamo's guard compares numbers with ==, which does not tell 0.0 "
                    f"from -0.0. Pass {captured!r}, or capture with {value!r} (re-emit the "
                    f"artifact)",
                    3,
                )

    return terms, recheck


def _ordered_dict_rows(namespace: dict[str, Any]) -> tuple[list[str], Any]:
    """The terms of ``ORDERED_DICTS`` for the generated check (binding what they read
    into ``namespace``), and the row-by-row pass over a call's bound arguments: an
    OrderedDict whose keys the guards compare by position must iterate in the order of
    its underlying dict, which is the order those guards read. ``move_to_end`` (or
    ``popitem`` and a re-insert) reorders the iteration and not the dict, so the guards
    would pass an OrderedDict that eager iterates in another order. A path that holds
    no OrderedDict now is left to the guards."""
    import collections

    namespace["__OD"] = collections.OrderedDict
    namespace["__dk"] = dict.keys
    rows = []
    terms = []
    for i, row in enumerate(ORDERED_DICTS):
        path = row["path"]
        if row.get("module"):
            namespace[f"__O{i}"] = vars(import_user_module(row["module"]))
            path = f"__O{i}" + path[1:]
        rows.append((row, compile(path, "<precompile ordered dict>", "eval")))
        terms.append(f"(not isinstance(__o := ({path}), __OD) or list(__o) == list(__dk(__o)))")

    def recheck(scope: dict[str, Any]) -> None:
        for row, path in rows:
            try:
                value = eval(path, namespace, scope)
            except Exception:
                continue  # the call's own guards refuse what is not there
            if not isinstance(value, collections.OrderedDict):
                continue
            order, stored = list(value), list(dict.keys(value))
            if order != stored:
                where = (
                    f"module {row['module']}'s global `{row['shown']}`"
                    if row.get("module")
                    else f"`{row['shown']}`"
                )
                refuse(
                    f"precompile: {where} is an OrderedDict that iterates as "
                    f"{order!r:.200} while its underlying dict holds the keys as "
                    f"{stored!r:.200} (move_to_end or popitem reordered it); the artifact's "
                    f"guards compare keys in the dict's order and the trace iterated it, so "
                    f"it would answer as if the keys came in that order. Pass "
                    f"OrderedDict(its items) built in the order you want, or capture "
                    f"again with it (re-emit the artifact)",
                    3,
                )

    return terms, recheck


def _identity_rows(missing: Any) -> tuple[list[str], list[Any], Any]:
    """The terms of ``ARG_IDENTITIES`` for the generated check (each compared with
    ``__E[i]``), the one-element list holding that tuple, and the row-by-row pass over a
    call's bound arguments: the objects at those access paths must be the ones the
    capture traced, compared by identity. The pass resolves names again (an object not
    importable at load is adopted once a call shows it by its name)."""
    import enum
    import operator

    def resolve(row: dict[str, Any]) -> Any:
        try:
            module = import_user_module(row["module"])
            found = operator.attrgetter(row["qualname"])(module)
            return found[row["member"]] if row["kind"] == "enum" else found
        except Exception:
            return missing

    def matches(row: dict[str, Any], value: Any) -> bool:
        """Whether ``value`` is what the capture traced at ``row``, by name."""
        if row["kind"] == "code":
            code = getattr(value, "__code__", None)
            return (
                getattr(value, "__module__", None),
                getattr(code, "co_qualname", None),
                code is not None and code_fingerprint(code),
            ) == (row["module"], row["qualname"], row["code"])
        target = resolve(row)
        return target is not missing and value is target

    def shown(value: Any) -> str:
        if isinstance(value, enum.Enum):
            return f"{type(value).__qualname__}.{value.name}"
        if value is missing:
            return "nothing (the path does not resolve)"
        import sys

        name = getattr(value, "__qualname__", None)
        module = getattr(value, "__module__", None)
        short = getattr(value, "__name__", None)
        if isinstance(module, str) and isinstance(short, str):
            if getattr(sys.modules.get(module), short, None) is value:
                return f"{module}.{short}"
        if isinstance(name, str) and isinstance(module, str) and name != "<lambda>":
            return f"{module}.{name}"
        if isinstance(name, str):
            code = getattr(value, "__code__", None)
            where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
            return f"{module}.{name}{where}"
        return f"another {type(value).__qualname__} instance"

    def captured(row: dict[str, Any]) -> str:
        if row["kind"] == "enum":
            return f"{row['qualname']}.{row['member']}"
        if row["kind"] == "global":
            return f"the object bound to {row['module']}.{row['qualname']}"
        if row["kind"] == "code":
            return f"a {row['module']}.{row['qualname']} function"
        return f"{row['module']}.{row['qualname']}"

    terms = [
        f"({row['path']}).__code__ is __E[{i}]"
        if row["kind"] == "code"
        else f"({row['path']}) is __E[{i}]"
        for i, row in enumerate(ARG_IDENTITIES)
    ]
    expected = [missing if row["kind"] == "code" else resolve(row) for row in ARG_IDENTITIES]
    state = [tuple(expected)]

    def recheck(scope: dict[str, Any]) -> None:
        for i, row in enumerate(ARG_IDENTITIES):
            try:
                value = eval(row["path"], {}, scope)
            except Exception:
                value = missing
            now = getattr(value, "__code__", missing) if row["kind"] == "code" else value
            if now is not missing and now is expected[i]:
                continue
            if value is not missing and matches(row, value):
                expected[i] = now
                continue
            refuse(
                f"precompile: `{row['shown']}` is {shown(value)} in this call; the capture "
                f"traced {captured(row)} there (the trace compared it by identity), and this "
                f"artifact serves only that. Pass what the capture traced, or capture again "
                f"with the new one (re-emit the artifact)"
            )
        state[0] = tuple(expected)

    return terms, state, recheck


def _build_class_check() -> Any:
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
        names = row.get("names")
        if names is not None:
            forwarded[cls] = frozenset(names)
            check_forwarded(cls)
        leaves.append(cls)
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
    mro_of = operator.attrgetter("__mro__")
    mros = tuple(map(mro_of, leaves))
    versions = [tuple(map(_dict_version, dicts))]
    missing = object()

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

    def recheck() -> None:
        for cls, at_load in zip(checked, loaded):
            now = own(cls)
            for name in sorted(set(at_load) | set(now)):
                before, after = at_load.get(name, missing), now.get(name, missing)
                if after is before:
                    continue
                ran = shown(before) if before is not missing else inherited(cls, name)
                refuse(
                    f"precompile: `{cls.__qualname__}.{name}` was "
                    f"{'set' if before is missing else 'rebound'} on class "
                    f"{cls.__module__}.{cls.__qualname__} after this artifact was loaded: it "
                    f"is {shown(after)} now, and the trace ran {ran} (Dynamo resolved it "
                    f"on the class at capture; the artifact does not look it up again). "
                    f"Restore it, or capture again with the new one (re-emit the artifact)",
                    2,
                )
        for cls in forwarded:
            check_forwarded(cls)
        for cls, mro in zip(leaves, mros):
            if cls.__mro__ != mro:
                refuse(
                    f"precompile: the bases of class {cls.__module__}.{cls.__qualname__} "
                    f"changed after this artifact was loaded ({cls.__mro__} now); the trace "
                    f"ran the methods its bases had. Restore them, or capture again (re-emit "
                    f"the artifact)",
                    2,
                )
        versions[0] = tuple(map(_dict_version, dicts))

    def check() -> None:
        if tuple(map(_dict_version, dicts)) != versions[0] or tuple(map(mro_of, leaves)) != mros:
            recheck()

    return check


def _build_builtin_check() -> Any:
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
    versions: list[Any] = [None]

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
        versions[0] = tuple(map(_dict_version, watched))

    def check() -> None:
        if tuple(map(_dict_version, watched)) != versions[0]:
            recheck()

    return check
