"""The runtime driver of multi-graph (Dynamo) artifacts, authored as code, emitted as text.

Like ``single_graph.py`` it is copied verbatim into artifacts and never imported by them. A
capture with graph breaks or several specializations is not one graph, so this driver
dispatches: it rebuilds, per captured frame, one dispatcher over that frame's variants
(serialized guards + Dynamo's transformed bytecode) and calls the first variant whose
guards hold. Deliberately standalone: nothing is installed on the program's code
objects and no frame evaluator runs, so an artifact serves exactly what it captured.

The rebuilt bytecode runs, and the guards check, against the LIVE globals of the module
each frame was compiled in: a global rebound after load fails the guard that certified
it. The only names bound there are ones Dynamo minted (normalized by the emitter so the
artifact is reproducible, and tagged so no other artifact or live compile mints them):
the frame's import aliases and builtins-dict key, the compiled subgraphs under their
backend ids, and the continuations under their resume names.

A call no variant covers raises PrecompileError naming the frame and, per variant, the
first guard that failed -- there is no compiler behind an artifact. The exception is a
frame Dynamo gave up on during capture: the capture ran it eagerly, so a miss of it runs
eagerly here too, with a warning once per frame.

Which variant serves (and the words of a miss) is ``multigraph_variants``; how the entry
runs one call under the captured global state is ``multigraph_serving``. This module
rebuilds the frames and their dispatchers and checks the artifact against the process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from collections.abc import Callable

    # Bound by the artifact prelude (precompile._compat.prelude).
    FN_NAME: str = ""
    FN_MODULE: str = ""
    TORCH_VERSION: str = ""
    PYTHON_VERSION: list[int] = []
    FUNCTION_SOURCES: list[dict[str, Any]] = []
    DYNAMO_GLOBALS: list[list[str]] = []
    ARTIFACT_TAG: str = ""
    _FRAMES: str = ""
    _ENTRY_BINDING: str = ""
    _BACKEND_FNS: dict[str, Any] = {}

    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...

    def import_user_module(name: str) -> Any: ...

    def dynamo_serving_runtime() -> Any: ...

    def plain_serving_runtime() -> Any: ...

    def disown_cleanup_hooks(scope: dict[str, Any], name: str) -> None: ...

    GUARD_RUNTIME: dict[str, Any] = {}

    def frame_label(name: str, line: int = 0) -> str: ...

    def changed_functions(records: Any, module_text: Any) -> Any: ...

    def changed_function_message(record: dict[str, Any], gone: bool, consequence: str) -> str: ...

    def build_dependency_check(before: Callable[[], None] | None = None) -> Any: ...

    def _build_surface_check() -> Any: ...

    # multigraph_variants: which variant serves, and why the others refused.
    def serving_variant(managers: list[Any], f_locals: dict[str, Any]) -> int | None: ...

    def variant_chooser(managers: list[Any]) -> Any: ...

    def dispatch_mode_depth() -> int: ...

    def variant_coverage(managers: list[Any], f_locals: dict[str, Any]) -> dict[str, Any]: ...

    def readable_guard_failure(manager: Any, f_locals: dict[str, Any]) -> str: ...

    def layout_note(failure: str, notes: list[list[str | None]]) -> str: ...

    def strip_dim_marks(values: Any) -> list[tuple[Any, dict[str, Any]]]: ...

    def restore_dim_marks(stripped: list[tuple[Any, dict[str, Any]]]) -> None: ...

    # multigraph_serving: one call under the captured state.
    def serve_as_captured(entry: Any, check: Any, installed: bool = False) -> Any: ...


def _mark_ran_before_refusal(error: RuntimeError) -> None:
    """Mark a refusal that escaped a variant (or an eagerly run frame) that had begun to
    run: its graphs and the user's code between graph breaks may have written buffers
    or inputs, so ``load(..., fallback=)`` must not run the call a second time. A frame's
    own guard miss is raised before its variant runs, unmarked; a continuation's miss
    passes through the entry's variant, which marks it. (A try costs a served call
    nothing on Python 3.11+.)"""
    if hasattr(error, "invariant"):  # a PrecompileError, the packaged one or refuse()'s
        error.ran_before_refusal = True  # type: ignore[attr-defined]


def check_versions() -> None:
    """Refuse a foreign Python or torch before anything is unpickled: the artifact holds
    pickled guard state (torch-build-locked) and code objects (Python-version-locked)."""
    import sys

    import torch

    if tuple(PYTHON_VERSION) != tuple(sys.version_info[:2]):
        refuse(
            f"precompile: this artifact was captured on Python {PYTHON_VERSION[0]}."
            f"{PYTHON_VERSION[1]} and cannot load on {sys.version_info[0]}."
            f"{sys.version_info[1]}: it carries serialized code objects, whose bytecode is "
            f"specific to one Python version. Capture it again under this Python"
        )
    if TORCH_VERSION != str(torch.__version__):
        refuse(
            f"precompile: this artifact was captured with torch {TORCH_VERSION} and cannot "
            f"load on torch {torch.__version__}: it carries pickled Dynamo guard state, "
            f"which only the torch build that wrote it can read. Capture it again with "
            f"this torch"
        )


def check_function_sources() -> None:
    """Refuse to serve a function whose source changed since capture: its guards and
    bytecode describe the old code."""
    for record, gone in changed_functions(FUNCTION_SOURCES, _module_text):
        refuse(
            changed_function_message(record, gone, "its guards and bytecode describe the old code")
        )


def _module_text(name: str, path: str) -> str | None:
    import inspect

    try:
        return inspect.getsource(import_user_module(name))
    except (OSError, TypeError):
        return None


def rebuild_global(kind: str, data: str) -> Any:
    """A helper global Dynamo bound at capture (DYNAMO_GLOBALS), rebuilt here: a module,
    a module's globals dict, a function or class by ``module:qualname``, or a small
    pickled value."""
    import base64
    import operator
    import pickle

    if kind == "module":
        return import_user_module(data)
    if kind == "module_dict":
        return vars(import_user_module(data))
    if kind == "object":
        module_name, qualname = data.split(":", 1)
        try:
            return operator.attrgetter(qualname)(import_user_module(module_name))
        except AttributeError:
            refuse(
                f"precompile: this artifact's compiled code reads {module_name}.{qualname}, "
                f"which this process does not define; capture it again"
            )
    return pickle.loads(base64.b64decode(data))


def check_dict_key_order(records: list[dict[str, Any]], scope: dict[str, Any], frame: Any) -> None:
    """Refuse, naming the dict, when a module-level dict whose key order the trace could
    depend on (``_compat.dict_keys``: it iterated the dict, took its length, ...) holds
    other keys at the positions its guards name than it held at capture: the guards read
    it by position, and could not be rebuilt or would never hold. A dict only looked up by
    key is named by key instead, and is not checked here."""
    for record in records:
        if not record["order"] or not record["dict"].startswith("G["):
            continue
        try:
            value = eval(record["dict"], {"__builtins__": {}, "G": scope})
            keys = list(dict.keys(value))
        except Exception:
            continue  # the guards refuse what is not there
        captured = [(p, k) for p, k in record["keys"]]
        if all(p < len(keys) and keys[p] == k for p, k in captured):
            continue
        refuse(
            f"precompile: module {frame['python_module']}'s dict `{record['shown']}` holds "
            f"the keys {keys!r:.300} in this process, but at capture it held "
            f"{[k for _p, k in captured]!r:.300} at positions {[p for p, _k in captured]}; "
            f"the trace depended on the dict's key order ({record['why']}), so the "
            f"artifact's guards read it by position. Fill it in the order the capture saw "
            f"(build or import what registers its keys in that order) before loading, or "
            f"capture again in a process that fills it as production does"
        )


def _entry_defaults_check(binding: dict[str, Any]) -> Any:
    """``check()``: refuse a call when the live entry's ``__defaults__`` or
    ``__kwdefaults__`` differ from the captured ones, which the rebuilt entry binds (an
    artifact rebuilds fn from the capture: rebinding them afterwards changes what eager
    computes, not what the artifact computes). Compared by value at load, then by
    identity per call (a new tuple is compared by value again)."""
    import operator

    import torch

    live = operator.attrgetter(FN_NAME)(import_user_module(FN_MODULE))

    def same(a: Any, b: Any) -> bool:
        if a is b:
            return True
        if type(a) is not type(b):
            return False
        if isinstance(a, (tuple, list)):
            return len(a) == len(b) and all(map(same, a, b))
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, torch.Tensor):  # another device must refuse, not raise
            if (a.shape, a.dtype, a.device) != (b.shape, b.dtype, b.device):
                return False
            return bool(torch.equal(a, b)) or (
                a.is_floating_point() and bool(torch.allclose(a, b, 0, 0, equal_nan=True))
            )
        if isinstance(a, float) and a != a:
            return b != b  # NaN: the same default, though it equals nothing
        try:
            return bool(a == b)
        except Exception:
            return False

    seen: list[Any] = [None, None]

    def check() -> None:
        defaults, kwdefaults = live.__defaults__, live.__kwdefaults__
        if defaults is seen[0] and kwdefaults is seen[1]:
            return
        for what, now, captured in (
            ("__defaults__", defaults, binding.get("defaults")),
            ("__kwdefaults__", kwdefaults, binding.get("kwdefaults")),
        ):
            if not same(now, captured):
                refuse(
                    f"precompile: {FN_MODULE}.{FN_NAME}.{what} is {now!r:.200} in this "
                    f"process; the capture traced it with {captured!r:.200}, which this "
                    f"artifact binds. Restore the defaults, or capture again with the new "
                    f"ones (re-emit the artifact)"
                )
        seen[0], seen[1] = defaults, kwdefaults

    check()
    return check


def _build_multigraph_forward() -> Any:
    """Rebuild every frame's dispatcher; return the entry, run under the captured
    global state (grad mode as captured, autocast off, default dtype and deterministic
    mode checked)."""
    import base64
    import pickle
    import types
    import warnings

    check_versions()
    check_function_sources()
    # A library function or registry entry replaced before load is refused by its name
    # before the guards are rebuilt: they read what the replacement changed (a
    # registry entry's defaults) and would fail in Dynamo's words.
    _build_surface_check()
    # "plain": guards and code objects carried Dynamo-free (plain_guards), so serving
    # never imports torch._dynamo; "dynamo": Dynamo's guard manager, for guards outside
    # plain_guards' whitelist (GUARD_RUNTIME says which, and why).
    dynamo_free = GUARD_RUNTIME.get("path") == "plain"
    rt = plain_serving_runtime() if dynamo_free else dynamo_serving_runtime()
    frames = pickle.loads(base64.b64decode(_FRAMES))
    binding = pickle.loads(base64.b64decode(_ENTRY_BINDING))
    compiled = {backend_id: rt.disable(fn) for backend_id, fn in _BACKEND_FNS.items()}
    seeded: list[tuple[dict[str, Any], str, Any]] = []
    warned: set[str] = set()

    def seed(scope: dict[str, Any], name: str, value: Any) -> None:
        disown_cleanup_hooks(scope, name)
        scope[name] = value
        seeded.append((scope, name, value))

    scopes: dict[str, dict[str, Any]] = {}

    def scope_of(frame: dict[str, Any]) -> dict[str, Any]:
        name = frame["python_module"]
        scope = scopes.get(name)
        if scope is None:
            scope = scopes[name] = vars(import_user_module(name))
            for backend_id, fn in compiled.items():
                seed(scope, backend_id, fn)
            for module_name, helper, kind, data in DYNAMO_GLOBALS:
                if module_name == name:
                    seed(scope, helper, rebuild_global(kind, data))
        stand_ins = getattr(rt, "stand_ins", {})
        for alias, module_name in frame["import_sources"].items():
            seed(scope, alias, stand_ins.get(module_name) or import_user_module(module_name))
        return scope

    def make_dispatcher(frame: dict[str, Any]) -> Any:
        target = rt.to_code(frame["code"])
        if frame["trivial"] and frame["resume_names"]:
            # Dynamo compiled nothing of this continuation: it ran as plain Python.
            scope = scope_of(frame)

            def plain(closure: Any) -> Any:
                return types.FunctionType(target, scope, target.co_name, None, closure)

            return plain if target.co_freevars else plain(None)
        if not frame["variants"] and not frame["eager_fallback"]:
            cause = (
                "was bypassed during capture (its guards could not be serialized)"
                if frame["bypassed"]
                else "produced no guarded code during capture"
            )
            message = (
                f"precompile: {frame_label(target.co_name)} {cause}, so this artifact has no "
                f"variant of it to serve; fix what the capture report says and capture again"
            )
            if frame["is_entry"]:
                refuse(message)

            def refusing(*_args: Any, **_kwargs: Any) -> Any:
                refuse(message)

            return refusing
        scope = scope_of(frame)
        is_entry = frame["is_entry"]
        defaults = binding.get("defaults") if is_entry else None
        kwdefaults = binding.get("kwdefaults") if is_entry else None

        def function(code: Any, closure: Any) -> Any:
            f = types.FunctionType(code, scope, target.co_name, defaults, closure)
            if kwdefaults:
                f.__kwdefaults__ = dict(kwdefaults)
            return f

        variants = []
        for number, variant in enumerate(frame["variants"]):
            if dynamo_free:
                key = variant["builtins_key"]
            else:
                guards_state = rt.load_guards_state(variant["guards_state"])
                key = guards_state.output_graph.name_of_builtins_dict_key_in_fglobals
            if key:
                builtins = rt.builtins_dict(scope)
                if scope.get(key, builtins) is not builtins:
                    refuse(
                        f"precompile: {key!r} in module {frame['python_module']!r} is bound to "
                        f"something other than the module's builtins, which this artifact's "
                        f"guards read through; unbind it and load again"
                    )
                seed(scope, key, builtins)
            check_dict_key_order(variant.get("dict_keys") or [], scope, frame)
            try:
                if dynamo_free:
                    manager = rt.guard_manager(variant["guards"], scope)
                else:
                    guards_state = rt.name_dict_keys(guards_state, variant.get("dict_keys") or [])
                    manager = rt.load_guard_manager(
                        guards_state, target, scope, variant.get("captured_values") or {}
                    )
            except Exception as error:
                # Building a guard manager reads the live objects its guards name (a
                # dict's keys by position, an attribute of a global): state a process may
                # not have yet.
                refuse(
                    f"precompile: the guards of {target.co_name} (variant {number}) could not "
                    f"be rebuilt in this process: {type(error).__name__}: {error}. They read "
                    f"state reachable from module {frame['python_module']!r} as it was at "
                    f"capture; do what fills that state first (e.g. build the model, import "
                    f"what registers its classes), then load"
                )
            variants.append((manager, rt.to_code(variant["dynamo_code"])))

        cells = tuple(types.CellType() for _ in target.co_freevars)
        import inspect

        signature = inspect.signature(function(target, cells or None))

        positional = target.co_varnames[: target.co_argcount]
        # A call that passes exactly the positional parameters (every continuation, most
        # entries) binds without inspect: 0x04/0x08 are CO_VARARGS/CO_VARKEYWORDS.
        plain_signature = not (target.co_flags & 0x0C or target.co_kwonlyargcount)

        def locals_of(closure: Any, args: Any, kwargs: Any) -> dict[str, Any]:
            if plain_signature and not kwargs and not closure and len(args) == len(positional):
                return dict(zip(positional, args))
            f_locals: dict[str, Any] = {}
            for name, cell in zip(target.co_freevars, closure or ()):
                try:
                    f_locals[name] = cell.cell_contents
                except ValueError:
                    pass
            f_locals.update(rt.bind_locals(signature, *args, **kwargs))
            for name in positional:
                if name.startswith("."):
                    f_locals[name] = f_locals.pop("implicit" + name[1:])
            return f_locals

        managers = [manager for manager, _body in variants]
        choose = variant_chooser(managers)
        layout_notes = [list(v.get("layout_notes", ())) for v in frame["variants"]]

        def dispatch_with(bound: list[Any], closure: Any, args: Any, kwargs: Any) -> Any:
            f_locals = locals_of(closure, args, kwargs)
            chosen = choose(f_locals)
            if chosen is None:
                # A tensor still carrying mark_unbacked / mark_dynamic marks (the
                # capture's example passed again) fails the rebuilt guards' marking
                # check, which says nothing about what the variant computes: check it
                # again unmarked (only on a miss, so a served call pays nothing).
                stripped = strip_dim_marks(f_locals.values())
                if stripped:
                    try:
                        chosen = serving_variant(managers, f_locals)
                    finally:
                        restore_dim_marks(stripped)
            if chosen is not None:
                try:
                    return bound[chosen](*args, **kwargs)
                except RuntimeError as error:
                    _mark_ran_before_refusal(error)
                    raise
            if frame["eager_fallback"]:
                if target.co_name not in warned:
                    warned.add(target.co_name)
                    category: type[Warning]
                    try:
                        from precompile.errors import EagerFallbackWarning

                        category = EagerFallbackWarning
                    except ImportError:
                        category = UserWarning
                    warnings.warn(
                        f"precompile: {frame_label(target.co_name)} runs eagerly: Dynamo gave up on "
                        f"it during capture ({frame.get('eager_reason') or 'see the capture report'})",
                        category,
                        stacklevel=3,
                    )
                try:
                    return function(target, closure)(*args, **kwargs)
                except RuntimeError as error:
                    _mark_ran_before_refusal(error)
                    raise
            texts = [readable_guard_failure(m, f_locals) for m in managers]
            failures = "; ".join(
                f"variant {i}: {text}{layout_note(text, notes)}"
                for i, (text, notes) in enumerate(zip(texts, layout_notes))
            )
            refuse(
                f"precompile: no captured variant of {frame_label(target.co_name)} serves this call "
                f"({len(bound)} captured: {failures}). The artifact serves only what capture "
                f"exercised: add a call like this one to the capture, or restore the global "
                f"the failing guard reads",
                3,
            )

        def bind(closure: Any) -> list[Any]:
            return [function(body, closure) for _manager, body in variants]

        def coverage(args: Any, kwargs: Any) -> dict[str, Any]:
            f_locals = locals_of(None, args, kwargs)
            stripped = strip_dim_marks(f_locals.values())  # as dispatch_with retries
            try:
                return variant_coverage(managers, f_locals)
            finally:
                restore_dim_marks(stripped)

        if target.co_freevars:

            def factory(closure: Any) -> Any:
                bound = bind(closure)

                def dispatch(*args: Any, **kwargs: Any) -> Any:
                    return dispatch_with(bound, closure, args, kwargs)

                return dispatch

            return factory
        bound = bind(None)
        only = getattr(choose, "only", None)
        if only is not None and plain_signature:
            # One variant, called with exactly its positional parameters and no dispatch
            # mode (almost every call): what dispatch_with, locals_of and choose would do
            # for it, in this one frame; any other call (and a miss) goes through them.
            first, count = bound[0], len(positional)

            def dispatch(*args: Any, **kwargs: Any) -> Any:
                if (
                    not kwargs
                    and len(args) == count
                    and not dispatch_mode_depth()
                    and only(dict(zip(positional, args)))
                ):
                    try:
                        return first(*args)
                    except RuntimeError as error:
                        _mark_ran_before_refusal(error)
                        raise
                return dispatch_with(bound, None, args, kwargs)

        else:

            def dispatch(*args: Any, **kwargs: Any) -> Any:
                return dispatch_with(bound, None, args, kwargs)

        dispatch.coverage = coverage  # type: ignore[attr-defined]  # covers() reads it off the entry
        return dispatch

    # Every resume name is checked before anything is seeded, so a refusal leaves each
    # module as it was: a name is rebound only over this artifact's own dispatcher.
    for frame in frames:
        if not (frame["variants"] or frame["eager_fallback"] or frame["trivial"]):
            continue
        module = vars(import_user_module(frame["python_module"]))
        for name in frame["resume_names"]:
            existing = module.get(name)
            owner = getattr(existing, "__precompile_artifact__", None)
            if existing is not None and owner != ARTIFACT_TAG:
                refuse(
                    f"precompile: {name!r} in module {frame['python_module']!r} is held by "
                    + (
                        f"another artifact ({owner}); two artifacts of one function cannot "
                        f"serve in one process"
                        if owner
                        else "something else in this process; load the artifact in a fresh process"
                    )
                )
    entry = None
    for frame in frames:
        dispatcher = make_dispatcher(frame)
        if frame["is_entry"]:
            entry = dispatcher
        else:
            dispatcher.__precompile_artifact__ = ARTIFACT_TAG
        scope = scopes.get(frame["python_module"])
        if scope is not None:
            for name in frame["resume_names"]:
                seed(scope, name, dispatcher)
    if entry is None:
        refuse("precompile: this artifact has no entry frame; capture it again")

    def unload() -> None:
        while seeded:
            scope, name, value = seeded.pop()
            if scope.get(name) is value:
                del scope[name]

    try:
        # The entry's defaults are checked first on every call, in the dependency
        # check's one frame.
        check = build_dependency_check(_entry_defaults_check(binding))
    except BaseException:
        unload()  # a refused load leaves the process as it found it
        raise

    forward = serve_as_captured(entry, check)

    def covers(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return entry.coverage(args, kwargs)

    forward.covers = covers
    forward.unload = unload
    return forward
