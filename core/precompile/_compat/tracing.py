"""make_fx, fake tensors and AOTAutograd's joint trace: the single-graph capture's torch
internals. Heavy private modules (fake tensors, make_fx) are imported on first use of the
names that need them, so importing this is cheap."""

from __future__ import annotations

import contextlib
import importlib
import sys
import traceback
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree  # noqa: F401  (re-exported: the one pytree spelling)

from precompile._compat.patching import patched
from precompile.locations import StackFrame, live_user_stack

#: Names imported on first use (module-level __getattr__), to keep this module cheap.
_LAZY = {
    "FakeTensor": ("torch._subclasses.fake_tensor", "FakeTensor"),
    "FakeTensorMode": ("torch._subclasses.fake_tensor", "FakeTensorMode"),
    "UnsupportedOperatorException": (
        "torch._subclasses.fake_tensor",
        "UnsupportedOperatorException",
    ),
    "HigherOrderOperator": ("torch._ops", "HigherOrderOperator"),
    "make_fx": ("torch.fx.experimental.proxy_tensor", "make_fx"),
}


def __getattr__(name: str) -> Any:
    if name == "DATA_DEPENDENT_ERRORS":
        # Exceptions fake tensors raise for an op whose result depends on tensor values.
        from torch._subclasses.fake_tensor import (
            DataDependentOutputException,
            DynamicOutputShapeException,
        )

        return (DataDependentOutputException, DynamicOutputShapeException)
    if name == "GuardOnDataDependentSymNode":
        # Raised when a trace must branch on a size it treats as unknown (unbacked).
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

        return GuardOnDataDependentSymNode
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def node_sites(node: Any) -> list[tuple[str, str]]:
    """``(file, line)`` of each frame of the stack torch recorded for an FX node
    (``node.meta["stack_trace"]``, in a traceback's format), outermost first; empty
    where the trace kept none."""
    import re

    return re.findall(r'File "([^"]+)", line (\d+)', str(node.meta.get("stack_trace") or ""))


#: torch's own files a dispatched operator passes through on its way to a fake kernel
#: (``torch.ops`` call, the proxy and fake modes, their decorators).
_DISPATCH_FILES = (
    "/torch/_ops.py",
    "/torch/_compile.py",
    "/torch/_dynamo/eval_frame.py",
    "/torch/utils/_stats.py",
    "/torch/fx/experimental/proxy_tensor.py",
    "/torch/_subclasses/",
)


def dispatched_by_autograd_engine(tb: types.TracebackType | None) -> bool:
    """Whether the failing operator of ``tb`` was called by autograd's C++ engine itself
    (no Python frame between ``torch.autograd.graph._engine_run_backward`` and the
    dispatch machinery): a value read there is the engine's own, as anomaly detection's
    NaN check of every gradient (``isnan(grad).any().item()``), not a backward
    formula's or fn's."""
    frames = [f.f_code for f, _ in traceback.walk_tb(tb)]
    engine = [
        i
        for i, code in enumerate(frames)
        if code.co_name == "_engine_run_backward"
        and code.co_filename.replace("\\", "/").endswith("/torch/autograd/graph.py")
    ]
    if not engine:
        return False
    return all(
        any(part in code.co_filename.replace("\\", "/") for part in _DISPATCH_FILES)
        for code in frames[engine[-1] + 1 :]
    )


#: ``Tensor.requires_grad``'s descriptor: how a trace's reads of it are recognised.
requires_grad_descriptor = torch._C.TensorBase.__dict__["requires_grad"]


