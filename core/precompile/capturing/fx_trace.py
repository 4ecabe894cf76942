"""Single-graph capture: one ``make_fx`` trace of ``fn`` on fake tensors.

Every refusal names what is wrong, the invariant it breaks, and the user line at fault:
the tensors of the example call are never computed on or mutated here, and anything the
artifact could not reproduce faithfully is refused before an artifact exists. What
``fn`` and its arguments may be is checked first (``fx_inputs``); what the trace and its
graph may hold is refused through ``fx_refusals``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch.overrides import TorchFunctionMode

from precompile._compat import tracing
from precompile._compat.tracing import pytree
from precompile.capturing import (
    call_context,
    collector,
    fx_dependencies,
    fx_keyed_inputs,
    fx_side_effects,
    fx_tensor_attributes,
    fx_watch,
    hook_stores,
    neutral_reads,
    user_state,
)
from precompile.capturing.bytecode_names import builtin_loads
from precompile.capturing.fx_dependencies import Dependencies
from precompile.capturing.fx_inputs import (
    LITERAL_TYPES,
    check_fn_holds_no_state,
    check_spec_serializable,
    check_tensor,
    fn_location,
    leaf_names,
    registration_hint,
    split_args,
)
from precompile.capturing.fx_lifting import LiftedState, lift_module_state, module_training_flags
from precompile.capturing.fx_refusals import (
    TraceRefusal,
    check_grad_inputs_capture,
    check_graph,
    refuse_from_exception,
)
from precompile.errors import PrecompileError
from precompile.locations import StackFrame, is_user_file
from precompile.runtime import state_checks


@dataclasses.dataclass
class SingleGraph:
    """A traced computation and everything the emitter and the driver need about it."""

    graph_module: torch.fx.GraphModule
    lifted: LiftedState
    num_args: int
    module_positions: list[int]
    module_training: list[list[tuple[str, bool | None]]]
    in_spec: Any
    out_spec: Any
    user_leaves: list[Any]
    grad_param_indices: list[int]
    node_stacks: dict[str, list[StackFrame]]
    training: bool
    #: Per input leaf, its dims marked with mark_unbacked: {dim: (min, max, shape_id)}.
    dynamic_dims: dict[int, dict[int, tuple[int | None, int | None, str | None]]] = (
        dataclasses.field(default_factory=dict)
    )
    #: Every project function the trace ran through (whether or not it made a node).
    functions_run: list[types.CodeType] = dataclasses.field(default_factory=list)
    #: The Python state the trace read (module types, attributes, globals, hooks).
    dependencies: Dependencies | None = None
    #: Where fn read or wrote a parameter's ``.grad`` (it saw none at capture).
    grad_access: list[str] = dataclasses.field(default_factory=list)
    #: State user code read that the graph does not take as an input, by kind
    #: ("grad_mode", "requires_grad", "layout"): "what at FILE:LINE".
    reads: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Per dict of ``in_spec`` (pre-order), whether fn read it only by key
    #: (``keyed_inputs``): a call may pass its keys in another order, or extra ones.
    keyed_dicts: list[bool] = dataclasses.field(default_factory=list)
    #: The ambient torch.autocast state of the capture (its casts are in the graph).
    autocast: tuple[tuple[str, str], ...] = ()
    #: The torch-function and dispatch modes active around the capture
    #: (``state_checks.ambient_modes``): each call is compared with them.
    ambient_modes: tuple[str, ...] = ()
    #: An inference capture of inputs that require grad (grad mode on): the artifact
    #: serves eager's autograd through a captured forward and backward graph.
    grad_inputs: bool = False
    #: Per output leaf, whether the trace's output required grad (as eager's would).
    output_requires_grad: list[bool] = dataclasses.field(default_factory=list)
    #: For ``grad_inputs``: the traced flat function, the real tensors it takes (state,
    #: then the user's tensors) and the tracer's decompositions, for the joint trace.
    joint_inputs: tuple[Callable[..., Any], list[torch.Tensor], Any] | None = None
    #: Per input leaf, where it sits in the user's call: ``x``, ``batch['ids']``,
    #: ``xs[1]`` (fn's parameter name, then the path into the container).
    input_names: list[str] = dataclasses.field(default_factory=list)
    #: Whether the tracer applied decompositions: the graph's operations are then not
    #: those eager dispatches (``MODES_SEE_OPS``).
    decomposed: bool = False

    @property
    def user_tensors(self) -> list[torch.Tensor]:
        return [leaf for leaf in self.user_leaves if isinstance(leaf, torch.Tensor)]

    def graph_input_strides(self) -> list[tuple[int, ...] | None]:
        """Each graph input's traced strides, None where they depend on a dynamic dim."""
        strides = []
        for node in self.graph_module.graph.nodes:
            if node.op == "placeholder":
                stride = tuple(node.meta["val"].stride())
                strides.append(None if tracing.has_symbols(stride) else stride)
        return strides

    def source_files(self) -> list[str]:
        files = {f.file for frames in self.node_stacks.values() for f in frames}
        return sorted(files)

    def op_count(self) -> int:
        return sum(1 for n in self.graph_module.graph.nodes if n.op == "call_function")


