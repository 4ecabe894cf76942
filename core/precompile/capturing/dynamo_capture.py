"""The one record a finished Dynamo capture hands its artifact and report
(``DynamoSession.finish``): a module of one record type, ``DynamoCapture``, with
``DynamoGraphs``, the part of it the backend built.

The build runs one way: the session builds the record (refusing, in this order, a capture
with no call, a tracing probe, a graph the backend cannot ship, the dependencies its
recorders refuse), and ``dynamo_emit`` and ``dynamo_artifact`` read only the record.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

import torch

from precompile.capturing.dynamo_frames import FrameRecord, GraphBreak


@dataclasses.dataclass(frozen=True)
class DynamoGraphs:
    """The subgraphs Dynamo compiled, as the backend ships them.

    ``section(names, tensor_guards)`` renders the artifact's graphs section under the names the emitter
    normalizes: those names come from the content tag, which hashes ``sources``, so the
    section is a callback rather than text. ``bundle(namespace)`` is what the load caches
    beside the artifact (Inductor's kernels and cache files; nothing for eager).
    """

    #: Backend ids, by frame (``dynamo_graph_sections.backend_order``).
    order: list[str]
    #: Each graph's source, for the content tag.
    sources: list[str]
    #: ``call_function`` nodes over the graphs, for the report.
    ops: int
    #: Every FX graph the backends were handed, and those Inductor lowered (for
    #: ``library_surface.record_dynamo_surface``).
    graphs: list[torch.fx.GraphModule]
    lowered: list[torch.fx.GraphModule]
    #: ``section(names, tensor_guards)``: ``tensor_guards`` maps a backend id to the
    #: TENSOR_MATCH specs of each variant of the frames that call it, where the plain
    #: guard program serves (the proof ``inductor_backend.dynamo_proven_inputs`` reads:
    #: an Inductor subgraph skips the input asserts they prove); None elsewhere.
    section: Callable[[dict[str, str], dict[str, list[list[dict[str, Any]]]] | None], str]
    bundle: Callable[[dict[str, Any]], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class DynamoCapture:
    """Everything a Dynamo artifact and its report are made from."""

    fn: types.FunctionType
    backend: str
    training: bool
    #: Default dtype and deterministic mode of every captured call.
    global_state: dict[str, Any]
    #: The torch modes around every captured call.
    ambient_modes: tuple[str, ...]
    #: Dynamo's CompilePackage (an installed artifact carries its cache entry).
    package: Any
    frames: list[FrameRecord]
    graph_breaks: list[GraphBreak]
    recompiles: list[dict[str, Any]]
    #: Every code object the trace ran: traced into a graph, then read by the recorders.
    codes: tuple[types.CodeType, ...]
    graphs: DynamoGraphs
    #: ``standalone`` or ``installed`` (``dynamo_frames.serving_mode``).
    serving_mode: str
    #: The user files the frames and what Dynamo inlined came from.
    source_files: list[str]
    #: The recorders' metadata (``MODULE_HOOKS``, ``GLOBAL_READS``, ... and
    #: ``LIBRARY_SURFACE``), before the emitter renames Dynamo's minted names in it.
    dependencies: dict[str, Any]
