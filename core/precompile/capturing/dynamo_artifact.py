"""Turn a finished Dynamo capture (``DynamoSession.finish``'s ``DynamoCapture``) into
its artifact and its report."""

from __future__ import annotations

from typing import Any

from precompile.capturing.dynamo_capture import DynamoCapture
from precompile.capturing.dynamo_emit import emit_dynamo
from precompile.capturing.dynamo_frames import FrameRecord
from precompile.capturing.dynamo_guard_audit import audit
from precompile.capturing.emit import Artifact
from precompile.report import CaptureReport, PrecompileSummary


def summarize(
    frames: list[FrameRecord], graph_breaks: int, backend_graphs: int
) -> PrecompileSummary:
    return PrecompileSummary(
        frames=len(frames),
        resume_functions=sum(1 for f in frames if f.resume_names),
        guarded_codes=sum(len(f.variants) for f in frames),
        backend_graphs=backend_graphs,
        graph_breaks=graph_breaks,
        bypassed=[
            f"{f.name} ({f.bypass_reason})" if f.bypass_reason else f.name
            for f in frames
            if f.bypassed
        ],
        truncated=[f.name for f in frames if f.truncated],
        uncovered=[
            f.name
            for f in frames
            if f.resume_names and not (f.variants or f.trivial or f.eager_fallback or f.bypassed)
        ],
        eager_fallback=[
            f"{f.name} ({f.eager_reason})" if f.eager_reason else f.name
            for f in frames
            if f.eager_fallback
        ],
    )


def build_dynamo_artifact(
    capture: DynamoCapture,
    *,
    fn_info: dict[str, Any],
    artifact_path: str,
    input_sources: list[dict[str, Any]],
) -> tuple[Artifact, CaptureReport, Any]:
    """The artifact (``dynamo_emit``) and the report of a finished capture; the third
    item is what the load caches beside the artifact (``DynamoGraphs.bundle``)."""
    frames = capture.frames
    report = CaptureReport(target=fn_info, tracer="dynamo", backend=capture.backend)
    report.serving_mode = capture.serving_mode
    report.frames = [f.summary() for f in frames]
    report.graph_breaks = [b.to_dict() for b in capture.graph_breaks]
    report.recompiles = list(capture.recompiles)
    report.summary = summarize(frames, len(capture.graph_breaks), len(capture.graphs.order))
    report.audit = audit(frames)
    report.graph = {"graphs": len(capture.graphs.order), "ops": capture.graphs.ops}
    artifact = emit_dynamo(
        capture, fn_info=fn_info, artifact_path=artifact_path, input_sources=input_sources
    )
    report.guards = artifact.metadata["GUARDS"]
    report.function_sources = artifact.metadata["FUNCTION_SOURCES"]
    report.sources = artifact.metadata["SOURCES"]
    return artifact, report, capture.graphs.bundle
