"""The forward and backward graphs of an inference capture whose inputs require grad.

Eager gives such a call outputs that carry grad: a later ``backward()`` fills the
inputs' and the parameters' ``.grad``. The artifact serves that through a small
``torch.autograd.Function`` over two graphs, traced here by AOTAutograd (the joint trace
and partition torch.compile uses for training): the forward returns the outputs and what
the backward needs; the backward takes that and the outputs' gradients and returns one
gradient per graph input. Only calls it can serve exactly are accepted: what AOTAutograd
would have to patch up at run time (input mutations, outputs that alias inputs or each
other, effect tokens, saved sizes) is refused here, naming the problem and the fix.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

from precompile._compat import tracing
from precompile.capturing.fx_trace import SingleGraph
from precompile.errors import PrecompileError
from precompile.runtime.autograd_serving import base_spec

_OUTPUT_ALIAS = {
    "is_input": "is an input of fn itself (a tensor argument, parameter or buffer)",
    "alias_of_input": "is a view of an input of fn (a tensor argument, parameter or buffer)",
}


@dataclasses.dataclass
class JointGraphs:
    """The two graphs and what the emitted ``torch.autograd.Function`` needs to run them
    (``runtime`` becomes the artifact's ``AUTOGRAD`` literal)."""

    forward: torch.fx.GraphModule
    backward: torch.fx.GraphModule
    runtime: dict[str, Any]

    def placeholder_values(self, which: str) -> list[Any]:
        gm = self.forward if which == "forward" else self.backward
        return [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]


def _labels(graph: SingleGraph) -> list[str]:
    lifted = graph.lifted
    labels = [f"parameter {n!r}" for n in lifted.names[: lifted.num_params]]
    labels += [f"buffer {n!r}" for n in lifted.names[lifted.num_params :]]
    labels += [
        f"input value {i}"
        for i, leaf in enumerate(graph.user_leaves)
        if isinstance(leaf, torch.Tensor)
    ]
    return labels


def _refuse(message: str, hint: str) -> PrecompileError:
    return PrecompileError(message, invariant=5, hint=hint)


_LIMIT_HINT = (
    "capture under torch.no_grad() (then serve under it too), or pass x.detach(); "
    "this is a precompile limitation, please report it"
)


def capture_joint(graph: SingleGraph, decompositions: dict[Any, Any] | None) -> JointGraphs:
    """Trace ``graph``'s function forward and backward, and check that the emitted
    autograd.Function serves it exactly as eager would."""
    assert graph.joint_inputs is not None
    flat_fn, tensors, _ = graph.joint_inputs
    fake_mode = tracing.fake_mode()
    fakes = [fake_mode.from_tensor(t) for t in tensors]
    try:
        with torch.enable_grad(), warnings.catch_warnings():
            # fn's own checks read .grad of its inputs, which AOTAutograd's functional
            # wrappers make non-leaf: torch warns, and the value (None) is right.
            warnings.filterwarnings("ignore", "The .grad attribute of a Tensor that is not")
            joint = tracing.trace_joint(flat_fn, fakes, decompositions)
    except PrecompileError:
        raise
    except Exception as error:
        raise _refuse(
            f"AOTAutograd could not trace the backward of fn (its input requires grad): "
            f"{type(error).__name__}: {str(error)[:500]}",
            "make the backward traceable (a custom autograd.Function's backward must use "
            "torch operations only), or " + _LIMIT_HINT,
        ) from error
    labels = _labels(graph)
    _check_metadata(graph, joint, labels)
    return JointGraphs(joint["forward"], joint["backward"], _runtime(graph, joint))


def _check_metadata(graph: SingleGraph, joint: dict[str, Any], labels: list[str]) -> None:
    for i in joint["mutated_inputs"]:
        raise _refuse(
            f"fn mutates {labels[i]} in place while an input requires grad; the artifact "
            f"serves the outputs' gradients through a captured forward and backward graph, "
            f"which does not replay in-place updates of fn's inputs",
            "compute out of place (x = x + 1 rather than x.add_(1)); or capture under "
            "torch.no_grad() (then serve under it too), or pass x.detach()",
        )
    for i, kind in enumerate(joint["output_kinds"]):
        if kind in ("non_alias", "unsafe_view_alias"):
            continue
        what = _OUTPUT_ALIAS.get(kind, f"aliases another output or intermediate ({kind})")
        raise _refuse(
            f"output value {i} {what}, while an input requires grad; the artifact's "
            f"captured autograd graph returns new tensors only, where eager would return "
            f"a view sharing memory (and autograd history) with it",
            "return a copy (.clone()) of that output, or capture under torch.no_grad() "
            "(then serve under it too)",
        )
    if joint["intermediate_bases"]:
        raise _refuse(
            "fn returns several views of one intermediate tensor while an input requires "
            "grad; the artifact's captured autograd graph returns new tensors only",
            "return copies (.clone()) of those outputs",
        )
    if joint["effects"]:
        raise _refuse(
            "fn calls operators with side effects (effect tokens) while an input requires "
            "grad; the artifact's captured autograd graph cannot order them",
            _LIMIT_HINT,
        )
    if joint["output_requires_grad"] != graph.output_requires_grad:
        raise _refuse(
            f"the captured backward disagrees with eager on which outputs carry grad "
            f"(AOTAutograd: {joint['output_requires_grad']}, the trace: "
            f"{graph.output_requires_grad})",
            _LIMIT_HINT,
        )


def _runtime(graph: SingleGraph, joint: dict[str, Any]) -> dict[str, Any]:
    """How the emitted Function maps the graphs' inputs and outputs, checked against the
    calling convention it relies on: forward -> (outputs..., saved...); backward
    (saved..., tangents...) -> one gradient (or None) per forward input."""
    n_outputs = len(graph.output_requires_grad)
    n_inputs = len(joint["forward"].graph.find_nodes(op="placeholder"))
    fw_out = joint["forward_outputs"]
    n_saved = len(fw_out) - n_outputs
    expected = [("output", i) for i in range(n_outputs)] + [("saved", i) for i in range(n_saved)]
    saved_values = list(joint["forward"].graph.output_node().args[0])[n_outputs:]
    bw_in = joint["backward_inputs"]
    tangents = [idx for kind, idx in bw_in[n_saved:] if kind == "tangent"]
    grad_of = [idx if kind == "grad" else None for kind, idx in joint["backward_outputs"]]
    conventional = (
        fw_out == expected
        and len(fw_out) == joint["forward_output_count"]
        and all(isinstance(getattr(v, "meta", {}).get("val"), torch.Tensor) for v in saved_values)
        and len(bw_in) == n_saved + len(tangents)
        and all(kind in ("input", "none") for kind, _ in bw_in[:n_saved])
        and len(joint["backward_outputs"]) == joint["backward_output_count"] == n_inputs
        and all(g in (i, None) for i, g in enumerate(grad_of))
        and all(kind in ("grad", "none") for kind, _ in joint["backward_outputs"])
    )
    if not conventional:
        raise _refuse(
            f"AOTAutograd partitioned fn's forward and backward in a form the artifact "
            f"cannot run (forward outputs {fw_out[:12]}, backward inputs {bw_in[:12]}); "
            f"saved sizes (dynamic shapes) or opaque objects are not supported",
            _LIMIT_HINT,
        )
    tangent_nodes = list(joint["backward"].graph.find_nodes(op="placeholder"))[n_saved:]
    end = n_outputs + n_saved
    # The spec ``autograd_serving.bind_autograd`` serves by, in the shape of
    # ``_compat.inductor.aot_runtime_spec``: no input mutations, no saved sizes, every tangent
    # restrided to the traced gradient's layout.
    return {
        **base_spec(n_outputs),
        "joint": True,
        "forward_returns": n_outputs,
        "saved": [n_outputs, end],
        "saved_no_check": [end, end],
        "symints": [end, end],
        "non_differentiable": [
            i for i, wanted in enumerate(joint["output_requires_grad"]) if not wanted
        ],
        # An output that is a view of an intermediate is handed back as a plain tensor
        # (a view made inside an autograd.Function could not be written in place); the
        # emitter adds the outputs the lowered forward returns as input objects.
        "plain_outputs": [
            i for i, kind in enumerate(joint["output_kinds"]) if kind == "unsafe_view_alias"
        ],
        "grad_outs": n_outputs,
        "tangents": [
            [i, ("strided", tuple(n.meta["val"].shape), tuple(n.meta["val"].stride()))]
            for i, n in zip(tangents, tangent_nodes)
        ],
    }
