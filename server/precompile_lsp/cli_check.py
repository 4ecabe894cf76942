"""``precompile check`` (the CI job: capture every target in worker processes, report
findings) and ``precompile merge`` (one report, and check's exit code, from the reports
of ``check --shard``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from precompile_lsp.cli_workspace import (
    EXIT_ERROR,
    EXIT_FINDINGS,
    EXIT_OK,
    FAIL_ON,
    OutsideWorkspace,
    Progress,
    workspace_files,
    workspace_root,
)
from precompile_lsp.files import holds_file


def _target_rows(engine: Any, keys: set[str] | None = None) -> list[dict[str, Any]]:
    rows = []
    for key, state in sorted(engine.targets.items()):
        if keys is not None and key not in keys:
            continue
        report = state.result.report if state.result is not None else None
        rows.append(
            {
                "target": key,
                "file": str(state.decl.file),
                "line": state.decl.definition.line,
                "summary": report.summary.text if report is not None else None,
                "tracer": report.tracer
                if report
                else engine.requests.options_of(state.decl)["tracer"],
                "backend": engine.requests.options_of(state.decl)["backend"],
                "artifact": str(engine.emit_paths.artifact_of(state.decl)[0]),
                # The files it depends on (not the places an import found nothing).
                "dependencies": sorted(
                    str(p) for p, d in state.dependencies.items() if holds_file(d)
                ),
            }
        )
    return rows


def check(args: argparse.Namespace) -> int:
    from precompile.errors import PrecompileError
    from precompile_lsp import formats
    from precompile_lsp.config import ConfigError
    from precompile_lsp.engine import Engine
    from precompile_lsp.findings import SEVERITY_RANK

    root = workspace_root(args.paths)
    progress = Progress(args.quiet)
    overrides: dict[str, Any] = {"workers": args.jobs} if args.jobs else {}
    if args.cache_dir:
        overrides["cache-dir"] = str(Path(args.cache_dir).expanduser().resolve())
    started = time.monotonic()
    shard = None
    if args.shard is not None:
        from precompile_lsp.shards import ShardError, parse_shard

        try:
            shard = parse_shard(args.shard)
        except ShardError as error:
            print(f"precompile check: {error}", file=sys.stderr)
            return EXIT_ERROR
    if args.output not in (None, "-"):
        from precompile.write_policy import refusal

        refused = refusal(args.output, "report")
        if refused is not None:  # said before the check runs, not after
            print(
                f"precompile check: --output {refused}; name a new file (or a report this "
                f"command wrote), or move the existing file away",
                file=sys.stderr,
            )
            return EXIT_ERROR
    try:
        files = workspace_files(args.paths, root)
        engine = Engine(
            root, overrides=overrides, trusted=True, use_cache=not args.no_cache, on_event=progress
        )
    except (ConfigError, FileNotFoundError, OutsideWorkspace) as error:
        print(f"precompile check: {error}", file=sys.stderr)
        return EXIT_ERROR

    assignment: dict[str, int] = {}
    select = None if shard is None else _shard_selector(engine, shard, args, assignment)
    if args.output not in (None, "-"):
        select = _output_guard(engine, Path(args.output), select)

    async def run() -> Any:
        try:
            return await engine.check(files, emit=args.emit, verify=args.verify, select=select)
        finally:
            await engine.close()

    try:
        findings = asyncio.run(run())
    except _OutputTaken as error:
        print(f"precompile check: {error}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as error:  # an internal error: say what broke, exit 2
        progress.done()
        print(f"precompile check: internal error: {type(error).__name__}: {error}", file=sys.stderr)
        return EXIT_ERROR
    progress.done()
    fail_on_empty = args.fail_on_empty or engine.config.fail_on_empty
    if not engine.targets:
        roots = ", ".join(str(r) for r in engine.config.source_roots)
        print(
            f"precompile check: {'error' if fail_on_empty else 'warning'}: no "
            f"@precompile.target found under {root} (source roots: {roots}), so nothing was "
            f"checked; mark a function with @precompile.target(examples) or fix "
            f"[tool.precompile] source-roots/include/exclude"
            + (
                ""
                if fail_on_empty
                else " (pass --fail-on-empty or set [tool.precompile] fail-on-empty = true "
                "to make this exit 1)"
            ),
            file=sys.stderr,
        )
    for warning in engine.config.warnings:
        print(f"precompile check: warning: {warning}", file=sys.stderr)
    elapsed = time.monotonic() - started
    mine = None
    if shard is not None:  # this shard's targets' findings (and, in shard 1, the workspace's)
        mine = {k for k, s in assignment.items() if s == shard.index}
        findings = engine.findings_by_file(mine, workspace=shard.index == 1)
    checked = len(engine.targets) if mine is None else len(mine)
    all_findings = [f for fs in findings.values() for f in fs]
    counts = {s: sum(1 for f in all_findings if f.severity == s) for s in ("error", "warning")}
    stats = {
        "targets": checked,
        "captures": engine.stats.captures,
        "cache_hits": engine.stats.cache_hits,
        "emits": engine.stats.emits,
        "verifies": engine.stats.verifies,
        "seconds": round(elapsed, 3),
    }
    summary = _summary(checked, elapsed, engine.stats.captures, engine.stats.cache_hits, counts)
    if shard is not None:
        summary += f" (shard {shard} of the workspace's {len(engine.targets)})"
    if args.format == "json":
        output = formats.as_json(findings, root, _target_rows(engine, mine), stats)
    elif args.format == "sarif":
        from precompile.version import __version__

        output = formats.sarif(findings, root, __version__, engine.config.docs_url)
    elif args.format == "github":
        output = formats.github(findings, root)
    else:
        output = formats.text(findings, root, summary)
    if shard is not None and args.format in ("json", "sarif"):
        from precompile_lsp.shards import record

        extra = {"docs_url": engine.config.docs_url, "fail_on_empty": fail_on_empty}
        output = _with_shard_record(output, args.format, record(shard, assignment, extra))
    try:
        formats.write(output, args.output)
    except PrecompileError as error:  # e.g. a file put there while the check ran
        print(f"precompile check: {error}", file=sys.stderr)
        return EXIT_ERROR
    if args.format != "text" and args.output not in (None, "-"):
        print(summary, file=sys.stderr)
    threshold = FAIL_ON[args.fail_on]
    worst = max((SEVERITY_RANK.get(f.severity or "", 0) for f in all_findings), default=-1)
    if fail_on_empty and not engine.targets:
        return EXIT_FINDINGS
    return EXIT_FINDINGS if worst >= threshold else EXIT_OK


def _summary(targets: int, elapsed: float, captures: int, hits: int, counts: dict[str, int]) -> str:
    return (
        f"{targets} target{'s' * (targets != 1)} checked in {elapsed:.1f} s "
        f"({captures} captured, {hits} from cache): "
        f"{counts['error']} error{'s' * (counts['error'] != 1)}, {counts['warning']} warning{'s' * (counts['warning'] != 1)}"
    )


class _OutputTaken(Exception):
    """``--output`` names a path a target's emit writes: a usage error, before any run."""


