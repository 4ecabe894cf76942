"""The runtime driver of single-graph artifacts, authored as real code, emitted as text.

An artifact does not import this module: the emitter copies it whole
(``emit.runtime_source``) into every single-graph artifact, after the metadata literals,
the import prelude and the captured graph, so an artifact runs where this package is not
installed and is frozen against later changes to it (its text is hashed into
``code_hash``). Everything defined here is runtime; the capture side calls a few of the
same functions. Writing it as a module rather than a string lets ruff and type
checkers read it.

The names the bodies read from the artifact's namespace -- the metadata constants, the
prelude's torch aliases and the graph's ``call`` -- are declared under TYPE_CHECKING.

``_build_single_graph_forward`` composes the checks of a call from sub-builders, each
computing once at load what its check needs and returning the closure the forward
calls: ``_build_ambient_checks`` here (modes, process state, grad and inference mode,
autocast, default dtype), ``single_graph_inputs.build_input_check`` (the arguments)
and ``single_graph_model_state.build_model_state_check`` (the model and the Python
state the trace read), both emitted before this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import torch as _torch

    # Bound by the artifact prelude (precompile._compat.prelude; only _compat names private
    # torch): ARTIFACT_PRELUDE and INDUCTOR_PRELUDE.
    _pytree: Any = None
    _DisableAutocast: Any = None
    _any_autocast_enabled: Callable[[], bool] = bool
    _set_grad_enabled: Callable[[bool], None] = print
    _dict_version: Callable[[dict[str, Any]], int] = len
    _TensorGuards: Any = None
    dispatch_tls_local_exclude_set: Any = None
    function_mode_depth: Callable[[], int] = int
    dispatch_mode_depth: Callable[[], int] = int

    AMBIENT_MODES: list[str] = []
    MODES_SEE_OPS: bool = False
    BACKEND: str = ""
    FN_NAME: str = ""
    PARAM_NAMES: list[str] = []
    GRAD_PARAM_INDICES: list[int] = []
    OUT_SPEC: str = ""
    USER_INPUT_SHAPES: list[tuple[int | None, ...] | None] = []

    TRAINING: bool = False
    OUTPUT_DETACH: list[int] = []
    INPUT_MUTATIONS: dict[str, Any] | None = None
    AUTOGRAD: dict[str, Any] | None = None
    DEFAULT_DTYPE: str = ""
    AUTOCAST: list[tuple[str, str]] = []
    STATE_READS: dict[str, str] = {}
    PROCESS_STATE: list[list[Any]] = []

    def autocast_state() -> tuple[tuple[str, str], ...]: ...

    def ambient_modes() -> tuple[str, ...]: ...

    def _opaque_to_dynamo(fn: Callable[..., Any]) -> Callable[..., Any]: ...

    def autocast_keys() -> dict[str, Any] | None: ...

    def state_getter(module: str, path: str, call: bool) -> Any: ...

    # precompile.runtime.surface_checks, emitted before this module.
    def _build_surface_check() -> Any: ...

    # The graph's entry: FX code names its parameter flat_inputs, Inductor's args.
    def call(flat_inputs: list[Any], /) -> list[Any]: ...

    # precompile.runtime.lowered_inputs, emitted where the graph writes an input (Inductor).
    def check_written_inputs(inputs: Any, mutated: Any, labels: Any) -> None: ...

    def call_backward(flat_inputs: list[Any]) -> list[Any]: ...

    # single_graph_checks, emitted before this module.
    def check_function_sources_once() -> None: ...

    def global_scopes() -> list[tuple[dict[str, Any], dict[str, Any]]]: ...

    def known_identities() -> dict[str, Any]: ...

    def serving_context(identities: dict[str, Any]) -> dict[str, Any]: ...

    def live_entry(identities: dict[str, Any]) -> Any: ...

    def check_globals(scopes: list[Any], context: dict[str, Any]) -> None: ...

    def check_process_state(values: list[Any]) -> None: ...

    def _relabel_layout_error(error: AssertionError, flat: list[Any]) -> str | None: ...

    def bind_autograd(
        name: str, spec: dict[str, Any], forward_call: Any, backward_call: Any
    ) -> Callable[..., list[Any]]: ...

    # The sub-builders of the call's checks, emitted before this module.
    def build_input_check() -> (
        Callable[[tuple[Any, ...], dict[str, Any], bool], tuple[tuple[Any, ...], tuple[Any, ...]]]
    ): ...

    def build_model_state_check(
        scopes: list[tuple[dict[str, Any], dict[str, Any]]], identities: dict[str, Any], entry: Any
    ) -> tuple[Callable[[tuple[Any, ...]], list[Any]], Callable[[list[Any]], None] | None]: ...

    # precompile.runtime.refusal, emitted before this module.
    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...


def check_ambient_modes(
    captured: tuple[str, ...], modes_see_ops: bool = False, kernels: str = ""
) -> None:
    """Refuse a call made under other torch modes than the capture ran under
    (``AMBIENT_MODES``; ``state_checks.ambient_modes``), except dispatch modes around an
    artifact whose graphs run eager's own ATen operations (``MODES_SEE_OPS``).
    ``kernels`` says what the artifact runs instead, where a dispatch mode is refused
    (``dispatch_refusal_reason``).

    The rule: a mode is served where it sees, during the served call, exactly what it
    sees in eager. A ``TorchDispatchMode`` sees each ATen operation dispatched under it;
    an eager-backend graph (no decompositions, no compiled forward/backward pair) is
    those very operations, dispatched in eager's order, so the mode sees and changes
    them as it would in eager: ``FlopCounterMode`` counts the same FLOPs, a mode that
    doubles ``aten.relu`` doubles the graph's. A ``TorchFunctionMode`` sees Python-level
    torch calls, which a graph does not make as eager made them, and Inductor's kernels
    dispatch nothing: both are refused, naming the mode. Both drivers call this only
    when a mode is active or was at capture (two C calls per call otherwise), before any
    other check, so the refusal names the mode."""
    live = ambient_modes()
    if modes_see_ops:
        live = tuple(m for m in live if not m.endswith("(a TorchDispatchMode)"))
    if live == captured:
        return

    def shown(modes: tuple[str, ...]) -> str:
        return "under " + ", ".join(modes) if modes else "under no torch mode"

    if any(m.endswith("(a TorchFunctionMode)") for m in live):
        why = (
            "A TorchFunctionMode sees the Python-level torch calls eager makes and may "
            "change their results; the artifact does not make those calls (its graph "
            "holds what they computed at capture), so it cannot answer as eager would"
        )
    elif any(m.endswith("(a TorchDispatchMode)") for m in live):
        why = (
            "A TorchDispatchMode sees every ATen operation eager runs and may change its "
            "result; this artifact's operations are "
            + (
                kernels
                or "compiled kernels (Inductor, decompositions, or a compiled "
                "forward/backward pair) that the mode would not see, or frames of an "
                "installed artifact, which Dynamo enters checking its guards under the "
                "mode's dispatch state, not the capture's"
            )
            + ", so it cannot answer as eager would (a standalone artifact of the eager "
            "backend runs its graph under the mode, which sees what it sees in eager)"
        )
    else:
        why = (
            "A mode sees every torch call eager makes under it and may change its "
            "result; the artifact runs the operations captured without it, so it "
            "cannot answer as eager would"
        )
    refuse(
        f"precompile: this call runs {shown(live)}, and the capture ran {shown(captured)}. "
        f"{why}. Call the artifact outside the mode, or run fn eagerly under it",
        6,
    )


def dispatch_refusal_reason() -> str:
    """What this artifact runs instead of eager's ATen operations, for the refusal of a
    dispatch mode (empty where ``MODES_SEE_OPS``): the mode sees a different count
    and order of operations -- none at all for Inductor's kernels."""
    if MODES_SEE_OPS:
        return ""
    if BACKEND == "inductor":
        return (
            "compiled kernels (Inductor's), which dispatch no ATen operation: the mode "
            "would see none of this call's operations (FlopCounterMode would count 0 "
            "FLOPs where eager counts them)"
        )
    if AUTOGRAD is not None:
        return (
            "a forward/backward pair compiled by AOTAutograd (from its joint graph), "
            "whose backward is not the sequence of operations eager's autograd engine "
            "dispatches: even a mode that only watches (FlopCounterMode) would see "
            "other operations than in eager"
        )
    return (
        "a graph of decomposed operations (the tracer's decompositions), other "
        "ATen operations than eager dispatches: even a mode that only watches "
        "(FlopCounterMode) would see other operations than in eager"
    )


