"""Single-graph capture: one ``make_fx`` trace of ``fn`` on fake tensors.

Every refusal names what is wrong, the invariant it breaks, and the user line at fault:
the tensors of the example call are never computed on or mutated here, and anything the
artifact could not reproduce faithfully is refused before an artifact exists.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch.overrides import TorchFunctionMode

from precompile._compat import tracing
from precompile._compat.tracing import pytree
from precompile.capturing import fx_dependencies, fx_keyed_inputs, neutral_reads
from precompile.capturing.fx_dependencies import Dependencies, param_free
from precompile.capturing.fx_lifting import LiftedState, lift_module_state, module_training_flags
from precompile.errors import Location, PrecompileError, generator_input_refusal
from precompile.locations import (
    StackFrame,
    definition_location,
    innermost,
    is_user_file,
    traceback_user_stack,
)
from precompile.runtime import state_checks

#: Non-tensor example values the artifact can bake and re-check on every call.
LITERAL_TYPES = (type(None), bool, int, float, complex, str)
#: A tensor built inside fn from Python literals may stay in the graph up to this size.
MAX_LITERAL_CONSTANT_NUMEL = 4096


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


class _Refusal(Exception):
    """Raised inside the trace; becomes a PrecompileError placed at the user's line."""

    def __init__(self, message: str, invariant: int | None, hint: str | None = None):
        super().__init__(message)
        self.invariant = invariant
        self.hint = hint


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
            raise _Refusal(
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
            raise _Refusal(
                f"fn calls {what} on a tensor; a capture records tensor operations, and "
                f"{what} leaves the graph (its result would be frozen at capture)",
                4,
                "keep the computation in torch operations, or do this outside fn",
            )
        return func(*args, **(kwargs or {}))


def _fn_location(fn: Callable[..., Any]) -> Location | None:
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:
        return None
    return definition_location(code)


def _holds_state(value: Any) -> bool:
    """A tensor, or a module with parameters or buffers: state the artifact would bake.
    A module without either (a loss, an activation) is code and configuration, baked
    like any other value fn closes over."""
    if isinstance(value, torch.nn.Module):
        return not param_free(value)
    return isinstance(value, torch.Tensor)


def check_fn_holds_no_state(fn: Callable[..., Any]) -> None:
    """Invariant 1: modules and tensors reach fn as arguments, never through fn itself."""
    where = _fn_location(fn)
    hint = "pass the module or tensor as an argument of fn instead"
    if isinstance(fn, torch.nn.Module) and not param_free(fn):
        raise PrecompileError(
            f"fn is itself an nn.Module ({type(fn).__name__}); its parameters would be "
            f"baked into the artifact",
            invariant=1,
            location=where,
            hint="capture a function that takes the module: "
            "capture(lambda model, x: model(x), ...) and call cap(model, x)",
        )
    if not callable(fn):
        raise TypeError(f"precompile.capture: fn must be callable, got {type(fn).__name__}")
    held: list[str] = []
    if isinstance(fn, functools.partial):
        held += [f"partial argument {i}" for i, a in enumerate(fn.args) if _holds_state(a)]
        held += [f"partial keyword {k!r}" for k, a in fn.keywords.items() if _holds_state(a)]
    owner = getattr(fn, "__self__", None)
    if _holds_state(owner):
        held.append(f"the bound object {type(owner).__name__} (fn is a method)")
    func = getattr(fn, "__func__", fn)
    code = getattr(func, "__code__", None)
    for name, cell in zip(
        getattr(code, "co_freevars", ()), getattr(func, "__closure__", None) or ()
    ):
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if _holds_state(value):
            held.append(f"closure variable {name!r} ({type(value).__name__})")
    for i, value in enumerate(getattr(func, "__defaults__", None) or ()):
        if _holds_state(value):
            held.append(f"default argument {i} ({type(value).__name__})")
    for name, value in (getattr(func, "__kwdefaults__", None) or {}).items():
        if _holds_state(value):
            held.append(f"keyword default {name!r} ({type(value).__name__})")
    if held:
        raise PrecompileError(
            f"fn holds a module or tensor through {', '.join(held)}; the artifact would "
            f"bake it in as a constant instead of taking it at run time",
            invariant=1,
            location=where,
            hint=hint,
        )


def _check_tensor(t: torch.Tensor, what: str, where: Location | None) -> None:
    """Refuse tensor kinds the artifact cannot check or reproduce yet (invariant 4)."""
    inner = tracing.active_trace()
    if isinstance(t, tracing.FakeTensor) or inner:
        raise PrecompileError(
            f"capture was called inside another trace ({inner or 'fake tensor inputs'}); "
            f"{what} is not a real tensor",
            invariant=None,
            location=where,
            hint="call precompile.capture at top level, outside torch.compile, make_fx "
            "and fake-tensor modes",
        )
    problem = None
    if t.is_nested:
        problem = f"is a nested tensor (layout {t.layout})"
        fix = "pass padded dense tensors (.to_padded_tensor(0.0))"
    elif t.layout != torch.strided:
        kind = "mkldnn" if "mkldnn" in str(t.layout) else "sparse"
        problem = f"has layout {t.layout} (a {kind} tensor)"
        fix = "pass a dense tensor (.to_dense())"
    elif t.is_quantized:
        problem = "is quantized"
        fix = "pass the dequantized tensor (.dequantize())"
    elif t.is_pinned():
        problem = "is in pinned memory"
        fix = "pass an unpinned copy"
    elif type(t) not in (torch.Tensor, torch.nn.Parameter, torch.nn.Buffer):
        problem = f"is a tensor subclass ({type(t).__name__})"
        fix = "pass a plain torch.Tensor"
    else:
        return
    raise PrecompileError(
        f"{what} {problem}, which precompile does not support yet",
        invariant=4,
        location=where,
        hint=fix,
    )


def _split_args(
    args: Sequence[Any], where: Location | None
) -> tuple[list[int], list[torch.nn.Module], list[Any], Any]:
    module_positions = [i for i, a in enumerate(args) if isinstance(a, torch.nn.Module)]
    modules = [args[i] for i in module_positions]
    user = tuple(a for i, a in enumerate(args) if i not in module_positions)
    leaves, in_spec = pytree.tree_flatten(user)
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.nn.Module):
            raise PrecompileError(
                f"input value {i} is an nn.Module nested inside a container; modules are "
                f"lifted only as top-level positional arguments",
                invariant=1,
                location=where,
                hint="pass each module as its own positional argument of fn",
            )
        if isinstance(leaf, torch.Tensor):
            _check_tensor(leaf, f"input value {i}", where)
            _check_dim_marks(leaf, i, where)
        elif isinstance(leaf, LITERAL_TYPES) and type(leaf) not in LITERAL_TYPES:
            base = next(t for t in LITERAL_TYPES if isinstance(leaf, t))
            raise PrecompileError(
                f"input value {i} is a {type(leaf).__name__}, a subclass of "
                f"{base.__name__}; the artifact bakes each Python value and re-checks its "
                f"exact type and value on every call, so it would refuse this one",
                invariant=3,
                location=where,
                hint=f"pass {base.__name__}(value) instead, or read the value inside fn",
            )
        elif isinstance(leaf, torch.Generator):
            raise generator_input_refusal(f"input value {i}", where)
        elif not isinstance(leaf, LITERAL_TYPES):
            raise PrecompileError(
                f"input value {i} is a {type(leaf).__name__}; besides tensors and modules "
                f"a captured call takes only Python literals (None, bool, int, float, "
                f"complex, str), which the artifact bakes and re-checks on every call",
                invariant=3,
                location=where,
                hint="pass tensors and literals only; read other configuration inside fn"
                + _registration_hint(type(leaf)),
            )
    check_spec_serializable(in_spec, "the call's inputs", where)
    return module_positions, modules, leaves, in_spec


