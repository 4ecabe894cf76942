"""Turn a captured FX graph into standalone source with a boxed ``call(flat_inputs)``.

The eager backend runs this source as is; it needs only ``torch``.
"""

from __future__ import annotations

import re

import torch

from precompile._compat.prelude import FX_GRAPH_GLOBALS
from precompile._compat.tracing import op_overload_qualname
from precompile.capturing.fx_refusals import is_literal_constant
from precompile.capturing.fx_trace import SingleGraph
from precompile.errors import PrecompileError

#: Names FX-generated code may reference; FX_GRAPH_GLOBALS defines every one of them.
_KNOWN_GLOBALS = {"torch", "device", "inf", "nan", "NoneType", "fx_pytree", "pytree"}


def _inline_literal_constants(gm: torch.fx.GraphModule) -> None:
    """Rebuild tensors fn made from Python literals as torch.tensor(...) calls, so the
    artifact needs no pickled constants."""
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        value = getattr(gm, node.target)
        if not is_literal_constant(node, value):
            continue
        with gm.graph.inserting_before(node):
            literal = gm.graph.call_function(
                torch.tensor,
                (value.tolist(),),
                {"dtype": value.dtype, "device": value.device},
            )
        node.replace_all_uses_with(literal)
        gm.graph.erase_node(node)
        delattr(gm, node.target)
    gm.graph.lint()
    gm.recompile()


def _input_legend(graph: SingleGraph, placeholders: list[str]) -> list[str]:
    labels = [f"parameter {n!r}" for n in graph.lifted.names[: graph.lifted.num_params]]
    labels += [f"buffer {n!r}" for n in graph.lifted.names[graph.lifted.num_params :]]
    labels += [
        f"input value {i}"
        for i, leaf in enumerate(graph.user_leaves)
        if isinstance(leaf, torch.Tensor)
    ]
    return [f"#   {p}: {label}" for p, label in zip(placeholders, labels)]


def fx_graph_source(graph: SingleGraph) -> str:
    gm = graph.graph_module
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    return "\n".join(
        [
            FX_GRAPH_GLOBALS,
            "# The captured ATen graph. Its inputs, in order:",
            *_input_legend(graph, placeholders),
            _graph_function(gm, "_graph"),
            "",
            "",
            _boxed_call("call", "_graph"),
        ]
    )


def _graph_function(gm: torch.fx.GraphModule, name: str) -> str:
    """``gm``'s code as a module-level function ``name(self, *inputs)``."""
    _inline_literal_constants(gm)
    code = gm.graph.python_code(root_module="self")
    unknown = set(code.globals) - _KNOWN_GLOBALS
    if unknown:
        raise PrecompileError(
            f"the captured graph references {sorted(unknown)}, which an artifact cannot "
            f"import; this is a precompile limitation, please report it",
        )
    body = code.src.strip().replace("def forward(self,", f"def {name}(self,", 1)
    body = body.replace("def forward(self)", f"def {name}(self)", 1)
    return bind_kernel_handles(gm, body)


def bind_kernel_handles(gm: torch.fx.GraphModule, source: str) -> str:
    """``source`` (``gm``'s generated code) with each ATen op overload it calls bound
    once at module level to its C++ operator handle (``_kernel``), and the calls
    rewritten to that name: ``torch.ops.aten.addmm.default(...)`` goes through
    ``OpOverload.__call__`` (a Python frame) per call, the handle is what that frame
    calls. Same kernel, same arguments, same result; the binding lines name the op, so
    the artifact stays readable. A name that a graph value already uses keeps the
    original spelling (it would be shadowed)."""
    taken = {node.name for node in gm.graph.nodes}
    bindings: list[str] = []
    seen: set[str] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        qualname = op_overload_qualname(node.target)
        if qualname is None or qualname in seen:
            continue
        seen.add(qualname)
        alias = "_k_" + qualname[len("torch.ops.") :].replace(".", "_")
        if alias in taken or not alias.isidentifier():
            continue
        pattern = re.compile(r"(?<![\w.])" + re.escape(qualname) + r"(?=\()")
        source, count = pattern.subn(alias, source)
        if count:
            bindings.append(f"{alias} = _kernel({qualname})")
    if not bindings:
        return source
    header = "# Each op's C++ handle, bound once (what torch.ops.<op>(...) would call)."
    return "\n".join([header, *bindings, "", "", source])


def _boxed_call(name: str, graph_function: str) -> str:
    return "\n".join(
        [
            f"def {name}(flat_inputs):",
            '    """Boxed like Inductor\'s call: takes the list and clears it."""',
            "    inputs = tuple(flat_inputs)",
            "    flat_inputs.clear()",
            f"    return {graph_function}(None, *inputs)",
            "",
        ]
    )


def fx_autograd_source(
    graph: SingleGraph, forward: torch.fx.GraphModule, backward: torch.fx.GraphModule
) -> str:
    """The forward and backward graphs of an autograd capture: ``call`` runs the forward
    (outputs, then what the backward saves), ``call_backward`` the backward (the saved
    values, then the outputs' gradients; one gradient or None per forward input)."""
    placeholders = [n.name for n in forward.graph.nodes if n.op == "placeholder"]
    return "\n".join(
        [
            FX_GRAPH_GLOBALS,
            "# The captured forward ATen graph (AOTAutograd). Its inputs, in order:",
            *_input_legend(graph, placeholders),
            _graph_function(forward, "_graph"),
            "",
            "",
            _boxed_call("call", "_graph"),
            "",
            "# The captured backward ATen graph: the forward's saved values, then the",
            "# gradients of the outputs that require grad.",
            _graph_function(backward, "_graph_backward"),
            "",
            "",
            _boxed_call("call_backward", "_graph_backward"),
        ]
    )
