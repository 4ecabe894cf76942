"""The input check of single-graph artifacts: a sub-builder of the driver, emitted as text.

``build_input_check`` computes once, at load, what the call's arguments must be (their
number, the captured pytree structure, each tensor's shape, dtype, device, and where the
graph depends on them requires_grad and strides, each Python value, the inputs that were
one tensor) and returns the closure ``single_graph._build_single_graph_forward`` calls
first on every call, after the ambient modes and the code checks. The helpers here
name the exact mismatch on the slow path. Emitted whole into every single-graph
artifact before ``single_graph`` (``capturing.carried.SingleGraph.DRIVER``), so like it
it imports nothing at module level and reads the artifact's names declared below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import torch as _torch

    # Bound by the artifact prelude (precompile._compat.prelude).
    _pytree: Any = None

    def _functorch_wrapped(tensor: Any) -> bool: ...

    def _functorch_grad_wrapped(tensor: Any) -> bool: ...

    # The artifact's metadata.
    AUTOGRAD: dict[str, Any] | None = None
    BACKEND: str = ""
    BUFFER_NAMES: list[str] = []
    FN_NAME: str = ""
    GRAPH_INPUT_STRIDES: list[tuple[int, ...] | None] = []
    IN_SPEC: str = ""
    INPUT_LAYOUT_COPY: list[str | None] = []
    KEYED_DICTS: list[bool] = []
    MODULE_POSITIONS: list[int] = []
    NUM_POSITIONAL_ARGS: int = 0
    PARAM_NAMES: list[str] = []
    STATE_READS: dict[str, str] = {}
    TRAINING: bool = False
    USER_INPUT_ALIASES: list[list[Any]] = []
    USER_INPUT_BOUNDS: list[dict[int, tuple[int | None, int | None]] | None] = []
    USER_INPUT_CONSTANTS: list[object] = []
    USER_INPUT_DEVICES: list[str | None] = []
    USER_INPUT_DTYPES: list[str | None] = []
    USER_INPUT_REQUIRES_GRAD: list[bool | None] = []
    USER_INPUT_SHAPE_IDS: list[dict[int, str] | None] = []
    USER_INPUT_SHAPES: list[tuple[int | None, ...] | None] = []

    # precompile.runtime.value_fingerprints and fingerprint_differences, emitted before
    # this module.
    def literal_fingerprint(value: Any) -> tuple[str, Any]: ...

    def describe_value(fp: Any) -> str: ...

    # guard_text.typed_value, emitted before this module.
    def typed_value(kind: str, shown: str) -> str: ...

    # precompile.runtime.single_graph, emitted after this module.
    def checks_layout() -> bool: ...

    def requires_grad_is_captured() -> bool: ...

    def metadata_guard(values: list[Any]) -> Any: ...

    def _memory_format(t: Any) -> str: ...

    def load_spec(text: str) -> Any: ...

    # precompile.runtime.refusal, emitted before this module.
    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...

    # precompile.runtime.single_graph_keyed_inputs, emitted before this module.
    def keyed_inputs(value: Any, spec: Any, keyed: list[bool], counter: list[int]) -> Any: ...

    def key_order_difference(spec: Any, expected: Any) -> str | None: ...

    def key_set_difference(spec: Any, expected: Any) -> str | None: ...


def check_strides(
    labels: list[str],
    tensors: list[Any],
    expected: list[Any],
    blockers: list[str | None] | None = None,
) -> None:
    """Raise naming the first tensor whose strides differ from the capture's. With
    ``blockers`` (user inputs of an Inductor graph, ``INPUT_LAYOUT_COPY``), a tensor
    whose blocker is None passes: the call serves it through a copy in the captured
    layout (``build_input_check``); any other blocker is why it cannot."""
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


def refuse_negative_bit(label: str, held: str, invariant: int) -> NoReturn:
    """Refuse a negative-bit tensor an Inductor graph would read as it lies, where a
    resolved copy cannot stand in for it (the graph ``held`` it so)."""
    refuse(
        f"precompile: {label} has its negative bit set (a lazy view such as "
        f"z.conj().imag), which Inductor's kernels do not apply: they read its storage, "
        f"which holds the values negated, and the graph {held}, so a resolved copy "
        f"cannot stand in for it. Pass t.resolve_neg()",
        invariant,
    )


def check_tensor_types(labels: list[str], tensors: list[Any], invariant: int) -> None:
    """Raise naming the first tensor whose Python type is neither ``torch.Tensor`` nor
    ``nn.Parameter``: the only types a capture takes (``capturing.fx_inputs.check_tensor``
    refuses subclasses), and the only ones whose every op the graph's ATen ops stand
    for. A subclass (its ``__torch_function__``, ``__torch_dispatch__`` or a method it
    overrides) may compute otherwise in eager, where the graph would run on its data
    as if it were plain. A Parameter where a tensor was captured (or the reverse)
    changes nothing the graph computes, so both are served. A tensor with its conjugate
    bit set is refused too, and on Inductor a parameter or buffer with its negative bit
    set (``z.conj().imag``): Inductor's kernels read a tensor's storage as it lies, where
    the bit says to negate it (an input is served through a resolved copy where one can
    stand in for it: ``checked_call``). Called on the slow paths only: the C-level guards
    of the fast paths compare each tensor's exact type and dispatch keys."""
    served = (_torch.Tensor, _torch.nn.Parameter)
    for label, t in zip(labels, tensors):
        if _functorch_grad_wrapped(t) or (BACKEND == "inductor" and _functorch_wrapped(t)):
            # grad's wrapper: the graph runs without autograd, which grad would need to
            # see its operations (its gradient would be zero). Any transform's on
            # Inductor: compiled kernels read the wrapped data outside the transform. (A
            # vmap of the eager backend's ATen graph goes through each op's batching
            # rule, as eager does: served.)
            refuse(
                f"precompile: {label} is a tensor a torch.func transform (grad, vmap, jvp, "
                f"...) wrapped, but the capture saw a plain one there; this artifact runs "
                f"its operations outside the transform, which would not see them "
                f"(torch.func.grad of the call would be zero). Call fn eagerly under the "
                f"transform",
                invariant,
            )
        if BACKEND == "inductor" and invariant == 2 and t.is_neg():
            refuse_negative_bit(label, "holds it as model state", invariant)
        if t.is_conj():
            # A lazy view the capture never takes (capturing.fx_inputs.check_tensor):
            # eager resolves the bit where an op needs it; ops make_fx decomposed into
            # (``z.real`` is ``view_as_real``) refuse an unresolved one, or read its
            # data as it lies. (A negative bit is resolved by every op's dispatch.)
            refuse(
                f"precompile: {label} has its conjugate bit set (a lazy z.conj() view), "
                f"but the capture saw a resolved tensor there, and the graph's operations "
                f"do not resolve it as eager's do. Pass z.resolve_conj()",
                invariant,
            )
        kind = type(t)
        if kind not in served:
            base = "nn.Parameter" if isinstance(t, _torch.nn.Parameter) else "torch.Tensor"
            refuse(
                f"precompile: {label} is a {kind.__module__}.{kind.__qualname__}, a "
                f"subclass of {base}, but the capture saw a plain torch.Tensor or nn.Parameter there; the "
                f"graph runs torch's own ops on its data, where eager runs the subclass's "
                f"overrides (__torch_function__, __torch_dispatch__, its methods). Pass a "
                f"plain tensor (t.as_subclass(torch.Tensor), or nn.Parameter(t.detach()) "
                f"for a parameter); precompile does not capture tensor subclasses",
                invariant,
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
        stacklevel=6,  # the user's call of the loaded runnable
    )


