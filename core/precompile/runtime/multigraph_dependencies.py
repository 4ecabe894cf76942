"""The per-call checks of what a Dynamo trace depended on beyond its serialized guards,
authored as code, emitted verbatim into multi-graph artifacts (standalone and installed).

``precompile.capturing.dynamo_dependencies`` records at capture what the trace depended
on; ``build_dependency_check`` here composes one sub-builder per kind of dependency,
each computing at load what its check needs and returning the closure every call runs:

- Hooks (``MODULE_HOOKS``: on every module the trace reached, and torch's global module
  hooks), here: the version tags of the hook dicts (and of each module's ``_modules``,
  so a swapped submodule is walked again) are compared on the fast path; only when a
  tag changed are the hooks walked and compared by what each is
  (``value_fingerprints.hooks_fingerprint``, as make_fx compares them).
- What the arguments reach (``ARG_IDENTITIES``, ``FLOAT_ZEROS``, ``ORDERED_DICTS``,
  ``ARG_RELATIONS``): ``multigraph_argument_checks``.
- The names the frames resolved (``GLOBAL_READS``, ``CLASS_ATTRS``, ``BUILTIN_READS``):
  ``multigraph_name_checks``.

A mismatch raises PrecompileError naming what changed, where, and the fix. Nothing
here imports precompile: the hook helpers are also what the capture records with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

# >>> not emitted: Dynamo artifacts carry value_fingerprints before this module, and their
# prelude binds the hook dicts' names
from precompile._compat.prelude import (
    GLOBAL_HOOK_DICTS,
    GLOBAL_MODULE_HOOK_NAMES,
    MODULE_HOOK_DICTS,
)
from precompile.runtime.hook_kinds import inference_skip
from precompile.runtime.hook_records import (
    global_hooks_fingerprint,
    named_hooks,
    reached_key,
    reached_state,
)
from precompile.runtime.hook_words import hook_change, hook_locations
from precompile.runtime.value_fingerprints import (
    hook_read_names,
    module_hook_flags,
    new_context,
    truth_deleted_refusal,
    truth_kind,
    truth_refusal,
)

# <<< not emitted

if TYPE_CHECKING:
    # Bound by the artifact prelude (precompile._compat.prelude).
    _dict_version: Callable[[dict[str, Any]], int] = len
    FN_NAME: str = ""
    FN_MODULE: str = ""
    MODULE_HOOKS: dict[str, Any] = {}

    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...

    def import_user_module(name: str) -> Any: ...

    def user_path(text: str) -> str: ...

    # precompile.runtime.surface_checks, emitted before this module.
    def _build_surface_check() -> Any: ...

    # The sub-builders of the other kinds of dependency, emitted with this module:
    # precompile.runtime.multigraph_argument_checks and multigraph_name_checks.
    def build_argument_check(signature: Any) -> Any: ...

    def build_global_read_check(
        adopters: list[Callable[[Any, Any], None]] | None = None,
    ) -> Callable[[], None] | None: ...

    def build_class_check() -> Any: ...

    def build_builtin_check() -> Any: ...

    # precompile.runtime.setting_checks, emitted before this module.
    def build_setting_check(records: list[list[Any]]) -> Callable[[], None] | None: ...

    PROCESS_STATE: list[list[Any]] = []

    def build_code_check() -> Any: ...

    # precompile.runtime.version_watch, emitted before this module.
    def watch_dicts(
        watched: Callable[[], list[Any]],
        recheck: Callable[[], None],
        checked: bool = True,
        key: Callable[[Any], Any] | None = None,
        keyed: Callable[[list[Any]], Any] | None = None,
    ) -> Callable[[], None]: ...

    def watch_together(checks: list[Callable[[], None]]) -> Callable[[], None]: ...


def hook_snapshot(
    root: Any, inference: bool = False, reached: list[Any] | None = None
) -> dict[str, dict[str, Any]]:
    """Submodule path -> hook dict -> ``(hook_name, identity)`` per hook, in order, for the
    hooks present under ``root`` (the forward, forward-pre, backward and backward-pre
    hooks of every submodule). A hook is identified as make_fx identifies it
    (``value_fingerprints.hooks_fingerprint``: the function it is -- code, closure,
    defaults -- and its registration flags); its name only words the message. An
    ``inference`` artifact leaves out forward hooks that only mark their output as
    requiring grad (``hook_kinds.marks_grad_only``): they change no value it
    returns. ``reached``: the fingerprinting passes are appended to it, for the driver
    to watch what the hooks reach (``reached_state``)."""
    found: dict[str, dict[str, Any]] = {}
    for path, module in root.named_modules():
        # The tensors a hook stores into its closure's lists and dicts (activations)
        # change with every call: left out of its identity, while the other entries (a
        # closure's ``box[0]``, ``table["act"]``) count, the hook's code reading them.
        context = new_context(hook_read_names(module, MODULE_HOOK_DICTS))
        context["contents"] = False
        hooks = named_hooks(
            module,
            MODULE_HOOK_DICTS,
            module_hook_flags(module),
            False,
            inference_skip(not inference),
            context,
        )
        if reached is not None:
            reached.append(context)
        if hooks:
            found[path] = hooks
    return found


def global_hook_snapshot(reached: list[Any] | None = None) -> dict[str, Any]:
    """torch's global module hooks present, as ``hook_snapshot`` records a module's: hook
    dict -> ``(hook_name, identity)`` per hook, without torch's module trackers' hooks,
    which only watch (``hook_kinds.watches_only``). ``reached`` as there."""
    from torch.nn.modules import module as nn_module

    hooks = tuple(getattr(nn_module, name) for name in GLOBAL_MODULE_HOOK_NAMES)
    return global_hooks_fingerprint(hooks, False, reached=reached)


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


def protocol_bindings(cls: Any, names: Any) -> dict[str, str]:
    """What each of ``names`` (protocol dunders: ``__getattr__``, ``__call__``, ...)
    resolves to on ``cls``: the class along its MRO that defines it and what is bound
    there (``class_attrs``' words), or "" where only a builtin class does. Python calls
    them implicitly, and Dynamo inlines what torch's own do: one set on a library class
    before load (``nn.Linear.__getattr__ = f``) changes eager and not the graph.
    Computed alike at capture and at load, so the two compare."""
    found = {}
    for name in sorted(names):
        found[name] = ""
        for owner in cls.__mro__:
            if owner.__module__ == "builtins":
                continue
            if name in vars(owner):
                bound = class_attrs(owner).get(name, "a class-level value")
                found[name] = f"{owner.__module__}.{owner.__qualname__}: {bound}"
                break
    return found


def build_dependency_check(before: Callable[[], None] | None = None) -> Any:
    """``check(args, kwargs)``: raise PrecompileError when a call's modules carry other
    hooks than at capture, torch's global module hooks changed, or a module-level
    function or class the frames read is bound to something else. Call it after the
    frames' import aliases are bound (global reads go through them).

    One sub-builder per kind of dependency (the library surface, torch's global hooks,
    the hooks of the modules the trace reached, global reads, what the arguments reach,
    the classes and the builtins the frames read), each computing at load what its
    check needs and returning the closure ``check`` calls (None where the capture
    recorded nothing of its kind that a call could change). ``before``: a check of the
    driver's own run first on every call (one frame for all)."""
    import inspect
    import operator

    # The torch settings a lowered kernel chose by (``PROCESS_STATE``): compared on
    # every call with the driver's own check, as a cheap comparison of the values.
    settings_ok = build_setting_check(PROCESS_STATE)
    if settings_ok is not None:
        before = settings_ok if before is None else _both(before, settings_ok)

    # First: a library function replaced before load (at import) is named as such, not
    # as the global read or class attribute its replacement also changes.
    surface_ok = _build_surface_check()
    global_hooks_ok = _build_global_hook_check()
    entry_fn = operator.attrgetter(FN_NAME)(import_user_module(FN_MODULE))
    signature = inspect.signature(entry_fn)
    module_hooks_ok = _build_module_hook_check(signature)
    # A function the read check adopts in place of the one read at load (the same
    # value, another object) has its code watched by the code check from then on.
    adopters: list[Callable[[Any, Any], None]] = []
    reads_ok = build_global_read_check(adopters)
    arguments_ok = build_argument_check(signature)
    classes_ok = build_class_check()
    builtins_ok = build_builtin_check()
    code_ok = build_code_check()
    if code_ok is not None:
        adopters.append(code_ok.adopt)

    # The checks that watch dicts by version tag (the library surface, the classes, the
    # builtins, torch's global hooks) are compared as one (``watch_together``): an
    # unchanged world costs one C-level read of all their tags. When a tag changed, each
    # of them runs (in this order) and refuses as it would alone, before the others.
    watchers = [c for c in (surface_ok, classes_ok, builtins_ok, global_hooks_ok) if c]
    watched_ok = watch_together(watchers)

    def full(args: Any, kwargs: Any) -> None:
        if before is not None:
            before()
        watched_ok()
        if arguments_ok is not None:
            arguments_ok(args, kwargs)
        if module_hooks_ok is not None:
            module_hooks_ok(args, kwargs)
        if reads_ok is not None:
            reads_ok()
        if code_ok is not None:
            code_ok()

    # Per call, one frame: ``before``, the epoch, then what it does not cover.
    return _dependency_epoch(
        watchers, module_hooks_ok, full, before, arguments_ok, reads_ok, code_ok
    )


def _both(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        first()
        second()

    return both


def _dependency_epoch(
    watchers: list[Any],
    module_hooks_ok: Any,
    full: Callable[[Any, Any], None],
    before: Callable[[], None] | None,
    arguments_ok: Callable[[Any, Any], None] | None,
    reads_ok: Callable[[], None] | None,
    code_ok: Callable[[], None] | None,
) -> Callable[[Any, Any], None]:
    """``check(args, kwargs)``: every dependency check, in one frame per call. The
    tag-watching checks (``watchers``) and the module-hook check are one comparison, as
    make_fx's per-call epoch is. Per call: the
    modules the hook check fetches from the call's positional arguments are the ones the
    last passing call had (identity), every instance ``__dict__`` of their submodules is
    still the one it held (``m.__dict__ = d`` stores into no dict), and the dicts all
    these checks watch hold what they held then: the non-empty ones by their version
    tags, the ones then empty by being empty still (an empty dict holds what an empty
    dict held, and which dict each is was read through a dict whose tag or identity is
    compared here: a hook dict or ``_modules`` replaced is a store into its module's
    instance dict); the objects compared by a key (an OrderedDict's key order, what a
    hook reaches) by their keys. Equal, each of those checks would pass without
    rechecking, and none is called; ``before`` and the checks the epoch does not cover
    (``arguments_ok``, ``reads_ok``, ``code_ok``) are, in ``full``'s order. Otherwise
    ``full(args, kwargs)`` runs every check as before (each refuses as alone) and the
    comparison is taken again from what they verified. When the hook check has a module
    not fetched from a positional argument (a global, a keyword), ``full`` runs every
    call."""
    import operator

    if module_hooks_ok is None:
        positions: list[int] = []
    else:
        positions = module_hooks_ok.positions
        if positions is None:
            return full
    instance_dict = operator.attrgetter("__dict__")
    is_ = operator.is_
    # (refs, dicts, versions, empties, modules, idicts, keyed, the idicts' versions)
    state: list[Any] = [None]
    last = max(positions, default=-1)

    def take() -> None:
        state[0] = None
        parts = [w.snapshot() for w in watchers]
        found = module_hooks_ok.snapshot() if module_hooks_ok is not None else []
        if found is None or any(versions is None for _d, versions, *_rest in parts):
            return  # a check not yet run, or a module not taken: the next call runs all
        dicts: list[Any] = []
        versions: list[Any] = []
        keyed: list[tuple[Any, Any, Any]] = []
        refs, modules, idicts = [], [], []
        for own_dicts, own_versions, key, items, keys in parts:
            dicts.extend(own_dicts)
            versions.extend(own_versions)
            if key is not None and items:
                keyed.append((key, items, keys))
        idict_versions: list[int] = []
        for ref, own_dicts, own_versions, own_modules, own_idicts, own_tags, own_keyed in found:
            refs.append(ref)
            dicts.extend(own_dicts)
            versions.extend(own_versions)
            modules.extend(own_modules)
            idicts.extend(own_idicts)
            idict_versions.extend(own_tags)
            keyed.extend(k for k in own_keyed if k[1])
        tagged = [(d, v) for d, v in zip(dicts, versions) if d]
        empties = [d for d, v in zip(dicts, versions) if not d]
        state[0] = (
            refs,
            [d for d, _v in tagged],
            tuple(v for _d, v in tagged),
            empties,
            modules,
            idicts,
            # The keyed objects as three parallel lists (key functions, objects, keys),
            # compared with C-level maps only: no Python frame per call.
            ([k for k, _o, _v in keyed], [o for _k, o, _v in keyed], [v for _k, _o, v in keyed]),
            tuple(idict_versions),
        )

    def check(args: Any, kwargs: Any) -> None:
        now = state[0]
        if not (
            now is not None
            and len(args) > last
            and all(map(is_, map(operator.call, now[0]), map(args.__getitem__, positions)))
            and tuple(map(_dict_version, now[1])) == now[2]
            and not any(now[3])
            and all(map(is_, map(instance_dict, now[4]), now[5]))
            and list(map(tuple, map(map, now[6][0], now[6][1]))) == now[6][2]
        ):
            full(args, kwargs)
            take()
            return
        if tuple(map(_dict_version, now[5])) != now[7]:
            # Only an instance dict changed (an attribute set: often, a module that
            # counts its calls): every check runs, the hook check finds its dicts in
            # place and checks shadowing alone; unless it walked a module again (its
            # watched dicts taken anew), only those tags are taken again.
            walked = module_hooks_ok.walks[0]
            full(args, kwargs)
            if module_hooks_ok.walks[0] == walked:
                state[0] = (*now[:7], tuple(map(_dict_version, now[5])))
            else:
                take()
            return
        # Each check the epoch proved passing was not called; these run still.
        if before is not None:
            before()
        if arguments_ok is not None:
            arguments_ok(args, kwargs)
        if reads_ok is not None:
            reads_ok()
        if code_ok is not None:
            code_ok()

    take()
    return check


def _build_global_hook_check() -> Callable[[], None]:
    """``global_hooks_ok()``: refuse when torch's global module hooks
    (``register_module_forward_hook`` and friends) differ from the capture's. Per call,
    the version tags of their dicts and of torch's module namespace, and the key order
    of the non-empty ones; only a change compares the hooks by name."""
    from torch.nn.modules import module as nn_module

    global_attrs = GLOBAL_HOOK_DICTS
    captured_global = MODULE_HOOKS.get("global") or {}
    # torch reads the global hook dicts as globals of its module: one replaced there
    # (a store into that module's dict) is fetched again. Non-empty ones are compared by
    # their keys in order too (``move_to_end`` changes no version).
    nn_scope = vars(nn_module)

    # What the hooks reach (a closure's list or dict, a callable object's state), as
    # the last check found it: its dicts watched by version with the hook dicts, the
    # other objects by ``reached_key`` with the non-empty hook dicts' key order.
    reached: list[list[Any]] = [[], []]

    def global_dicts() -> list[Any]:
        return [nn_scope, *(getattr(nn_module, attr) for attr in global_attrs), *reached[0]]

    def ordered(dicts: list[Any]) -> tuple[Any, ...]:
        hook_dicts = dicts[1 : 1 + len(global_attrs)]
        return (*(d for d in hook_dicts if d), *reached[1])

    def check_global_hooks() -> None:
        passes: list[Any] = []
        now = global_hook_snapshot(passes)
        for attr in sorted(set(captured_global) | set(now)):
            if captured_global.get(attr, []) != now.get(attr, []):
                change = hook_change(
                    {attr.replace("_global", ""): captured_global.get(attr, [])},
                    {attr.replace("_global", ""): now.get(attr, [])},
                    "every module (a global hook, torch.nn.modules.module.register_module_*)",
                    hook_locations([nn_module], global_attrs),
                )
                refuse(f"precompile: {change}")
        reached[:] = reached_state(passes)

    # Not compared at load: the first call does.
    return watch_dicts(global_dicts, check_global_hooks, False, reached_key, ordered)


def _build_module_hook_check(signature: Any) -> Callable[[Any, Any], None] | None:
    """``module_hooks_ok(args, kwargs)``: refuse when a module the trace reached (each
    root of ``MODULE_HOOKS``, fetched from the call's arguments or a global) carries
    other hooks than at capture, or an instance ``__dict__`` entry shadows what the
    trace ran. Per call, the version tags and identities of the hook, ``_modules`` and
    instance dicts the last check saw; only a change walks the module again. None when
    the trace reached no module.

    Each training-only flag whose Dynamo guards the capture relaxed (the root's
    ``"flags"``: submodule dotted path -> names) is checked by the kind of its truth
    test, as make_fx checks it (``truth_kind``): eager runs it before it reads
    ``training``. Its value is looked up without running code, where Python would find
    it; a change of it is a store into the instance dict (whose version the fast path
    compares), or into a class dict of its MRO or its ``_parameters`` / ``_buffers``
    (watched by version with the hook dicts' reach), so it costs nothing per call."""
    import gc
    import inspect
    import operator
    import weakref

    from torch.nn.modules import module as nn_module

    module_type = nn_module.Module
    instance_dict = operator.attrgetter("__dict__")  # vars(), a third cheaper per call
    attrs = MODULE_HOOK_DICTS
    # (root, id(module)) -> (weakref to the module, its hook and _modules dicts, their
    # version tags when last found as captured): one module may stand for two roots.
    # Then the (path, submodule) pairs, their instance dicts and those dicts' version
    # tags when last checked (one-element list: updated in place), the submodules, the
    # non-empty hook dicts and their keys in order.
    cache: dict[tuple[int, int], tuple[Any, ...]] = {}
    fetchers = []
    positional: list[int] = []  # the argument positions of roots that are parameters
    for number, root in enumerate(MODULE_HOOKS.get("roots") or []):
        # "open": the instance dict names, at capture, of submodules whose class has its
        # own __getattr__ (check_shadowing refuses any other name).
        open_keys = {dotted: frozenset(names) for dotted, names in root.get("open", {}).items()}
        # "flags": submodule dotted path -> [[name, whether every captured read found it]].
        flags = {dotted: dict(map(tuple, names)) for dotted, names in root.get("flags", {}).items()}
        root = {**root, "number": number, "open": open_keys, "flags": flags}
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
            positional.append(root["index"])
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

    inference = bool(MODULE_HOOKS.get("inference"))

    def check_module(root: dict[str, Any], module: Any) -> None:
        walks[0] += 1
        passes: list[Any] = []
        now = hook_snapshot(module, inference, passes)
        captured = root["hooks"]
        for sub in sorted(set(captured) | set(now)):
            where = user_path(root["path"]) + (f".{sub}" if sub else "")
            change = hook_change(
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
        check_flags(root, subs)
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
        # What the hooks reach (a closure's dict or list, a callable object's state):
        # its dicts by version, the other objects by ``reached_key``.
        reached_dicts, reached_objects = reached_state(passes)
        reached_dicts = [*reached_dicts, *flag_dicts(root, subs)]
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
            reached_dicts,
            tuple(map(_dict_version, reached_dicts)),
            reached_objects,
            tuple(map(reached_key, reached_objects)),
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

    absent = object()

    def flag_value(module: Any, name: str) -> Any:
        """What reading ``module.name`` finds, without running code: the instance
        ``__dict__``, its parameters, buffers and children, then the classes of its MRO
        (as ``_compat.dynamo_guard_relaxing._held`` did at capture); ``absent`` where
        none holds it."""
        own = vars(module)
        if name in own:
            return own[name]
        for table in ("_parameters", "_buffers", "_modules"):
            held = own.get(table)
            if held and name in held:
                return held[name]
        for cls in type(module).__mro__:
            if name in vars(cls):
                return vars(cls)[name]
        return absent

    def check_flags(root: dict[str, Any], subs: list[tuple[str, Any]]) -> None:
        """Refuse a relaxed flag whose value's truth test is not known to be pure, or
        that every captured read found and no module or class holds now (eager's plain
        read raises; one absent at capture was read by ``getattr`` with a default, a
        constant of the code, whose truth test is the captured one)."""
        flags = root["flags"]
        if not flags:
            return
        for dotted, sub_module in subs:
            for name, held in sorted(flags.get(dotted, {}).items()):
                value = flag_value(sub_module, name)
                where = user_path(root["path"]) + (f".{dotted}" if dotted else "")
                if value is absent and held:
                    refuse(truth_deleted_refusal(f"`{where}`", name), 2)
                kind = truth_kind(None if value is absent else value)[1]
                if kind != "pure":
                    refuse(truth_refusal(f"`{where}`", name, kind), 2)

    def flag_dicts(root: dict[str, Any], subs: list[tuple[str, Any]]) -> list[Any]:
        """The dicts a flag's value is also found in, watched by version: each flagged
        submodule's ``_parameters`` and ``_buffers``, and the class dicts along its MRO
        (a type's ``__dict__`` is a proxy of the dict a store into the class changes)."""
        found: list[Any] = []
        for dotted, sub_module in subs:
            if dotted not in root["flags"]:
                continue
            own = vars(sub_module)
            found.extend(d for d in (own.get("_parameters"), own.get("_buffers")) if d is not None)
            for cls in type(sub_module).__mro__:
                if cls.__module__ != "builtins":
                    held = [d for d in gc.get_referents(vars(cls)) if isinstance(d, dict)]
                    found.extend(held[:1])
        return found

    # The cache entries the last call that passed used, one per root (None: a root
    # that was not a module), for the dependency epoch (``snapshot``).
    last: list[Any] = [None]
    walks = [0]  # how many times a module was walked (its watched dicts taken again)

    def module_hooks_ok(args: Any, kwargs: Any) -> None:
        last[0] = None
        used: list[tuple[int, int] | None] = []
        for fetch, root in fetchers:
            try:
                module = fetch(args, kwargs)
            except Exception:
                used.append(None)
                continue  # the call's own guards refuse what is missing
            if not isinstance(module, module_type):
                used.append(None)
                continue
            key = (root["number"], id(module))
            used.append(key)
            cached = cache.get(key)
            if (
                cached is None
                or cached[0]() is not module
                or tuple(map(_dict_version, cached[1])) != cached[2]
                or not all(map(operator.is_, map(instance_dict, cached[6]), cached[4]))
                or (cached[7] and tuple(map(tuple, cached[7])) != cached[8])
                or (cached[9] and tuple(map(_dict_version, cached[9])) != cached[10])
                or (cached[11] and tuple(map(reached_key, cached[11])) != cached[12])
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
                check_flags(root, cached[3])
                cached[5][0] = versions
        last[0] = used

    def snapshot() -> list[tuple[Any, ...]] | None:
        """Per root, what the last passing call verified of its module: a weak reference
        to it, the dicts watched (hook and ``_modules`` dicts, the dicts the hooks reach)
        with their tags then, the submodules with their instance dicts and those dicts'
        tags, and the keyed objects ``(key, objects, keys)``. None when that call had a root
        that was no module, or none passed yet."""
        used = last[0]
        if used is None or None in used:
            return None
        found = []
        for key in used:
            cached = cache.get(key)
            if cached is None:
                return None
            found.append(
                (
                    cached[0],
                    [*cached[1], *cached[9]],
                    (*cached[2], *cached[10]),
                    cached[6],
                    cached[4],
                    cached[5][0],
                    [(tuple, cached[7], cached[8]), (reached_key, cached[11], cached[12])],
                )
            )
        return found

    # The argument positions the roots are fetched from, when every root is a
    # positional parameter (the dependency epoch compares those arguments' identity).
    module_hooks_ok.snapshot = snapshot  # type: ignore[attr-defined]
    module_hooks_ok.walks = walks  # type: ignore[attr-defined]
    module_hooks_ok.positions = positional if len(positional) == len(fetchers) else None  # type: ignore[attr-defined]
    return module_hooks_ok if fetchers else None
