"""The ``precompile`` command line.

Exit codes, as linters use them: 0 clean, 1 findings at or above ``--fail-on``, 2 a usage,
configuration or internal error. ``check`` imports neither torch nor pygls in this
process: captures run in worker processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
#: ``precompile inspect`` shows this much of a value unless asked for --full.
INSPECT_LIMIT = 400
FAIL_ON = {"error": 3, "warning": 2, "never": 99}


def _workspace(paths: list[str]) -> Path:
    from precompile_lsp.config import find_pyproject

    start = Path(paths[0]).resolve() if paths else Path.cwd()
    if start.is_file():
        start = start.parent
    pyproject = find_pyproject(start)
    return pyproject.parent if pyproject else Path.cwd().resolve()


class OutsideWorkspace(ValueError):
    """A path named on the command line that is not inside the workspace being checked."""


def _files(paths: list[str], root: Path | None = None) -> list[Path] | None:
    """The Python files ``paths`` name. With ``root``, each must lie inside it: a path
    outside the workspace would otherwise be checked against nothing and pass."""
    if not paths:
        return None
    files: list[Path] = []
    for raw in paths:
        path = Path(raw).resolve()
        if root is not None and path != root and root not in path.parents:
            raise OutsideWorkspace(
                f"{raw} is outside the workspace {root} (the folder of the nearest "
                f"pyproject.toml above the first path, else the current directory), so "
                f"nothing in it would be checked; cd into the project that holds {raw} "
                f"and run precompile check there, or name paths inside {root}"
            )
        if path.is_dir():
            files.extend(sorted(path.rglob("*.py")))
        elif path.exists():
            files.append(path)
        else:
            raise FileNotFoundError(f"no such file or directory: {raw}")
    return files


class _Progress:
    """A live progress line on a terminal (stderr); silent otherwise, or with --quiet."""

    def __init__(self, quiet: bool = False) -> None:
        self.tty = sys.stderr.isatty() and not quiet

    def __call__(self, event: dict[str, Any]) -> None:
        if event["kind"] in ("log", "warning"):
            self.done()
            print(event["message"], file=sys.stderr)
            return
        if not self.tty:
            return
        if event["kind"] == "progress":
            sys.stderr.write(
                f"\r\033[Kprecompile: capturing {event['done']}/{event['total']} {event.get('target') or ''}"
            )
            sys.stderr.flush()
        elif event["kind"] == "stage":
            from precompile_lsp.stages import stage_text

            sys.stderr.write(
                f"\r\033[Kprecompile: {event['job']} {event['target']}: {stage_text(event)}"
            )
            sys.stderr.flush()

    def done(self) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


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
                "tracer": report.tracer if report else engine.options_of(state.decl)["tracer"],
                "backend": engine.options_of(state.decl)["backend"],
                "artifact": str(engine.artifact_of(state.decl)[0]),
                "dependencies": sorted(str(p) for p in state.dependencies),
            }
        )
    return rows


def _check(args: argparse.Namespace) -> int:
    from precompile.errors import PrecompileError
    from precompile_lsp import formats
    from precompile_lsp.config import ConfigError
    from precompile_lsp.engine import Engine
    from precompile_lsp.findings import SEVERITY_RANK

    root = _workspace(args.paths)
    progress = _Progress(args.quiet)
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
        files = _files(args.paths, root)
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
            for path, kind in engine.written_paths(state.decl):
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
        seconds = engine.remembered_seconds(decls) if timed else {}
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


def _merge(args: argparse.Namespace) -> int:
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


def _resolve_target(engine: Any, spec: str) -> Any:
    engine.discover()
    if "::" in spec:
        file, function = spec.split("::", 1)
        path = Path(file).resolve()
        matches = [
            s.decl
            for s in engine.targets.values()
            if s.decl.file == path and s.decl.function == function
        ]
    else:
        matches = [s.decl for k, s in engine.targets.items() if k == spec or k.endswith("." + spec)]
    if len(matches) != 1:
        known = ", ".join(sorted(engine.targets)) or "none found"
        raise LookupError(
            f"{'no' if not matches else 'more than one'} target matches {spec!r} (targets: {known})"
        )
    return matches[0]


def _emit_or_verify(args: argparse.Namespace, kind: str) -> int:
    from precompile_lsp.config import ConfigError
    from precompile_lsp.engine import Engine
    from precompile_lsp.files import shown_path
    from precompile_lsp.protocol import JobResult

    root = _workspace([])
    progress = _Progress(args.quiet)
    try:
        # Key files as absolute paths: the worker that loads the pair runs elsewhere.
        keys = [str(Path(k).resolve()) for k in getattr(args, "trusted_key", None) or ()]
        engine = Engine(root, trusted=True, use_cache=False, on_event=progress, trusted_keys=keys)
        if kind == "verify":
            from precompile.artifact.metadata import inspect_artifact

            metadata = inspect_artifact(args.artifact)
            decl = _resolve_target(engine, f"{metadata['FN_MODULE']}.{metadata['FN_NAME']}")
            own = engine.artifact_of(decl)[0]
            if own != Path(args.artifact).resolve():
                # The worker verifies the target's own artifact: verifying (or checking the
                # signature of) any other file would report on one file and load another.
                raise LookupError(
                    f"{args.artifact} is a copy of {decl.key}'s artifact, which lives at "
                    f"{shown_path(own, root)}; verify that path (or point the target's "
                    f"artifact= option at this file)"
                )
        else:
            decl = _resolve_target(engine, args.target)
    except (ConfigError, LookupError) as error:
        print(f"precompile {kind}: {error}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as error:
        print(f"precompile {kind}: {error}", file=sys.stderr)
        return EXIT_ERROR

    async def run() -> JobResult:
        try:
            return await (engine.verify(decl) if kind == "verify" else engine.emit(decl))
        finally:
            await engine.close()

    result = asyncio.run(run())
    progress.done()
    if result.status.failed:
        print(f"precompile {kind}: {result.message}", file=sys.stderr)
        return EXIT_FINDINGS
    if result.failure is not None:
        print(f"precompile {kind}: {decl.key}: {result.failure.message}", file=sys.stderr)
        return EXIT_FINDINGS
    if kind == "emit":
        summary = result.report.summary.text if result.report is not None else ""
        print(f"emitted {result.artifact}: {summary}")
        return EXIT_OK
    failures = result.verify_failures
    for failure in failures:
        print(f"{args.artifact}: {failure}")
    status = engine.targets[decl.key].artifact
    stale = status.stale if status is not None else ()
    for source in stale:
        print(f"{args.artifact}: stale: {source.describe(str(source.file))} since it was emitted")
    if not failures and not stale:
        print(f"{args.artifact}: verified against eager")
    return EXIT_FINDINGS if failures or stale else EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    """With ``--trusted-key``, the pair's signature is checked first (in this process,
    without torch); a refused signature is a finding, and nothing is loaded."""
    if args.trusted_key:
        from precompile.artifact.pair import default_cache_path
        from precompile.artifact.signing import verify_signature
        from precompile.errors import PrecompileError, SignatureError

        cache = default_cache_path(args.artifact)
        try:
            signer = verify_signature(
                args.artifact,
                cache if Path(cache).exists() else None,
                trusted_keys=args.trusted_key,
            )
        except SignatureError as error:
            print(f"{args.artifact}: {error}", file=sys.stderr)
            return EXIT_FINDINGS
        except PrecompileError as error:
            print(f"precompile verify: {error}", file=sys.stderr)
            return EXIT_ERROR
        print(f"{args.artifact}: signed by trusted key {signer}")
    elif args.signature_only:
        print("precompile verify: --signature-only needs --trusted-key", file=sys.stderr)
        return EXIT_ERROR
    if args.signature_only:
        return EXIT_OK
    return _emit_or_verify(args, "verify")


def _keygen(args: argparse.Namespace) -> int:
    from precompile.artifact.signing import generate_key
    from precompile.errors import PrecompileError

    try:
        private, public, key = generate_key(args.key, args.public)
    except PrecompileError as error:
        print(f"precompile keygen: {error}", file=sys.stderr)
        return EXIT_ERROR
    print(f"wrote private key {private} (mode 0600: keep it secret) and public key {public}")
    print(f"key id {key}; load with trusted_keys=[{public!r}] or verify --trusted-key {public}")
    return EXIT_OK


def _sign(args: argparse.Namespace) -> int:
    from precompile.artifact.pair import default_cache_path
    from precompile.artifact.signing import sign
    from precompile.errors import PrecompileError

    cache = args.cache or default_cache_path(args.artifact)
    try:
        signature = sign(args.artifact, cache, args.key, signature_path=args.signature)
    except PrecompileError as error:
        print(f"precompile sign: {error}", file=sys.stderr)
        return EXIT_ERROR
    print(f"signed {args.artifact} and {cache}: {signature}")
    return EXIT_OK


def _daemon(args: argparse.Namespace) -> int:
    from precompile_lsp.config import ConfigError
    from precompile_lsp.daemon import run_daemon

    try:
        root = _workspace(args.paths)
        return run_daemon(root, _files(args.paths, root))
    except (ConfigError, FileNotFoundError, OutsideWorkspace) as error:
        print(f"precompile daemon: {error}", file=sys.stderr)
        return EXIT_ERROR


def _inspect(args: argparse.Namespace) -> int:
    from precompile.artifact.metadata import inspect_artifact
    from precompile.errors import PrecompileError

    try:
        metadata = inspect_artifact(args.artifact)
    except PrecompileError as error:
        print(f"precompile inspect: {error}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps(metadata, indent=2, default=list))
        return EXIT_OK
    width = max(map(len, metadata), default=0)
    columns = max(shutil.get_terminal_size((100, 24)).columns - width - 2, 40)
    for key, value in metadata.items():
        if key.startswith("_"):
            # Encoded payloads (_FRAMES, _PACKAGE...) are sized, never printed.
            print(f"{key.ljust(width)}  <{len(str(value))} characters>")
            continue
        text = repr(value)
        if not args.full and len(text) > INSPECT_LIMIT:
            text = (
                f"{text[:INSPECT_LIMIT]}... ({len(text) - INSPECT_LIMIT} more characters; --full)"
            )
        lines = textwrap.wrap(text, columns, break_long_words=True) or [""]
        print(f"{key.ljust(width)}  {lines[0]}")
        for line in lines[1:]:
            print(f"{'':{width}}  {line}")
    return EXIT_OK


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


def _coverage(args: argparse.Namespace) -> int:
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
    root = _workspace([])
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
    hashes = {key: artifact_hash(engine.artifact_of(d)[0]) for key, d in decls.items()}
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


def _lsp(args: argparse.Namespace) -> int:
    from precompile_lsp.server import main as serve

    serve()
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="precompile",
        description="torch-precompile: capture once, serve anywhere; see graph breaks and coverage gaps.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser(
        "check", help="check the workspace's @precompile.target functions (CI)"
    )
    check.add_argument(
        "paths", nargs="*", help="files or directories (default: the whole workspace)"
    )
    check.add_argument(
        "--format",
        choices=["text", "json", "sarif", "github"],
        default="text",
        help="report format: text for people, json for scripts, sarif for code scanning, "
        "github for workflow annotations (default: text)",
    )
    check.add_argument("--output", help="write the report here (atomically) instead of stdout")
    check.add_argument("--emit", action="store_true", help="also emit each target's artifact")
    check.add_argument(
        "--verify", action="store_true", help="also verify each artifact against eager"
    )
    check.add_argument(
        "--fail-on",
        choices=["error", "warning", "never"],
        default="error",
        help="exit 1 when a finding of this severity or worse is reported; never: always "
        "exit 0 unless the check itself fails (default: error)",
    )
    check.add_argument(
        "--fail-on-empty",
        action="store_true",
        help="exit 1 when no @precompile.target is found, so CI notices a check that checked "
        "nothing (default: exit 0 with a warning; also [tool.precompile] fail-on-empty)",
    )
    check.add_argument(
        "--jobs", type=int, help="worker processes (default: [tool.precompile] workers)"
    )
    check.add_argument(
        "--no-cache", action="store_true", help="ignore and do not write .precompile/cache"
    )
    check.add_argument(
        "--cache-dir",
        help="keep the result cache in this folder, e.g. one CI persists and shares between "
        "runners (default: [tool.precompile] cache-dir, else .precompile/cache)",
    )
    check.add_argument(
        "--shard",
        metavar="K/N",
        help="check only the K-th of N deterministic parts of the targets (1 <= K <= N); "
        "combine the N reports (--format json or sarif) with precompile merge",
    )
    check.add_argument(
        "--shard-balance",
        choices=["time", "count"],
        default="time",
        help="split by the capture times the result cache remembers (time; count when it "
        "remembers none) or by target count (default: time)",
    )
    check.add_argument("--quiet", action="store_true", help="no progress line on a terminal")
    check.set_defaults(run=_check)
    merge = commands.add_parser(
        "merge", help="one report, and check's exit code, from the reports of check --shard"
    )
    merge.add_argument("reports", nargs="+", metavar="REPORT", help="the N shard reports")
    merge.add_argument(
        "--format",
        choices=["text", "json", "sarif", "github"],
        help="report format (default: the reports' format; SARIF merges into SARIF only)",
    )
    merge.add_argument("--output", help="write the report here (atomically) instead of stdout")
    merge.add_argument(
        "--fail-on",
        choices=["error", "warning", "never"],
        default="error",
        help="exit 1 when a finding of this severity or worse is reported (default: error)",
    )
    merge.add_argument(
        "--fail-on-empty",
        action="store_true",
        help="exit 1 when the shards found no target (also when the shards were run with it)",
    )
    merge.set_defaults(run=_merge)
    daemon = commands.add_parser("daemon", help="watch the workspace and print changed findings")
    daemon.add_argument(
        "paths", nargs="*", help="files or directories to watch (default: the whole workspace)"
    )
    daemon.set_defaults(run=_daemon)
    emit = commands.add_parser("emit", help="emit one target's artifact pair")
    emit.add_argument("target", help="module.function, function, or path.py::function")
    emit.add_argument("--quiet", action="store_true", help="no progress line on a terminal")
    emit.set_defaults(run=lambda a: _emit_or_verify(a, "emit"))
    verify = commands.add_parser("verify", help="verify an artifact against eager")
    verify.add_argument("artifact", help="path of the artifact's .py file")
    verify.add_argument("--quiet", action="store_true", help="no progress line on a terminal")
    verify.add_argument(
        "--trusted-key",
        action="append",
        metavar="PUBLIC_KEY",
        help="first require a signature by this public key (repeatable)",
    )
    verify.add_argument(
        "--signature-only", action="store_true", help="check the signature, not against eager"
    )
    verify.set_defaults(run=_verify)
    keygen = commands.add_parser("keygen", help="make an Ed25519 key pair for signing artifacts")
    keygen.add_argument("key", help="private key file to create (written 0600)")
    keygen.add_argument("--public", help="public key file (default: KEY.pub)")
    keygen.set_defaults(run=_keygen)
    sign = commands.add_parser("sign", help="sign an artifact pair (writes NAME.sig)")
    sign.add_argument("artifact", help="path of the artifact's .py file")
    sign.add_argument("--key", required=True, help="the Ed25519 private key file")
    sign.add_argument("--cache", help="the pair's cache (default: NAME.cache)")
    sign.add_argument("--signature", help="where to write the signature (default: NAME.sig)")
    sign.set_defaults(run=_sign)
    inspect = commands.add_parser("inspect", help="print an artifact's metadata without running it")
    inspect.add_argument("artifact", help="path of the artifact's .py file")
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.add_argument(
        "--full",
        action="store_true",
        help=f"print values longer than {INSPECT_LIMIT} characters whole",
    )
    inspect.set_defaults(run=_inspect)
    coverage = commands.add_parser(
        "coverage",
        help="aggregate serving logs per target: served %%, refusal reasons, shadow mismatches",
    )
    coverage.add_argument(
        "logs", nargs="+", metavar="LOG", help="serving log files or globs (docs/serving.md)"
    )
    coverage.add_argument(
        "--format",
        choices=["text", "json", "sarif", "github"],
        default="text",
        help="report format (default: text)",
    )
    coverage.add_argument("--output", help="write the report here (atomically) instead of stdout")
    coverage.add_argument(
        "--max-refused",
        metavar="RATE",
        help="exit 1 when an artifact's refused share of calls is above RATE (0.05 or 5%%): "
        "a canary gate",
    )
    coverage.set_defaults(run=_coverage)
    lsp = commands.add_parser("lsp", help="run the language server over stdio")
    lsp.set_defaults(run=_lsp)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0) and EXIT_ERROR
    if getattr(args, "jobs", None) is not None and args.jobs < 1:
        print("precompile check: --jobs must be at least 1", file=sys.stderr)
        return EXIT_ERROR
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
