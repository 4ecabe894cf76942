"""Findings as LSP: diagnostics in the negotiated position encoding, hover text, CodeLens
titles, and keeping published diagnostics honest while a buffer is edited."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.uris import from_fs_path, to_fs_path

from precompile_lsp.findings import CODES, Finding, Span

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
            try:
                self.cache[uri] = path.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError):
                self.cache[uri] = []
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


def lens_title(result: dict[str, Any] | None) -> str:
    """``N frames · N graph breaks · N variants · covers k/n`` for a target."""
    if result is None:
        return "precompile: not checked yet"
    if result.get("status") in ("timeout", "crashed"):
        return f"precompile: {result.get('message', 'capture failed')}"
    report = result.get("report") or {}
    if result.get("error") and not report.get("frames"):
        return "precompile: capture failed"
    summary = report.get("summary") or {}
    coverage = result.get("coverage") or []
    covered = sum(1 for c in coverage if c.get("served_by") is not None)
    frames, breaks, variants = (
        summary.get("frames", 0),
        summary.get("graph_breaks", 0),
        summary.get("guarded_codes", 0),
    )
    parts = [
        f"{frames} frame{'s' * (frames != 1)}",
        f"{breaks} graph break{'s' * (breaks != 1)}",
        f"{variants} variant{'s' * (variants != 1)}",
    ]
    if coverage:
        parts.append(f"covers {covered}/{len(coverage)}")
    return " · ".join(parts)


def shift_for_edit(findings: list[Finding], change: Any) -> list[Finding]:
    """Keep findings pointing at the right code across an edit: those on changed lines
    are dropped (they may no longer hold), those below move with the text."""
    if not hasattr(change, "range") or change.range is None:
        return []  # a full-text change: nothing can be placed reliably until the next save
    first = change.range.start.line + 1  # 1-based
    last = change.range.end.line + 1
    delta = change.text.count("\n") - (last - first)
    kept = []
    for finding in findings:
        if finding.span.end_line < first:
            kept.append(finding)
        elif finding.span.line > last:
            span = finding.span
            moved = Span(span.line + delta, span.column, span.end_line + delta, span.end_column)
            kept.append(dataclasses.replace(finding, span=moved))
    return kept
