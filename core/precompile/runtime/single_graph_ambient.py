"""What a single-graph call must run under besides its arguments, authored as real code
and emitted whole into make_fx's artifacts, after the input and model-state sub-builders
and before ``single_graph`` (``capturing.carried.SingleGraph.DRIVER``).

``build_ambient_checks`` is the sub-builder ``single_graph._build_single_graph_forward``
composes: it computes once at load what a call's ambient state must be and returns
``check_modes()`` (the torch-function and dispatch modes, ``check_ambient_modes``) and
``check_state()`` (the torch settings fn read, grad and inference mode, autocast, the
default dtype). ``check_ambient_modes`` and ``warn_inference_grad`` serve Dynamo's
artifacts too, which carry those two functions. Beside them, in the order the
artifact's text has always had them, the predicates over the artifact's metadata that
the sub-builders share (``requires_grad_is_captured``, ``checks_layout``,
``metadata_guard``) and ``load_spec``.

The names the bodies read from the artifact's namespace are declared under
TYPE_CHECKING.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import torch as _torch

    # Bound by the artifact prelude (precompile._compat.prelude; only _compat names private
    # torch): ARTIFACT_PRELUDE and INDUCTOR_PRELUDE.
    _pytree: Any = None
    _any_autocast_enabled: Callable[[], bool] = bool
    _deterministic_enabled: Callable[[], bool] = bool
    _anomaly_enabled: Callable[[], bool] = bool
    _anomaly_check_nan: Callable[[], bool] = bool
    _TensorGuards: Any = None
    dispatch_tls_local_exclude_set: Any = None
    function_mode_depth: Callable[[], int] = int
    dispatch_mode_depth: Callable[[], int] = int

    AMBIENT_MODES: list[str] = []
    MODES_SEE_OPS: bool = False
    BACKEND: str = ""
    TRAINING: bool = False
    AUTOGRAD: dict[str, Any] | None = None
    DEFAULT_DTYPE: str = ""
    AUTOCAST: list[tuple[str, str]] = []
    STATE_READS: dict[str, str] = {}
    PROCESS_STATE: list[list[Any]] = []

    # precompile.runtime.state_checks, emitted before this module.
    def autocast_state() -> tuple[tuple[str, str], ...]: ...

    def ambient_modes() -> tuple[str, ...]: ...

    def autocast_keys() -> dict[str, Any] | None: ...

    # precompile.runtime.setting_checks, emitted before this module.
    def build_setting_check(records: list[list[Any]]) -> Callable[[], None] | None: ...

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


def ambient_now() -> tuple[Any, ...]:
    """The ambient state the make_fx driver compares per call, as one tuple of C calls:
    the torch-function and dispatch mode depths, the default dtype, deterministic mode
    and whether any autocast is on -- the tuple the Dynamo driver reads inline in its
    forward (``multigraph_serving.serve_as_captured``; a call of this function there
    measured 0.2-0.3 us slower in one A/B). Equal to ``ordinary_ambient``'s tuple, a call skips
    the checks of each one by one; any difference runs them, in the order their
    refusals are said."""
    return (
        function_mode_depth(),
        dispatch_mode_depth(),
        _torch.get_default_dtype(),
        _deterministic_enabled(),
        _any_autocast_enabled(),
    )


def ordinary_ambient(
    captured_modes: tuple[str, ...], default_dtype: Any, deterministic: bool
) -> tuple[Any, ...] | None:
    """What ``ambient_now`` reads in an ordinary call of an artifact captured without
    torch modes under ``default_dtype`` and ``deterministic``: no mode, that dtype and
    mode, no autocast. None (never equal) for an artifact captured under modes."""
    return None if captured_modes else (0, 0, default_dtype, deterministic, False)


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


def nan_detection_on() -> bool:
    """Whether autograd's anomaly detection would check this call's backward for NaN
    (``torch.autograd.detect_anomaly()``, ``set_detect_anomaly(True)``; not with
    ``check_nan=False``, which only records where each node was made). Eager then
    raises naming the backward function whose output holds a NaN; an artifact whose
    backward is compiled into its graph (a training capture, an AOTAutograd pair, an
    Inductor one) runs no such node to check. Two C calls bound at load: it is read on
    every call of an artifact that carries a backward."""
    return _anomaly_enabled() and _anomaly_check_nan()


def refuse_nan_detection() -> NoReturn:
    """Refuse a call made under anomaly detection's NaN checks (``nan_detection_on``)."""
    refuse(
        "precompile: this call runs under autograd's anomaly detection "
        "(torch.autograd.detect_anomaly() or set_detect_anomaly(True)), which checks the "
        "output of every backward function eager runs and raises at the first NaN; this "
        "artifact's backward is compiled into its graph and runs no such function, so it "
        "cannot check what eager checks. Call it outside anomaly detection (or with "
        "check_nan=False), or run fn eagerly to find the NaN",
        6,
    )


