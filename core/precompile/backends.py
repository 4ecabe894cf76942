"""Backends turn a captured single graph into the graph section of python_code."""

from __future__ import annotations

from precompile import autograd_serving, driver
from precompile._compat.prelude import AUTOGRAD_PRELUDE
from precompile.emit import LoweredGraph
from precompile.fx_capture import SingleGraph
from precompile.graph_code import fx_autograd_source, fx_graph_source
from precompile.graph_layouts import free_views

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
        from precompile.autograd_capture import capture_joint

        assert graph.joint_inputs is not None
        joint = capture_joint(graph, graph.joint_inputs[2])
        free_views(joint.forward)
        free_views(joint.backward)
        return LoweredGraph(
            source=fx_autograd_source(graph, joint.forward, joint.backward),
            relabel=driver.relabel_layout_error_eager,
            runtime=(autograd_serving.bind_autograd,),
            prelude=AUTOGRAD_PRELUDE,
            autograd=joint.runtime,
        )
    free_views(graph.graph_module)
    return LoweredGraph(source=fx_graph_source(graph), relabel=driver.relabel_layout_error_eager)