def _output_guard(engine: Any, output: Path, then: Any) -> Any:
    """A ``select`` for ``Engine.check`` that first refuses an ``--output`` that is one of
    any discovered target's pair paths (artifact, .cache, .sig): the emit would write
    there and the report would then be refused, losing every finding of the run (or a
    report would later block the emit). Runs after discovery, before any job."""
    wanted = output.resolve()

    def select(decls: list[Any]) -> list[Any]:
        for state in engine.targets.values():
            for path, kind in engine.emit_paths.written_paths(state.decl):
                if path == wanted:
                    raise _OutputTaken(
                        f"--output {output} is the {kind} path of target "
                        f"{state.decl.key}; name a report file that no target's "
                        f"artifact=, .cache or .sig uses"
                    )
        return decls if then is None else then(decls)

    return select


def _shard_selector(
    engine: Any, shard: Any, args: argparse.Namespace, assignment: dict[str, int]
) -> Any:
    """What ``Engine.check`` runs of the discovered targets: this shard's (the rule is
    precompile_lsp.shards'); fills ``assignment`` with every target's shard."""
    from precompile_lsp import shards

    def select(decls: list[Any]) -> list[Any]:
        keys = [d.key for d in decls]
        timed = args.shard_balance == "time" and not args.no_cache
        seconds = engine.requests.remembered_seconds(decls) if timed else {}
        assignment.update(shards.partition(keys, shard.count, shards.weights(keys, seconds)))
        return [d for d in decls if assignment[d.key] == shard.index]

    return select