def warn_inference_grad(what: str, more_fixes: str = "") -> None:
    """Say, as an InferenceGradWarning, that an inference artifact's outputs carry no
    gradient though this call runs with grad mode on and ``what`` requires grad. A
    warning, not a refusal: serving code often calls with grad on and needs no
    gradient. Emitted whole into every artifact; the category is imported at the moment
    of warning only, and is a plain UserWarning where the package is not installed."""
    import warnings

    category: type[Warning]
    try:
        from precompile.errors import InferenceGradWarning

        category = InferenceGradWarning
    except ImportError:
        category = UserWarning
    warnings.warn(
        f"precompile: this artifact was captured for inference (training=False), so it "
        f"runs without autograd and its outputs carry no gradient; this call runs with "
        f"grad mode on and {what} requires grad, so eager's outputs would carry one (a "
        f"backward through them would leave these gradients out). Call it under "
        f"torch.no_grad() or torch.inference_mode() if you need no gradient; to train "
        f"through it, capture with training=True and run the backward inside fn"
        f"{more_fixes}. Warned once per artifact",
        category,
        stacklevel=4,  # the user's call of the loaded runnable
    )


def requires_grad_is_captured() -> bool:
    """Whether the tensors' ``requires_grad`` flags are part of what the graph computes:
    a training capture (its backward computes the gradients of what required grad), an
    inference capture that carries the backward of inputs that required grad
    (``AUTOGRAD``), or fn reading ``.requires_grad`` of an input or parameter. Otherwise
    the graph runs with grad off, where no flag changes a value: a parameter frozen (or
    unfrozen) since capture, an ``nn.Parameter`` or a tensor that requires grad passed
    as an input, is served (docs/serving.md, "Grad mode and inference mode")."""
    return bool(TRAINING or AUTOGRAD is not None or "requires_grad" in STATE_READS)


