"""The Dynamo and Inductor internals an artifact's runtime reaches, as functions emitted
verbatim into multi-graph artifacts (``capturing.carried`` says which): each imports what
it needs itself, or reads what the prelude binds (``plain_serving_runtime``, after
``prelude.PLAIN_GUARDS_PRELUDE``; declared under ``TYPE_CHECKING``), so the artifact's
driver reaches torch's internals only through them. Every function here is emitted code;
the capture side never calls them, but for ``dict_keys_by_name``, which it runs before it
translates the guards, so that both guard paths check the same."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from precompile.runtime.guard_text import frame_label, guard_failure_text

if TYPE_CHECKING:
    # What the emitted plain_serving_runtime finds in the artifact: the names
    # prelude.PLAIN_GUARDS_PRELUDE binds, and runtime.multigraph_guards (emitted alongside).
    from precompile.runtime.multigraph_guards import PlainGuards, code_object

    _set_code_exec_strategy: Any = None
    _SKIP_FRAMES: Any = None
    _DynamoUtilsStandIn: Any = None


def disown_cleanup_hooks(scope: dict[str, Any], name: str) -> None:
    """Before an artifact binds ``name`` in ``scope``: a live compile (Dynamo already
    imported; nothing else can hold one) may have bound it with a hook that deletes it
    once that compile's code object dies; point such hooks at a scratch scope instead,
    so they cannot delete the binding the artifact is about to make. Emitted for both
    guard paths."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    instance = getattr(getattr(utils, "CleanupManager", None), "instance", None)
    for hooks in list(getattr(instance, "values", {}).values()):
        for hook in hooks if isinstance(hooks, list) else ():
            if getattr(hook, "scope", None) is scope and getattr(hook, "name", None) == name:
                hook.scope = {name: None}


def dict_keys_by_name(state: Any, records: list[dict[str, Any]]) -> Any:
    """``state`` (a variant's unpickled Dynamo guards) with every key Dynamo named by
    position in a dict whose order cannot matter named by the key the capture saw there
    (``_compat.dict_keys.positional_dicts`` made ``records``): ``D[key]`` for the entry
    read at ``list(dict.keys(D))[i]``, ``key in D`` for each key the trace read, and
    neither the other keys' guards nor the dict's length guard, which only Dynamo's
    positional accessors need. A dict whose order can matter keeps its guards. Emitted
    into artifacts whose guards Dynamo rebuilds; the capture runs it too, before it
    translates the guards into a Dynamo-free program, so both paths check the same."""
    import dataclasses
    import functools

    from torch._dynamo.guards import GuardBuilder
    from torch._dynamo.source import ConstDictKeySource
    from torch._guards import GuardsSet, Source
    from torch.utils._ordered_set import OrderedSet

    named = {r["dict"]: r for r in records if not r["order"]}
    if not named:
        return state
    keys = {name: dict((p, k) for p, k in r["keys"]) for name, r in named.items()}

    def positional(source: Any) -> Any:
        """The named dict's record and position when ``source`` is one of its keys."""
        if isinstance(source, ConstDictKeySource) and source.base.name in named:
            return source.base.name, source.index
        return None

    def rewrite(source: Any) -> Any:
        if not isinstance(source, Source) or not dataclasses.is_dataclass(source):
            return source
        changes: dict[str, Any] = {}
        index = getattr(source, "index", None)
        at = positional(index)
        if at is not None and at[1] in keys[at[0]]:
            changes["index"] = keys[at[0]][at[1]]
        for field in dataclasses.fields(source):
            value = getattr(source, field.name, None)
            if field.name not in changes and isinstance(value, Source):
                new = rewrite(value)
                if new is not value:
                    changes[field.name] = new
        if not changes:
            return source
        node: Any = source  # a frozen Source dataclass (is_dataclass narrowed it to a class too)
        return dataclasses.replace(node, **changes)

    def rewrite_fn(create_fn: Any) -> Any:
        if not isinstance(create_fn, functools.partial):
            return create_fn
        args = tuple(rewrite(a) if isinstance(a, Source) else a for a in create_fn.args)
        kwargs = {
            k: rewrite(v) if isinstance(v, Source) else v for k, v in create_fn.keywords.items()
        }
        return functools.partial(create_fn.func, *args, **kwargs)

    graph = state.output_graph
    guards = []
    for guard in graph.guards:
        source = guard.originating_source
        at = positional(source)
        if at is not None:  # a guard on a key: the keys read stay, as membership
            if at[1] in named[at[0]]["read"] and at[1] in keys[at[0]]:
                membership = functools.partial(GuardBuilder.DICT_CONTAINS, key=keys[at[0]][at[1]])
                guards.append(
                    dataclasses.replace(
                        guard, originating_source=source.base, create_fn=membership, _hash=None
                    )
                )
            continue
        if source.name in named and guard.create_fn_name() == "SEQUENCE_LENGTH":
            continue
        new_source, new_fn = rewrite(source), rewrite_fn(guard.create_fn)
        if new_source is source and new_fn is guard.create_fn:
            guards.append(guard)
        else:
            guards.append(
                dataclasses.replace(
                    guard, originating_source=new_source, create_fn=new_fn, _hash=None
                )
            )
    graph._guards = GuardsSet(OrderedSet(guards))
    graph.guard_on_key_order = {rewrite(s) for s in graph.guard_on_key_order if s.name not in named}
    graph.input_source_to_sizes_strides = {
        rewrite(s): info for s, info in graph.input_source_to_sizes_strides.items()
    }
    return state