def _with_shard_record(output: str, format: str, shard_record: dict[str, Any]) -> str:
    """A JSON or SARIF report with the record ``precompile merge`` reads."""
    from precompile_lsp.shards import SARIF_PROPERTY, SHARD_KEY

    document = json.loads(output)
    if format == "json":
        document[SHARD_KEY] = shard_record
        return json.dumps(document, indent=2, default=str) + "\n"
    document["runs"][0].setdefault("properties", {})[SARIF_PROPERTY] = shard_record
    return json.dumps(document, indent=2) + "\n"


#: A SARIF level's rank, as ``SEVERITY_RANK`` ranks severities (note: information/hint).
_SARIF_RANK = {"error": 3, "warning": 2, "note": 1, "none": 0}


def merge_reports(args: argparse.Namespace) -> int:
    """One report from shard reports, and the exit code the unsharded check would give."""
    from precompile.errors import PrecompileError
    from precompile_lsp import formats, shards
    from precompile_lsp.findings import SEVERITY_RANK

    if args.output not in (None, "-"):
        from precompile.write_policy import refusal

        refused = refusal(args.output, "report")
        if refused is not None:
            print(
                f"precompile merge: --output {refused}; name a new file (or a report this "
                f"product wrote), or move the existing file away",
                file=sys.stderr,
            )
            return EXIT_ERROR
    try:
        reports = shards.validate([shards.load(p) for p in args.reports])
    except shards.ShardError as error:
        print(f"precompile merge: {error}", file=sys.stderr)
        return EXIT_ERROR
    kind = reports[0].kind
    fmt = args.format or kind
    first = reports[0].shard
    total = int(first.get("workspace_targets", 0))
    if kind == "sarif":
        if fmt != "sarif":
            print(
                f"precompile merge: SARIF reports merge into SARIF only (--format {fmt} needs "
                f"what SARIF does not carry); merge the shards' --format json reports instead",
                file=sys.stderr,
            )
            return EXIT_ERROR
        output = shards.merge_sarif(reports)
        ranks = [
            _SARIF_RANK.get(r.get("level", "warning"), 2)
            for report in reports
            for r in report.document["runs"][0].get("results", [])
        ]
    else:
        docs_url = first.get("docs_url")
        found = [f for r in reports for f in shards.findings_of(r.document, docs_url)]
        ranks = [SEVERITY_RANK.get(f.severity or "", 0) for f in found]
        root = Path(reports[0].document["root"])
        by_file: dict[Path, list[Any]] = {}
        for finding in found:
            by_file.setdefault(finding.file, []).append(finding)
        stats = shards.merged_stats(reports)
        if fmt == "json":
            rows = sorted(
                (row for r in reports for row in r.document.get("targets", [])),
                key=lambda row: str(row.get("target")),
            )
            output = formats.as_json(by_file, root, rows, stats)
        elif fmt == "sarif":
            from precompile.version import __version__

            output = formats.sarif(by_file, root, __version__, docs_url)
        elif fmt == "github":
            output = formats.github(by_file, root)
        else:
            counts = {s: sum(1 for f in found if f.severity == s) for s in ("error", "warning")}
            summary = _summary(
                int(stats.get("targets", 0)),
                float(stats.get("seconds", 0)),
                int(stats.get("captures", 0)),
                int(stats.get("cache_hits", 0)),
                counts,
            )
            output = formats.text(by_file, root, summary)
    try:
        formats.write(output, args.output)
    except PrecompileError as error:
        print(f"precompile merge: {error}", file=sys.stderr)
        return EXIT_ERROR
    fail_on_empty = args.fail_on_empty or any(r.shard.get("fail_on_empty") for r in reports)
    if total == 0:
        print(
            f"precompile merge: {'error' if fail_on_empty else 'warning'}: the shards found "
            f"no @precompile.target, so nothing was checked",
            file=sys.stderr,
        )
        if fail_on_empty:
            return EXIT_FINDINGS
    worst = max(ranks, default=-1)
    return EXIT_FINDINGS if worst >= FAIL_ON[args.fail_on] else EXIT_OK