def checks_layout() -> bool:
    """Whether the graph depends on its inputs' strides: Inductor bakes them, and a
    trace whose user code read a layout (``x.is_contiguous()``) took the branch of the
    capture's layout."""
    return BACKEND == "inductor" or "layout" in STATE_READS


def metadata_guard(values: list[Any]) -> Any:
    """One C-level guard over ``values`` (the model's tensors, or a call's).

    Checks shape, strides, dtype, device and requires_grad in one C call. It also
    compares dispatch keys under the ambient state (inference mode, autocast) and
    strides, which the eager contract does not fix: a miss falls back to comparing the
    metadata (with strides for Inductor) in Python, and rebuilds the guard when that
    comparison passes."""
    return _TensorGuards(*values, dynamic_dims_sizes=None, dynamic_dims_strides=None)


def _autocast_mismatch(live: tuple[tuple[str, str], ...]) -> NoReturn:
    """Raise for a call whose ambient ``torch.autocast`` differs from the capture's."""

    def shown(state: Any) -> str:
        if not state:
            return "without torch.autocast"
        return "under torch.autocast(" + ", ".join(f"{d}: {t}" for d, t in state) + ")"

    captured = tuple(map(tuple, AUTOCAST))
    refuse(
        f"precompile: this call runs {shown(live)} but the artifact was captured "
        f"{shown(captured)}; the graph holds the casts autocast made at capture, so eager "
        f"would compute in other dtypes here. Call it {shown(captured)}, or capture again "
        f"under the autocast state you serve with",
        6,
    )