#: torch's Python wrappers between a user's call and a torch-function mode (make_fx's
#: own mode forwards every call to the next one).
_TORCH_WRAPPER_FILES = (
    os.path.join("torch", "overrides.py"),
    os.path.join("torch", "_tensor.py"),
    os.path.join("torch", "fx", "experimental", "proxy_tensor.py"),
    os.path.join("torch", "utils", "_python_dispatch.py"),
)


class _RefuseOpaqueAccess(TorchFunctionMode):
    """Fake tensors have no storage: reading a pointer or a NumPy view of one would be
    silently meaningless (data_ptr only warns), so refuse those accesses outright."""

    _REFUSED: ClassVar[dict[Any, str]] = {
        torch.Tensor.data_ptr: ".data_ptr()",
        torch.Tensor.numpy: ".numpy()",
    }
    #: Reading a real (non-fake) tensor's value during the trace bakes it as a Python
    #: number: such a tensor is neither an input nor a parameter or buffer.
    _VALUE_READS: ClassVar[dict[Any, str]] = {
        torch.Tensor.item: ".item()",
        torch.Tensor.tolist: ".tolist()",
        torch.Tensor.__bool__: "bool()",
        torch.Tensor.__int__: "int()",
        torch.Tensor.__float__: "float()",
        torch.Tensor.__index__: "an index",
        torch.Tensor.__complex__: "complex()",
    }

    #: Tensor methods that read an input's memory layout: Python branching on one bakes
    #: the layout of the capture (the eager graph itself runs on any layout).
    _LAYOUT_READS: ClassVar[dict[Any, str]] = {
        torch.Tensor.is_contiguous: ".is_contiguous()",
        torch.Tensor.stride: ".stride()",
        torch.Tensor.storage_offset: ".storage_offset()",
        torch.Tensor.dim_order: ".dim_order()",
    }

    def __init__(self) -> None:
        super().__init__()
        #: What user code read that the graph cannot see: kind -> "what at FILE:LINE".
        self.reads: dict[str, str] = {}
        #: ids of the traced function's tensor inputs (parameters, buffers, user
        #: tensors): the requires_grad of any other tensor follows the grad mode.
        self.inputs: set[int] = set()
        #: ids of fn's own tensor arguments (not the model's state): the ones a caller
        #: may pass as an nn.Parameter.
        self.user_inputs: set[int] = set()

    def _note_read(self, kind: str, what: str) -> None:
        """Record ``kind`` when user code itself made the read (torch's own code reads
        layouts and requires_grad all the time, for the same result in every call)."""
        if kind in self.reads:
            return
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.endswith(_TORCH_WRAPPER_FILES):
            frame = frame.f_back  # type: ignore[assignment]  # None ends the walk
        if frame is not None and is_user_file(frame.f_code.co_filename):
            self.reads[kind] = f"{what} at {frame.f_code.co_filename}:{frame.f_lineno}"

    def note_class_check(self, instance: Any, frame: types.FrameType) -> None:
        """``isinstance(x, nn.Parameter)`` asked by user code of one of fn's inputs: the
        trace's fake input is never a Parameter, so the answer is the plain tensor's."""
        if "class" not in self.reads and id(instance) in self.user_inputs:
            if is_user_file(frame.f_code.co_filename):
                self.reads["class"] = (
                    f"isinstance(..., nn.Parameter) of an input at "
                    f"{frame.f_code.co_filename}:{frame.f_lineno}"
                )

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        layout = self._LAYOUT_READS.get(func)
        if layout is not None:
            self._note_read("layout", layout)
        elif getattr(func, "__self__", None) is tracing.requires_grad_descriptor:
            if args and (id(args[0]) in self.inputs or not isinstance(args[0], tracing.FakeTensor)):
                # An input's, or a real tensor's (one fn did not compute: a parameter
                # a module holds in a plain attribute): its flag as the caller set it.
                self._note_read("requires_grad", ".requires_grad")
            else:
                # A tensor fn computed requires grad exactly when grad mode is on and
                # an input of it does: a read of it is a read of the grad mode.
                self._note_read("grad_mode", ".requires_grad of a tensor fn computed")
        read = self._VALUE_READS.get(func)
        if (
            read is not None
            and args
            and isinstance(args[0], torch.Tensor)
            and not isinstance(args[0], tracing.FakeTensor)
        ):
            t = args[0]
            raise TraceRefusal(
                f"fn reads the value of a tensor that is not an input ({read} of a tensor of "
                f"shape {tuple(t.shape)} and dtype {t.dtype}: a plain module attribute, a "
                f"global or a closure variable); the artifact would bake the value it had "
                f"at capture",
                1,
                "pass it as an argument of fn, or register it on a module argument with "
                "register_buffer / nn.Parameter",
            )
        what = self._REFUSED.get(func)
        if what is not None:
            raise TraceRefusal(
                f"fn calls {what} on a tensor; a capture records tensor operations, and "
                f"{what} leaves the graph (its result would be frozen at capture)",
                4,
                "keep the computation in torch operations, or do this outside fn",
            )
        return func(*args, **(kwargs or {}))


