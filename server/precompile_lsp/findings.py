"""Findings: what the engine tells its clients, with stable codes (docs/diagnostics.md).

A finding has a location in the file where the thing happens (a graph break in a helper
module is reported there), related locations (the target, the user stack), a severity
(default per code, overridable per workspace), a documentation link, and ``data`` that
clients act on without recomputing anything (the target key, for code actions).
Positions: 1-based lines, 0-based columns in Unicode code points.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from precompile.guard_text import frame_label, guard_failure_text
from precompile_lsp.doclinks import doc_link


@dataclasses.dataclass(frozen=True)
class Code:
    code: str
    name: str
    severity: str
    summary: str


CODES = {
    c.code: c
    for c in [
        Code("PC001", "capture-failed", "error", "The target could not be captured."),
        Code("PC002", "syntax-error", "error", "A file could not be parsed for targets."),
        Code(
            "PC003",
            "target-not-module-level",
            "warning",
            "A target on a method or nested function is ignored.",
        ),
        Code(
            "PC004",
            "invalid-target",
            "error",
            "A target declaration is incomplete or cannot be imported.",
        ),
        Code("PC101", "graph-break", "warning", "Dynamo breaks the graph here."),
        Code("PC102", "bypassed-frame", "error", "A frame could not be saved into the artifact."),
        Code(
            "PC103",
            "eager-fallback-frame",
            "warning",
            "Dynamo gave up on a frame; it runs eagerly.",
        ),
        Code(
            "PC201",
            "coverage-gap",
            "error",
            "A declared covers call would be refused by the artifact.",
        ),
        Code(
            "PC202", "risky-dropped-guard", "warning", "A guard that decides dispatch was dropped."
        ),
        Code(
            "PC203",
            "pinned-value",
            "warning",
            "A value computed in the function crosses a graph break and is served only as captured.",
        ),
        Code(
            "PC301",
            "stale-artifact",
            "warning",
            "The artifact was emitted from sources that changed since.",
        ),
        Code(
            "PC302",
            "artifact-missing",
            "warning",
            "The target declares an artifact that does not exist.",
        ),
        Code(
            "PC303",
            "verification-failed",
            "error",
            "The artifact does not load or does not match eager.",
        ),
        Code(
            "PC304",
            "artifact-conflict",
            "error",
            "Two targets would write the same artifact.",
        ),
        Code(
            "PC900", "worker-failed", "error", "A capture timed out or its worker process crashed."
        ),
    ]
}

SEVERITY_RANK = {"error": 3, "warning": 2, "information": 1, "hint": 0}


@dataclasses.dataclass(frozen=True)
class Span:
    line: int
    column: int
    end_line: int
    end_column: int

    @classmethod
    def at(cls, line: int, column: int = 0, width: int = 1) -> Span:
        return cls(line, column, line, column + width)

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Related:
    file: Path
    span: Span
    message: str
    #: Content hash of ``file`` the span was computed against (None: unknown).
    version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"file": str(self.file), **self.span.to_dict(), "message": self.message}


@dataclasses.dataclass(frozen=True)
class Finding:
    code: str
    message: str
    file: Path
    span: Span
    target: str | None = None
    related: tuple[Related, ...] = ()
    details: str | None = None
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    severity: str | None = None  # None: the code's default (after workspace overrides)
    #: Content hash of ``file`` the span was computed against: a client holding another
    #: version of the file maps the span into it (or hides it) instead of misplacing it.
    version: str | None = None
    docs_url: str | None = None  # None: the docs shipped in the package

    @property
    def doc(self) -> str:
        return doc_link(self.code, self.docs_url)

    def with_docs(self, docs_url: str | None) -> Finding:
        """The finding with its documentation link at ``docs_url`` (None: shipped docs)."""
        return dataclasses.replace(self, docs_url=docs_url)

    def with_severity(self, overrides: dict[str, str]) -> Finding:
        severity = overrides.get(self.code, self.severity or CODES[self.code].severity)
        return dataclasses.replace(self, severity=severity)

    def at_versions(self, versions: dict[Path, str]) -> Finding:
        """This finding with the content hash of each file it points into."""
        return dataclasses.replace(
            self,
            version=versions.get(self.file),
            related=tuple(
                dataclasses.replace(r, version=versions.get(r.file)) for r in self.related
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": CODES[self.code].name,
            "severity": self.severity or CODES[self.code].severity,
            "message": self.message,
            "file": str(self.file),
            **self.span.to_dict(),
            "target": self.target,
            "related": [r.to_dict() for r in self.related],
            "details": self.details,
            "doc": self.doc,
            "data": self.data,
        }


def _span_of(location: dict[str, Any] | None, fallback: Span) -> Span:
    if not location:
        return fallback
    return Span.at(location["line"], location.get("column", 0), 1)


def _inside(path: Path, root: Path | None) -> bool:
    """Whether ``path`` is a file of the workspace (not an installed library's)."""
    if not path.is_file():
        return False
    if root is None:
        return True
    resolved = path.resolve()
    return root in resolved.parents and "site-packages" not in resolved.parts


def _shown(path: str, root: Path | None) -> str:
    if root is None:
        return path
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return path


def _pinned_crossing_breaks(audit: dict[str, Any]) -> list[dict[str, Any]]:
    """Values computed inside the function that a continuation serves by value: one per
    value (a value crossing two breaks is named once, at the first)."""
    seen: set[tuple[str, ...]] = set()
    found = []
    for pinned in sorted(audit.get("pinned", []), key=lambda p: (p["file"], p["line"])):
        key = tuple(pinned["values"])
        if not pinned.get("continuation") or key in seen:
            continue
        seen.add(key)
        found.append(pinned)
    return found


def findings_from_result(
    result: dict[str, Any], decl: Any, root: Path | None = None
) -> list[Finding]:
    """Turn one job's result (a worker's JSON) into findings for one target; paths in
    messages are shown relative to the workspace ``root``."""
    target_related = Related(decl.file, decl.definition, f"target {decl.function}")
    base = {"target": decl.key, "data": {"target": decl.key}}
    findings: list[Finding] = []
    status = result.get("status")
    if status in ("timeout", "crashed"):
        findings.append(
            Finding(
                code="PC900",
                message=result.get("message", "the capture worker failed"),
                file=decl.file,
                span=decl.decorator,
                details=result.get("output"),
                **base,
            )
        )
        return findings
    report = result.get("report") or {}
    error = result.get("error") or report.get("error")
    if error:
        location = error.get("location")
        in_workspace = bool(location) and _inside(Path(location["file"]), root)
        file = Path(location["file"]) if in_workspace else decl.file
        span = _span_of(location, decl.definition) if in_workspace else decl.definition
        # The failure is shown where it happened; the decorator is where the target is.
        related = [Related(decl.file, decl.decorator, f"target {decl.function}")]
        if location and not in_workspace:
            # Raised inside a library: the finding stays on the user's code, the library
            # line is where to look next.
            where = Span.at(location["line"], location.get("column", 0), 1)
            related.append(Related(Path(location["file"]), where, "raised here, in a library"))
        text = error["message"] + (f"\nHint: {error['hint']}" if error.get("hint") else "")
        findings.append(
            Finding(
                code="PC001",
                message=f"{decl.function} could not be captured: {text}",
                file=file,
                span=span,
                related=tuple(related),
                details="\n\n".join(d for d in (error.get("details"), result.get("output")) if d)
                or None,
                **base,
            )
        )
    for gb in report.get("graph_breaks", []):
        location = gb.get("location")
        if not location:
            continue
        gb_id = f" [{gb['gb_id']}]" if gb.get("gb_id") else ""
        hint = f" Hint: {gb['hints'][0]}" if gb.get("hints") else ""
        stack = tuple(
            Related(Path(f["file"]), Span.at(f["line"], f["column"]), f"in {f['function']}")
            for f in gb.get("user_stack", [])[:-1]
        )
        findings.append(
            Finding(
                code="PC101",
                message=f"graph break{gb_id}: {gb['reason']}.{hint}",
                file=Path(location["file"]),
                span=Span.at(location["line"], location["column"], 1),
                related=(target_related, *stack),
                details=gb.get("explanation"),
                target=decl.key,
                data={
                    "target": decl.key,
                    "gb_id": gb.get("gb_id"),
                    "doc_link": gb.get("doc_link"),
                    "hints": gb.get("hints", []),
                },
            )
        )
    for frame in report.get("frames", []):
        frame_span = Span.at(frame["line"], 0, 3)
        if frame.get("bypassed"):
            findings.append(
                Finding(
                    code="PC102",
                    message=f"{frame_label(frame['name'])} was left out of the artifact: {frame.get('bypass_reason') or 'its guards could not be saved'}",
                    file=Path(frame["file"]),
                    span=frame_span,
                    related=(target_related,),
                    **base,
                )
            )
        if frame.get("eager_fallback"):
            findings.append(
                Finding(
                    code="PC103",
                    message=f"{frame_label(frame['name'])} runs eagerly: Dynamo gave up on it ({frame.get('eager_reason') or 'see the report'})",
                    file=Path(frame["file"]),
                    span=frame_span,
                    related=(target_related,),
                    **base,
                )
            )
    for gap in result.get("coverage", []):
        if gap.get("served_by") is not None:
            continue
        reasons = "; ".join(
            f"variant {f['variant']}: {guard_failure_text(f['guard'])}"
            for f in gap.get("failures", [])
        ) or gap.get("error", "")
        findings.append(
            Finding(
                code="PC201",
                message=f"covers call {gap['call']} would be refused by the artifact: {reasons}",
                file=decl.file,
                span=decl.definition,
                **base,
            )
        )
    audit = report.get("audit") or {}
    for risky in audit.get("risky", []):
        findings.append(
            Finding(
                code="PC202",
                message=f"dropped guard {risky['guard']} could change which variant runs: {risky['why']}",
                file=decl.file,
                span=decl.definition,
                **base,
            )
        )
    for pinned in _pinned_crossing_breaks(audit):
        values = " or ".join(pinned["values"][:3])
        where = (
            f"the value computed on line {pinned['line']} crosses the graph break there"
            if pinned["path"].startswith("___stack")
            else f"`{pinned['path']}` crosses the graph break on line {pinned['line']}"
        )
        findings.append(
            Finding(
                code="PC203",
                message=f"{where} as a Python value ({values}): the artifact serves only that "
                f"value and refuses any other. Keep it a tensor across the break (no .item()), "
                f"or capture examples that give it different values (or DynamoTracer("
                f"dynamic=True)) so that it is captured as a dynamic input",
                file=Path(pinned["file"]),
                span=Span.at(pinned["line"], 0, 1),
                related=(target_related,),
                **base,
            )
        )
    for failure in result.get("verify_failures", []):
        findings.append(
            Finding(
                code="PC303",
                message=f"artifact verification failed: {failure}",
                file=decl.file,
                span=decl.decorator,
                **base,
            )
        )
    output = (result.get("output") or "").strip()
    if output and status not in ("timeout", "crashed"):
        # What user code printed while captured belongs to its findings, never to stdout.
        findings = [
            dataclasses.replace(
                f,
                details=(
                    f"{f.details}\n\nOutput of the capture:\n{output}"
                    if f.details
                    else f"Output of the capture:\n{output}"
                ),
            )
            for f in findings
        ]
    return findings


def artifact_findings(
    status: Any, decl: Any, artifact: Path, declared: bool, root: Path | None = None
) -> list[Finding]:
    """What the workspace says of a target's artifact (a ``staleness.ArtifactStatus``):
    stale sources, a declared artifact that is missing, one that cannot be read."""
    data = {"target": decl.key, "artifact": str(artifact), "fix": "emit"}
    shown = _shown(str(artifact), root)
    if not status.exists:
        if not declared:
            return []
        message = f"the declared artifact {shown} does not exist; emit it"
        return [Finding("PC302", message, decl.file, decl.decorator, decl.key, data=data)]
    if status.unreadable:
        message = f"the artifact {shown} cannot be read ({status.unreadable}); emit it again"
        return [Finding("PC301", message, decl.file, decl.decorator, decl.key, data=data)]
    if not status.stale:
        return []
    changes = "; ".join(s.describe(_shown(str(s.file), root)) for s in status.stale)
    message = f"the artifact {shown} is stale: {changes} since it was emitted; emit it again"
    return [Finding("PC301", message, decl.file, decl.decorator, decl.key, data=data)]


def conflict_finding(decl: Any, others: list[Any], artifact: Path, root: Path | None) -> Finding:
    """A target whose artifact path another target resolves to as well: neither is
    emitted, since each would overwrite the other."""
    names = ", ".join(f"{o.key} ({_shown(str(o.file), root)}:{o.decorator.line})" for o in others)
    return Finding(
        "PC304",
        f"{decl.function} and {names} all write the artifact {_shown(str(artifact), root)}; "
        f"neither is emitted while they share it. Give each target its own artifact= path",
        decl.file,
        decl.decorator,
        decl.key,
        related=tuple(
            Related(o.file, o.decorator, f"target {o.function} writes the same artifact")
            for o in others
        ),
        data={"target": decl.key, "artifact": str(artifact)},
    )