def load_spec(text: str) -> Any:
    """A pytree spec from its JSON, importing the modules that register its container
    types (a model's output class, say) when this process has not imported them yet."""
    import importlib
    import json

    try:
        return _pytree.treespec_loads(text)
    except Exception as error:
        first = error
    names: list[str] = []
    stack = [json.loads(text)[1]]
    while stack:
        node = stack.pop()
        if node.get("type"):
            names.append(node["type"])
        stack.extend(node.get("children_spec") or [])
    for name in names:
        parts = name.split(".")
        for end in range(len(parts) - 1, 0, -1):
            try:
                importlib.import_module(".".join(parts[:end]))
                break
            except ImportError:
                continue
    try:
        return _pytree.treespec_loads(text)
    except Exception:
        refuse(
            f"precompile: the artifact's inputs or outputs use container types "
            f"({', '.join(names)}) that are not registered with torch.utils._pytree in "
            f"this process ({type(first).__name__}: {first}). Import the module that "
            f"registers them before loading",
            3,
        )


def _build_ambient_checks() -> tuple[Callable[[], None], Callable[[], None]]:
    """Compute once what a call must run under besides its arguments, and return
    ``check_modes()`` (the torch modes: first of every check, so that the refusal names
    the mode) and ``check_state()`` (the torch settings fn read, grad and inference mode
    where fn read them, autocast, the default dtype: after the model's check)."""
    # The torch modes of the capture (almost always none): a call under others is
    # refused naming them, before any other check.
    captured_modes = tuple(AMBIENT_MODES)

    kernels = dispatch_refusal_reason()

    def check_modes() -> None:
        if function_mode_depth() or dispatch_mode_depth() or captured_modes:
            check_ambient_modes(captured_modes, MODES_SEE_OPS, kernels)

    # fn branched on torch.is_grad_enabled(): the trace saw grad mode on for a training
    # capture and for an inference capture of inputs that require grad (AUTOGRAD).
    grad_mode_read = STATE_READS.get("grad_mode")
    traced_grad_mode = TRAINING or AUTOGRAD is not None
    is_grad_enabled = _torch.is_grad_enabled
    # fn branched on torch.is_inference_mode_enabled(): the trace ran outside it (a
    # capture under inference mode that reads it is refused).
    inference_mode_read = STATE_READS.get("inference_mode")
    is_inference_mode_enabled = _torch.is_inference_mode_enabled
    # fn read torch settings (deterministic algorithms, a torch.backends flag): each is
    # read again per call and compared with the last values that verified.
    state_getters = tuple(state_getter(m, p, c) for m, p, c, _, _ in PROCESS_STATE)
    state_seen: list[Any] = [None]
    # A tensor fn built from Python numbers took the default dtype at capture; the
    # graph carries that dtype where eager would take today's.
    default_dtype = getattr(_torch, DEFAULT_DTYPE.split(".")[-1])
    get_default_dtype = _torch.get_default_dtype
    # The graph holds the casts of the capture's autocast state: a call under another
    # one (autocast entered or left since) would get other dtypes from eager.
    captured_autocast = tuple(map(tuple, AUTOCAST))
    # Captured under autocast: each call compares the autocast keys of torch's
    # thread-local excluded set (every device's on/off in one C call) and the captured
    # devices' dtypes; only a difference reads the full state, for the exact answer.
    keys = autocast_keys() if captured_autocast else None
    autocast_mask: Any = None
    autocast_expected: Any = None
    if keys and all(device in keys for device, _ in captured_autocast):
        all_keys = list(keys.values())
        autocast_mask = all_keys[0]
        for key in all_keys[1:]:
            autocast_mask = autocast_mask | key
        # Excluded: every device's key but those of the devices captured under it.
        autocast_expected = autocast_mask
        for device, _ in captured_autocast:
            autocast_expected = autocast_expected - keys[device]
    autocast_excluded = dispatch_tls_local_exclude_set
    get_autocast_dtype = _torch.get_autocast_dtype
    autocast_devices = tuple(device for device, _ in captured_autocast)
    autocast_dtypes = tuple(getattr(_torch, dtype.split(".")[-1]) for _, dtype in captured_autocast)

    def check_state() -> None:
        if state_getters:
            values = [get() for get in state_getters]
            if values != state_seen[0]:
                check_process_state(values)
                state_seen[0] = values
        if grad_mode_read is not None and is_grad_enabled() != traced_grad_mode:
            mode = "on" if traced_grad_mode else "off"
            kind = "a training" if TRAINING else "an inference"
            if AUTOGRAD is not None:
                kind = "an inference capture of inputs that require grad; such"
            refuse(
                f"precompile: fn reads the grad mode ({grad_mode_read}), which was {mode} "
                f"in the trace ({kind} capture traces with grad "
                f"{'enabled' if traced_grad_mode else 'disabled'}), but this "
                f"call runs with grad mode {'off' if traced_grad_mode else 'on'}: eager "
                f"would take the other branch. Call it under "
                f"{'torch.enable_grad()' if traced_grad_mode else 'torch.no_grad()'}, or "
                f"pass the choice to fn as an argument instead of reading the grad mode",
                5,
            )
        if inference_mode_read is not None and is_inference_mode_enabled():
            refuse(
                f"precompile: fn reads the inference mode ({inference_mode_read}), which "
                f"was off in the trace, but this call runs under torch.inference_mode(): "
                f"eager would take the other branch. Call it outside "
                f"torch.inference_mode(), or pass the choice to fn as an argument instead "
                f"of reading torch.is_inference_mode_enabled()",
                5,
            )
        if (
            (_any_autocast_enabled() or captured_autocast)
            and not (
                autocast_mask is not None
                and autocast_excluded() & autocast_mask == autocast_expected
                and tuple(map(get_autocast_dtype, autocast_devices)) == autocast_dtypes
            )
            and autocast_state() != captured_autocast
        ):
            _autocast_mismatch(autocast_state())
        if get_default_dtype() is not default_dtype:
            refuse(
                f"precompile: the default dtype is {get_default_dtype()} but this artifact "
                f"was captured under {default_dtype}, which tensors fn builds from Python "
                f"numbers took. Restore it (torch.set_default_dtype) around the call, or "
                f"capture again",
                6,
            )

    return check_modes, check_state


