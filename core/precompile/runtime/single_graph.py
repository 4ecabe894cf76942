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

INVARIANT: ``lift_live_module_state`` orders and names params and buffers exactly as
``precompile.capturing.fx_lifting.lift_module_state`` does at capture (params then buffers, over all
modules, interned by identity, ``m{i}.`` prefixes only with several modules). A test
holds the two in agreement.
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
    NUM_POSITIONAL_ARGS: int = 0
    MODULE_POSITIONS: list[int] = []
    PARAM_NAMES: list[str] = []
    PARAM_SHAPES: list[tuple[int, ...]] = []
    PARAM_DTYPES: list[str] = []
    PARAM_DEVICES: list[str] = []
    PARAM_REQUIRES_GRAD: list[bool] = []
    BUFFER_NAMES: list[str] = []
    BUFFER_SHAPES: list[tuple[int, ...]] = []
    BUFFER_DTYPES: list[str] = []
    BUFFER_DEVICES: list[str] = []
    MODULE_TRAINING: list[list[tuple[str, bool | None]]] = []
    MODULE_READS: list[list[list[str] | None]] = []
    GRAD_PARAM_INDICES: list[int] = []
    IN_SPEC: str = ""
    KEYED_DICTS: list[bool] = []
    OUT_SPEC: str = ""
    USER_INPUT_SHAPES: list[tuple[int | None, ...] | None] = []
    USER_INPUT_DTYPES: list[str | None] = []
    USER_INPUT_DEVICES: list[str | None] = []
    USER_INPUT_BOUNDS: list[dict[int, tuple[int | None, int | None]] | None] = []
    USER_INPUT_SHAPE_IDS: list[dict[int, str] | None] = []
    USER_INPUT_CONSTANTS: list[object] = []
    USER_INPUT_ALIASES: list[list[Any]] = []

    GRAPH_INPUT_STRIDES: list[tuple[int, ...] | None] = []
    INPUT_LAYOUT_COPY: list[str | None] = []
    TRAINING: bool = False
    USER_INPUT_REQUIRES_GRAD: list[bool | None] = []
    GRAD_ACCESS: list[str] = []
    OUTPUT_DETACH: list[int] = []
    INPUT_MUTATIONS: dict[str, Any] | None = None
    AUTOGRAD: dict[str, Any] | None = None
    DEFAULT_DTYPE: str = ""
    AUTOCAST: list[tuple[str, str]] = []
    STATE_READS: dict[str, str] = {}
    PROCESS_STATE: list[list[Any]] = []
    _torch_nn_module: Any = None

    def _global_module_hooks() -> tuple[dict[Any, Any], ...]: ...

    def literal_fingerprint(value: Any) -> tuple[str, Any]: ...

    def autocast_state() -> tuple[tuple[str, str], ...]: ...

    def ambient_modes() -> tuple[str, ...]: ...

    def _opaque_to_dynamo(fn: Callable[..., Any]) -> Callable[..., Any]: ...

    def autocast_keys() -> dict[str, Any] | None: ...

    def state_getter(module: str, path: str, call: bool) -> Any: ...

    def shallow_contents(value: Any) -> tuple[Any, ...]: ...

    def describe_value(fp: Any) -> str: ...

    # guard_text.typed_value, emitted before this module.
    def typed_value(kind: str, shown: str) -> str: ...

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

    def check_entry(entry: Any, context: dict[str, Any]) -> None: ...

    def check_globals(scopes: list[Any], context: dict[str, Any]) -> None: ...

    def check_module_state(mods: list[Any], context: dict[str, Any]) -> None: ...

    def check_class_state(subs: list[Any], context: dict[str, Any]) -> None: ...

    def check_process_state(values: list[Any]) -> None: ...

    def _relabel_layout_error(error: AssertionError, flat: list[Any]) -> str | None: ...

    def bind_autograd(
        name: str, spec: dict[str, Any], forward_call: Any, backward_call: Any
    ) -> Callable[..., list[Any]]: ...

    # precompile.runtime.refusal, emitted before this module.
    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...