def refuse_forward_ad_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a call to an Inductor artifact, made while a forward-AD level is open
    (``torch.autograd.forward_ad.dual_level``), that passes a dual tensor (``make_dual``)
    anywhere in its arguments: as one, in a list, tuple or dict, as a parameter or
    buffer of a module, or in an object's attributes (a dataclass), a few levels deep.
    Eager carries the tangent through every operation; Inductor's kernels read the
    primal's data and drop it, and its extern calls (``addmm``'s out= form) raise. The
    eager backend's graph runs ATen ops, which carry it, and is served. Called only
    while a level is open, so an ordinary call pays one attribute read."""
    import torch

    unpack = torch.autograd.forward_ad.unpack_dual
    seen: set[int] = set()

    def dual(label: str, value: Any, depth: int) -> str:
        if isinstance(value, torch.Tensor):
            return label if unpack(value).tangent is not None else ""
        if depth > 4 or id(value) in seen:
            return ""
        seen.add(id(value))
        items: list[tuple[str, Any]]
        if isinstance(value, torch.nn.Module):
            named = [*value.named_parameters(), *value.named_buffers()]
            items = [(f"{label}'s {name!r}", t) for name, t in named]
        elif isinstance(value, dict):
            items = [(label, v) for v in list(value.values())]
        elif isinstance(value, (list, tuple)):
            items = [(label, v) for v in value]
        elif isinstance(getattr(value, "__dict__", None), dict):
            items = [(f"{label}'s {k!r}", v) for k, v in list(vars(value).items())]
        else:
            return ""
        return next((found for at, item in items if (found := dual(at, item, depth + 1))), "")

    labelled = [
        *((f"argument {i}", a) for i, a in enumerate(args)),
        *((f"argument {k!r}", v) for k, v in kwargs.items()),
    ]
    found = next((found for label, value in labelled if (found := dual(label, value, 0))), "")
    if found:
        refuse(
            f"precompile: {found} is a forward-AD dual tensor "
            f"(torch.autograd.forward_ad.make_dual), but this artifact runs Inductor's "
            f"compiled kernels, which carry no tangent: eager would compute the "
            f"output's tangent, the kernels would drop it. Call fn eagerly under forward "
            f"AD, or capture with backend='eager' (its graph's ATen operations carry "
            f"tangents)",
            2,
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


def build_ambient_checks() -> tuple[Callable[[], None], Callable[[], None], tuple[Any, ...] | None]:
    """Compute once what a call must run under besides its arguments, and return
    ``check_modes()`` (the torch modes: first of every check, so that the refusal names
    the mode), ``check_state()`` (the torch settings fn read, grad and inference mode
    where fn read them, autocast, the default dtype: after the model's check) and the
    ``ambient_now()`` of a call that both would pass without looking further (None
    where ``check_state`` has more to compare: settings, grad or inference mode fn
    read, a captured autocast, or captured modes)."""
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
    # fn read torch settings (deterministic algorithms, a torch.backends flag), or a
    # kernel the graph holds the choice of did: each is read again per call.
    settings_ok = build_setting_check(PROCESS_STATE)
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
        if settings_ok is not None:
            settings_ok()
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

    # Deterministic mode as at load: check_state compares it only where fn read it
    # (PROCESS_STATE, then no shortcut); a call in the other mode takes both checks.
    ordinary = (
        None
        if settings_ok or grad_mode_read or inference_mode_read or captured_autocast
        else ordinary_ambient(captured_modes, default_dtype, _deterministic_enabled())
    )
    return check_modes, check_state, ordinary
