"""Output formats of ``precompile check``: text, json, sarif (2.1.0), github annotations.

Columns: findings carry 0-based columns in Unicode code points; text and GitHub output
show 1-based columns, SARIF declares ``columnKind: unicodeCodePoints`` and counts from 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from precompile.artifact.pair import write_files
from precompile_lsp.doclinks import doc_link, page_link
from precompile_lsp.files import shown_path
from precompile_lsp.findings import CODES, Finding

JSON_SCHEMA_VERSION = 1


def _ordered(findings: dict[Path, list[Finding]]) -> list[Finding]:
    return sorted(
        (f for fs in findings.values() for f in fs),
        # A total order, a function of the findings alone: a merge of shard reports
        # (precompile_lsp.shards) puts them in the same order.
        key=lambda f: (str(f.file), f.span.line, f.span.column, f.code, f.target or "", f.message),
    )


def text(findings: dict[Path, list[Finding]], root: Path, summary: str) -> str:
    lines = []
    for f in _ordered(findings):
        first, *rest = f.message.splitlines() or [""]
        lines.append(
            f"{shown_path(f.file, root)}:{f.span.line}:{f.span.column + 1}: {f.severity} {f.code} {first}"
        )
        lines.extend(f"    {line}" for line in rest)
        for related in f.related:
            lines.append(
                f"    {shown_path(related.file, root)}:{related.span.line}:{related.span.column + 1}: {related.message}"
            )
    lines.append(summary)
    return "\n".join(lines) + "\n"


def as_json(
    findings: dict[Path, list[Finding]],
    root: Path,
    targets: list[dict[str, Any]],
    stats: dict[str, Any],
) -> str:
    """The JSON document (docs/diagnostics.md#json-output)."""
    document = {
        "version": JSON_SCHEMA_VERSION,
        "root": str(root),
        "findings": [
            f.to_dict()
            | {
                "file": shown_path(f.file, root),
                "related": [r.to_dict() | {"file": shown_path(r.file, root)} for r in f.related],
                "data": {
                    k: shown_path(Path(v), root) if k == "artifact" else v
                    for k, v in f.data.items()
                },
            }
            for f in _ordered(findings)
        ],
        "targets": targets,
        "stats": stats,
    }
    return json.dumps(document, indent=2, default=str) + "\n"


_SARIF_LEVEL = {"error": "error", "warning": "warning", "information": "note", "hint": "note"}


def _sarif_region(span: Any) -> dict[str, int]:
    """1-based, end-exclusive, never empty."""
    end = max(span.end_column, span.column + 1) if span.end_line == span.line else span.end_column
    return {
        "startLine": span.line,
        "startColumn": span.column + 1,
        "endLine": span.end_line,
        "endColumn": end + 1,
    }


def sarif(
    findings: dict[Path, list[Finding]], root: Path, version: str, docs_url: str | None = None
) -> str:
    ordered = _ordered(findings)
    rules = [
        {
            "id": code.code,
            "name": code.name,
            "shortDescription": {"text": code.summary},
            "helpUri": doc_link(code.code, docs_url),
            "defaultConfiguration": {"level": _SARIF_LEVEL.get(code.severity, "warning")},
        }
        for code in CODES.values()
    ]
    index = {code: i for i, code in enumerate(CODES)}

    def location(file: Path, span: Any, message: str | None = None) -> dict[str, Any]:
        loc: dict[str, Any] = {
            "physicalLocation": {
                "artifactLocation": {"uri": shown_path(file, root), "uriBaseId": "%SRCROOT%"},
                "region": _sarif_region(span),
            }
        }
        if message:
            loc["message"] = {"text": message}
        return loc

    results = []
    for f in ordered:
        result = {
            "ruleId": f.code,
            "ruleIndex": index[f.code],
            "level": _SARIF_LEVEL.get(f.severity or "warning", "warning"),
            "message": {"text": f.message},
            "locations": [location(f.file, f.span)],
        }
        if f.target is not None:
            result["properties"] = {"target": f.target}
        if f.related:
            result["relatedLocations"] = [
                location(r.file, r.span, r.message) | {"id": i} for i, r in enumerate(f.related)
            ]
        results.append(result)
    document = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "torch-precompile",
                        "version": version,
                        "informationUri": page_link(docs_url),
                        "rules": rules,
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": root.as_uri() + "/"}},
                "columnKind": "unicodeCodePoints",
                "results": results,
            }
        ],
    }
    return json.dumps(document, indent=2) + "\n"


def _escape_data(value: str) -> str:
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(value: str) -> str:
    return _escape_data(value).replace(":", "%3A").replace(",", "%2C")


def github(findings: dict[Path, list[Finding]], root: Path) -> str:
    """GitHub Actions workflow commands (``::error file=...,line=...::message``)."""
    kinds = {"error": "error", "warning": "warning", "information": "notice", "hint": "notice"}
    lines = []
    for f in _ordered(findings):
        props = ",".join(
            [
                f"file={_escape_property(shown_path(f.file, root))}",
                f"line={f.span.line}",
                f"col={f.span.column + 1}",
                f"endLine={f.span.end_line}",
                f"title={_escape_property(f'{f.code} {CODES[f.code].name}')}",
            ]
        )
        lines.append(
            f"::{kinds.get(f.severity or 'warning', 'warning')} {props}::{_escape_data(f.message)}"
        )
    return "\n".join(lines) + ("\n" if lines else "")


def write(text_out: str, output: str | None) -> None:
    if output is None or output == "-":
        import sys

        sys.stdout.write(text_out)
        sys.stdout.flush()
        return
    # Atomically, and only over a report of ours (precompile.write_policy).
    write_files([(output, text_out.encode("utf-8"), "report")])