def _registration_hint(cls: type) -> str:
    """How to make ``cls`` a container pytree flattens, with a name another process can
    find it by (``serialized_type_name``)."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    if dataclasses.is_dataclass(cls):
        return (
            f"; or register the dataclass: torch.utils._pytree.register_dataclass("
            f"{cls.__qualname__}, serialized_type_name={name!r})"
        )
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return (
            f"; or register the namedtuple: torch.utils._pytree._register_namedtuple("
            f"{cls.__qualname__}, serialized_type_name={name!r})"
        )
    return (
        f"; or register it: torch.utils._pytree.register_pytree_node({cls.__qualname__}, "
        f"flatten_fn, unflatten_fn, serialized_type_name={name!r}), with "
        f"to_dumpable_context / from_dumpable_context when its context is not JSON"
    )


def _spec_types(spec: Any) -> list[type]:
    """The container classes in a spec, outermost first (a namedtuple's node names
    ``collections.namedtuple`` and keeps its class as the context)."""
    found: list[type] = []
    stack = [spec]
    while stack:
        node = stack.pop(0)
        kind = node.type
        if kind is collections.namedtuple:
            kind = node.context
        if isinstance(kind, type) and kind not in found:
            found.append(kind)
        stack.extend(node.children())
    return found


def check_spec_serializable(spec: Any, what: str, where: Location | None) -> None:
    """The artifact records the nesting of inputs and outputs as JSON and rebuilds it in
    another process: every container type in it must be registered with pytree under a
    ``serialized_type_name``, with a JSON context."""
    try:
        same = pytree.treespec_loads(pytree.treespec_dumps(spec)) == spec
        error: Exception | None = None
    except Exception as exc:  # pytree raises NotImplementedError, TypeError, KeyError...
        same, error = False, exc
    if same:
        return
    plain = (list, tuple, dict, type(None))
    odd = [t for t in _spec_types(spec) if t not in plain]
    culprit = odd[-1] if odd else None
    shown = f"a {culprit.__module__}.{culprit.__qualname__}" if culprit else "a container"
    detail = f": {type(error).__name__}: {str(error)[:300]}" if error else ""
    raise PrecompileError(
        f"{what} hold {shown}, which the artifact cannot record as a pytree node it can "
        f"rebuild in another process{detail}",
        invariant=3,
        location=where,
        hint=(
            "use lists, tuples and dicts" + _registration_hint(culprit)
            if culprit
            else "use lists, tuples and dicts"
        ),
    )


def _check_dim_marks(t: torch.Tensor, i: int, where: Location | None) -> None:
    """Dynamo's dim marks mean something under make_fx only as mark_unbacked dims; any
    other mark would be dropped silently, so it is refused."""
    marks = tracing.dim_marks(t)
    if marks["dynamic"]:
        raise PrecompileError(
            f"input value {i} has dims {marks['dynamic']} marked with "
            f"torch._dynamo.mark_dynamic, which the make_fx tracer does not honour (it "
            f"would trace them static)",
            invariant=3,
            location=where,
            hint="mark them with torch._dynamo.decorators.mark_unbacked(t, dim) (served at "
            "any size; refused at capture where the graph must specialize on them), or "
            "use precompile.DynamoTracer()",
        )
    if marks["specialize_on"]:
        raise PrecompileError(
            f"input value {i} dims {sorted(marks['specialize_on'])} carry "
            f"mark_unbacked(..., specialize_on=...), which the make_fx tracer does not "
            f"support (it traces one graph, not one per criterion)",
            invariant=3,
            location=where,
            hint="drop specialize_on, or use precompile.DynamoTracer()",
        )


def _name_constant(
    value: torch.Tensor,
    fn: Callable[..., Any],
    modules: list[torch.nn.Module],
    frames: list[StackFrame],
) -> str:
    """Say where a tensor that is not an input came from, as precisely as we can."""
    func = getattr(fn, "__func__", fn)
    scopes: list[tuple[str, dict[str, Any]]] = []
    for frame in reversed(frames):
        for mod in list(sys.modules.values()):
            if getattr(mod, "__file__", None) == frame.file:
                scopes.append((f"global of {mod.__name__}", vars(mod)))
                break
    scopes.append(("global", getattr(func, "__globals__", {})))
    for label, scope in scopes:
        for name, v in scope.items():
            if v is value:
                return f"{label} {name!r}"
    code = getattr(func, "__code__", None)
    for name, cell in zip(
        getattr(code, "co_freevars", ()), getattr(func, "__closure__", None) or ()
    ):
        with contextlib.suppress(ValueError):
            if cell.cell_contents is value:
                return f"closure variable {name!r}"
    multi = len(modules) > 1
    for mi, module in enumerate(modules):
        for sub_name, sub in module.named_modules():
            for attr, v in vars(sub).items():
                if v is value:
                    owner = (f"m{mi}." if multi else "") + (sub_name or "")
                    return (
                        f"attribute {attr!r} of module {owner or type(module).__name__!r}, "
                        f"which is not a registered parameter or buffer"
                    )
    return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"


def _higher_order_op_in(tb: Any) -> str | None:
    """The control-flow operator (torch.cond, while_loop, ...) a failure happened in."""
    name = None
    while tb is not None:
        parts = tb.tb_frame.f_code.co_filename.replace("\\", "/").split("/_higher_order_ops/")
        if len(parts) == 2:
            name = parts[1].removesuffix(".py")
        tb = tb.tb_next
    return name


def _control_flow_refusal(op: str, where: Location | None) -> PrecompileError:
    return PrecompileError(
        f"fn uses {op} (a higher-order control-flow op), which the single-graph capture "
        f"does not support yet",
        invariant=3,
        location=where,
        hint="express the branch with tensor ops (torch.where), or use precompile.DynamoTracer()",
    )


def _read_training_flags(
    module: torch.nn.Module, reads: list[list[str] | None]
) -> list[tuple[str, bool | None]]:
    """``MODULE_TRAINING`` of one module argument: each submodule's training flag where
    the trace read it (dropout, batch norm, a user's ``if self.training``) or could not
    tell (reads unseen); None where it did not, which no ``train()`` can change."""
    return [
        (name, flag if seen is None or "training" in seen else None)
        for (name, flag), seen in zip(module_training_flags(module), reads)
    ]


def _refuse_from_exception(error: BaseException, training: bool) -> PrecompileError:
    where = innermost(traceback_user_stack(error.__traceback__))
    control_flow = _higher_order_op_in(error.__traceback__)
    if control_flow and not isinstance(error, _Refusal):
        return _control_flow_refusal(control_flow, where)
    if isinstance(error, _Refusal):
        return PrecompileError(
            str(error), invariant=error.invariant, location=where, hint=error.hint
        )
    if isinstance(error, tracing.GuardOnDataDependentSymNode):
        return PrecompileError(
            f"fn must decide on a size or value the capture treats as unknown "
            f"({str(error).splitlines()[0]}): a dim marked with mark_unbacked is served at any "
            f"size, so the graph cannot branch or specialize on it",
            invariant=3,
            location=where,
            hint="remove the branch on that dim, or do not mark it; inputs whose dims must "
            "match can share one mark_unbacked shape_id",
        )
    if isinstance(error, tracing.DATA_DEPENDENT_ERRORS):
        op = getattr(error, "func", None)
        return PrecompileError(
            f"fn depends on tensor values ({op}: .item(), .tolist(), a tensor in an "
            f"`if`, .nonzero() or another op whose output shape depends on data); a "
            f"single graph cannot specialize on values it has not seen",
            invariant=3,
            location=where,
            hint="keep the decision in tensor ops (torch.where, masking), or use "
            "precompile.DynamoTracer(), which splits the graph there",
        )
    if isinstance(error, tracing.UnsupportedOperatorException):
        return PrecompileError(
            f"operator {error.func} has no fake (meta) kernel, so the capture cannot tell "
            f"the shape of its result without running it on real data",
            invariant=None,
            location=where,
            hint="register one with torch.library.register_fake, or call the op outside fn",
        )
    text = str(error)
    if not training and "does not require grad and does not have a grad_fn" in text:
        return PrecompileError(
            "fn runs a backward but was captured with training=False (grad disabled)",
            invariant=5,
            location=where,
            hint="pass training=True to precompile.capture to trace the backward",
        )
    return PrecompileError(
        f"fn raised {type(error).__name__} while being traced: {text}",
        invariant=None,
        location=where,
        hint="fix the error at the location shown; fn runs on fake tensors during capture",
    )


def trace_single_graph(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    training: bool,
    decompositions: dict[Any, Callable[..., Any]] | None = None,
) -> SingleGraph:
    where = _fn_location(fn)
    check_fn_holds_no_state(fn)
    inner = tracing.active_trace()
    if inner:
        raise PrecompileError(
            f"capture was called inside {inner}",
            location=where,
            hint="call precompile.capture at top level, outside other traces",
        )
    module_positions, modules, leaves, in_spec = _split_args(args, where)
    lifted = lift_module_state(modules)
    for name, tensor in zip(lifted.names, lifted.tensors):
        _check_tensor(tensor, f"parameter/buffer {name!r}", where)
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
    # The input dicts fn observed beyond values by key (keyed_inputs).
    dicts_observed: set[int] = set()

    def flat_fn(*flat: torch.Tensor) -> list[Any]:
        state, user_tensors = flat[:n_state], flat[n_state:]
        opaque.inputs = set(map(id, flat))
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
        with fx_keyed_inputs.quiet():
            watch = fx_dependencies.ArgumentWatch(
                [
                    (f"{'parameter' if k < lifted.num_params else 'buffer'} {name!r}", t)
                    for k, (name, t) in enumerate(zip(lifted.names, state))
                ]
                + [(f"input value {slot}", t) for slot, t in zip(tensor_slots, user_tensors)],
                [(i, a) for i, a in enumerate(call_args) if i not in module_positions],
            )
        with contextlib.ExitStack() as stack:
            for mi, module in enumerate(modules):
                swap = {
                    name: state[k]
                    for k, names in enumerate(lifted.aliases)
                    for m, name in names
                    if m == mi
                }
                stack.enter_context(
                    fx_dependencies.unrecorded(tracing.reparametrized(module, swap))
                )
            out = fx_keyed_inputs.plain(fn(*call_args))
            with fx_keyed_inputs.quiet():
                argument_changes[:] = watch.changes()
        out_leaves, out_spec = pytree.tree_flatten(out)
        out_spec_box.append(out_spec)
        for i, leaf in enumerate(out_leaves):
            if not isinstance(leaf, (torch.Tensor, *LITERAL_TYPES)):
                raise _Refusal(
                    f"fn returned a {type(leaf).__name__} (output value {i}); outputs are "
                    f"tensors and Python literals, in lists, tuples, dicts and registered "
                    f"pytree containers",
                    3,
                    "return tensors (or literals) only" + _registration_hint(type(leaf)),
                )
        for k in range(lifted.num_params, n_state):
            if state[k].grad is not None:
                raise _Refusal(
                    f"buffer {lifted.names[k]!r} received a gradient; only parameter "
                    f"gradients are accumulated by an artifact",
                    5,
                    "register it as a parameter, or keep it out of the backward",
                )
        for slot, t in zip(tensor_slots, user_tensors):
            if t.grad is not None:
                raise _Refusal(
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
            raise _Refusal(
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
    before = fx_dependencies.Snapshot(modules)
    neutral_positions: dict[tuple[int, str], list[tuple[Any, types.CodeType]]] = {}
    autocast = state_checks.autocast_state()
    ambient_modes = state_checks.ambient_modes()
    try:
        with (
            tracing.recording_user_stacks(flat_fn.__code__) as stack_of,
            tracing.recording_grad_access(
                lambda frame: frame.f_code.co_filename != __file__
            ) as grad_access,
            fx_dependencies.recording_calls() as ran,
            fx_dependencies.recording_module_reads(modules, neutral_positions) as module_reads,
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
        raise _refuse_from_exception(error, training) from error
    _check_graph(gm, node_stacks, fn, modules)
    check_spec_serializable(out_spec_box[-1], "fn's outputs", where)
    names = fx_dependencies.read_names(ran)
    fx_dependencies.refuse_trace_side_effects(
        before.changed_during(modules, names, ran) + argument_changes, where
    )
    reads = {**ran.reads, **opaque.reads}
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
        _check_grad_inputs_capture(grad_param_indices, dynamic_dims, where)
    # Library-module values whose other values the graph proves cannot change its
    # result (ReLU.inplace where relu's input is not read again, padding_idx in an
    # inference graph) leave the reads; the others keep why (MODULE_READ_NOTES).
    read_notes = neutral_reads.settle_fx_reads(
        gm.graph,
        modules,
        module_reads,
        neutral_positions,
        inference=not training and not grad_inputs,
    )
    recorded = fx_dependencies.record_dependencies(
        modules, ran, training, fn, where, reads=module_reads
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
        joint_inputs=(flat_fn, [*state_tensors, *(leaves[i] for i in tensor_slots)], decompositions)
        if grad_inputs
        else None,
        input_names=_leaf_names(fn, len(args), module_positions, in_spec),
        keyed_dicts=fx_keyed_inputs.keyed_flags(in_spec, dicts_observed),
        decomposed=bool(decompositions),
    )


def _leaf_names(
    fn: Callable[..., Any], num_args: int, module_positions: list[int], in_spec: Any
) -> list[str]:
    """Each input leaf as the user would name it: fn's parameter name (``args[2]`` past
    the named ones, ``argument 2`` without a signature), then the path into the
    container that held it."""
    import inspect

    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
    except (TypeError, ValueError):
        params = []

    def arg_name(position: int) -> str:
        for i, p in enumerate(params):
            if p.kind == p.VAR_POSITIONAL:
                return f"{p.name}[{position - i}]"
            if i == position:
                return p.name
        return f"argument {position}"

    user_positions = [i for i in range(num_args) if i not in module_positions]
    shaped = pytree.tree_unflatten(list(range(in_spec.num_leaves)), in_spec)
    names = []
    for path, _ in pytree.tree_flatten_with_path(shaped)[0]:
        head, rest = path[0], path[1:]
        # The user's arguments are a tuple: the first key is a position in it.
        position = user_positions[getattr(head, "idx", 0)]
        names.append(arg_name(position) + pytree.keystr(rest))
    return names


def _check_grad_inputs_capture(
    grad_param_indices: list[int],
    dynamic_dims: dict[int, Any],
    where: Location | None,
) -> None:
    """What an inference capture of inputs that require grad cannot carry yet."""
    if grad_param_indices:
        raise PrecompileError(
            "fn runs a backward but was captured with training=False; with an input that "
            "requires grad the artifact carries fn's own backward, not one run inside fn",
            invariant=5,
            location=where,
            hint="pass training=True to precompile.capture to trace the backward inside fn",
        )
    if dynamic_dims:
        raise PrecompileError(
            f"input values {sorted(dynamic_dims)} have dims marked with mark_unbacked, and "
            f"an input requires grad: the captured backward of a graph with dynamic dims "
            f"is not supported yet",
            invariant=5,
            location=where,
            hint="drop the mark_unbacked marks, or pass x.detach() / capture under "
            "torch.no_grad() (then serve under it too)",
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


def is_literal_constant(node: torch.fx.Node, value: Any) -> bool:
    """A tensor fn built from Python literals (torch.tensor([...])) is safe to inline."""
    return (
        isinstance(value, torch.Tensor)
        and value.numel() <= MAX_LITERAL_CONSTANT_NUMEL
        and bool(node.users)
        and all(u.target is torch.ops.aten.lift_fresh_copy.default for u in node.users)
    )


def _check_graph(
    gm: torch.fx.GraphModule,
    node_stacks: dict[str, list[StackFrame]],
    fn: Callable[..., Any],
    modules: list[torch.nn.Module],
) -> None:
    for node in gm.graph.nodes:
        frames = node_stacks.get(node.name, [])
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            if not isinstance(value, torch.Tensor) or is_literal_constant(node, value):
                continue  # a subgraph of a control-flow op is refused at that op
            raise PrecompileError(
                f"fn uses a tensor that is not an input: "
                f"{_name_constant(value, fn, modules, frames)}; the artifact would bake "
                f"its current value in as a constant",
                invariant=1,
                location=innermost(frames) or _fn_location(fn),
                hint="pass it as an argument of fn, or register it on a module "
                "argument with register_buffer / nn.Parameter",
            )
        if node.op == "call_function" and isinstance(node.target, tracing.HigherOrderOperator):
            where = innermost(frames) or _fn_location(fn)
            raise _control_flow_refusal(node.target.name(), where)


def describe_fn(fn: Callable[..., Any]) -> dict[str, Any]:
    """Name, module and definition site of the captured function, for reports."""
    func = getattr(fn, "__func__", fn)
    if isinstance(func, functools.partial):
        func = func.func
    code = getattr(func, "__code__", None)
    return {
        "name": getattr(func, "__qualname__", type(func).__name__),
        "module": getattr(func, "__module__", None),
        "file": getattr(code, "co_filename", None),
        "line": getattr(code, "co_firstlineno", None),
    }