def check_ambient_modes(captured: tuple[str, ...], modes_see_ops: bool = False) -> None:
    """Refuse a call made under other torch modes than the capture ran under
    (``AMBIENT_MODES``; ``state_checks.ambient_modes``), except dispatch modes around an
    artifact whose graphs run eager's own ATen operations (``MODES_SEE_OPS``).

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
            "result; this artifact's operations are compiled kernels (Inductor, "
            "decompositions, or a compiled forward/backward pair) that the mode would "
            "not see, so it cannot answer as eager would (an artifact of the eager "
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


def lift_live_module_state(mods: list[Any]) -> tuple[list[Any], list[str], list[Any]]:
    """Params then buffers of the runtime modules, interned by identity, named like the
    capture named them; also every submodule in walk order (for the training flags)."""
    multi = len(mods) > 1
    seen: set[int] = set()
    tensors: list[Any] = []
    names: list[str] = []
    for kind in ("named_parameters", "named_buffers"):
        for mi, m in enumerate(mods):
            for n, t in getattr(m, kind)(remove_duplicate=False):
                if id(t) not in seen:
                    seen.add(id(t))
                    tensors.append(t)
                    names.append(f"m{mi}.{n}" if multi else n)
    subs = [sub for m in mods for sub in m.modules()]
    return tensors, names, subs


def _without_unread_buffers(
    mods: list[Any], tensors: list[Any], names: list[str], expected: list[str]
) -> tuple[list[Any], list[str]] | None:
    """The captured parameters and buffers, in the captured order, when every other one
    the runtime model has is a buffer added after capture that the trace could not have
    read: its module's reads were seen (``MODULE_READS``), and they include neither its
    name nor the module's ``_buffers`` (what ``buffers()``, ``named_buffers()`` and
    ``state_dict()`` enumerate). None when that is not so (the caller refuses)."""
    if not MODULE_READS:
        return None
    by_name = dict(zip(names, tensors))
    if not set(expected) <= by_name.keys() or [n for n in names if n in set(expected)] != (
        expected
    ):
        return None
    multi = len(mods) > 1
    for name in names:
        if name in by_name and name in expected:
            continue
        mi, path = (int(name.split(".", 1)[0][1:]), name.split(".", 1)[1]) if multi else (0, name)
        owner, _, leaf = path.rpartition(".")
        paths = [n for n, _ in mods[mi].named_modules()]
        if owner not in paths or len(paths) != len(MODULE_READS[mi]):
            return None
        own = MODULE_READS[mi][paths.index(owner)]
        sub = mods[mi].get_submodule(owner)
        if own is None or "_buffers" in own or leaf in own or leaf not in sub._buffers:
            return None
    return [by_name[n] for n in expected], list(expected)


def _checked_module_state(mods: list[Any]) -> tuple[list[Any], list[str], list[Any]]:
    """Raise the precise invariant-2 message for a runtime model that differs from the
    traced one; if it matches, return its lifted state (as ``lift_live_module_state``). Slow
    on purpose: it runs only when the per-call fast check saw a new model or a change."""
    tensors, names, subs = lift_live_module_state(mods)
    expected = list(PARAM_NAMES) + list(BUFFER_NAMES)
    if names != expected:
        unread = _without_unread_buffers(mods, tensors, names, expected)
        if unread is not None:
            tensors, names = unread
    if names != expected:
        missing = [n for n in expected if n not in names]
        extra = [n for n in names if n not in expected]
        detail = (
            f"missing {missing}, unexpected {extra}"
            if missing or extra
            else f"same names in another order: {names}"
        )
        refuse(
            f"precompile: the runtime model's parameters/buffers differ from the traced "
            f"model's ({detail}); pass a model with the same structure as the one "
            f"captured, or capture again",
            2,
        )
    shapes = list(PARAM_SHAPES) + list(BUFFER_SHAPES)
    dtypes = list(PARAM_DTYPES) + list(BUFFER_DTYPES)
    devices = list(PARAM_DEVICES) + list(BUFFER_DEVICES)
    for name, t, shape, dtype, device in zip(names, tensors, shapes, dtypes, devices):
        if tuple(t.shape) != tuple(shape):
            refuse(
                f"precompile: the runtime parameter/buffer {name!r} has shape "
                f"{tuple(t.shape)} but the traced model's was {tuple(shape)}; the graph "
                f"is specialized to the traced shapes",
                2,
            )
        if str(t.dtype) != dtype:
            refuse(
                f"precompile: the runtime parameter/buffer {name!r} has dtype {t.dtype} "
                f"but the traced model's was {dtype}; cast the model back (e.g. "
                f".to({dtype})) or capture again",
                2,
            )
        if str(t.device) != device:
            refuse(
                f"precompile: the runtime parameter/buffer {name!r} is on device "
                f"{t.device} but the traced model's was on {device}; move the model "
                f"(.to({device!r})) or capture again",
                2,
            )
    if _checks_layout():
        labels = [f"parameter {n!r}" for n in PARAM_NAMES] + [f"buffer {n!r}" for n in BUFFER_NAMES]
        _check_strides(labels, tensors, GRAPH_INPUT_STRIDES)
    for name, t, wanted in zip(names, tensors, PARAM_REQUIRES_GRAD):
        if bool(t.requires_grad) != wanted and requires_grad_is_captured():
            refuse(
                f"precompile: parameter {name!r} has requires_grad={t.requires_grad} but "
                f"was captured with requires_grad={wanted}; the capture baked which "
                f"gradients the graph computes. Restore it with "
                f".requires_grad_({wanted}) or capture again",
                2,
            )
    for mi, (m, flags) in enumerate(zip(mods, MODULE_TRAINING)):
        actual = [(n, bool(sub.training)) for n, sub in m.named_modules()]
        for (name, flag), (aname, aflag) in zip(flags, actual):
            if name != aname:
                refuse(
                    f"precompile: the runtime model's submodule {aname!r} stands where "
                    f"the traced model had {name!r}; pass a structurally identical model",
                    2,
                )
            # None: the trace never read this submodule's flag, so its mode changes
            # nothing the graph computes (a Linear's train()).
            if flag is not None and flag != aflag:
                where = f"submodule {name!r}" if name else "the model"
                mode = "train()" if flag else "eval()"
                refuse(
                    f"precompile: {where} of module argument {MODULE_POSITIONS[mi]} is in "
                    f"{'training' if aflag else 'eval'} mode but was captured in "
                    f"{'training' if flag else 'eval'} mode; the capture baked that mode "
                    f"(dropout, batch-norm statistics). Call .{mode} on the model or "
                    f"capture again in this mode",
                    2,
                )
        if len(actual) != len(flags):
            refuse(
                f"precompile: module argument {MODULE_POSITIONS[mi]} has {len(actual)} "
                f"submodules but the traced model had {len(flags)}; pass a structurally "
                f"identical model",
                2,
            )
    return tensors, names, subs


def _checks_layout() -> bool:
    """Whether the graph depends on its inputs' strides: Inductor bakes them, and a
    trace whose user code read a layout (``x.is_contiguous()``) took the branch of the
    capture's layout."""
    return BACKEND == "inductor" or "layout" in STATE_READS