def _read_training_flags(
    module: torch.nn.Module, reads: list[list[Any] | None]
) -> list[tuple[str, bool | None]]:
    """``MODULE_TRAINING`` of one module argument: each submodule's training flag where
    the trace read it (dropout, batch norm, a user's ``if self.training``) or could not
    tell (reads unseen); None where it did not, which no ``train()`` can change."""
    return [
        (name, flag if seen is None or "training" in seen else None)
        for (name, flag), seen in zip(module_training_flags(module), reads)
    ]


@collector.paused()  # from the walk of the user's state to its put-back (``collector``)
def trace_single_graph(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    training: bool,
    decompositions: dict[Any, Callable[..., Any]] | None = None,
) -> SingleGraph:
    where = fn_location(fn)
    check_fn_holds_no_state(fn)
    inner = tracing.active_trace()
    if inner:
        raise PrecompileError(
            f"capture was called inside {inner}",
            location=where,
            hint="call precompile.capture at top level, outside other traces",
        )
    module_positions, modules, leaves, in_spec = split_args(args, where)
    lifted = lift_module_state(modules)
    for name, tensor in zip(lifted.names, lifted.tensors):
        check_tensor(tensor, f"parameter/buffer {name!r}", where)
    tensor_slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    # An inference capture of an input that requires grad, under grad mode: eager's
    # outputs carry its gradient, so the artifact carries the backward too (captured by
    # AOTAutograd at lowering, from ``joint_inputs``) and the trace runs with grad on.
    grad_inputs = (
        not training
        and torch.is_grad_enabled()
        and any(leaves[i].requires_grad for i in tensor_slots)
    )
    n_state = len(lifted.tensors)
    grad_param_indices: list[int] = []
    out_spec_box: list[Any] = []
    out_requires_grad: list[bool] = []
    opaque = _RefuseOpaqueAccess()
    argument_changes: list[str] = []
    # Reads of a tensor's Python attributes its stand-in lacks (fx_tensor_attributes).
    attribute_reads: list[str] = []
    # The input dicts fn observed beyond values by key (keyed_inputs).
    dicts_observed: set[int] = set()

    def flat_fn(*flat: torch.Tensor) -> list[Any]:
        state, user_tensors = flat[:n_state], flat[n_state:]
        opaque.inputs = set(map(id, flat))
        opaque.user_inputs = set(map(id, user_tensors))
        call_leaves = list(leaves)
        for slot, t in zip(tensor_slots, user_tensors):
            call_leaves[slot] = t
        user_values = fx_keyed_inputs.watch_dicts(
            pytree.tree_unflatten(call_leaves, in_spec), dicts_observed
        )
        user_args = iter(user_values)
        call_args = [
            args[i] if i in module_positions else next(user_args) for i in range(len(args))
        ]
        kinds = ["parameter" if k < lifted.num_params else "buffer" for k in range(n_state)]
        with fx_keyed_inputs.quiet():
            watch = fx_side_effects.ArgumentWatch(
                [(f"{kind} {name!r}", t) for kind, name, t in zip(kinds, lifted.names, state)]
                + [(f"input value {slot}", t) for slot, t in zip(tensor_slots, user_tensors)],
                [(i, a) for i, a in enumerate(call_args) if i not in module_positions],
                [
                    (f"{kinds[k]} {lifted.qualified(mi, name)!r}", modules[mi], name, state[k])
                    for k, names in enumerate(lifted.aliases)
                    for mi, name in names
                ],
            )
        with contextlib.ExitStack() as stack:
            for mi, module in enumerate(modules):
                swap = {
                    name: state[k]
                    for k, names in enumerate(lifted.aliases)
                    for m, name in names
                    if m == mi
                }
                stack.enter_context(fx_watch.unrecorded(tracing.reparametrized(module, swap)))
            stack.enter_context(
                fx_tensor_attributes.watching_reads(
                    [
                        (f"{kind} {name!r}", real, t)
                        for kind, name, real, t in zip(kinds, lifted.names, lifted.tensors, state)
                    ]
                    + [
                        (f"input value {slot}", leaves[slot], t)
                        for slot, t in zip(tensor_slots, user_tensors)
                    ],
                    attribute_reads,
                )
            )
            entered = call_context.snapshot()
            out = fx_keyed_inputs.plain(fx_watch.traced_call(fn, call_args))
            call_context.refuse_left_changed(entered, fn)
            call_context.refuse_grad_mode_left(
                ran.grad_trail, fn, training or grad_inputs, "grad_mode" in ran.reads
            )
            with fx_keyed_inputs.quiet():
                argument_changes[:] = watch.changes()
        out_leaves, out_spec = pytree.tree_flatten(out)
        out_spec_box.append(out_spec)
        for i, leaf in enumerate(out_leaves):
            if not isinstance(leaf, (torch.Tensor, *LITERAL_TYPES)):
                raise TraceRefusal(
                    f"fn returned a {type(leaf).__name__} (output value {i}); outputs are "
                    f"tensors and Python literals, in lists, tuples, dicts and registered "
                    f"pytree containers",
                    3,
                    "return tensors (or literals) only" + registration_hint(type(leaf)),
                )
        for k in range(lifted.num_params, n_state):
            if state[k].grad is not None:
                raise TraceRefusal(
                    f"buffer {lifted.names[k]!r} received a gradient; only parameter "
                    f"gradients are accumulated by an artifact",
                    5,
                    "register it as a parameter, or keep it out of the backward",
                )
        for slot, t in zip(tensor_slots, user_tensors):
            if t.grad is not None:
                raise TraceRefusal(
                    f"input value {slot} received a gradient in a backward inside fn; an "
                    f"artifact accumulates parameter gradients only",
                    5,
                    "compute input gradients with torch.autograd.grad and return them",
                )
        grads = [state[k].grad for k in range(lifted.num_params)]
        grad_param_indices[:] = [k for k, g in enumerate(grads) if g is not None]
        out_requires_grad[:] = [
            isinstance(leaf, torch.Tensor) and leaf.requires_grad for leaf in out_leaves
        ]
        if (
            training
            and not grad_param_indices
            and any(isinstance(leaf, torch.Tensor) and leaf.requires_grad for leaf in out_leaves)
        ):
            raise TraceRefusal(
                "training=True but fn ran no backward, and its outputs require grad; an "
                "artifact runs without autograd, so a backward outside fn would see no "
                "graph",
                5,
                "call loss.backward() inside fn, or capture with training=False",
            )
        return [*out_leaves, *(g for g in grads if g is not None)]

    dynamic_dims = {i: tracing.unbacked_marks(leaves[i]) for i in tensor_slots}
    dynamic_dims = {i: marks for i, marks in dynamic_dims.items() if marks}
    # The trace starts with no gradients on the parameters (an existing .grad would
    # become a constant of the graph): served calls accumulate onto .grad like eager.
    state_tensors = [_without_grad(t) for t in lifted.tensors]
    if dynamic_dims:
        fake_mode, fakes = tracing.dynamic_fakes(state_tensors, [leaves[i] for i in tensor_slots])
    else:
        fake_mode = tracing.fake_mode()
        fakes = [fake_mode.from_tensor(t) for t in state_tensors]
        fakes += [fake_mode.from_tensor(leaves[i]) for i in tensor_slots]
    # The user's Python state, put back once the trace's stores into it are checked:
    # what the trace stored there holds fake tensors, and no served call stores.
    roots = user_state.capture_roots(fn, args)
    user = user_state.UserState(roots)
    before = fx_side_effects.Snapshot(modules)
    hook_states = hook_stores.global_hook_states()
    neutral_positions: dict[tuple[int, str], list[tuple[Any, types.CodeType]]] = {}
    flag_readers: dict[tuple[int, str], set[tuple[types.CodeType, int]]] = {}
    outside_classes: set[type] = set()
    autocast = state_checks.autocast_state()
    ambient_modes = state_checks.ambient_modes()
    try:
        with (
            # First, so that it exits last: the recorders are off when it puts back.
            user_state.restored_on_error(user),
            user.recording_imports(),
            tracing.recording_user_stacks(flat_fn.__code__) as stack_of,
            tracing.recording_grad_access(
                lambda frame: frame.f_code.co_filename != __file__
            ) as grad_access,
            fx_watch.recording_calls() as ran,
            fx_watch.recording_module_reads(
                modules, neutral_positions, flag_readers, outside_classes
            ) as module_reads,
            tracing.recording_parameter_checks(opaque.note_class_check),
        ):
            with fake_mode, opaque, torch.set_grad_enabled(training or grad_inputs):
                gm = tracing.make_fx(
                    flat_fn,
                    decomposition_table=decompositions,
                    record_stack_traces=True,
                )(*fakes)
            node_stacks = {
                n.name: stack_of(n.meta.get("stack_trace"))
                for n in gm.graph.nodes
                if n.op in ("call_function", "get_attr")
            }
    except PrecompileError:
        raise
    except Exception as error:
        if attribute_reads:  # the read raised, as it would have, or took another path
            raise fx_tensor_attributes.refusal(attribute_reads) from error
        raise refuse_from_exception(error, training) from error
    try:
        if attribute_reads:
            raise fx_tensor_attributes.refusal(attribute_reads)
        hook_stores.refuse_global_hook_stores(hook_states)
        check_graph(gm, node_stacks, fn, modules)
        check_spec_serializable(out_spec_box[-1], "fn's outputs", where)
        names = fx_watch.read_names(ran)
        # The snapshot's words (a global named by the code that stored, a module
        # attribute) and any store into the user's state the walk recorded (a hook's
        # closure list, a deque, a slot, a closure cell, a deep container, C state: an
        # array's, a generator's): the walk's first, which name where the object is
        # (``fn's arguments: [0].rng (a Random)``), then the snapshot's others.
        changes = before.changed_during(modules, names, ran) + argument_changes
        walked = user.changed()[:3] if changes else []
        changes = walked + [c for c in changes if not any(c in w for w in walked)]
        fx_side_effects.refuse_trace_side_effects(changes or user.changed()[:3], where)
    finally:
        user.restore()
    reads = {**ran.reads, **opaque.reads}
    if "class" not in reads:
        # type(x) and x.__class__ name no tensor the trace can see: any in the project's
        # code that ran counts as a read of its inputs' classes (more refusals, never
        # fewer; a library's isinstance of an input is seen above).
        for code in ran.project_codes():
            what = "type()" if "type" in builtin_loads(code) else None
            what = ".__class__" if "__class__" in code.co_names else what
            if what is not None:
                reads["class"] = (
                    f"{what} in {code.co_qualname} at {code.co_filename}:{code.co_firstlineno}"
                )
                break
    parameter_inputs = [i for i in tensor_slots if type(leaves[i]) is not torch.Tensor]
    if "class" in reads and parameter_inputs:
        raise PrecompileError(
            f"fn reads the class of its inputs ({reads['class']}) and input "
            f"{parameter_inputs[0]} is an nn.Parameter; make_fx traces every input as a "
            f"plain tensor, so the trace took a plain tensor's branch where eager takes "
            f"the Parameter's",
            invariant=3,
            location=where,
            hint="pass a plain tensor (x.detach()) at capture and when serving, or "
            "capture with DynamoTracer, which traces the Parameter as one",
        )
    if "environ" in reads:
        raise PrecompileError(
            f"fn reads the process environment ({reads['environ']}); the value it read at "
            f"capture is baked into the graph, and a served call would not read it again",
            invariant=3,
            location=where,
            hint="read it outside fn and pass it as an argument: a number or string "
            "argument is checked per call, a tensor is an input",
        )
    if "random" in reads:
        raise PrecompileError(
            f"fn draws from Python's random module ({reads['random']}); the number drawn "
            f"at capture is baked into the graph, and every served call would reuse it",
            invariant=3,
            location=where,
            hint="draw with torch (torch.rand, torch.randint: graph operations), or draw "
            "outside fn and pass the value as an argument",
        )
    if "process" in reads:
        raise PrecompileError(
            f"fn asks the process for a value no argument carries ({reads['process']}); "
            f"the answer at capture is baked into the graph, and a served call would not "
            f"ask again: another time, process, thread, machine, file or hash seed would "
            f"get the capture's answer",
            invariant=3,
            location=where,
            hint="ask outside fn and pass the answer as an argument: a number or string "
            "argument is checked per call, a tensor is an input (for a stable hash of a "
            "string, zlib.crc32 or hashlib)",
        )
    if "reseed" in reads:
        raise PrecompileError(
            f"fn reseeds torch's random number generator ({reads['reseed']}); the graph "
            f"holds the random draws that follow but not the reseed, so every served call "
            f"would draw from wherever the generator stands instead of from the seed",
            invariant=3,
            location=where,
            hint="seed outside fn (torch.manual_seed before the call draws the same "
            "numbers from the artifact as from eager), or capture with DynamoTracer, "
            "which replays the reseed",
        )
    if "inference_mode" in reads and torch.is_inference_mode_enabled():
        raise PrecompileError(
            f"fn reads the inference mode ({reads['inference_mode']}) and is captured "
            f"under torch.inference_mode(); the trace took that branch, and an artifact "
            f"checks calls against a capture made outside inference mode",
            invariant=5,
            location=where,
            hint="capture outside torch.inference_mode() (calls under it are then "
            "refused), or pass the choice to fn as an argument",
        )
    if "layout" in reads and dynamic_dims:
        raise PrecompileError(
            f"fn reads memory layout ({reads['layout']}) and has inputs with dims marked "
            f"with mark_unbacked, whose strides the artifact cannot compare with the "
            f"capture's; the trace took the branch of the captured layout",
            invariant=3,
            location=where,
            hint="make fn independent of layout (call .contiguous() instead of testing "
            "it), or do not mark the dims",
        )
    if dynamic_dims:
        tracing.insert_runtime_asserts(gm, fake_mode)
    if grad_inputs:
        check_grad_inputs_capture(grad_param_indices, dynamic_dims, where)
    # Library-module values whose other values the graph proves cannot change its
    # result (ReLU.inplace where relu's input is not read again, padding_idx in an
    # inference graph) leave the reads; the others keep why (MODULE_READ_NOTES). A flag
    # read only as ``self.flag and self.training`` on a module in eval decides nothing:
    # its training flag is checked instead (transformers' gradient_checkpointing).
    truths = neutral_reads.settle_training_only_reads(
        modules,
        module_reads,
        flag_readers,
        # What could read a property's getter otherwise: user code, libraries included.
        [c for c in ran.codes if is_user_file(c.co_filename)],
    )
    read_notes = neutral_reads.settle_fx_reads(
        gm.graph,
        modules,
        module_reads,
        neutral_positions,
        inference=not training and not grad_inputs,
    )
    recorded = fx_dependencies.record_dependencies(
        modules,
        ran,
        training,
        fn,
        where,
        reads=module_reads,
        truths=truths,
        outside=outside_classes,
    )
    recorded.read_notes = read_notes
    fx_dependencies.refuse_unnamed_sentinels(recorded, where)
    return SingleGraph(
        graph_module=gm,
        lifted=lifted,
        num_args=len(args),
        module_positions=module_positions,
        module_training=[
            _read_training_flags(m, row) for m, row in zip(modules, recorded.module_reads)
        ],
        in_spec=in_spec,
        out_spec=out_spec_box[-1],
        user_leaves=leaves,
        grad_param_indices=list(grad_param_indices),
        node_stacks=node_stacks,
        training=training,
        dynamic_dims=dynamic_dims,
        functions_run=_with_enclosing(ran.project_codes(), ran.scopes),
        dependencies=recorded,
        grad_access=list(dict.fromkeys(grad_access)) if grad_param_indices else [],
        autocast=autocast,
        ambient_modes=ambient_modes,
        reads=reads,
        grad_inputs=grad_inputs,
        output_requires_grad=list(out_requires_grad),
        joint_inputs=(
            user_state.restoring(flat_fn, roots),
            [*state_tensors, *(leaves[i] for i in tensor_slots)],
            decompositions,
        )
        if grad_inputs
        else None,
        input_names=leaf_names(fn, len(args), module_positions, in_spec),
        keyed_dicts=fx_keyed_inputs.keyed_flags(in_spec, dicts_observed),
        decomposed=bool(decompositions),
    )


def _with_enclosing(
    codes: list[types.CodeType], scopes: dict[types.CodeType, dict[str, Any]]
) -> list[types.CodeType]:
    """``codes`` and, for each nested function among them, the module-level function
    that defines it: a closure's values (the loss module a training-step factory
    creates) come from that function's source, so an edit of it must be seen at load
    like an edit of the traced code itself."""
    extra: list[types.CodeType] = []
    for code in codes:
        qualname = getattr(code, "co_qualname", code.co_name)
        if ".<locals>." not in qualname:
            continue
        holder: Any = scopes.get(code, {})
        for part in qualname.split(".<locals>.")[0].split("."):
            holder = holder.get(part) if isinstance(holder, dict) else getattr(holder, part, None)
        outer = getattr(getattr(holder, "__func__", holder), "__code__", None)
        if isinstance(outer, types.CodeType) and outer not in codes and outer not in extra:
            extra.append(outer)
    return codes + extra


def _without_grad(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the trace should see it: the same storage and requires_grad, no .grad."""
    if t.grad is None:
        return t
    alias = t.detach()
    if isinstance(t, torch.nn.Parameter):
        return torch.nn.Parameter(alias, requires_grad=t.requires_grad)
    return alias.requires_grad_(t.requires_grad)
