"""Backends turn a captured single graph into the graph section of python_code."""

from __future__ import annotations

from precompile import driver
from precompile.emit import LoweredGraph
from precompile.fx_capture import SingleGraph
from precompile.graph_code import fx_graph_source

BACKENDS = ("inductor", "eager")


def check_backend(backend: object) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"precompile: backend must be 'inductor' or 'eager', got {backend!r}")
    return str(backend)


def lower_eager(graph: SingleGraph) -> LoweredGraph:
    return LoweredGraph(source=fx_graph_source(graph), relabel=driver._relabel_layout_error_eager)
