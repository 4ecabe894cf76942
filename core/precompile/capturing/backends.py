"""Backends turn a captured single graph into the graph section of python_code."""

from __future__ import annotations

from precompile._compat.prelude import AUTOGRAD_PRELUDE
from precompile.capturing import carried
from precompile.capturing.emit import LoweredGraph
from precompile.capturing.fx_trace import SingleGraph
from precompile.capturing.graph_code import fx_autograd_source, fx_graph_source
from precompile.capturing.graph_layouts import free_views
from precompile.runtime import single_graph

BACKENDS = ("inductor", "eager")


def check_backend(backend: object) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"precompile: backend must be 'inductor' or 'eager', got {backend!r}")
    return str(backend)


def lower_eager(graph: SingleGraph) -> LoweredGraph:
    """FX code of the captured graph(s). The eager backend promises to run on any
    layout, so the views the trace chose for the capture's strides are freed first
    (``graph_layouts.free_views``)."""
    if graph.grad_inputs:
        from precompile.capturing.fx_autograd import capture_joint

        assert graph.joint_inputs is not None
        joint = capture_joint(graph, graph.joint_inputs[2])
        free_views(joint.forward)
        free_views(joint.backward)
        return LoweredGraph(
            source=fx_autograd_source(graph, joint.forward, joint.backward),
            relabel=single_graph.relabel_layout_error_eager,
            runtime=(carried.SingleGraph.EAGER_AUTOGRAD,),
            prelude=AUTOGRAD_PRELUDE,
            autograd=joint.runtime,
        )
    free_views(graph.graph_module)
    return LoweredGraph(
        source=fx_graph_source(graph), relabel=single_graph.relabel_layout_error_eager
    )
