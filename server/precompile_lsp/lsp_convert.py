"""Findings as LSP: diagnostics in the negotiated position encoding, hover text, CodeLens
titles, and placing findings computed against one version of a file in the version a
client shows (so they stay right while a buffer is edited and after it is saved)."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.uris import from_fs_path, to_fs_path

from precompile_lsp.files import read_source
from precompile_lsp.findings import CODES, Finding, Span
from precompile_lsp.protocol import JobResult

_SEVERITY = {
    "error": types.DiagnosticSeverity.Error,
    "warning": types.DiagnosticSeverity.Warning,
    "information": types.DiagnosticSeverity.Information,
    "hint": types.DiagnosticSeverity.Hint,
}


def uri_of(path: Path) -> str:
    return from_fs_path(str(path)) or path.as_uri()


def path_of(uri: str) -> Path:
    """The file a ``file:`` URI names (an empty path for any other scheme)."""
    return Path(to_fs_path(uri) or "")


class Lines:
    """Source lines of files, for converting code-point columns to client units; an open
    document's text wins over the file on disk."""

    def __init__(self, open_text: dict[str, str]) -> None:
        self.open_text = open_text
        self.cache: dict[str, list[str]] = {}

    def of(self, path: Path) -> list[str]:
        uri = uri_of(path)
        if uri in self.open_text:
            return self.open_text[uri].splitlines()
        if uri not in self.cache:
            self.cache[uri] = (read_source(path).text or "").splitlines()
        return self.cache[uri]


def to_range(span: Span, lines: list[str], codec: Any) -> types.Range:
    def position(line: int, column: int) -> types.Position:
        zero = line - 1
        if codec is None or zero >= len(lines):
            return types.Position(zero, column)
        text = lines[zero]
        return types.Position(zero, codec.client_num_units(text[:column]))

    return types.Range(position(span.line, span.column), position(span.end_line, span.end_column))


def to_diagnostic(finding: Finding, lines: Lines, codec: Any) -> types.Diagnostic:
    related = [
        types.DiagnosticRelatedInformation(
            location=types.Location(
                uri=uri_of(r.file), range=to_range(r.span, lines.of(r.file), codec)
            ),
            message=r.message,
        )
        for r in finding.related
    ]
    return types.Diagnostic(
        range=to_range(finding.span, lines.of(finding.file), codec),
        message=finding.message,
        severity=_SEVERITY.get(
            finding.severity or CODES[finding.code].severity, types.DiagnosticSeverity.Warning
        ),
        code=finding.code,
        code_description=types.CodeDescription(href=finding.doc),
        source="precompile",
        related_information=related or None,
        data={"code": finding.code, **finding.data},
    )


def hover_markdown(finding: Finding) -> str:
    """The full story of a finding: message, explanation, hints, user stack as links."""
    parts = [f"**{finding.code} {CODES[finding.code].name}**: {finding.message}"]
    if finding.details:
        parts.append(finding.details.strip())
    for hint in finding.data.get("hints", []) or []:
        parts.append(f"*Hint:* {hint}")
    stack = [r for r in finding.related if r.message.startswith("in ")]
    if stack:
        links = [
            f"- [{r.message} ({r.file.name}:{r.span.line})]({uri_of(r.file)}#L{r.span.line})"
            for r in stack
        ]
        parts.append("User stack, outermost first:\n" + "\n".join(links))
    links = [f"[{finding.code} documentation]({finding.doc})"]
    if finding.data.get("doc_link"):  # Dynamo's own page on this graph break
        links.append(
            f"[PyTorch on {finding.data.get('gb_id') or 'this'}]({finding.data['doc_link']})"
        )
    parts.append(" · ".join(links))
    return "\n\n".join(parts)


def lens_title(result: JobResult | None, rechecking: bool = False) -> str:
    """``N frames · N graph breaks · N variants · covers k/n`` for a target, and
    ``re-checking…`` while a newer result is on its way (the old one stays shown)."""
    if result is None:
        return "precompile: checking…" if rechecking else "precompile: not checked yet"
    title = _result_title(result)
    return f"{title} · re-checking…" if rechecking else title


def _result_title(result: JobResult) -> str:
    if result.status.failed:
        return f"precompile: {result.message or 'capture failed'}"
    report = result.report
    if result.failure is not None and (report is None or not report.frames):
        return "precompile: capture failed"
    summary = report.summary if report is not None else None
    frames = summary.frames if summary else 0
    breaks = summary.graph_breaks if summary else 0
    variants = summary.guarded_codes if summary else 0
    parts = [
        f"{frames} frame{'s' * (frames != 1)}",
        f"{breaks} graph break{'s' * (breaks != 1)}",
        f"{variants} variant{'s' * (variants != 1)}",
    ]
    if result.coverage:
        covered = sum(1 for c in result.coverage if c.served_by is not None)
        parts.append(f"covers {covered}/{len(result.coverage)}")
    return " · ".join(parts)


class LineMap:
    """Where each line of an old version of a text stands in a new one (a line diff):
    a line the edit left alone maps to its new number, a line it changed maps to None."""

    def __init__(self, old: list[str], new: list[str]) -> None:
        self.moves: list[tuple[int, int, int]] = []  # (old start, old end, delta), 1-based
        matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
        for tag, i1, i2, j1, _j2 in matcher.get_opcodes():
            if tag == "equal":
                self.moves.append((i1 + 1, i2, j1 - i1))

    def line(self, line: int) -> int | None:
        for start, end, delta in self.moves:
            if start <= line <= end:
                return line + delta
        return None


class Placement:
    """Places findings in the file versions a client shows. A finding knows the content
    hash of the file version its position was computed against; when the client shows
    another version, a line diff moves it with its code, or hides it when its own lines
    changed (what it said may no longer hold). Without the old text it stays where it is."""

    def __init__(self, lines: Lines, text_of: Callable[[Path, str], str | None]) -> None:
        self.lines = lines
        self.text_of = text_of
        self.maps: dict[tuple[str, str], LineMap | None] = {}

    def _map(self, path: Path, version: str | None) -> LineMap | None:
        """None: no move needed (same text) or none possible (old text unknown)."""
        if version is None:
            return None
        key = (str(path), version)
        if key not in self.maps:
            old = self.text_of(path, version)
            current = self.lines.of(path)
            if old is None or old.splitlines() == current:
                self.maps[key] = None
            else:
                self.maps[key] = LineMap(old.splitlines(), current)
        return self.maps[key]

    def place(self, finding: Finding) -> Finding | None:
        moved = self._map(finding.file, finding.version)
        span = finding.span
        if moved is not None:
            start, end = moved.line(span.line), moved.line(span.end_line)
            if start is None or end is None:
                return None
            span = Span(start, span.column, end, span.end_column)
        related = []
        for r in finding.related:
            rmap = self._map(r.file, r.version)
            line = rmap.line(r.span.line) if rmap is not None else r.span.line
            if line is not None:
                delta = line - r.span.line
                r = dataclasses.replace(
                    r, span=Span(line, r.span.column, r.span.end_line + delta, r.span.end_column)
                )
            related.append(r)
        return dataclasses.replace(finding, span=span, related=tuple(related))

    def place_all(self, findings: list[Finding]) -> list[Finding]:
        return [p for f in findings if (p := self.place(f)) is not None]