def guards_rebuilt_as_captured(
    load: Any, state: Any, code: Any, scope: Any, captured: dict[str, Any]
) -> Any:
    """``load(state, code, scope)`` -- Dynamo's ``load_guard_manager`` -- with each plain
    value a guard expects being the one the capture read (``captured``: source name ->
    value, ``_compat.dynamo.captured_guard_values``), not what this process holds there.
    Dynamo's rebuild reads each guard's source again and makes what it reads the guard's
    expectation: a class attribute (``self.SCALE``, inherited or through
    ``type(self)``), an enum member's value or a global changed in the source since the
    capture would pass its own guard and be served by a graph that baked the old value."""
    if not captured:
        return load(state, code, scope)
    from torch._dynamo import guards

    read = guards.GuardBuilder.get
    missing = object()
    differ: dict[str, tuple[Any, Any]] = {}

    def get(self: Any, guard_or_source: Any, closure_vars: Any = None) -> Any:
        value = read(self, guard_or_source, closure_vars)
        source = getattr(guard_or_source, "originating_source", guard_or_source)
        name = getattr(source, "name", None)
        if not isinstance(name, str):
            return value
        then = captured.get(name, missing)
        if then is missing:
            return value
        if "type(" in name and (type(value) is not type(then) or repr(value) != repr(then)):
            differ.setdefault(name, (value, then))
        return then

    guards.GuardBuilder.get = get  # type: ignore[method-assign]  # for this rebuild only
    try:
        manager = load(state, code, scope)
    finally:
        guards.GuardBuilder.get = read  # type: ignore[method-assign]
    if differ:
        # Read through a class (``self.SCALE``, ``type(self).__dict__[...]``): Dynamo's
        # manager takes a class dict unchanged since this rebuild for one whose values
        # it checked, so a value that differs from the capture's now would pass until
        # the class changes again (torch 2.13). Refused here, naming it.
        name, (now, then) = next(iter(differ.items()))
        raise LookupError(
            f"`{name}` is {now!r} in this process, where the capture read {then!r} (the "
            f"graph baked it); restore it before loading, or capture again (re-emit the "
            f"artifact)"
        )
    return manager


def dynamo_serving_runtime() -> Any:
    """The few Dynamo internals a standalone artifact needs to rebuild its frames; its
    ``load_guard_manager`` rebuilds a variant's guards with the values the capture read
    (``guards_rebuilt_as_captured``)."""
    import functools
    import types as _types

    import torch
    import torch._dynamo
    from torch._dynamo.aot_compile import bind_locals
    from torch._dynamo.output_graph import get_builtins_dict
    from torch._dynamo.package import SerializedCode, load_guard_manager, load_guards_state

    return _types.SimpleNamespace(
        to_code=SerializedCode.to_code_object,
        load_guards_state=load_guards_state,
        load_guard_manager=functools.partial(guards_rebuilt_as_captured, load_guard_manager),
        name_dict_keys=dict_keys_by_name,
        builtins_dict=get_builtins_dict,
        bind_locals=bind_locals,
        disable=torch._dynamo.disable,
    )


