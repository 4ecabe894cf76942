"""``precompile coverage``: serving logs aggregated per target of the workspace (served
share, refusal reasons, shadow mismatches), and the ``--max-refused`` canary gate."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from precompile_lsp.cli_workspace import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK, workspace_root


def _rate(raw: str) -> float:
    """``0.05`` or ``5%``: a share of calls in [0, 1]."""
    text = raw.strip()
    value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    if not 0 <= value <= 1:
        raise ValueError(raw)
    return value


def _log_files(patterns: list[str]) -> list[Path]:
    """The files the command line names: paths or globs (``**`` recursive) the shell did
    not expand. One that matches nothing is a usage error, naming it."""
    import glob

    files: list[Path] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            found = [Path(p) for p in sorted(glob.glob(pattern, recursive=True))]
            found = [p for p in found if p.is_file()]
            if not found:
                raise FileNotFoundError(f"{pattern} matches no file")
        elif Path(pattern).is_file():
            found = [Path(pattern)]
        else:
            raise FileNotFoundError(f"no such file: {pattern}")
        files.extend(p.resolve() for p in found if p.resolve() not in files)
    return files


def coverage_report(args: argparse.Namespace) -> int:
    """Aggregate serving logs per target of the workspace (the folder of the nearest
    pyproject.toml above the current directory). Reads logs and artifacts only: nothing of
    the workspace runs, so no trust is needed."""
    from precompile.errors import PrecompileError
    from precompile_lsp import formats
    from precompile_lsp.config import ConfigError
    from precompile_lsp.engine import Engine
    from precompile_lsp.files import shown_path
    from precompile_lsp.serving_logs import (
        artifact_hash,
        attribute,
        production_findings,
        read_logs,
    )

    try:
        limit = _rate(args.max_refused) if args.max_refused is not None else None
    except ValueError:
        print(
            f"precompile coverage: --max-refused takes a share of calls between 0 and 1 "
            f"(e.g. 0.05) or a percentage (e.g. 5%), got {args.max_refused!r}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    root = workspace_root([])
    try:
        files = _log_files(args.logs)
        engine = Engine(root, trusted=False)
        engine.discover()
    except (ConfigError, FileNotFoundError) as error:
        print(f"precompile coverage: {error}", file=sys.stderr)
        return EXIT_ERROR
    logs = read_logs(files, root)
    for warning in logs.warnings:
        print(f"precompile coverage: warning: {warning}", file=sys.stderr)
    decls = {key: state.decl for key, state in sorted(engine.targets.items())}
    hashes = {key: artifact_hash(engine.emit_paths.artifact_of(d)[0]) for key, d in decls.items()}
    found = attribute(logs, hashes)
    findings: dict[Path, list[Any]] = {}
    for key, decl in decls.items():
        current, stale = found.current.get(key), found.stale.get(key, [])
        if current is None and not stale:
            continue
        for finding in production_findings(decl, current, stale, hashes[key], root):
            finding = finding.with_severity(engine.config.severity)
            if finding.severity != "off":
                findings.setdefault(finding.file, []).append(finding)
    groups = (
        [("current", key, c) for key, c in sorted(found.current.items())]
        + [("re-emitted", key, c) for key, cs in sorted(found.stale.items()) for c in cs]
        + [("unknown", None, c) for c in found.unknown]
    )
    over = [
        (key or c.target, c)
        for _, key, c in groups
        if limit is not None and c.calls and c.missed / c.calls > limit
    ]
    if args.format == "json":
        rows = []
        for status, name, coverage in groups:
            owner = decls.get(name) if name else None
            rows.append(
                {
                    "status": status,
                    "workspace_target": name,
                    "file": shown_path(owner.file, root) if owner else None,
                    "line": owner.decorator.line if owner else None,
                    **coverage.to_dict(root),
                }
            )
        document = {
            "version": 1,
            "root": str(root),
            "logs": [shown_path(p, root) for p in logs.files],
            "records": logs.records,
            "artifacts": rows,
            "findings": [
                f.to_dict() | {"file": shown_path(f.file, root)}
                for fs in findings.values()
                for f in fs
            ],
            "warnings": logs.warnings,
            "max_refused": limit,
            "over_max_refused": [name for name, _ in over],
        }
        output = json.dumps(document, indent=2, default=str) + "\n"
    elif args.format == "sarif":
        from precompile.version import __version__

        output = formats.sarif(findings, root, __version__, engine.config.docs_url)
    elif args.format == "github":
        output = formats.github(findings, root)
    else:
        output = _coverage_text(groups, decls, root, logs)
    try:
        formats.write(output, args.output)
    except PrecompileError as error:
        print(f"precompile coverage: {error}", file=sys.stderr)
        return EXIT_ERROR
    for name, coverage in over:
        print(
            f"precompile coverage: {name}: {coverage.missed:,} of {coverage.calls:,} calls "
            f"refused ({coverage.missed / coverage.calls:.2%}), above --max-refused "
            f"{limit:.2%}",
            file=sys.stderr,
        )
    return EXIT_FINDINGS if over else EXIT_OK


def _coverage_text(groups: list[Any], decls: dict[str, Any], root: Path, logs: Any) -> str:
    from precompile_lsp.files import shown_path

    lines = []
    for status, key, c in groups:
        decl = decls.get(key) if key else None
        where = f" ({shown_path(decl.file, root)}:{decl.decorator.line})" if decl else ""
        head = f"{key or c.target}{where}: served {c.served:,} of {c.calls:,} calls ({c.served_percent})"
        if c.missed:
            head += f"; refused {c.missed:,} ({c.fallback:,} answered by the fallback, {c.refused:,} raised)"
        if status == "re-emitted":
            head += (
                f"\n  artifact {c.code_hash[:12]} was re-emitted since: these calls say nothing "
                f"of the current artifact"
            )
        elif status == "unknown":
            head += (
                f"\n  artifact {c.code_hash[:12]} ({c.target}) is no current artifact of any "
                f"target of {root}: it was re-emitted since, or is another project's"
            )
        lines.append(head)
        for reason in c.top_reasons():
            first = reason.reason.splitlines()[0] if reason.reason else ""
            lines.append(f"  {reason.count:,} × {first.removeprefix('precompile: ')}")
            lines.extend(f"      {signature}" for signature in reason.signatures)
        if c.shadow_runs or c.shadow_mismatches:
            lines.append(
                f"  shadow checks: {c.shadow_mismatches:,} mismatches in {c.shadow_runs:,} sampled calls"
            )
            lines.extend(f"      mismatch: {s}" for s, _, _, _ in c.mismatches)
    lines.append(
        f"{logs.records:,} record{'s' * (logs.records != 1)} from {len(logs.files)} "
        f"log{'s' * (len(logs.files) != 1)}, {len(groups)} artifact{'s' * (len(groups) != 1)}"
    )
    return "\n".join(lines) + "\n"
