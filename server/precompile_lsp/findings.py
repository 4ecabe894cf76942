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

from precompile.runtime.guard_text import frame_label, guard_failure_text
from precompile_lsp.doclinks import doc_link
from precompile_lsp.files import shown_path
from precompile_lsp.protocol import (
    CaptureError,
    CoverageFact,
    FrameFact,
    GraphBreakFact,
    JobResult,
    PinnedValue,
    RiskyDrop,
)


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
        Code(
            "PC002",
            "syntax-error",
            "error",
            "A file could not be parsed (or decoded) for targets.",
        ),
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
        Code(
            "PC005",
            "source-too-large",
            "error",
            "A file that may hold targets is too large to be searched for them.",
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
            "Two targets would write the same file (an artifact, its .cache or its .sig).",
        ),
        Code(
            "PC305",
            "write-refused",
            "error",
            "The artifact path holds a file the tools did not write, or is outside the workspace.",
        ),
        Code(
            "PC306",
            "emit-write-failed",
            "error",
            "Writing the emitted artifact failed (a full disk, a read-only folder).",
        ),
        Code(
            "PC401",
            "production-refusal",
            "warning",
            "Production refused calls of the target (a serving log records them).",
        ),
        Code(
            "PC402",
            "shadow-mismatch",
            "error",
            "A shadow check in production found the artifact's answer differing from the fallback's.",
        ),
        Code(
            "PC403",
            "re-emitted-since-logged",
            "information",
            "A serving log records an artifact of the target that was re-emitted since.",
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

    def at_versions(self, versions: dict[Path, str | None] | dict[Path, str]) -> Finding:
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


def _inside(path: Path, root: Path | None) -> bool:
    """Whether ``path`` is a file of the workspace (not an installed library's)."""
    if not path.is_file():
        return False
    if root is None:
        return True
    resolved = path.resolve()
    return root in resolved.parents and "site-packages" not in resolved.parts


class _Target:
    """What every finding of one target shares: its key, its place, its ``data``.

    A finding about the target as a whole (its capture failed, a covers call it would
    refuse, its artifact) sits at ``anchor``, the decorator that declares it, as do the
    related locations that point back to it: one target, one line. A finding with a real
    place elsewhere (a graph break in a helper module) stays where it happens."""

    def __init__(self, decl: Any, root: Path | None) -> None:
        self.decl = decl
        self.root = root
        self.anchor: Span = decl.decorator
        self.related = Related(decl.file, self.anchor, f"target {decl.function}")

    def finding(self, code: str, message: str, file: Path, span: Span, **extra: Any) -> Finding:
        extra.setdefault("data", {"target": self.decl.key})
        return Finding(code, message, file, span, target=self.decl.key, **extra)


def _worker_failed(result: JobResult, t: _Target) -> list[Finding]:
    message = result.message or "the capture worker failed"
    return [t.finding("PC900", message, t.decl.file, t.anchor, details=result.output)]


def _capture_failed(error: CaptureError, result: JobResult, t: _Target) -> Finding:
    decl, location = t.decl, error.location
    in_workspace = location is not None and _inside(Path(location.file), t.root)
    if location is not None and in_workspace:
        file, span = Path(location.file), Span.at(location.line, location.column, 1)
    else:
        file, span = decl.file, t.anchor
    # The failure is shown where it happened; the decorator is where the target is.
    related = [t.related]
    # An exception of user code: the workspace frames that led to where it was raised.
    related += [
        Related(Path(f.file), Span.at(f.line, f.column), f"called from {f.function}")
        for f in error.stack[:-1]
        if _inside(Path(f.file), t.root)
    ]
    if location is not None and not in_workspace:
        # Raised inside a library: the finding stays on the user's code, the library
        # line is where to look next.
        where = Span.at(location.line, location.column, 1)
        related.append(Related(Path(location.file), where, "raised here, in a library"))
    text = error.message + (f"\nHint: {error.hint}" if error.hint else "")
    details = "\n\n".join(d for d in (error.details, result.output) if d) or None
    return t.finding(
        "PC001",
        f"{decl.function} could not be captured: {text}",
        file,
        span,
        related=tuple(related),
        details=details,
    )


def _graph_break(gb: GraphBreakFact, t: _Target) -> Finding | None:
    if gb.location is None:
        return None
    gb_id = f" [{gb.gb_id}]" if gb.gb_id else ""
    hint = f" Hint: {gb.hints[0]}" if gb.hints else ""
    stack = tuple(
        Related(Path(f.file), Span.at(f.line, f.column), f"in {f.function}")
        for f in gb.user_stack[:-1]
    )
    return t.finding(
        "PC101",
        f"graph break{gb_id}: {gb.reason}.{hint}",
        Path(gb.location.file),
        Span.at(gb.location.line, gb.location.column, 1),
        related=(t.related, *stack),
        details=gb.explanation or None,
        data={
            "target": t.decl.key,
            "gb_id": gb.gb_id,
            "doc_link": gb.doc_link,
            "hints": list(gb.hints),
        },
    )


def _frame(frame: FrameFact, t: _Target) -> list[Finding]:
    span, found = Span.at(frame.line, 0, 3), []
    if frame.bypassed:
        reason = frame.bypass_reason or "its guards could not be saved"
        found.append(
            t.finding(
                "PC102",
                f"{frame_label(frame.name)} was left out of the artifact: {reason}",
                Path(frame.file),
                span,
                related=(t.related,),
            )
        )
    if frame.eager_fallback:
        reason = frame.eager_reason or "see the report"
        found.append(
            t.finding(
                "PC103",
                f"{frame_label(frame.name)} runs eagerly: Dynamo gave up on it ({reason})",
                Path(frame.file),
                span,
                related=(t.related,),
            )
        )
    return found


def _coverage_gap(gap: CoverageFact, t: _Target) -> Finding | None:
    if gap.served_by is not None:
        return None
    reasons = "; ".join(
        f"variant {f.variant}: {guard_failure_text(f.guard)}" for f in gap.failures
    ) or (gap.error or "")
    return t.finding(
        "PC201",
        f"covers call {gap.call} would be refused by the artifact: {reasons}",
        t.decl.file,
        t.anchor,
    )


def _risky_drop(risky: RiskyDrop, t: _Target) -> Finding:
    return t.finding(
        "PC202",
        f"dropped guard {risky.guard} could change which variant runs: {risky.why}",
        t.decl.file,
        t.anchor,
    )


def _pinned_crossing_breaks(pinned: list[PinnedValue]) -> list[PinnedValue]:
    """Values computed inside the function that a continuation serves by value: one per
    value (a value crossing two breaks is named once, at the first)."""
    seen: set[tuple[str, ...]] = set()
    found = []
    for value in sorted(pinned, key=lambda p: (p.file, p.line)):
        key = tuple(value.values)
        if value.continuation and key not in seen:
            seen.add(key)
            found.append(value)
    return found


def _pinned_value(pinned: PinnedValue, t: _Target) -> Finding:
    values = " or ".join(pinned.values[:3])
    where = (
        f"the value computed on line {pinned.line} crosses the graph break there"
        if pinned.path.startswith(("___stack", "the value carried"))
        else f"`{pinned.path}` crosses the graph break on line {pinned.line}"
    )
    return t.finding(
        "PC203",
        f"{where} as a Python value ({values}): the artifact serves only that value and "
        f"refuses any other. Keep it a tensor across the break (no .item()), or capture "
        f"examples that give it different values (or DynamoTracer(dynamic=True)) so that "
        f"it is captured as a dynamic input",
        Path(pinned.file),
        Span.at(pinned.line, 0, 1),
        related=(t.related,),
    )


def _with_output(findings: list[Finding], output: str | None) -> list[Finding]:
    """What user code printed while captured belongs to its findings, never to stdout."""
    text = (output or "").strip()
    if not text:
        return findings
    return [
        dataclasses.replace(
            f,
            details=(
                f"{f.details}\n\nOutput of the capture:\n{text}"
                if f.details
                else f"Output of the capture:\n{text}"
            ),
        )
        for f in findings
    ]


def findings_from_result(result: JobResult, decl: Any, root: Path | None = None) -> list[Finding]:
    """One job's result as findings of one target; paths in messages are shown relative
    to the workspace ``root``."""
    t = _Target(decl, root)
    if result.status.failed:
        return _worker_failed(result, t)
    findings: list[Finding] = []
    error = result.failure
    if error is not None:
        findings.append(_capture_failed(error, result, t))
    report = result.report
    if report is not None:
        findings += [f for gb in report.graph_breaks if (f := _graph_break(gb, t)) is not None]
        findings += [f for frame in report.frames for f in _frame(frame, t)]
    findings += [f for gap in result.coverage if (f := _coverage_gap(gap, t)) is not None]
    if report is not None:
        findings += [_risky_drop(r, t) for r in report.audit.risky]
        findings += [_pinned_value(p, t) for p in _pinned_crossing_breaks(report.audit.pinned)]
    return _with_output(findings, result.output)


def verify_findings(verified: JobResult, decl: Any) -> list[Finding]:
    """A verification's outcome: each failure (a refused call, a call that differs from
    eager, an artifact that does not load, a verify job that did not finish)."""
    t = _Target(decl, None)
    if verified.failure is not None:
        failures = [verified.failure.message]
    elif verified.status.failed:
        failures = [verified.message or "the verification did not finish"]
    else:
        failures = list(verified.verify_failures)
    return [
        t.finding("PC303", f"artifact verification failed: {failure}", decl.file, t.anchor)
        for failure in failures
    ]


def artifact_findings(
    status: Any, decl: Any, artifact: Path, declared: bool, root: Path | None = None
) -> list[Finding]:
    """What the workspace says of a target's artifact (a ``staleness.ArtifactStatus``):
    stale sources, a declared artifact that is missing, one that cannot be read."""
    data = {"target": decl.key, "artifact": str(artifact), "fix": "emit"}
    shown = shown_path(str(artifact), root)
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
    changes = "; ".join(s.describe(shown_path(str(s.file), root)) for s in status.stale)
    message = f"the artifact {shown} is stale: {changes} since it was emitted; emit it again"
    return [Finding("PC301", message, decl.file, decl.decorator, decl.key, data=data)]


#: The error types of an emit whose capture was fine but whose files were not written.
WRITE_ERRORS = frozenset({"OverwriteRefusedError", "ArtifactWriteError"})


def conflict_finding(
    decl: Any, shared: list[tuple[Any, list[tuple[Path, str, str]]]], root: Path | None
) -> Finding:
    """A target one of whose paths (artifact, ``.cache``, ``.sig``) another target's emit
    writes too: neither is emitted, since each would overwrite or tear the other's pair.
    ``shared`` is ``EmitPaths.shared_paths``: each other target with the paths they share,
    and what each of the two writes there."""

    def one_path(path: Path, mine: str, theirs: str) -> str:
        what = f"the {mine} of each" if mine == theirs else f"its {mine}, the other's {theirs}"
        return f"{shown_path(str(path), root)} ({what})"

    def sentence(other: Any, paths: list[tuple[Path, str, str]]) -> str:
        where = f"{other.key} ({shown_path(str(other.file), root)}:{other.decorator.line})"
        return f"{decl.key} and {where} both write {' and '.join(one_path(*p) for p in paths)}"

    def related(other: Any, paths: list[tuple[Path, str, str]]) -> Related:
        _, mine, theirs = paths[0]
        what = f"the same {theirs}" if mine == theirs else f"this target's {mine} as its {theirs}"
        return Related(other.file, other.decorator, f"target {other.function} writes {what}")

    return Finding(
        "PC304",
        f"{'; '.join(sentence(*row) for row in shared)}. Neither is emitted while they share "
        f"a path: give each target its own artifact= path (its .cache and .sig go beside it)",
        decl.file,
        decl.decorator,
        decl.key,
        related=tuple(related(*row) for row in shared),
        data={"target": decl.key, "artifact": str(shared[0][1][0][0])},
    )


def write_refused_finding(decl: Any, why: str, artifact: Path) -> Finding:
    """A target whose emit may not write where its artifact= points (the write policy):
    nothing is written there, and the fix is another path."""
    example = f"artifacts/{decl.function}.py"
    if Path(artifact).as_posix().endswith("/" + example):  # the refused path itself
        example = f"artifacts/{decl.function}_new.py"
    return Finding(
        "PC305",
        f"{decl.function}'s artifact is not written: {why}. Point artifact= at a new path "
        f"inside the workspace (e.g. {example}), or move the existing file away if you "
        f"mean to replace it",
        decl.file,
        decl.decorator,
        decl.key,
        data={"target": decl.key, "artifact": str(artifact)},
    )


def emit_failure_finding(emitted: Any, decl: Any, artifact: Path) -> list[Finding]:
    """An emit whose capture was fine but whose write was refused (PC305) or failed
    (PC306: a full disk); shown beside the target's other findings."""
    failure = emitted.failure
    if failure is None:
        return []
    data = {"target": decl.key, "artifact": str(artifact)}
    if failure.type == "OverwriteRefusedError":
        return [write_refused_finding(decl, failure.message, artifact)]
    hint = f" ({failure.hint})" if failure.hint else ""
    return [
        Finding(
            "PC306",
            f"{decl.function}'s artifact could not be written: {failure.message}{hint}",
            decl.file,
            decl.decorator,
            decl.key,
            data={**data, "fix": "emit"},
        )
    ]