def _check_strides(
    labels: list[str],
    tensors: list[Any],
    expected: list[Any],
    blockers: list[str | None] | None = None,
) -> None:
    """Raise naming the first tensor whose strides differ from the capture's. With
    ``blockers`` (user inputs of an Inductor graph, ``INPUT_LAYOUT_COPY``), a tensor
    whose blocker is None passes: the call serves it through a copy in the captured
    layout (``_in_captured_layout``); any other blocker is why it cannot."""
    if BACKEND == "inductor":
        why = (
            "the Inductor backend bakes each tensor's memory layout (invariants 3 and 6). "
            "Pass it in the captured layout (.contiguous(), or the memory format it had "
            "at capture), or use backend='eager'"
        )
    else:
        why = (
            f"fn reads memory layout ({STATE_READS.get('layout')}), so the trace took the "
            f"branch of the captured layout (invariants 3 and 6). Pass it in the captured "
            f"layout (.contiguous(), or the memory format it had at capture), or make fn "
            f"independent of layout"
        )
    for k, (label, t, strides) in enumerate(zip(labels, tensors, expected)):
        if strides is not None and tuple(t.stride()) != tuple(strides):
            if blockers is not None and k < len(blockers):
                if blockers[k] is None:
                    continue
                why = (
                    f"the Inductor backend bakes each tensor's memory layout, and a call "
                    f"in another layout is served through a copy in the captured one, "
                    f"but not this input: {blockers[k]} (invariants 4 and 6). Pass it in "
                    f"the captured layout (.contiguous(), or the memory format it had at "
                    f"capture), or use backend='eager'"
                )
            refuse(
                f"precompile: {label} has strides {tuple(t.stride())} ({_memory_format(t)} "
                f"memory format) but was captured with strides {tuple(strides)}; {why}",
                6,
            )


def warn_layout_copy(label: str, strides: tuple[int, ...], captured: Any) -> None:
    """Say once per artifact, as a LayoutCopyWarning, that a call passed an input in
    another layout than the one the Inductor kernels were compiled for, and is served
    through a copy (exact, but a copy per such call). The category is imported at the
    moment of warning only, and is a plain UserWarning where the package is not
    installed."""
    import warnings

    category: type[Warning]
    try:
        from precompile.errors import LayoutCopyWarning

        category = LayoutCopyWarning
    except ImportError:
        category = UserWarning
    warnings.warn(
        f"precompile: {label} has strides {strides} but the Inductor kernels of this "
        f"artifact were compiled for strides {tuple(captured)}; it is served through a "
        f"copy in the captured layout, which costs a copy of the tensor on each such "
        f"call. Pass inputs in the captured layout (.contiguous(), or the memory format "
        f"they had at capture) to avoid it, or capture with inputs in this layout. Warned "
        f"once per artifact",
        category,
        stacklevel=5,  # the user's call of the loaded runnable
    )


def _keyed_inputs(value: Any, spec: Any, keyed: list[bool], counter: list[int]) -> Any:
    """``value`` with each dict that fn read only by key (``KEYED_DICTS``, pre-order over
    the captured spec's dicts) rebuilt in the captured key order, without the keys the
    capture did not have: eager computes the same from either, and the graph takes
    its inputs in the captured order. A dict missing a captured key is refused naming
    it. Anything shaped otherwise is returned as is, for the structure check to name."""
    if spec.type is dict:
        index = counter[0]
        counter[0] += 1
        if not isinstance(value, dict):
            return value
        keys = list(spec.context)
        if keyed[index] if index < len(keyed) else False:
            missing = [k for k in keys if k not in value]
            if missing:
                refuse(
                    f"precompile: a dict input has no key {missing[0]!r} (captured with "
                    f"keys {keys}); fn reads that dict by key, so its order and any other "
                    f"keys do not matter, but the graph takes the value of every captured "
                    f"key. Pass a dict with each of them, or capture again without it",
                    3,
                )
            value = {k: value[k] for k in keys}
        elif list(value) != keys:
            return value
        return {
            k: _keyed_inputs(value[k], child, keyed, counter)
            for k, child in zip(keys, spec.children())
        }
    if spec.type in (list, tuple) and type(value) is spec.type and len(value) == spec.num_children:
        return spec.type(
            _keyed_inputs(item, child, keyed, counter)
            for item, child in zip(value, spec.children())
        )
    return value


def _key_order_difference(spec: Any, expected: Any) -> str | None:
    """The first dict in a call's inputs whose keys are the captured ones in another
    order, in words; None when the nesting differs otherwise."""
    if spec.type is not expected.type or spec.num_children != expected.num_children:
        return None
    keys, captured = spec.context, expected.context
    if isinstance(keys, list) and isinstance(captured, list) and keys != captured:
        if sorted(map(repr, keys)) == sorted(map(repr, captured)):
            return f"a dict input has its keys in the order {keys} but was captured with {captured}"
        return None
    for child, expected_child in zip(spec.children(), expected.children()):
        found = _key_order_difference(child, expected_child)
        if found:
            return found
    return None