def inductor_backend_loader(bundle: dict[str, Any] | None) -> Any:
    """Emitted verbatim into Dynamo+Inductor artifacts: turn each pickled backend artifact
    back into a compiled function. With a cache bundle (every file of which the loader
    checked against the envelope's digests: Inductor loads its shared objects and
    unpickles its entries), Inductor reads from a private directory unpacked from it (so
    nothing compiles that the capture compiled, and the user's Inductor cache is never
    written); without one, kernels compile from the
    source inside the artifacts, into the user's Inductor cache."""
    import atexit
    import os
    import pickle
    import shutil
    import tempfile

    files = (bundle or {}).get("inductor_cache_files") or {}
    directory = None
    if files:
        directory = tempfile.mkdtemp(prefix="precompile-inductor-")
        atexit.register(shutil.rmtree, directory, True)
        for relative, data in files.items():
            path = os.path.join(directory, relative)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)

    # Finding a cached kernel asks Inductor which vector ISA to build for, and Inductor
    # answers by compiling and loading a test program per ISA (seconds). The bundle
    # records the ISA the kernels were built for, and the load only got this bundle
    # because this CPU has its features: answer with it while the kernels load.
    recorded = None
    if directory is not None:
        from torch._inductor import codecache, cpu_vec_isa

        isa = ((bundle or {}).get("requires") or {}).get("isa")
        matches = [v for v in cpu_vec_isa.supported_vec_isa_list if str(v) == isa]
        if matches or isa == "none":
            recorded = matches

        # Before it looks a kernel up, Inductor precompiles the kernels' common header into
        # the machine's own directory (not TORCHINDUCTOR_CACHE_DIR, so never into the bundle):
        # on a machine, or in a fresh venv, that never compiled it, that is a g++ run of
        # seconds. Every kernel is in the bundle, so no header is needed: answer with a plain
        # one (a kernel compiled despite that would still build, only without the speed-up).
        def plain_header(header: str, *args: Any, **kwargs: Any) -> str:
            path = os.path.join(directory, "headers", header.replace("/", "_"))
            if not os.path.exists(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(f"#include <{header}>\n")
            return path

    def load(blob: bytes) -> Any:
        previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        probe = precompile_header = None
        if directory is not None:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory
            precompile_header = codecache._precompile_header
            # Patched for this load only, restored below.
            codecache._precompile_header = plain_header  # type: ignore[assignment]  # a plain function for torch's lru_cache'd one
            if recorded is not None:
                probe = cpu_vec_isa.valid_vec_isa_list
                cpu_vec_isa.valid_vec_isa_list = lambda: recorded  # type: ignore[assignment]  # a plain function for torch's lru_cache'd one
        try:
            return pickle.loads(blob).after_deserialization()
        finally:
            if probe is not None:
                cpu_vec_isa.valid_vec_isa_list = probe
            if precompile_header is not None:
                codecache._precompile_header = precompile_header
            if directory is not None:
                if previous is None:
                    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
                else:
                    os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous

    return load


def dynamo_installed_runtime() -> Any:
    """Emitted verbatim into installed artifacts: what installing a package onto the live
    code objects needs, and a compile-refusing callback bound to one callable (torch 2.13
    has none: a process-global stance would also stop other code from compiling)."""
    import types as _types

    import torch._dynamo
    from torch._C._dynamo.eval_frame import (
        _debug_get_cache_entry_list,
        _debug_get_precompile_entries,
        _reset_precompile_entries,
    )
    from torch._dynamo import convert_frame, trace_rules
    from torch._dynamo.eval_frame import OptimizeContext
    from torch._dynamo.package import CompilePackage, _lookup_code
    from torch._dynamo.types import ConvertFrameReturn

    class CompileRefused(RuntimeError):
        """A frame of an installed artifact missed every captured variant."""

    def refusing_callback(inner: Any, eager_codes: set[Any]) -> Any:
        def callback(frame: Any, *args: Any, **kwargs: Any) -> Any:
            code = frame.f_code
            if (
                code in eager_codes
                or trace_rules.check(code)
                or not convert_frame.has_tensor_in_frame(frame)
            ):
                return ConvertFrameReturn()  # run this frame eagerly, as the capture did
            failures = []
            for i, entry in enumerate(_debug_get_precompile_entries(code)):
                info = entry.guard_manager.check_verbose(frame.f_locals)
                parts = list(getattr(info, "verbose_code_parts", None) or [])
                shown = (
                    guard_failure_text(str(parts[0]), frame.f_locals) if parts else "a guard failed"
                )
                failures.append(f"variant {i}: {shown}")
            raise CompileRefused(
                f"{frame_label(code.co_name)} ({code.co_filename}:{frame.f_lineno}) would need "
                f"a new compile; {'; '.join(failures) or 'no captured variant'}"
            )

        callback._torchdynamo_orig_backend = getattr(inner, "_torchdynamo_orig_backend", inner)  # type: ignore[attr-defined]  # Dynamo reads it off the callback function
        return callback

    class Backend:
        """What ``CompilePackage.install`` wants per backend id."""

        def __init__(self, fn: Any) -> None:
            self.fn = fn

        def after_deserialization(self) -> Any:
            return self.fn

    def package_for(fn: Any, state: Any) -> Any:
        """A CompilePackage of ``state`` for ``fn``, leaving the process as it is:
        ``CompilePackage(fn, state)`` also uninstalls whatever serves ``fn`` now (its
        constructor resets the code's precompile entries), which would leave an artifact
        loaded earlier refusing every call after this load was refused for it."""
        package = CompilePackage(None)
        package.initialize(fn, state)
        package.validate()
        return package

    def target_codes(package: Any) -> list[Any]:
        return [_lookup_code(e) if e.code_source else c for c, e in package._codes.items()]

    def uninstall(package: Any, targets: list[Any]) -> None:
        # CompilePackage.uninstall pops each global once per code that installed it, and
        # fails on an import alias two frames share; remove each once, idempotently.
        for module, names in package._installed_globals.items():
            for name in set(names):
                module.__dict__.pop(name, None)
        package._installed_globals.clear()
        for code in targets:
            _reset_precompile_entries(code)

    def install(package: Any, backends: dict[str, Any], captured: dict[str, Any]) -> None:
        """``package.install(backends)``, each guarded code's guards rebuilt with the
        values the capture read (``captured``: sha256 of its guards state -> source name
        -> value; ``guards_rebuilt_as_captured``)."""
        import hashlib

        from torch._dynamo import package as package_module

        load_state, load_manager = (
            package_module.load_guards_state,
            package_module.load_guard_manager,
        )
        digests: dict[int, str] = {}

        def state_of(data: bytes) -> Any:
            state = load_state(data)
            digests[id(state)] = hashlib.sha256(data).hexdigest()
            return state

        def manager_of(state: Any, code: Any, scope: Any) -> Any:
            values = captured.get(digests.get(id(state), ""), {})
            return guards_rebuilt_as_captured(load_manager, state, code, scope, values)

        # Both looked up in the package module when install calls them, for this install.
        vars(package_module).update(load_guards_state=state_of, load_guard_manager=manager_of)
        try:
            package.install(backends)
        finally:
            vars(package_module).update(
                load_guards_state=load_state, load_guard_manager=load_manager
            )

    return _types.SimpleNamespace(
        CompilePackage=CompilePackage,
        install=install,
        package_for=package_for,
        OptimizeContext=OptimizeContext,
        optimize=torch._dynamo.optimize,
        config=torch._dynamo.config,
        CompileRefused=CompileRefused,
        refusing_callback=refusing_callback,
        Backend=Backend,
        target_codes=target_codes,
        uninstall=uninstall,
        live_entries=_debug_get_cache_entry_list,
        precompile_entries=_debug_get_precompile_entries,
    )


def plain_serving_runtime() -> Any:
    """What the multi-graph driver needs to rebuild its frames, without ``torch._dynamo``."""
    import inspect
    import types as _types

    def builtins_dict(scope: dict[str, Any]) -> dict[str, Any]:
        # What Dynamo's get_builtins_dict returns: __builtins__ is a module or its dict.
        found = scope["__builtins__"]
        return found if isinstance(found, dict) else found.__dict__

    def bind_locals(signature: inspect.Signature, *args: Any, **kwargs: Any) -> dict[str, Any]:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments

    def disable(fn: Any) -> Any:
        # Keep a backend function's frames out of any eval-frame callback, as
        # torch._dynamo.disable would (a later torch.compile around the artifact).
        target = fn.func if hasattr(fn, "func") else fn
        code = getattr(target, "__code__", None)
        if isinstance(code, _types.CodeType):
            _set_code_exec_strategy(code, _SKIP_FRAMES)
        return fn

    return _types.SimpleNamespace(
        # What an import alias names instead of a Dynamo module (see import_source).
        stand_ins={"precompile:dynamo-utils-stand-in": _DynamoUtilsStandIn},
        to_code=code_object,
        builtins_dict=builtins_dict,
        bind_locals=bind_locals,
        disable=disable,
        guard_manager=PlainGuards,
    )
