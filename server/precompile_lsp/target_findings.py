"""A target's findings from everything the engine knows of it: its last check result
(placed in the file versions it was computed from), where its emit would write (a
conflict with another target, a refused write), what the workspace says of its artifact,
its last emit failure and verification, and what production's serving logs say -- each
shown with the workspace's severities and documentation link."""

from __future__ import annotations

from pathlib import Path

from precompile_lsp.config import Config
from precompile_lsp.emit_paths import EmitPaths
from precompile_lsp.engine_records import TargetState
from precompile_lsp.findings import (
    Finding,
    artifact_findings,
    conflict_finding,
    emit_failure_finding,
    findings_from_result,
    verify_findings,
    write_refused_finding,
)
from precompile_lsp.serving_logs import Attribution, production_findings


def target_findings(
    state: TargetState,
    emit_paths: EmitPaths,
    production: Attribution | None,
    decl_sha: str | None,
    root: Path,
    config: Config,
) -> list[Finding]:
    """``state``'s findings; ``decl_sha`` is the content hash of the target's own file
    as the engine last read it (the version a finding without one is placed in)."""
    decl = state.decl
    findings: list[Finding] = []
    if state.result is not None:
        versions = dict(state.dependencies)
        findings += [
            f.at_versions(versions)
            for f in findings_from_result(state.result, state.result_decl or decl, root)
        ]
    decl_version = {decl.file: decl_sha}
    artifact, declared = emit_paths.artifact_of(decl)
    shared = emit_paths.shared_paths(decl)
    refused = emit_paths.write_refusal(decl)
    if refused is None and state.artifact is not None:
        refused = state.artifact.refused
    if shared:
        findings.append(conflict_finding(decl, shared, root))
    elif refused is not None:
        findings.append(write_refused_finding(decl, refused, artifact))
    elif state.artifact is not None:
        findings += artifact_findings(state.artifact, decl, artifact, declared, root)
    if state.emit_failure is not None and not (shared or refused):
        # (A refusal the workspace still shows is said once, above.)
        findings += emit_failure_finding(state.emit_failure, decl, artifact)
    if state.verified is not None:
        findings += verify_findings(state.verified, decl)
    if production is not None:
        findings += production_findings(
            decl,
            production.current.get(decl.key),
            production.stale.get(decl.key, []),
            production.hashes.get(decl.key),
            root,
        )
    return [
        configured(
            f if f.version is not None or f.file != decl.file else f.at_versions(decl_version),
            config,
        )
        for f in findings
    ]


def configured(finding: Finding, config: Config) -> Finding:
    """A finding as the workspace shows it: its severity, its documentation link."""
    return finding.with_severity(config.severity).with_docs(config.docs_url)