def _key_set_difference(spec: Any, expected: Any) -> str | None:
    """The first dict in a call's inputs whose keys differ from the captured ones (fn
    read it beyond values by key: ``KEYED_DICTS``), in words; None when the nesting
    differs otherwise."""
    if spec.type is not expected.type:
        return None
    if spec.type is dict and list(spec.context) != list(expected.context):
        return f"a dict input has the keys {list(spec.context)} but was captured with {list(expected.context)}"
    if spec.num_children != expected.num_children:
        return None
    for child, expected_child in zip(spec.children(), expected.children()):
        found = _key_set_difference(child, expected_child)
        if found:
            return found
    return None


def _describe_input_mismatch(
    leaves: list[Any], spec_matches: bool, spec: Any = None, expected_spec: Any = None
) -> None:
    """Raise the precise invariant-3/6 message for user inputs that differ from the
    traced example; return quietly if they match."""
    order = None if spec is None else _key_order_difference(spec, expected_spec)
    if not spec_matches and order:
        refuse(
            f"precompile: {order}; the capture flattened it in key order, so its values "
            f"would meet the graph in the wrong places. Pass its keys in the captured "
            f"order, or capture again",
            3,
        )
    keys = None if spec is None else _key_set_difference(spec, expected_spec)
    if not spec_matches and keys:
        refuse(
            f"precompile: {keys}, and fn reads more of it than values by key (it iterates "
            f"it, takes its length, tests or unpacks its keys, or returns it; or it is "
            f"held in another container than a list, tuple or dict), so its key set is "
            f"part of the capture. Pass a dict with the captured keys, or capture again",
            3,
        )
    if not spec_matches:
        refuse(
            "precompile: the call's inputs are nested differently from the traced "
            "example (lists, tuples, dicts and their lengths are part of the capture); "
            "pass them in the captured structure",
            3,
        )
    if len(leaves) != len(USER_INPUT_SHAPES):
        refuse(
            f"precompile: the call's inputs flatten to {len(leaves)} values but the "
            f"traced example had {len(USER_INPUT_SHAPES)}",
            3,
        )
    for i, leaf in enumerate(leaves):
        shape = USER_INPUT_SHAPES[i]
        if shape is None:
            expected = USER_INPUT_CONSTANTS[i]
            if literal_fingerprint(leaf) != expected:
                baked = describe_value(expected)
                # A fingerprint is (type name, value): 2.0 == 2, yet the trace took the
                # int's path, so the type is what to name.
                kind = type(leaf).__name__
                baked_kind = str(expected[0]) if isinstance(expected, (tuple, list)) else kind
                if baked_kind not in (kind, "not a literal"):
                    text = repr(leaf)
                    text = text if len(text) <= 80 else text[:77] + "..."
                    refuse(
                        f"precompile: input value {i} is {typed_value(kind, text)}; the "
                        f"capture baked {typed_value(baked_kind, baked)} (a Python value "
                        f"is specialized by type and value). Pass {baked}, or capture "
                        f"again for this value",
                        3,
                    )
                refuse(
                    f"precompile: input value {i} is {leaf!r} but the capture baked "
                    f"{baked}; Python values are specialized at capture. Pass {baked}, or "
                    f"capture again for this value",
                    3,
                )
            continue
        if not isinstance(leaf, _torch.Tensor):
            refuse(
                f"precompile: input {i} is a {type(leaf).__name__} but a tensor was "
                f"traced there",
                3,
            )
        actual = tuple(leaf.shape)
        bounds = USER_INPUT_BOUNDS[i] or {}
        if len(actual) != len(shape) or any(
            e is not None and a != e for a, e in zip(actual, shape)
        ):
            shown = tuple("*" if e is None else e for e in shape)
            refuse(
                f"precompile: input {i} has shape {actual} but the artifact was traced "
                f"with shape {shown} ('*' = dynamic); static dims are specialized. "
                f"Capture with this shape, or mark the dim dynamic with "
                f"torch._dynamo.decorators.mark_unbacked before capture",
                3,
            )
        for dim, (lo, hi) in bounds.items():
            size = actual[dim]
            if (lo is not None and size < lo) or (hi is not None and size > hi):
                refuse(
                    f"precompile: input {i} dim {dim} has size {size}, outside the range "
                    f"[{lo}, {hi}] declared with mark_unbacked at capture",
                    3,
                )
        if str(leaf.dtype) != USER_INPUT_DTYPES[i]:
            refuse(
                f"precompile: input {i} has dtype {leaf.dtype} but the artifact was "
                f"traced with {USER_INPUT_DTYPES[i]}; cast the input (.to("
                f"{USER_INPUT_DTYPES[i]})) or capture again",
                6,
            )
        if str(leaf.device) != USER_INPUT_DEVICES[i]:
            refuse(
                f"precompile: input {i} is on device {leaf.device} but the artifact was "
                f"traced on {USER_INPUT_DEVICES[i]}; move the input "
                f"(.to({USER_INPUT_DEVICES[i]!r})) or capture again",
                6,
            )
    tensor_leaves = [leaf for leaf, shape in zip(leaves, USER_INPUT_SHAPES) if shape is not None]
    if _checks_layout():
        n_state = len(PARAM_NAMES) + len(BUFFER_NAMES)
        labels = [f"input {i}" for i, s in enumerate(USER_INPUT_SHAPES) if s is not None]
        # Only Inductor's inputs may be copied into the captured layout: the eager
        # graph checks strides only where fn read a layout, and then refuses.
        _check_strides(
            labels,
            tensor_leaves,
            GRAPH_INPUT_STRIDES[n_state:],
            list(INPUT_LAYOUT_COPY) if BACKEND == "inductor" else None,
        )
    for i, leaf in enumerate(leaves):
        if USER_INPUT_SHAPES[i] is None or not leaf.requires_grad:
            continue
        if TRAINING and not USER_INPUT_REQUIRES_GRAD[i]:
            refuse(
                f"precompile: input {i} requires grad but was captured without; the "
                f"captured backward computes no gradient for it, where eager would. Pass "
                f"x.detach(), or capture again with an input that requires grad",
                5,
            )
        if AUTOGRAD is not None and not USER_INPUT_REQUIRES_GRAD[i] and _torch.is_grad_enabled():
            refuse(
                f"precompile: input {i} requires grad but was captured without; the "
                f"captured backward graph computes no gradient for it, where eager would. "
                f"Pass x.detach() or call under torch.no_grad(), or capture again with "
                f"this input requiring grad",
                5,
            )
        # An inference artifact without a backward serves it with grad off, as it
        # serves parameters that require grad: forward() says so (InferenceGradWarning).
    if not TRAINING and "requires_grad" in STATE_READS:
        for i, leaf in enumerate(leaves):
            wanted = USER_INPUT_REQUIRES_GRAD[i]
            if wanted is not None and bool(leaf.requires_grad) != wanted:
                refuse(
                    f"precompile: input {i} has requires_grad={leaf.requires_grad} but was "
                    f"captured with requires_grad={wanted}, and fn reads requires_grad "
                    f"({STATE_READS['requires_grad']}): the trace took the branch of the "
                    f"captured value. Pass it with requires_grad={wanted} (x.detach() or "
                    f"x.requires_grad_()), or capture again",
                    5,
                )
    if TRAINING:
        for i, leaf in enumerate(leaves):
            if USER_INPUT_REQUIRES_GRAD[i] and not leaf.requires_grad:
                refuse(
                    f"precompile: input {i} does not require grad but was captured "
                    f"requiring it; the captured graph computes with its gradient. Pass "
                    f"it with requires_grad=True, or capture again",
                    5,
                )
    sizes: dict[str, tuple[int, int, int]] = {}
    for i, ids in enumerate(USER_INPUT_SHAPE_IDS):
        for dim, shape_id in (ids or {}).items():
            size = leaves[i].shape[dim]
            if shape_id in sizes and sizes[shape_id][0] != size:
                j, jdim = sizes[shape_id][1:]
                refuse(
                    f"precompile: input {i} dim {dim} has size {size} but input {j} dim "
                    f"{jdim} has size {sizes[shape_id][0]}; both were marked with "
                    f"shape_id {shape_id!r}, so they must be equal",
                    3,
                )
            sizes.setdefault(shape_id, (size, i, dim))


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