def graph_tail() -> Any:
    """The last node of the graph make_fx is recording now (None outside a trace): what
    a read made during the trace is placed after (``capturing.neutral_reads``)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    mode = get_proxy_mode()
    if mode is None:
        return None
    return next(reversed(mode.tracer.graph.nodes), None)


def op_result_aliases(target: Any) -> bool | None:
    """Whether an ATen operator's result is a view or an in-place result of one of its
    arguments (its schema's alias annotations); None for a target with no schema."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    return any(r.alias_info is not None for r in schema.returns)


def is_view(value: Any) -> bool | None:
    """Whether a (fake) tensor is a view of another; None for a value that is not one."""
    check = getattr(value, "_is_view", None)
    return None if check is None else bool(check())


def reparametrized(module: torch.nn.Module, tensors: dict[str, Any]) -> Any:
    """Swap a module's params/buffers for ``tensors`` (by qualified name) for a block."""
    from torch.nn.utils.stateless import _reparametrize_module

    return _reparametrize_module(module, tensors)


def active_trace() -> str | None:
    """Name the tracer or compiler this process is inside of, if any.

    A capture nested in another trace would record that trace's proxies, not the
    user's computation.
    """
    if torch.compiler.is_compiling():
        return "torch.compile / Dynamo"
    from torch.fx._symbolic_trace import is_fx_symbolic_tracing

    if is_fx_symbolic_tracing():
        return "torch.fx symbolic tracing"
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    mode = _get_current_dispatch_mode()
    if mode is not None:
        return f"a {type(mode).__name__} dispatch mode (make_fx, fake tensors or similar)"
    return None


def tracing_dispatch_modes() -> list[str]:
    """The active dispatch modes that are torch's own tracing (fake tensors, make_fx's
    proxy mode, functionalization): a capture under one is a capture inside another
    trace, not under a user's mode."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch._subclasses.functional_tensor import FunctionalTensorMode
    from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    kinds = (FakeTensorMode, FunctionalTensorMode, ProxyTorchDispatchMode)
    return [type(m).__name__ for m in _get_current_dispatch_mode_stack() if isinstance(m, kinds)]


def is_trace_value(value: object) -> bool:
    """Whether ``value`` is a tensor only a trace makes (a fake or functional tensor):
    one left in the user's state would be returned by later eager code."""
    from torch._subclasses.fake_tensor import is_fake
    from torch._subclasses.functional_tensor import FunctionalTensor

    return isinstance(value, torch.Tensor) and (
        isinstance(value, FunctionalTensor) or bool(is_fake(value))
    )


@contextlib.contextmanager
def recording_user_stacks(
    boundary: types.CodeType,
) -> Iterator[Callable[[str | None], list[StackFrame]]]:
    """Make FX record the full *user* stack of every node, not only ``forward`` frames.

    make_fx keeps only frames named ``forward``, which loses helper functions and the
    traced function itself; and FX stack strings carry no columns. While this is active
    each node's ``stack_trace`` string is also a key into a table of structured frames
    with exact columns; the yielded lookup turns a node's ``stack_trace`` into them. Frames
    are taken inside ``boundary``, the code object that calls the user's function.
    """
    from torch.fx.proxy import TracerBase

    table: dict[str, list[StackFrame]] = {}

    def _filter(
        self: TracerBase, user_stack_summary: traceback.StackSummary
    ) -> traceback.StackSummary:
        frames = live_user_stack(sys._getframe(1), boundary)
        if not frames:
            return traceback.StackSummary.from_list([])
        result = traceback.StackSummary.from_list(
            [traceback.FrameSummary(f.file, f.line, f.function, lookup_line=False) for f in frames]
        )
        table["".join(result.format()).strip()] = frames
        return result

    with patched(TracerBase, "_filter_traceback_frames", _filter):
        yield lambda stack_trace: table.get(stack_trace or "", [])


def unbacked_marks(t: torch.Tensor) -> dict[int, tuple[int | None, int | None, str | None]]:
    """The dims ``torch._dynamo.decorators.mark_unbacked`` marked on ``t``:
    ``{dim: (min, max, shape_id)}``. A ``strict=True`` mark (kept by torch in a set of
    its own) is one too: an unbacked dim that the trace would specialize is refused."""
    dims = {
        *(getattr(t, "_dynamo_unbacked_indices", None) or ()),
        *(getattr(t, "_dynamo_strict_unbacked_indices", None) or ()),
    }
    bounds = getattr(t, "_dynamo_unbacked_bounds", None) or {}
    ids = getattr(t, "_dynamo_shape_ids", None) or {}
    return {d: (*bounds.get(d, (None, None)), ids.get(d)) for d in sorted(dims)}


def dynamic_fakes(static: list[torch.Tensor], marked: list[torch.Tensor]) -> tuple[Any, list[Any]]:
    """Fake tensors over one shape environment: ``static`` ones with static shapes, and
    ``marked`` ones with their mark_unbacked dims as unbacked symbols (bounds and shared
    shape ids applied). Returns the fake mode and the fakes (static, then marked)."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    shape_env = ShapeEnv()
    mode = fake_mode(shape_env=shape_env)
    fakes = [mode.from_tensor(t, static_shapes=True) for t in static]
    with shape_env.ignore_fresh_unbacked_symbols():
        for i, t in enumerate(marked):
            marks = unbacked_marks(t)
            context: StatelessSymbolicContext[..., Any] = StatelessSymbolicContext(
                dynamic_sizes=[
                    DimDynamic.UNBACKED if d in marks else DimDynamic.STATIC for d in range(t.dim())
                ],
                shape_ids=getattr(t, "_dynamo_shape_ids", None),
                unbacked_bounds=getattr(t, "_dynamo_unbacked_bounds", None),
            )
            fakes.append(
                mode.from_tensor(t, source=ConstantSource(f"input{i}"), symbolic_context=context)
            )

    return mode, fakes


def insert_runtime_asserts(gm: torch.fx.GraphModule, fake_mode: Any) -> None:
    """Put every assumption the trace made about unbacked sizes (bounds, shared shape ids,
    anything an op had to assume) into the graph as run-time asserts, so the artifact
    checks at run time what the capture took for granted."""
    from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

    if fake_mode.shape_env is not None:
        insert_deferred_runtime_asserts(gm, fake_mode.shape_env, "precompile")
        gm.recompile()


def has_symbols(values: Any) -> bool:
    return any(isinstance(v, torch.SymInt) for v in values)


def tracing_probes() -> dict[str, Callable[[], bool]]:
    """The functions that answer "is a trace or compile running?" by the expression a
    user writes: true in a trace where eager says false, so a branch on one bakes the
    branch eager never takes."""
    import torch.compiler
    import torch.fx._symbolic_trace as symbolic_trace
    import torch.jit

    probes: dict[str, Any] = {
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "torch.compiler.is_dynamo_compiling()": torch.compiler.is_dynamo_compiling,
        "torch.compiler.is_exporting()": torch.compiler.is_exporting,
        "torch.fx._symbolic_trace.is_fx_tracing()": symbolic_trace.is_fx_tracing,
        "torch.fx._symbolic_trace.is_fx_symbolic_tracing()": getattr(
            symbolic_trace, "is_fx_symbolic_tracing", None
        ),
        "torch.jit.is_tracing()": torch.jit.is_tracing,
        "torch._utils.is_compiling()": getattr(torch._utils, "is_compiling", None),
    }
    external = sys.modules.get("torch._dynamo.external_utils")
    if external is not None:
        probes["torch._dynamo.is_compiling()"] = getattr(external, "is_compiling", None)
    return {name: f for name, f in probes.items() if isinstance(f, types.FunctionType)}


def fake_mode(**kwargs: Any) -> Any:
    """A fake-tensor mode that refuses operators without a fake kernel. By default
    FakeTensorMode runs such an operator's real kernel on zero-filled inputs for a few
    namespaces (``aten``, ``quantized``, ...): the output shapes it takes from zeros
    would be baked into the graph, right or not."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True, allow_fallback_kernels=False, **kwargs)


@contextlib.contextmanager
def recording_parameter_checks(on_check: Callable[[Any, types.FrameType], None]) -> Iterator[None]:
    """Call ``on_check(instance, frame)`` for each ``isinstance(x, nn.Parameter)`` made
    while active (``frame``: the code that asked), then answer it as torch does. The
    test goes through ``nn.Parameter``'s metaclass, whose ``__instancecheck__`` is Python
    code; a trace's fake tensors are never Parameters, so an input's answer in the trace
    can differ from eager's."""
    meta = type(torch.nn.Parameter)
    native = meta.__dict__["__instancecheck__"]

    def instancecheck(cls: Any, instance: Any) -> bool:
        on_check(instance, sys._getframe(1))
        return bool(native(cls, instance))

    with patched(meta, "__instancecheck__", instancecheck):
        yield


@contextlib.contextmanager
def recording_grad_access(counts: Callable[[types.FrameType], bool]) -> Iterator[list[str]]:
    """Record reads and writes of ``.grad`` on fake tensors made by code for which
    ``counts(frame)`` is true, while active. A trace starts with no gradients on its fake
    parameters, so code that reads them (gradient clipping, an optimizer step, a
    ``zero_grad``) saw none: the artifact must serve only calls that have none either."""
    from torch._subclasses.fake_tensor import FakeTensor

    native = torch._C.TensorBase.__dict__["grad"]
    seen: list[str] = []

    def note(what: str) -> None:
        frame = sys._getframe(2)
        if counts(frame):
            seen.append(f"{what} at {frame.f_code.co_filename}:{frame.f_lineno}")

    def get(self: Any) -> Any:
        note("read")
        return native.__get__(self)

    def set_(self: Any, value: Any) -> None:
        note("write")
        native.__set__(self, value)

    def delete(self: Any) -> None:
        note("delete")
        native.__delete__(self)

    with patched(FakeTensor, "grad", property(get, set_, delete)):
        yield seen


def dim_marks(t: torch.Tensor) -> dict[str, Any]:
    """The Dynamo dim marks on ``t`` besides plain mark_unbacked: ``mark_dynamic`` dims,
    ``mark_unbacked(..., strict=True)`` dims (torch keeps them apart from the other
    unbacked dims) and ``specialize_on`` criteria."""
    return {
        "dynamic": sorted(getattr(t, "_dynamo_dynamic_indices", None) or ()),
        "strict": sorted(getattr(t, "_dynamo_strict_unbacked_indices", None) or ()),
        "specialize_on": {
            d: list(v) for d, v in (getattr(t, "_specialize_on", None) or {}).items() if v
        },
    }


class _Flat(torch.nn.Module):
    """A module with no state whose forward is ``fn``: what AOTAutograd's export takes.
    The user's modules stay out of it (``fn`` swaps their state for its inputs)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self._fn = fn

    def forward(self, *flat: Any) -> Any:
        return self._fn(*flat)


def _descriptor(desc: Any) -> tuple[str, int | None]:
    """An AOTAutograd input/output descriptor as plain data: ("input", i),
    ("output", i), ("saved", i), ("tangent", output i), ("grad", of input i), or
    (its class name, None) for anything else -- which the caller refuses."""
    from torch._functorch._aot_autograd import descriptors as d

    if desc is None:
        return ("none", None)
    if isinstance(desc, d.PlainAOTInput):
        return ("input", desc.idx)
    if isinstance(desc, d.PlainAOTOutput):
        return ("output", desc.idx)
    if isinstance(desc, d.SavedForBackwardsAOTOutput):
        return ("saved", desc.idx)
    if isinstance(desc, d.TangentAOTInput) and isinstance(desc.output, d.PlainAOTOutput):
        return ("tangent", desc.output.idx)
    if isinstance(desc, d.GradAOTOutput) and isinstance(desc.grad_of, d.PlainAOTInput):
        return ("grad", desc.grad_of.idx)
    return (type(desc).__name__, None)


def trace_joint(
    fn: Callable[..., Any],
    fakes: list[Any],
    decompositions: dict[Any, Callable[..., Any]] | None,
) -> dict[str, Any]:
    """Trace ``fn``'s forward and backward with AOTAutograd (its joint trace and default
    partition) on the fake ``fakes``, the way torch.compile does for a training graph.
    Returns the two graphs and AOTAutograd's view of the call as plain data."""
    from torch._functorch.aot_autograd import (
        aot_compile_joint_with_descriptors,
        aot_export_joint_with_descriptors,
    )

    graphs: dict[str, torch.fx.GraphModule] = {}

    def recording(kind: str) -> Callable[..., Any]:
        def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            graphs[kind] = gm
            return gm

        return compiler

    with contextlib.ExitStack() as stack:
        joint = aot_export_joint_with_descriptors(
            stack, _Flat(fn), tuple(fakes), decompositions=decompositions
        )
        meta = joint._aot_state.fw_metadata
        aot_compile_joint_with_descriptors(
            joint, fw_compiler=recording("forward"), bw_compiler=recording("backward")
        )
    if "backward" not in graphs:
        raise RuntimeError("AOTAutograd traced no backward graph for this call")
    forward, backward = graphs["forward"], graphs["backward"]
    forward_outputs = forward.graph.output_node()
    backward_outputs = backward.graph.output_node()
    return {
        "forward": forward,
        "backward": backward,
        "mutated_inputs": [
            i
            for i, info in enumerate(meta.input_info)
            if info.mutates_data or info.mutates_metadata or info.mutates_storage_metadata
        ],
        "output_kinds": [info.output_type.name for info in meta.output_info],
        "output_requires_grad": [bool(info.requires_grad) for info in meta.output_info],
        "intermediate_bases": meta.num_intermediate_bases,
        "effects": bool(meta.tokens) or bool(meta.num_backward_tokens),
        "forward_outputs": [_descriptor(x) for x in forward_outputs.meta.get("desc", [])],
        "forward_output_count": _output_count(forward_outputs),
        "backward_inputs": [
            _descriptor(n.meta.get("desc")) for n in backward.graph.nodes if n.op == "placeholder"
        ],
        "backward_outputs": [_descriptor(x) for x in backward_outputs.meta.get("desc", [])],
        "backward_output_count": _output_count(backward_outputs),
    }