def _describe_input_mismatch(
    leaves: list[Any], spec_matches: bool, spec: Any = None, expected_spec: Any = None
) -> None:
    """Raise the precise invariant-3/6 message for user inputs that differ from the
    traced example; return quietly if they match."""
    order = None if spec is None else key_order_difference(spec, expected_spec)
    if not spec_matches and order:
        refuse(
            f"precompile: {order}; the capture flattened it in key order, so its values "
            f"would meet the graph in the wrong places. Pass its keys in the captured "
            f"order, or capture again",
            3,
        )
    keys = None if spec is None else key_set_difference(spec, expected_spec)
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
        check_tensor_types([f"input {i}"], [leaf], 3)
        if type(leaf) is not _torch.Tensor and "class" in STATE_READS:
            refuse(
                f"precompile: input {i} is a {type(leaf).__module__}.{type(leaf).__name__} "
                f"and fn reads its inputs' classes ({STATE_READS['class']}); the trace "
                f"took a plain tensor's branch there, where eager may take another. Pass "
                f"a plain tensor (x.detach()), or capture with DynamoTracer",
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
    if checks_layout():
        n_state = len(PARAM_NAMES) + len(BUFFER_NAMES)
        labels = [f"input {i}" for i, s in enumerate(USER_INPUT_SHAPES) if s is not None]
        # Only Inductor's inputs may be copied into the captured layout: the eager
        # graph checks strides only where fn read a layout, and then refuses.
        check_strides(
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


def _picker(positions: tuple[int, ...]) -> Any:
    """A C-level ``seq -> seq[i] for i in positions``, as a tuple (a list where ``seq``
    is one). itemgetter returns a bare item for one position: that case, and none, take
    a slice, still one C call (a Python wrapper was a frame per pick, three a call).
    Every caller picks from a sequence whose length it has checked (the arguments'
    count, the leaves' spec): a slice past the end would come back short, where an
    index raises."""
    from operator import itemgetter

    if len(positions) == 1:
        return itemgetter(slice(positions[0], positions[0] + 1))
    if not positions:
        return itemgetter(slice(0, 0))
    return itemgetter(*positions)


def build_input_check() -> (
    Callable[
        [tuple[Any, ...], dict[str, Any], bool],
        tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]],
    ]
):
    """Compute once what a call's arguments must be, and return ``checked_call(args,
    kwargs, running)``: it refuses a call whose arguments the graph cannot take as
    captured, naming the exact mismatch, and returns the module arguments, the tensors
    for the graph (an input in another layout copied into the captured one for
    Inductor, only when ``running`` the graph; a negative view resolved) and the
    caller's own tensors (the same tuple where nothing was copied). What the caller's
    tensors share with each other and with the model's is checked on them, never on a
    copy: a copy of ``x`` made before the graph writes a buffer ``x`` views would read
    the buffer's old values where eager reads the new ones. The fast path compares the
    inputs' (shape, dtype, device, requires_grad where compared, strides where baked) as
    one tuple, through a C-level guard built from the last tensors that passed."""
    from operator import attrgetter
    from operator import is_ as _is
    from typing import cast

    n_args = NUM_POSITIONAL_ARGS
    module_positions = tuple(MODULE_POSITIONS)
    user_positions = tuple(i for i in range(n_args) if i not in set(module_positions))
    in_spec = load_spec(IN_SPEC)
    keyed_dicts = list(KEYED_DICTS) if any(KEYED_DICTS) else []
    flat_inputs = in_spec == _pytree.tree_structure(tuple(0 for _ in user_positions))
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
    # Where fn reads its inputs' classes, each must be a plain tensor, as the trace saw.
    reads_class = "class" in STATE_READS
    input_meta = attrgetter(
        "shape",
        "dtype",
        "device",
        *(("requires_grad",) if grad_flags_fixed else ()),
        *(("__class__",) if reads_class else ()),
    )
    reads_requires_grad = "requires_grad" in STATE_READS
    # An inference artifact expecting an input that requires grad serves it only with
    # grad mode off.
    inference_grad_inputs = (
        not TRAINING
        and AUTOGRAD is None
        and any(USER_INPUT_REQUIRES_GRAD[i] for i in tensor_slots if reads_requires_grad)
    )
    is_grad_enabled = _torch.is_grad_enabled
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
            # is expected, and grad mode is checked on its own, by the ambient check),
            # or carries the backward (AUTOGRAD: another value takes the slow path,
            # which serves or refuses it).
            bool(
                (TRAINING or reads_requires_grad or AUTOGRAD is not None)
                and USER_INPUT_REQUIRES_GRAD[i]
            ),
        )[: 4 if grad_flags_fixed else 3]
        + ((_torch.Tensor,) if reads_class else ())
        for i in tensor_slots
        if not has_dynamic
    )
    # Inductor bakes every graph input's strides (and may return a view of an input
    # built from them), whether or not its own asserts stayed on at capture: compare
    # them per call. The eager graph runs ATen ops, which take any layout.
    stride_of = _torch.Tensor.stride if checks_layout() else type
    n_state = len(PARAM_NAMES) + len(BUFFER_NAMES)
    expected_input_strides = tuple(GRAPH_INPUT_STRIDES[n_state:]) if checks_layout() else ()
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

    def _resolved_negative_bits(tensors_in: Any) -> Any:
        """Each negative-bit input as a resolved copy (its values as they read, in
        storage), which Inductor's kernels read right; refused where the graph writes the
        input or returns a view of it (``INPUT_LAYOUT_COPY``), which a copy would cut
        from the caller's tensor."""
        resolved = list(tensors_in)
        for k, t in enumerate(tensors_in):
            if t.is_neg():
                if k >= len(INPUT_LAYOUT_COPY) or INPUT_LAYOUT_COPY[k] is not None:
                    refuse_negative_bit(
                        f"input {tensor_slots[k]}", "writes it or returns a view of it", 3
                    )
                resolved[k] = t.resolve_neg()
        return tuple(resolved)

    # The user's tensors of the last call that matched the capture, as a C-level guard
    # (it compares each tensor's exact Python type too: a tensor subclass misses it, and
    # the comparison below sends it to the slow path, which refuses it).
    input_guard: Any = None
    served_types = {_torch.Tensor, _torch.nn.Parameter}
    # Inputs that were one tensor at capture (q, k and v of self-attention): the graph
    # reads one of them for all, so each call must pass one tensor there too.
    alias_later = tuple(i for i, _, _, _ in USER_INPUT_ALIASES)
    alias_first = tuple(j for _, j, _, _ in USER_INPUT_ALIASES)
    pick_alias_later = _picker(alias_later)
    pick_alias_first = _picker(alias_first)

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
        if (
            tuple(map(input_meta, tensors_in)) != expected_inputs
            or not set(map(type, tensors_in)) <= served_types
            # A lazy conjugate view (the slow path refuses it), or on Inductor a
            # negative one (the slow path resolves or refuses it): the guard compares
            # dispatch keys, and this comparison must too.
            or any(t.is_conj() or (BACKEND == "inductor" and t.is_neg()) for t in tensors_in)
            # A torch.func transform's wrapper (the guard sees its dispatch keys).
            or any(map(_functorch_wrapped, tensors_in))
            or (check_input_strides and tuple(map(stride_of, tensors_in)) != expected_input_strides)
        ):
            return False
        input_guard = metadata_guard(list(tensors_in))
        return True

    def checked_call(
        args: tuple[Any, ...], kwargs: dict[str, Any], running: bool
    ) -> tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]:
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
                leaves, spec = _pytree.tree_flatten(keyed_inputs(user, in_spec, keyed_dicts, [0]))
            if spec != in_spec:
                _describe_input_mismatch(leaves, False, spec, in_spec)
        try:
            tensors_in = pick_tensors(leaves)
            ok = (
                not has_dynamic
                # The guard first, in this frame (the common case), then the comparison.
                and (
                    (input_guard is not None and input_guard.check(*tensors_in))
                    or _inputs_as_captured(tensors_in)
                )
                and (
                    not constant_slots
                    or tuple(map(literal_fingerprint, pick_constants(leaves))) == expected_constants
                )
                and not (inference_grad_inputs and is_grad_enabled())
            )
        except (AttributeError, IndexError, RuntimeError):
            ok = False
        if ok:
            callers = tensors_in
        else:
            _describe_input_mismatch(list(leaves), True)
            tensors_in = callers = pick_tensors(leaves)
            if BACKEND == "inductor" and any(t.is_neg() for t in tensors_in):
                tensors_in = _resolved_negative_bits(tensors_in)
            if (
                running
                and copy_layouts
                and tuple(map(stride_of, tensors_in)) != expected_input_strides
            ):
                unwarned = layout_copy_unwarned[0]
                tensors_in = _in_captured_layout(tensors_in)
                if unwarned and not layout_copy_unwarned[0]:
                    # Its warning ran user code (a warnings hook) after the inputs
                    # were checked, and the graph code trusts what they proved (an
                    # Inductor graph does not repeat their size asserts): this once,
                    # check the call again.
                    return checked_call(args, kwargs, running)
        if alias_later and not all(map(_is, pick_alias_later(leaves), pick_alias_first(leaves))):
            _refuse_unaliased(list(leaves))
        return mods, tensors_in, callers

    return checked_call
