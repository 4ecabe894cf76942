"""The one runtime that serves a captured forward/backward pair through autograd.

Every artifact whose graph eager would record for a backward carries ``bind_autograd``:
make_fx captures of inputs that require grad (their ``AUTOGRAD`` literal, eager and
Inductor backends) and Dynamo+Inductor subgraphs AOTAutograd partitioned
(``inductor_serving.bind_aot_graph``). Both describe their graphs by one spec, in the
shape of ``_compat.inductor.aot_runtime_spec``; a make_fx capture writes it in
``capturing.fx_autograd``. One binder means one refusal of a double backward, one of a
backward under autocast, one coercion of incoming gradients to the traced layout and one
way of saving tensors for the backward.

``bind_autograd`` is emitted into the artifacts that need it, after the artifact prelude
(``_compat.prelude.ARTIFACT_PRELUDE`` and ``AUTOGRAD_PRELUDE``), whose names the stubs
below stand for. The capture side calls it through the same emitted text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import torch as _torch

    _view_replay_enabled: Callable[[], bool] = bool
    _set_view_replay_enabled: Callable[[bool], None] = print
    _set_code_exec_strategy: Any = None
    _SKIP_FRAMES: Any = None
    _set_grad_enabled: Callable[[bool], None] = print
    _any_autocast_enabled: Callable[[], bool] = bool

    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...

    # precompile.runtime.single_graph_ambient's, carried with every section that
    # carries this module (both drivers, and the capture's AOT binder).
    def nan_detection_on() -> bool: ...

    def refuse_nan_detection() -> NoReturn: ...


def base_spec(outputs: int) -> dict[str, Any]:
    """The spec of a graph with ``outputs`` outputs around which nothing is done: no
    input detached or mutated, grad mode left as it is. Capture side only; the specs
    ``bind_autograd`` reads extend it (a backward's keys) or come from
    ``_compat.inductor.aot_runtime_spec``, which writes the same keys."""
    return {
        "joint": False,
        "detach": [],
        "mutations": [],
        "leaf_mutations": [],
        "bump_versions": [],
        "grad_enabled_mutation": None,
        "outputs": outputs,
    }


def bind_autograd(
    name: str, spec: dict[str, Any], forward_call: Any, backward_call: Any
) -> Callable[..., list[Any]]:
    """Serve a forward graph (``forward_call(*inputs)``) and its backward graph
    (``backward_call(*saved, *tangents)``, or None for a graph without one) as
    AOTAutograd's runtime wrappers would, for the cases the capture accepted (``spec``):
    detach inputs whose gradient is known to be None, run the forward in an
    autograd.Function that saves what the backward needs (tensors and sizes), hand back
    ``plain_outputs`` as plain tensors, mark outputs that need no gradient, coerce
    incoming gradients to the layout the backward was traced for, refuse a double
    backward and a backward under autocast, copy mutated inputs back, restore grad mode.
    Returns ``run(*inputs) -> list of outputs``."""
    detach = tuple(spec["detach"])
    mutations = tuple(spec["mutations"])
    leaves = frozenset(spec["leaf_mutations"])
    bump = tuple(spec["bump_versions"])
    grad_mode_after = spec["grad_enabled_mutation"]
    detach_outputs = spec.get("detach_outputs", False)
    expected = len(mutations) + spec["outputs"]

    def finish(args: list[Any], outs: Any) -> list[Any]:
        outs = list(outs)
        if len(outs) != expected:
            refuse(
                f"precompile: graph {name} returned {len(outs)} values where it was "
                f"captured returning {expected}; this is a precompile bug, please report it"
            )
        for i, index in enumerate(mutations):
            original = args[index]
            if index in leaves and original.requires_grad:
                original.detach().copy_(outs[i])
            else:
                original.copy_(outs[i])
        if bump:
            _torch.autograd.graph.increment_version(tuple(args[i] for i in bump))
        if grad_mode_after is not None:
            _set_grad_enabled(grad_mode_after)
        return outs[len(mutations) :]

    if backward_call is None:

        def run_inference(*args: Any) -> list[Any]:
            inputs = list(args)
            enabled = _torch.is_grad_enabled()
            if enabled:
                _set_grad_enabled(False)
            try:
                outs = forward_call(*inputs)
            finally:
                if enabled:
                    _set_grad_enabled(True)
            if detach_outputs:
                outs = [
                    o.detach() if isinstance(o, _torch.Tensor) and o.requires_grad else o
                    for o in outs
                ]
            return finish(inputs, outs)

        return run_inference

    saved = slice(*spec["saved"])
    saved_no_check = slice(*spec["saved_no_check"])
    symints = slice(*spec["symints"])
    returns = spec["forward_returns"]
    non_differentiable = tuple(spec["non_differentiable"])
    plain_outputs = tuple(spec.get("plain_outputs", ()))
    grad_outs = spec["grad_outs"]
    tangents = tuple(
        (
            position,
            None
            if fmt is None
            else (
                ("format", getattr(_torch, fmt[1]))
                if fmt[0] == "format"
                else ("strided", tuple(fmt[1]), tuple(fmt[2]))
            ),
        )
        for position, fmt in spec["tangents"]
    )

    def tangent(grad: Any, fmt: Any) -> Any:
        # The backward graph was traced (and Inductor lowered it) for one layout of each
        # incoming gradient: give it that layout (a gradient may come transposed, or
        # expanded from a scalar with stride 0).
        if fmt is None or not isinstance(grad, _torch.Tensor):
            return grad
        if fmt[0] == "format":
            if not grad.is_contiguous(memory_format=fmt[1]):
                grad = grad.contiguous(memory_format=fmt[1])
            return grad
        if tuple(grad.shape) == fmt[1] and grad.stride() == fmt[2]:
            return grad
        restrided = _torch.empty_strided(
            fmt[1], fmt[2], dtype=grad.dtype, device=grad.device, layout=grad.layout
        )
        restrided.copy_(grad)
        return restrided

    class CompiledFunction(_torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:
            outs = list(forward_call(*args))
            # A saved view is saved detached, as AOTAutograd saves it (it shares the
            # version counter, so an in-place change before the backward is still seen).
            ctx.save_for_backward(*[t.detach() if t._is_view() else t for t in outs[saved]])
            ctx.unchecked = [t.detach() if t._is_view() else t for t in outs[saved_no_check]]
            ctx.symints = outs[symints]
            raw = outs[:returns]
            for i in plain_outputs:
                # A view made inside the Function (of an intermediate, or an input object
                # a make_fx lowered forward hands back for x.detach()) could not be
                # written in place; eager's could: hand back a plain tensor.
                raw[i] = raw[i].detach()
            ctx.mark_non_differentiable(
                *[raw[i] for i in non_differentiable if isinstance(raw[i], _torch.Tensor)]
            )
            ctx._materialize_non_diff_grads = False
            return tuple(raw)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            if len(grads) != grad_outs:
                refuse(
                    f"precompile: graph {name} got {len(grads)} gradients, expected "
                    f"{grad_outs}; this is a precompile bug, please report it"
                )
            if nan_detection_on():
                # The caller's backward, under anomaly detection: eager's checks each
                # backward function's output, which this compiled backward has none of.
                refuse_nan_detection()
            if _torch.is_grad_enabled():
                refuse(
                    f"precompile: a backward with create_graph=True (a double backward) "
                    f"through the outputs of graph {name} is not supported: its captured "
                    f"backward graph records no autograd history, so higher-order "
                    f"gradients would be silently wrong. Run the backward without "
                    f"create_graph, or run this computation eagerly",
                    5,
                )
            if _any_autocast_enabled():
                refuse(
                    f"precompile: the backward of graph {name} runs under torch.autocast, "
                    f"but its captured backward graph holds the dtypes of a backward "
                    f"without it: eager would recast some of its ops. Run the backward "
                    f"outside the autocast block (as PyTorch recommends), or run this "
                    f"computation eagerly",
                    5,
                )
            all_args = [
                *ctx.symints,
                *ctx.saved_tensors,
                *ctx.unchecked,
                *(tangent(grads[position], fmt) for position, fmt in tangents),
            ]
            ctx.unchecked = None
            return tuple(backward_call(*all_args))

    def run_training(*args: Any) -> list[Any]:
        inputs = list(args)
        for index in detach:
            if isinstance(inputs[index], _torch.Tensor):
                inputs[index] = inputs[index].detach()
        replay = _view_replay_enabled()
        try:
            if not replay:
                _set_view_replay_enabled(True)
            with _torch.enable_grad():
                outs = CompiledFunction.apply(*inputs)
        finally:
            if _view_replay_enabled() != replay:
                _set_view_replay_enabled(replay)
        return finish(list(args), outs)

    # The autograd engine calls backward from whatever frame runs loss.backward(); where
    # Dynamo's frame callback is active (a capture, an installed artifact) it must not
    # try to compile this runtime, as it never compiles AOTAutograd's own.
    for code in (
        CompiledFunction.forward.__code__,
        CompiledFunction.backward.__code__,
        run_training.__code__,
    ):
        _set_code_exec_strategy(code, _SKIP_FRAMES)
    return run_training
