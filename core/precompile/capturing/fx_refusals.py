"""What a single-graph trace refuses once it has run, or when it fails.

``TraceRefusal`` is raised inside the trace (by the opaque-access mode and the traced
flat function) and becomes a ``PrecompileError`` placed at the user's line; the
tracer's own exceptions (data-dependent decisions, ops without a fake kernel, control
flow) are translated into refusals that say what to do instead; the finished graph is
checked for tensors that are not inputs and for control-flow operators.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

import torch

from precompile._compat import tracing
from precompile.capturing.fx_inputs import fn_location
from precompile.errors import Location, PrecompileError
from precompile.locations import StackFrame, innermost, traceback_user_stack

#: A tensor built inside fn from Python literals may stay in the graph up to this size.
MAX_LITERAL_CONSTANT_NUMEL = 4096


class TraceRefusal(Exception):
    """Raised inside the trace; becomes a PrecompileError placed at the user's line."""

    def __init__(self, message: str, invariant: int | None, hint: str | None = None):
        super().__init__(message)
        self.invariant = invariant
        self.hint = hint


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


def refuse_from_exception(error: BaseException, training: bool) -> PrecompileError:
    where = innermost(traceback_user_stack(error.__traceback__))
    control_flow = _higher_order_op_in(error.__traceback__)
    if control_flow and not isinstance(error, TraceRefusal):
        return _control_flow_refusal(control_flow, where)
    if isinstance(error, TraceRefusal):
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
        if tracing.dispatched_by_autograd_engine(error.__traceback__):
            return PrecompileError(
                f"fn's backward reads tensor values inside autograd's engine ({op}), as "
                f"anomaly detection's NaN check of every gradient does "
                f"(torch.autograd.detect_anomaly() or set_detect_anomaly(True)); a single "
                f"graph cannot specialize on values it has not seen, and an artifact's "
                f"backward runs no such check",
                invariant=3,
                location=where,
                hint="run the backward outside anomaly detection, or under "
                "detect_anomaly(check_nan=False), which only records where each node was "
                "made; debug a NaN by running fn eagerly",
            )
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


def check_grad_inputs_capture(
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


def is_literal_constant(node: torch.fx.Node, value: Any) -> bool:
    """A tensor fn built from Python literals (torch.tensor([...])) is safe to inline."""
    return (
        isinstance(value, torch.Tensor)
        and value.numel() <= MAX_LITERAL_CONSTANT_NUMEL
        and bool(node.users)
        and all(u.target is torch.ops.aten.lift_fresh_copy.default for u in node.users)
    )


def _generator_refusal(where: Location | None) -> PrecompileError:
    """A graph that holds a ``torch.Generator`` object: the emitted graph drew from the
    process's default generator instead (served silently wrong, every call), or its
    code failed to load (a raw AttributeError out of the capture)."""
    return PrecompileError(
        "fn draws random numbers from a torch.Generator object it holds; an artifact "
        "cannot carry a generator, so its calls would draw another sequence than eager's",
        invariant=1,
        location=where,
        hint="draw from the default generator (seed it with torch.manual_seed), or draw "
        "the random tensor outside fn and pass it as an argument",
    )


def check_graph(
    gm: torch.fx.GraphModule,
    node_stacks: dict[str, list[StackFrame]],
    fn: Callable[..., Any],
    modules: list[torch.nn.Module],
) -> None:
    for node in gm.graph.nodes:
        frames = node_stacks.get(node.name, [])
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            if isinstance(value, torch.Generator):
                raise _generator_refusal(innermost(frames) or fn_location(fn))
            if not isinstance(value, torch.Tensor) or is_literal_constant(node, value):
                continue  # a subgraph of a control-flow op is refused at that op
            raise PrecompileError(
                f"fn uses a tensor that is not an input: "
                f"{_name_constant(value, fn, modules, frames)}; the artifact would bake "
                f"its current value in as a constant",
                invariant=1,
                location=innermost(frames) or fn_location(fn),
                hint="pass it as an argument of fn, or register it on a module "
                "argument with register_buffer / nn.Parameter",
            )
        if node.op == "call_function" and isinstance(node.target, tracing.HigherOrderOperator):
            where = innermost(frames) or fn_location(fn)
            raise _control_flow_refusal(node.target.name(), where)