def _build_single_graph_forward() -> Any:
    """Compute once what every call needs, and return the lean per-call ``forward``.

    Loading checks the code the trace ran through (``check_function_sources_once``)
    and finds the live modules whose globals it read. Each call is then checked in
    full, but through fast paths, by the checks the sub-builders return, always in this
    order: the ambient modes (``_build_ambient_checks``), the library surface and the
    builtins, the arguments (``single_graph_inputs.build_input_check``: one tuple of the
    inputs' metadata against the captured one), the model and the Python state the
    trace read (``single_graph_model_state.build_model_state_check``: identities,
    version tags and one C-level guard against the last verified call), then the rest
    of the ambient state (process state, grad and inference mode, autocast, default
    dtype) and the parameters' ``.grad``. Only a difference takes a slow path, which
    names the exact mismatch or re-verifies and refreshes the snapshot.
    """
    # First: a library function replaced before load (at import) is named as such, not
    # as whatever later check its replacement happens to trip.
    surface_ok = _build_surface_check()
    check_function_sources_once()
    scopes = global_scopes()
    # The builtins the traced code (the project's and the library code it ran) resolved,
    # checked before anything else whenever the builtins dict changed.
    builtins_scopes = [
        (scope, record) for scope, record in scopes if record["module"] == "builtins"
    ]
    builtins_seen: list[Any] = [None]
    identities = known_identities()
    entry = live_entry(identities)
    check_modes, check_ambient = _build_ambient_checks()
    checked_call = build_input_check()
    model_tensors, check_grads = build_model_state_check(scopes, identities, entry)
    out_spec = load_spec(OUT_SPEC)
    single_output = out_spec == _pytree.tree_structure(0)
    tensor_slots = tuple(i for i, s in enumerate(USER_INPUT_SHAPES) if s is not None)
    grad_indices = tuple(GRAD_PARAM_INDICES)
    n_grads = len(grad_indices)
    output_detach = tuple(OUTPUT_DETACH)
    # An inference capture of inputs that require grad: under grad mode the call goes
    # through the captured forward and backward graphs (an autograd.Function), as eager
    # would record it; under no_grad through the forward graph alone, whose results past
    # the outputs (what the backward would need) are dropped.
    autograd_run = (
        bind_autograd(
            FN_NAME,
            AUTOGRAD,
            lambda *flat: call(list(flat)),
            lambda *flat: call_backward(list(flat)),
        )
        if AUTOGRAD is not None
        else None
    )
    n_outputs = AUTOGRAD["outputs"] if AUTOGRAD is not None else None
    # Inductor's functional graph writes these inputs assuming no other input shares
    # their memory: a call where one does (x and x[:]) is refused, not served wrong.
    mutated_inputs = tuple(INPUT_MUTATIONS["mutated"]) if INPUT_MUTATIONS else ()
    mutation_labels = INPUT_MUTATIONS["labels"] if INPUT_MUTATIONS else ()

    def checked_inputs(
        args: tuple[Any, ...], kwargs: dict[str, Any], running: bool = True
    ) -> tuple[list[Any], list[Any], tuple[Any, ...]]:
        """Every check of a call; the graph's flat inputs, the model's tensors and the
        user's tensors (an input in another layout copied for Inductor only when
        ``running`` the graph)."""
        check_modes()
        if surface_ok is not None:
            surface_ok()
        if builtins_scopes and _dict_version(builtins_scopes[0][0]) != builtins_seen[0]:
            # First: the checks below call builtins themselves (``len(args)``), and a
            # patched one would make them refuse for the wrong reason.
            check_globals(builtins_scopes, serving_context(identities))
            builtins_seen[0] = _dict_version(builtins_scopes[0][0])
        mods, tensors_in = checked_call(args, kwargs, running)
        state = model_tensors(mods)
        check_ambient()
        if check_grads is not None:
            check_grads(state)
        flat = [*state, *tensors_in]
        if mutated_inputs:
            check_written_inputs(flat, mutated_inputs, mutation_labels)
        return flat, state, tensors_in

    def covers(*args: Any, **kwargs: Any) -> dict[str, Any]:
        """Whether this artifact serves the call, decided by the very checks a call runs
        (no graph runs): served by its one graph, or the refusal."""
        try:
            checked_inputs(args, kwargs, running=False)
        except Exception as error:
            if type(error).__name__ != "PrecompileError":
                raise
            return {"served_by": None, "failures": [{"variant": 0, "guard": str(error)}]}
        return {"served_by": 0, "failures": []}

    def _apply_flat(flat: list[Any]) -> Any:
        return autograd_run(*flat)  # type: ignore[misc]  # set whenever this runs

    # An inference artifact runs without autograd: under grad mode, with a parameter or
    # an input that requires grad, eager's outputs would carry a gradient and these
    # carry none. Said once per artifact, at the first such call; until then a grad-on
    # call looks at the inputs, and at the parameters once per verified model state
    # (a requires_grad_ since takes the slow path, which lifts them anew).
    grad_loss_unwarned = [not TRAINING and autograd_run is None]
    grad_looked_at: list[Any] = [None]

    def _check_mode_sees_backward(tensors: list[Any]) -> None:
        """A training graph holds the backward as eager's autograd engine dispatched it
        onto parameters whose ``.grad`` was None (each gradient detached into place).
        A dispatch mode around a call onto parameters that already hold a gradient
        would see other operations than in eager (eager adds each into ``.grad`` in
        place as its node runs; the artifact adds them after the graph): refused."""
        held = [PARAM_NAMES[i] for i in grad_indices if tensors[i].grad is not None]
        if held:
            refuse(
                f"precompile: this call runs under a TorchDispatchMode onto parameters that "
                f"already hold a gradient ({held[0]!r}"
                + (f" and {len(held) - 1} more" if len(held) > 1 else "")
                + "): eager's backward adds each gradient into .grad in place as it runs, "
                "where the captured graph (traced with .grad None) detaches it, so the mode "
                "would not see the operations it sees in eager. Set the gradients to None "
                "first (optimizer.zero_grad(), the default set_to_none=True), or call the "
                "artifact outside the mode",
                6,
            )

    def _requiring_grad(tensors_in: Any, tensors: list[Any]) -> str:
        for i, t in enumerate(tensors_in):
            if t.requires_grad:
                return f"input {tensor_slots[i]}"
        if tensors is grad_looked_at[0]:
            return ""
        grad_looked_at[0] = tensors
        names = [n for n, t in zip(PARAM_NAMES, tensors) if t.requires_grad]
        return (
            f"parameter {names[0]!r}" + (f" (and {len(names) - 1} more)" if len(names) > 1 else "")
            if names
            else ""
        )

    def forward(*args: Any, **kwargs: Any) -> Any:
        flat, state, tensors_in = checked_inputs(args, kwargs)
        if n_grads and MODES_SEE_OPS and dispatch_mode_depth():
            _check_mode_sees_backward(state)
        grad_was_enabled = _torch.is_grad_enabled()
        through_autograd = grad_was_enabled and autograd_run is not None
        run = _apply_flat if through_autograd else call
        if grad_was_enabled and not through_autograd:
            if grad_loss_unwarned[0]:
                what = _requiring_grad(tensors_in, state)
                if what:
                    grad_loss_unwarned[0] = False
                    warn_inference_grad(
                        what,
                        "; or capture with an example input that requires grad (the "
                        "artifact then carries the backward)",
                    )
            _set_grad_enabled(False)
        try:
            if _any_autocast_enabled():
                # The capture's casts are already in the graph; ambient autocast
                # must not cast a second time.
                with _DisableAutocast():
                    out = run(flat)
            else:
                out = run(flat)
            if n_outputs is not None and not through_autograd:
                out = out[:n_outputs]
            if output_detach and not through_autograd:
                # The graph computes a new tensor there (x.detach(), say) that Inductor
                # returns as the input object itself: hand back a new one, as eager does.
                out = list(out)
                for i in output_detach:
                    out[i] = out[i].detach()
        except RuntimeError as error:
            if BACKEND != "eager" or "view size is not compatible" not in str(error):
                raise
            # A view the eager graph keeps because its aliasing is observable (an
            # output views an input, or a write goes through it: graph_layouts) cannot
            # view this call's layout.
            refuse(
                f"precompile: this call passes an input in a memory layout that a view in "
                f"the captured graph cannot take ({error}); the view is kept because an "
                f"output or an in-place write goes through it, so the graph cannot copy "
                f"there instead. Pass the input in the captured layout (.contiguous(), or "
                f"the memory format it had at capture), or return a .clone() of the view",
                6,
            )
        except AssertionError as error:
            # call() consumed its list: rebuild the inputs for the message.
            message = _relabel_layout_error(error, [*state, *tensors_in])
            if message is None:
                raise
            refuse(message, 6)
            raise
        finally:
            if grad_was_enabled and not through_autograd:
                _set_grad_enabled(True)
        if n_grads:
            # Accumulate like eager .backward(): frozen parameters keep .grad None.
            for idx, g in zip(grad_indices, out[len(out) - n_grads :]):
                p = state[idx]
                if p.grad is None:
                    p.grad = g
                else:
                    p.grad.add_(g)
            out = out[: len(out) - n_grads]
        if single_output:
            return out[0]
        return _pytree.tree_unflatten(list(out), out_spec)

    forward.covers = covers  # type: ignore[attr-defined]  # loaders call forward.covers()
    return _opaque_to_dynamo(forward)


def relabel_layout_error_eager(error: AssertionError, flat: list[Any]) -> str | None:
    """The eager backend has no layout asserts of its own: every AssertionError is the
    user's and passes through unchanged."""
    return None


def _memory_format(t: Any) -> str:
    if t.is_contiguous():
        return "contiguous"
    for name in ("channels_last", "channels_last_3d"):
        fmt = getattr(_torch, name)
        if t.dim() == (4 if name == "channels_last" else 5) and t.is_contiguous(memory_format=fmt):
            return name
    return "non-contiguous"