def _output_count(output: torch.fx.Node) -> int:
    values = output.args[0]
    return len(values) if isinstance(values, (tuple, list)) else 1


def op_overload_qualname(target: Any) -> str | None:
    """How FX code spells a call of ``target`` when it is an ATen-style op overload
    (``torch.ops.aten.addmm.default``), else None: the graph emitter binds such ops
    to their C++ handle once (``_kernel`` in FX_GRAPH_GLOBALS)."""
    from torch._ops import OpOverload
    from torch.fx.node import _get_qualified_name

    if not isinstance(target, OpOverload) or not hasattr(target, "_op"):
        return None
    name = _get_qualified_name(target)
    return name if name.startswith("torch.ops.") else None


#: ATen views whose success depends on the input's strides (``capturing.graph_layouts``
#: frees them for the eager backend): ``view``, ``_unsafe_view``, and ``_reshape_alias``
#: (self, size, stride), with which older decompositions of reshape bake the capture's
#: strides.
#: The C setter every grad-mode switch of torch's calls (``set_grad_enabled``,
#: ``enable_grad``), and what user code calls to set the mode directly.
SET_GRAD_ENABLED = torch._C._set_grad_enabled

LAYOUT_VIEWS = (
    torch.ops.aten.view.default,
    torch.ops.aten._unsafe_view.default,
    torch.ops.aten._reshape_alias.default,
)