def _load_spec(text: str) -> Any:
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


def _picker(positions: tuple[int, ...]) -> Any:
    """A C-level ``seq -> tuple of seq[i] for i in positions``: itemgetter returns a bare
    item for one position, so that case is wrapped."""
    from operator import itemgetter

    if len(positions) == 1:
        only = itemgetter(positions[0])
        return lambda seq: (only(seq),)
    if not positions:
        return lambda seq: ()
    return itemgetter(*positions)


def _build_single_graph_forward() -> Any:
    """Compute once what every call needs, and return the lean per-call ``forward``.

    Loading checks the code the trace ran through (``check_function_sources_once``)
    and finds the live modules whose globals it read. Each call is then checked in full,
    but through a fast path: the inputs' (shape, dtype, device, requires_grad, and for
    Inductor strides) are compared as one tuple against the captured ones, and the model
    and the Python state the trace read by identity, by the version tags of the dicts
    that hold them, by the types of the submodules, by the contents of the few mutable
    objects that have no version tag, and by one C-level guard over the model's tensors'
    metadata, against what the last verified call saw. Only a difference (or a new
    model) takes the slow path, which names the exact mismatch or re-verifies and
    refreshes the snapshot. The snapshot holds the most recent model, so it stays alive
    until a call with another model replaces it.
    """
    from operator import attrgetter
    from operator import is_ as _is
    from typing import cast

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
    n_args = NUM_POSITIONAL_ARGS
    module_positions = tuple(MODULE_POSITIONS)
    user_positions = tuple(i for i in range(n_args) if i not in set(module_positions))
    in_spec = _load_spec(IN_SPEC)
    keyed_dicts = list(KEYED_DICTS) if any(KEYED_DICTS) else []
    out_spec = _load_spec(OUT_SPEC)
    flat_inputs = in_spec == _pytree.tree_structure(tuple(0 for _ in user_positions))
    single_output = out_spec == _pytree.tree_structure(0)
    tensor_slots = tuple(i for i, s in enumerate(USER_INPUT_SHAPES) if s is not None)
    pick_modules = _picker(module_positions)
    pick_user = _picker(user_positions)
    pick_tensors = _picker(tensor_slots)
    # Each Python value as its literal fingerprint (floats by repr: the sign of a zero,
    # NaN), compared with the capture's in one tuple.
    constant_slots = tuple(i for i, s in enumerate(USER_INPUT_SHAPES) if s is None)
    pick_constants = _picker(constant_slots)
    expected_constants = tuple(USER_INPUT_CONSTANTS[i] for i in constant_slots)
    has_dynamic = any(s is not None and None in s for s in USER_INPUT_SHAPES) or any(
        USER_INPUT_SHAPE_IDS
    )
    # requires_grad is compared only where the graph depends on it (see
    # requires_grad_is_captured): otherwise any input's flag is served alike.
    grad_flags_fixed = requires_grad_is_captured()
    input_meta = (
        attrgetter("shape", "dtype", "device", "requires_grad")
        if grad_flags_fixed
        else attrgetter("shape", "dtype", "device")
    )
    reads_requires_grad = "requires_grad" in STATE_READS
    # An inference artifact expecting an input that requires grad serves it only with
    # grad mode off.
    inference_grad_inputs = (
        not TRAINING
        and AUTOGRAD is None
        and any(USER_INPUT_REQUIRES_GRAD[i] for i in tensor_slots if reads_requires_grad)
    )
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
    # Only without dynamic dims: then each tensor slot's shape (tensor_slots holds the
    # slots with one) is all ints, and the emitter writes a dtype and a device exactly
    # where it writes a shape.
    expected_inputs = tuple(
        (
            _torch.Size(cast("tuple[int, ...]", USER_INPUT_SHAPES[i])),
            getattr(_torch, cast(str, USER_INPUT_DTYPES[i]).split(".")[-1]),
            _torch.device(cast(str, USER_INPUT_DEVICES[i])),
            # Compared only where the graph depends on it (grad_flags_fixed): a training
            # capture, or an inference one that reads requires_grad (the captured value
            # is expected, and grad mode is checked on its own below), or carries the
            # backward (AUTOGRAD: another value takes the slow path, which serves or
            # refuses it).
            bool(
                (TRAINING or reads_requires_grad or AUTOGRAD is not None)
                and USER_INPUT_REQUIRES_GRAD[i]
            ),
        )[: 4 if grad_flags_fixed else 3]
        for i in tensor_slots
        if not has_dynamic
    )
    # Inductor bakes every graph input's strides (and may return a view of an input
    # built from them), whether or not its own asserts stayed on at capture: compare
    # them per call. The eager graph runs ATen ops, which take any layout.
    stride_of = _torch.Tensor.stride if _checks_layout() else type
    n_state = len(PARAM_NAMES) + len(BUFFER_NAMES)
    expected_input_strides = tuple(GRAPH_INPUT_STRIDES[n_state:]) if _checks_layout() else ()
    check_input_strides = bool(expected_input_strides) and None not in expected_input_strides
    # Inductor's kernels read their inputs by the captured strides: an input in another
    # layout that nothing else ties to the caller's tensor (the graph does not write
    # it, no output views it: INPUT_LAYOUT_COPY) is copied into the captured layout,
    # warned once per artifact. The slow path refuses the others.
    copy_layouts = (
        check_input_strides
        and BACKEND == "inductor"
        and any(reason is None for reason in INPUT_LAYOUT_COPY)
    )
    layout_copy_unwarned = [True]
    empty_strided = _torch.empty_strided

    def _in_captured_layout(tensors_in: Any) -> Any:
        restrided = list(tensors_in)
        for k, (t, strides) in enumerate(zip(tensors_in, expected_input_strides)):
            # Never None here: copy_layouts needs every input's strides fixed.
            strides = cast("tuple[int, ...]", strides)
            if tuple(t.stride()) != strides:
                copy = empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
                copy.copy_(t)
                restrided[k] = copy
                if layout_copy_unwarned[0]:
                    layout_copy_unwarned[0] = False
                    slot = tensor_slots[k]
                    warn_layout_copy(f"input {slot}", tuple(t.stride()), strides)
        return tuple(restrided)

    # One getter for parameters and buffers alike: a buffer's requires_grad is compared
    # against the snapshot too, which only ever makes the fast path more careful.
    tensor_meta = attrgetter("shape", "dtype", "device", "requires_grad")
    training = attrgetter("training")
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
    # The last verified model and state: the module roots, the dicts that hold what the
    # trace read (each submodule's attribute, parameter, buffer, child and hook dicts,
    # the dicts of objects its attributes hold, the globals of the user modules the
    # trace read, torch's global hook dicts) with their version tags, the submodules'
    # types, mutable objects without a version tag with their contents, the lifted
    # tensors, their metadata and a C-level guard over that metadata. Any store into
    # one of those dicts -- a parameter, buffer, child, attribute, hook or global
    # replaced, added or deleted, a training flag flipped -- changes a version, and the
    # next call re-verifies from scratch.
    roots: tuple[Any, ...] | None = None
    dicts: tuple[dict[str, Any], ...] = ()
    versions: tuple[int, ...] = ()
    empty_dicts: tuple[dict[str, Any], ...] = ()
    unwatched: list[Any] = []
    flags: tuple[bool, ...] = ()
    subs: tuple[Any, ...] = ()
    sub_types: tuple[type, ...] = ()
    shallow: tuple[Any, ...] = ()
    shallow_snapshot: tuple[Any, ...] = ()
    # The objects whose instance dicts are among ``dicts`` (every submodule, each object
    # an attribute or global holds), with those dicts: ``m.__dict__ = d`` swaps in
    # another dict without a store into the watched one.
    holders: tuple[Any, ...] = ()
    holder_dicts: tuple[Any, ...] = ()
    # Functions the trace read (helpers, methods, the captured function): the objects
    # that hold what a call of each reads besides its arguments (the function's code,
    # defaults and keyword defaults, each closure cell's contents), with the attribute
    # names to read them by and what they held, compared by identity.
    func_holders: tuple[Any, ...] = ()
    func_attrs: tuple[str, ...] = ()
    func_snapshot: tuple[Any, ...] = ()
    tensors: list[Any] = []
    meta: tuple[Any, ...] = ()
    tensor_guard: Any = None
    # The user's tensors of the last call that matched the capture, as a C-level guard.
    input_guard: Any = None

    # The torch modes of the capture (almost always none): a call under others is
    # refused naming them, before any other check.
    captured_modes = tuple(AMBIENT_MODES)
    # Inputs that were one tensor at capture (q, k and v of self-attention): the graph
    # reads one of them for all, so each call must pass one tensor there too.
    alias_later = tuple(i for i, _, _, _ in USER_INPUT_ALIASES)
    alias_first = tuple(j for _, j, _, _ in USER_INPUT_ALIASES)
    pick_alias_later = _picker(alias_later)
    pick_alias_first = _picker(alias_first)

    def _guard(values: list[Any]) -> Any:
        # Checks shape, strides, dtype, device and requires_grad in one C call. It
        # also compares dispatch keys under the ambient state (inference mode, autocast)
        # and strides, which the eager contract does not fix: a miss falls back to
        # comparing the metadata (with strides for Inductor) in Python, and rebuilds the
        # guard when that comparison passes.
        return _TensorGuards(*values, dynamic_dims_sizes=None, dynamic_dims_strides=None)

    def _held(holder: Any, attr: str) -> Any:
        # An emptied cell reads as the cell itself: never what it held.
        try:
            return getattr(holder, attr)
        except ValueError:
            return holder

    def _functions_unchanged() -> bool:
        # One C-level pass over every holder; an emptied cell raises, and is never what
        # it held, so it takes the slow path like any change.
        try:
            return all(map(_is, map(getattr, func_holders, func_attrs), func_snapshot))
        except ValueError:
            return False

    def _same_items(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
        return len(a) == len(b) and all(map(_is, a, b))

    def _verify_model(mods: tuple[Any, ...]) -> list[Any]:
        nonlocal roots, dicts, versions, empty_dicts, unwatched, flags, subs, sub_types, shallow
        nonlocal shallow_snapshot, tensors, meta, tensor_guard, func_holders, func_attrs
        nonlocal func_snapshot, holders, holder_dicts
        roots = None
        for i, m in zip(module_positions, mods):
            if not isinstance(m, _torch.nn.Module):
                refuse(
                    f"precompile: argument {i} must be the nn.Module the captured function "
                    f"took there, got {type(m).__name__}",
                    2,
                )
        tensors, _names, sub_list = _checked_module_state(list(mods))
        context = serving_context(identities)
        check_module_state(list(mods), context)
        check_globals(scopes, context)
        check_entry(entry, context)
        check_class_state(sub_list, context)
        # torch's global hook dicts as its module holds them now, and that module's
        # namespace: a dict replaced whole is a store into it.
        global_hooks = _global_module_hooks()
        watched = [
            *context["dicts"],
            *(scope for scope, _ in scopes),
            *global_hooks,
            vars(_torch_nn_module),
        ]
        watched = list({id(d): d for d in watched}.values())
        # An empty dict's whole state is that it is empty (most hook, buffer and child
        # dicts): one truth test each, cheaper than reading a version tag.
        empty_dicts = tuple(d for d in watched if not d)
        dicts = tuple(d for d in watched if d)
        versions = tuple(map(_dict_version, dicts))
        # torch's global hook dicts run their hooks in key order (move_to_end changes it
        # and not their version tags).
        ordered_hooks = [d for d in global_hooks if d]
        found = tuple({id(o): o for o in [*context["shallow"], *ordered_hooks]}.values())
        shallow = tuple(o for o in found if not hasattr(o, "__closure__"))
        shallow_snapshot = tuple(map(shallow_contents, shallow))
        holders = tuple({id(o): o for o in context["holders"]}.values())
        holder_dicts = tuple(map(vars, holders))
        held: list[Any] = []
        attrs: list[str] = []
        for f in found:
            # A function without defaults or cells was called with every argument: a
            # default added later changes no traced call, and cells cannot be added.
            if hasattr(f, "__closure__") and (f.__defaults__ or f.__kwdefaults__ or f.__closure__):
                held += [f, f, f]
                attrs += ["__code__", "__defaults__", "__kwdefaults__"]
                for cell in f.__closure__ or ():
                    held.append(cell)
                    attrs.append("cell_contents")
        # One identity pass per call covers both: each holder's instance dict (``m.__dict__
        # = d`` swaps it without a store into the watched one) beside the functions'
        # code, defaults and closure cells.
        held = [*holders, *held]
        attrs = [*("__dict__" for _ in holders), *attrs]
        func_holders, func_attrs = tuple(held), tuple(attrs)
        func_snapshot = tuple(map(_held, func_holders, func_attrs))
        subs = tuple(sub_list)
        sub_types = tuple(map(type, subs))
        # A training flag that does not live in the instance dict (a property, say) is
        # invisible to the versions: compare those flags themselves.
        unwatched = [sub for sub in subs if "training" not in vars(sub)]
        flags = tuple(map(training, unwatched))
        meta = tuple(zip(map(tensor_meta, tensors), map(stride_of, tensors)))
        tensor_guard = _guard(tensors)
        roots = mods
        return tensors

    def _model_tensors(mods: tuple[Any, ...]) -> list[Any]:
        nonlocal tensor_guard
        if (
            roots is not None
            and all(map(_is, mods, roots))
            and not any(empty_dicts)
            and tuple(map(_dict_version, dicts)) == versions
            and tuple(map(type, subs)) == sub_types
            and tuple(map(training, unwatched)) == flags
            and (
                not shallow
                or all(map(_same_items, map(shallow_contents, shallow), shallow_snapshot))
            )
            and (not func_holders or _functions_unchanged())
        ):
            if tensor_guard.check(*tensors):
                return tensors
            if tuple(zip(map(tensor_meta, tensors), map(stride_of, tensors))) == meta:
                tensor_guard = _guard(tensors)
                return tensors
        return _verify_model(mods)

    def _refuse_unaliased(leaves: list[Any]) -> NoReturn:
        for i, j, name, first in USER_INPUT_ALIASES:
            if leaves[i] is not leaves[j]:
                refuse(
                    f"precompile: {name} and {first} were one tensor at capture (the same "
                    f"object passed twice, as self-attention passes q, k and v), and this "
                    f"call passes different tensors there. The trace saw one value, so the "
                    f"graph reads only one of these inputs for both. Pass the same "
                    f"tensor there, or capture with distinct tensors (an artifact captured "
                    f"so also serves calls that pass one tensor in several places)",
                    3,
                )
        raise AssertionError("unreachable: some aliased input differs")

    def _inputs_as_captured(tensors_in: tuple[Any, ...]) -> bool:
        """Whether the call's tensors have the captured shape, dtype, device (and
        requires_grad where it is compared) and, where the graph bakes them, strides. First one C-level guard
        built from the last tensors that passed the comparison below (it checks all of
        that and more: a pass implies the comparison passes); on a miss, the comparison
        itself, which rebuilds the guard when it passes."""
        nonlocal input_guard
        if input_guard is not None and input_guard.check(*tensors_in):
            return True
        if tuple(map(input_meta, tensors_in)) != expected_inputs or (
            check_input_strides and tuple(map(stride_of, tensors_in)) != expected_input_strides
        ):
            return False
        input_guard = _guard(list(tensors_in))
        return True

    def checked_inputs(
        args: tuple[Any, ...], kwargs: dict[str, Any], running: bool = True
    ) -> tuple[list[Any], Any]:
        """Every check of a call; the graph's flat inputs and the user's tensors (an
        input in another layout copied for Inductor only when ``running`` the graph)."""
        if function_mode_depth() or dispatch_mode_depth() or captured_modes:
            check_ambient_modes(captured_modes, MODES_SEE_OPS)
        if surface_ok is not None:
            surface_ok()
        if builtins_scopes and _dict_version(builtins_scopes[0][0]) != builtins_seen[0]:
            # First: the checks below call builtins themselves (``len(args)``), and a
            # patched one would make them refuse for the wrong reason.
            check_globals(builtins_scopes, serving_context(identities))
            builtins_seen[0] = _dict_version(builtins_scopes[0][0])
        if kwargs or len(args) != n_args:
            if kwargs:
                refuse(
                    f"precompile: {FN_NAME} was captured with positional arguments only "
                    f"and got keyword arguments {sorted(kwargs)}; pass them positionally",
                    2,
                )
            refuse(
                f"precompile: {FN_NAME} takes {n_args} positional arguments (as captured) "
                f"but got {len(args)}",
                2,
            )
        mods = pick_modules(args)
        user = pick_user(args)
        if flat_inputs:
            leaves = user
        else:
            leaves, spec = _pytree.tree_flatten(user)
            if spec != in_spec and keyed_dicts:
                # Dicts fn read only by key, in another key order or with keys fn
                # never reads: served as the captured dicts.
                leaves, spec = _pytree.tree_flatten(_keyed_inputs(user, in_spec, keyed_dicts, [0]))
            if spec != in_spec:
                _describe_input_mismatch(leaves, False, spec, in_spec)
        try:
            tensors_in = pick_tensors(leaves)
            ok = (
                not has_dynamic
                and _inputs_as_captured(tensors_in)
                and (
                    not constant_slots
                    or tuple(map(literal_fingerprint, pick_constants(leaves))) == expected_constants
                )
                and not (inference_grad_inputs and is_grad_enabled())
            )
        except (AttributeError, IndexError, RuntimeError):
            ok = False
        if not ok:
            _describe_input_mismatch(list(leaves), True)
            tensors_in = pick_tensors(leaves)
            if (
                running
                and copy_layouts
                and tuple(map(stride_of, tensors_in)) != expected_input_strides
            ):
                tensors_in = _in_captured_layout(tensors_in)
        if alias_later and not all(map(_is, pick_alias_later(leaves), pick_alias_first(leaves))):
            _refuse_unaliased(list(leaves))
        state = _model_tensors(mods)
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
        if GRAD_ACCESS:
            for idx in grad_indices:
                if state[idx].grad is not None:
                    refuse(
                        f"precompile: parameter {PARAM_NAMES[idx]!r} already has a .grad, "
                        f"and fn reads or writes .grad ({GRAD_ACCESS[0]}: gradient "
                        f"clipping, an optimizer step, zero_grad); the trace saw no "
                        f"gradients there, so it would compute with the wrong ones. Clear "
                        f"them first (optimizer.zero_grad(set_to_none=True))",
                        5,
                    )
        flat = [*state, *tensors_in]
        if mutated_inputs:
            check_written_inputs(flat, mutated_inputs, mutation_labels)
        return flat, tensors_in

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

    def _requiring_grad(tensors_in: Any) -> str:
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
        flat, tensors_in = checked_inputs(args, kwargs)
        grad_was_enabled = _torch.is_grad_enabled()
        through_autograd = grad_was_enabled and autograd_run is not None
        run = _apply_flat if through_autograd else call
        if grad_was_enabled and not through_autograd:
            if grad_loss_unwarned[0]:
                what = _requiring_grad(tensors_in)
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
            message = _relabel_layout_error(error, [*tensors, *tensors_in])
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
                p = tensors[idx]
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
