"""Turn a finished Dynamo capture session into its artifact and its report."""

from __future__ import annotations

import types
from typing import Any

from precompile._compat.kernel_platform import kernel_platform
from precompile.capturing.dynamo_emit import emit_dynamo
from precompile.capturing.dynamo_graph_sections import (
    backend_order,
    eager_graph_section,
    graph_source,
    inductor_graph_section,
)
from precompile.capturing.dynamo_guard_audit import audit
from precompile.capturing.dynamo_session import (
    DynamoSession,
    FrameRecord,
    function_sources,
    inlined_source_files,
    serving_mode,
)
from precompile.capturing.emit import Artifact
from precompile.capturing.inductor_backend import (
    InlinedAotSubgraph,
    InlinedSubgraph,
    collect_kernels,
)
from precompile.capturing.library_surface import record_dynamo_surface
from precompile.errors import PrecompileError
from precompile.locations import is_project_file
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


def guards_summary(frames: list[FrameRecord]) -> list[dict[str, Any]]:
    """Per frame and variant, which guards the serialized copy kept and which it dropped
    (and who dropped them: the default filter, the driver, or the user's filter)."""
    rows = []
    for frame in frames:
        for index, decisions in enumerate(frame.guards):
            rows.append(
                {
                    "frame": frame.name,
                    "variant": index,
                    "kept": [f"{d.guard_type} {d.name}" for d in decisions if d.kept],
                    "dropped": [
                        {"guard": f"{d.guard_type} {d.name}", "by": d.dropped_by, "value": d.value}
                        for d in decisions
                        if not d.kept
                    ],
                }
            )
    return rows


#: The names of torch's "is a trace or compile running?" probes. Dynamo answers True for
#: the compiling ones while it traces (as torch.compile does), eager answers False.
_PROBE_NAMES = frozenset({"is_compiling", "is_dynamo_compiling", "is_exporting"})


def refuse_tracing_probes(codes: list[types.CodeType]) -> None:
    """A branch on ``torch.compiler.is_compiling()`` in project code is traced as True,
    so an artifact would serve the branch eager never takes: refused at capture. Told by
    the name the code loads (an over-approximation: any use of the name counts)."""
    for code in codes:
        if not is_project_file(code.co_filename):
            continue
        probe = next((n for n in code.co_names if n in _PROBE_NAMES), None)
        if probe is not None:
            raise PrecompileError(
                f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno}) calls "
                f"{probe}(), which answers True while Dynamo captures and False in eager: "
                f"the artifact would serve the branch eager never takes",
                invariant=3,
                hint="remove the branch, or make both branches compute the same thing",
            )


def build_dynamo_artifact(
    session: DynamoSession, *, fn_info: dict[str, Any], artifact_path: str
) -> tuple[Artifact, CaptureReport, Any]:
    frames = session.frames()
    breaks = session.graph_breaks()
    refuse_tracing_probes([*session.traced_codes, *session.dependencies.read_codes])
    mode, _why = serving_mode(frames)
    order = backend_order(frames)
    report = CaptureReport(target=fn_info, tracer="dynamo", backend=session.backend)
    report.serving_mode = mode
    report.frames = [f.summary() for f in frames]
    report.graph_breaks = [b.to_dict() for b in breaks]
    report.recompiles = list(session.recompiles)
    report.guards = guards_summary(frames)
    report.function_sources = function_sources(
        session.fn,
        frames,
        artifact_path,
        [*session.traced_codes, *session.dependencies.read_codes],
    )
    report.summary = summarize(frames, len(breaks), len(order))
    report.audit = audit(frames)
    if session.backend == "eager":
        graphs = session.backend_graphs()
        graph_sources = [graph_source(i, graphs[b]) for i, b in enumerate(order) if b in graphs]
        ops = sum(
            1
            for b in order
            if b in graphs
            for n in graphs[b].graph.nodes
            if n.op == "call_function"
        )

        def graph_section(names: dict[str, str]) -> str:
            return eager_graph_section(frames, graphs, names)

        collect_bundle: Any = lambda namespace: {}  # noqa: E731
    else:
        inlined = session.inlined_subgraphs()
        artifacts = session.inductor_artifacts([b for b in order if b not in inlined])
        modules = {b: sub.source for b, sub in inlined.items() if isinstance(sub, InlinedSubgraph)}
        aot_graphs = {
            b: (sub.spec, sub.forward, sub.backward)
            for b, sub in inlined.items()
            if isinstance(sub, InlinedAotSubgraph)
        }
        graph_sources = [gm.code for gm in session.inductor_graphs]
        ops = sum(
            1 for gm in session.inductor_graphs for n in gm.graph.nodes if n.op == "call_function"
        )

        input_checks = session.input_checks_by_backend()

        def graph_section(names: dict[str, str]) -> str:
            return inductor_graph_section(
                frames, modules, aot_graphs, artifacts, names, input_checks
            )

        files = session.inductor_cache_files(artifacts) if artifacts else {}

        def collect_bundle(namespace: dict[str, Any]) -> dict[str, Any]:
            bundle: dict[str, Any] = {"requires": kernel_platform()}
            if files:
                bundle["inductor_cache_files"] = files
            if inlined:
                slim = all(sub.slim for sub in inlined.values())
                bundle.update(collect_kernels(session.kernel_runtime, slim))
            return bundle

    report.graph = {"graphs": len(order), "ops": ops}
    files_traced = sorted(
        {f.code.co_filename for f in frames} | set(inlined_source_files(session.package))
    )
    artifact = emit_dynamo(
        frames=frames,
        graph_sources=graph_sources,
        graph_section=graph_section,
        fn=session.fn,
        fn_info=fn_info,
        backend=session.backend,
        artifact_path=artifact_path,
        grad_mode=session.training,
        global_state=session.global_state,
        ambient_modes=session.ambient_modes or (),
        function_sources=report.function_sources,
        source_files=[f for f in files_traced if not f.startswith("<")],
        guards_summary=report.guards,
        serving_mode=mode,
        package=session.package,
        dependencies={
            **session.dependencies.metadata(
                [*session.traced_codes, *session.dependencies.read_codes]
            ),
            "LIBRARY_SURFACE": record_dynamo_surface(
                session.fn,
                [*session.backend_graphs().values(), *session.inductor_graphs],
                [*session.traced_codes, *session.dependencies.read_codes],
                session.dependencies.classes,
                lowered=session.inductor_graphs,
            ),
        },
    )
    report.sources = artifact.metadata["SOURCES"]
    return artifact, report, collect_bundle
