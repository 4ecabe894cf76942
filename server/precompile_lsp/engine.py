"""The engine: discovers targets, runs their jobs in warm workers, caches results, and
turns them into findings. The language server, the daemon and the CLI are its clients.

The engine process never imports torch: captures run user code, and run it in worker
processes (precompile_lsp.worker). Results are cached on disk (``.precompile/cache``),
keyed by everything they depend on -- the content of every workspace file the capture
imported, the target's options, and the versions of torch, Python, this package and the
third-party packages the capture imported -- so an unchanged target is never captured
again, in the editor or across CI runs.

Changes arrive as paths (a save, a watched-file event, the daemon's watcher), possibly
several times for one edit. The engine reads each path and compares its content hash
with the last one it saw: an event whose content did not change is dropped, and a target
is re-checked only when a file its last result was computed from now reads differently
-- and not again while a job for exactly that content is already running. So duplicate
notifications of one save coalesce into one re-check, and a check with nothing changed
does no work and reports nothing. A target keeps its previous result and findings until
the new result replaces them. Files are read and parsed off the event loop; a source
larger than ``MAX_SOURCE_BYTES`` is not parsed (one log line; a finding when it mentions
precompile, since targets in it would go unchecked). No user code runs unless
the engine is trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from precompile_lsp.config import load_config
from precompile_lsp.discovery import TargetDecl, scan
from precompile_lsp.emit_paths import EmitPaths
from precompile_lsp.engine_records import Event, Job, Stats, TargetState, TextStore
from precompile_lsp.executors import make_executor
from precompile_lsp.files import ABSENT, MAX_SOURCE_BYTES, SourceRead, holds_file, read_source
from precompile_lsp.findings import (
    WRITE_ERRORS,
    Finding,
)
from precompile_lsp.job_requests import JobRequests, cacheable, import_failed
from precompile_lsp.protocol import (
    CaptureError,
    JobKind,
    JobResult,
    Outcome,
    Stage,
)
from precompile_lsp.result_cache import (
    ResultCache,
)
from precompile_lsp.serving_logs import Attribution, LogReader
from precompile_lsp.staleness import artifact_status
from precompile_lsp.target_findings import configured, target_findings
from precompile_lsp.trust import TrustGate

_MISSING = object()
_REFUSAL_HINT = (
    "point artifact= at a new path inside the workspace (e.g. artifacts/NAME.py), or move "
    "the existing file away if you mean to replace it"
)


class Engine:
    def __init__(
        self,
        root: Path,
        *,
        overrides: dict[str, Any] | None = None,
        trusted: bool = False,
        use_cache: bool = True,
        on_event: Callable[[Event], None] | None = None,
        trusted_keys: Sequence[str] = (),
    ) -> None:
        self.root = root.resolve()
        #: Public keys a verification's load must find the pair signed by (none: any
        #: pair loads, as a plain ``precompile.load`` would).
        self.trusted_keys = list(trusted_keys)
        self.overrides = dict(overrides or {})
        self.on_event = on_event or (lambda event: None)
        #: The one trust gate every program-starting path of this engine asks (trust.py).
        self.gate = TrustGate(trusted)
        self.gate.on_refuse = lambda what: self.on_event({"kind": "untrusted", "what": what})
        self.config = load_config(self.root, self.overrides, gate=self.gate)
        self.cache = ResultCache(
            self.root, use_cache, self.config.cache_dir, self.config.cache_max_bytes
        )
        #: Who runs the jobs: local workers or a cluster ([tool.precompile] executor).
        self.pool = make_executor(self.config, self.gate)
        self.stats = Stats()
        self.targets: dict[str, TargetState] = {}
        #: Where each target's emit writes, and the requests and cache keys of its jobs.
        self.emit_paths = EmitPaths(self.root, self.config, self.targets)
        self.requests = JobRequests(
            self.root, self.config, self.emit_paths, self.cache, self.trusted_keys
        )
        self.discovery_findings: dict[Path, list[Finding]] = {}
        self.texts = TextStore()
        #: The content hash of each file as the engine last read it.
        self.seen: dict[Path, str | None] = {}
        self.skipped: set[Path] = set()  # too big to read; logged once each
        self._deciding = asyncio.Lock()
        self._job_ids = itertools.count(1)
        #: What the configured serving logs say of each target (None: none configured),
        #: and the reader that re-reads them only when they changed.
        self.production: Attribution | None = None
        self.log_reader = LogReader(self.root)

    @property
    def trusted(self) -> bool:
        return self.gate.trusted

    async def trust(self) -> dict[Path, list[Finding]]:
        """Trust the workspace from now on and do what waited for it: probe the
        interpreter the configuration names (a ConfigError propagates, as at start) and
        check every target."""
        self.gate.grant()
        self.reconfigure()
        return await self.check()

    # ------------------------------------------------------------ discovery

    def _apply_scan(
        self, scanned: list[tuple[SourceRead, list[TargetDecl], list[Finding]]]
    ) -> list[TargetDecl]:
        """Replace the targets of the scanned files. A target that is still there keeps
        its result, findings and running jobs (its declaration is updated); only a
        target that is gone loses them."""
        found = []
        self.emit_paths.invalidate()
        for read, targets, findings in scanned:
            path = read.path
            self.seen[path] = read.sha
            if read.too_big and path not in self.skipped:
                self.skipped.add(path)
                self.on_event(
                    {
                        "kind": "log",
                        "message": f"precompile: skipping {path}: it is larger than "
                        f"{MAX_SOURCE_BYTES // (1024 * 1024)} MiB, so it is not searched for "
                        f"targets",
                    }
                )
            self.discovery_findings.pop(path, None)
            if findings:
                self.discovery_findings[path] = [f.at_versions({path: read.sha}) for f in findings]
            if targets or findings:
                self.texts.put(read.sha, read.text)
            kept = {d.key for d in targets}
            for key in [k for k, s in self.targets.items() if s.decl.file == path]:
                if key not in kept:
                    self._forget(key)
            for decl in targets:
                state = self.targets.get(decl.key)
                if state is None:
                    self.targets[decl.key] = TargetState(decl)
                else:
                    state.decl = decl
                found.append(decl)
        return found

    def _forget(self, key: str) -> None:
        self.emit_paths.invalidate()
        state = self.targets.pop(key)
        for job in state.jobs.values():
            job.task.cancel()

    def _paths(self, files: Iterable[Path] | None) -> list[Path]:
        return [p.resolve() for p in files] if files is not None else self.config.python_files()

    def discover(self, files: Iterable[Path] | None = None) -> list[TargetDecl]:
        """(Re)discover targets in ``files`` (default: the whole workspace)."""
        return self._apply_scan(scan(self._paths(files), self.config))

    async def discover_async(self, files: Iterable[Path] | None = None) -> list[TargetDecl]:
        """``discover``, reading and parsing off the event loop."""
        paths = await asyncio.to_thread(self._paths, files)
        return self._apply_scan(await asyncio.to_thread(scan, paths, self.config))

    # ------------------------------------------------------------ jobs

    def _inputs(self, state: TargetState) -> dict[Path, str | None]:
        """The current content hashes of what ``state``'s target depends on: its own file
        and the files its last result was computed from."""
        paths = {state.decl.file, *state.dependencies}
        return {p: self.seen.get(p, state.dependencies.get(p)) for p in sorted(paths)}

    def up_to_date(self, state: TargetState) -> bool:
        """Whether the last result was computed from the files as they read now."""
        if state.result is None:
            return False
        if import_failed(state.decl, state.result):
            return False  # it depends on every file (see ``cacheable``)
        recorded = {p: state.dependencies.get(p) for p in self._inputs(state)}
        return recorded == self._inputs(state)

    def _submit(self, decl: TargetDecl, kind: JobKind, inputs: dict[Path, str | None]) -> Job:
        job_id = f"job-{next(self._job_ids)}"
        self.stats.jobs += 1

        def progress(stage: Stage) -> None:
            self.on_event(
                {"kind": "stage", "target": decl.key, "job": kind.value, **attrs.asdict(stage)}
            )

        task = asyncio.create_task(
            self.pool.run(job_id, self.requests.job_request(decl, kind), progress)
        )
        return Job(job_id, task, inputs)

    async def run_target(
        self,
        decl: TargetDecl,
        kind: JobKind = JobKind.CHECK,
        on_submit: Callable[[], None] | None = None,
    ) -> JobResult:
        """One job for a target (check and verify results are cached). A running job of
        the same kind for the same content is shared; one for older content is cancelled
        (superseded) and its waiter gets a ``cancelled`` result."""
        state = self.targets.get(decl.key) or TargetState(decl)
        inputs = self._inputs(state)
        job = state.jobs.get(kind)
        if job is not None and (job.inputs != inputs or kind is JobKind.EMIT):
            await self.pool.cancel(job.id)
            job.task.cancel()
            job = None
        cache_key = (
            None
            if kind is JobKind.EMIT
            else await asyncio.to_thread(self.requests.cache_key, decl, kind)
        )
        if job is None:
            if cache_key is not None:
                cached = await asyncio.to_thread(self.cache.get, cache_key, dict(self.seen))
                if cached is not None:
                    self.stats.cache_hits += 1
                    return cached
            if kind is JobKind.EMIT and self.emit_paths.conflicts(decl):
                error = CaptureError(
                    message=self.emit_paths.conflict_text(decl), type="ArtifactConflict"
                )
                return JobResult(status=Outcome.ERROR, kind=kind, error=error)
            if kind is JobKind.EMIT:
                refused = await asyncio.to_thread(self.emit_paths.emit_refusal, decl)
                if refused is not None:
                    error = CaptureError(
                        message=refused, type="OverwriteRefusedError", hint=_REFUSAL_HINT
                    )
                    return JobResult(status=Outcome.ERROR, kind=kind, error=error)
            job = state.jobs.get(kind)  # another run may have started it meanwhile
            if job is None or job.inputs != inputs or kind is JobKind.EMIT:
                if job is not None:
                    await self.pool.cancel(job.id)
                    job.task.cancel()
                job = state.jobs[kind] = self._submit(decl, kind, inputs)
                if on_submit is not None:
                    on_submit()
                self.on_event({"kind": "job", "target": decl.key, "job": kind.value})
        try:
            result = await asyncio.shield(job.task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we are being cancelled ourselves
            # A newer run of this target superseded this one: only the newer result counts.
            return JobResult(status=Outcome.CANCELLED, message="superseded by a newer run")
        finally:
            if state.jobs.get(kind) is job and job.task.done():
                del state.jobs[kind]
        if kind is JobKind.CHECK:
            self.stats.captures += 1
        elif kind is JobKind.EMIT:
            self.stats.emits += 1
        else:
            self.stats.verifies += 1
        seconds = self.pool.seconds.pop(job.id, None)
        if cache_key is not None and cacheable(decl, result):
            warning = await asyncio.to_thread(
                self.requests.put, cache_key, decl, kind, result, seconds
            )
            if warning is not None:
                self.on_event({"kind": "warning", "message": f"precompile: {warning}"})
        return result

    def reconfigure(self, overrides: dict[str, Any] | None = None) -> None:
        """Reload pyproject.toml with the editor's ``overrides`` (None: keep the current
        ones) and re-derive findings (severities may have changed). A ConfigError keeps
        the old configuration."""
        if overrides is not None:
            self.overrides = dict(overrides)
        self.config = load_config(self.root, self.overrides, gate=self.gate)
        if self.config.executor != self.pool.kind:  # the next job goes to the new one
            previous, self.pool = self.pool, make_executor(self.config, self.gate)
            with contextlib.suppress(RuntimeError):  # no loop: nothing was started
                asyncio.get_running_loop().create_task(previous.close())
        self.pool.config = self.config
        self.emit_paths.reconfigured(self.config)
        self.requests.reconfigured(self.config)
        for state in self.targets.values():
            self._derive(state)

    def running(self, decl: TargetDecl) -> bool:
        state = self.targets.get(decl.key)
        return state is not None and JobKind.CHECK in state.jobs

    def _derive(self, state: TargetState) -> None:
        """A target's findings from its result, artifact status and last verification."""
        state.findings = target_findings(
            state,
            self.emit_paths,
            self.production,
            self.seen.get(state.decl.file),
            self.root,
            self.config,
        )

    def _apply(self, decl: TargetDecl, result: JobResult) -> None:
        state = self.targets.get(decl.key)
        if state is None:
            return
        state.result = result
        state.result_decl = decl
        state.verified = None
        state.emit_failure = None
        # A place an import looked and found nothing is None, as the engine's scan says
        # of a file that is not there: a file created there makes the target stale.
        state.dependencies = {
            Path(p): None if d == ABSENT else d for p, d in result.dependencies.items()
        }
        self._derive(state)

    async def _refresh_artifact(self, state: TargetState) -> None:
        artifact, _ = self.emit_paths.artifact_of(state.decl)
        state.artifact = await asyncio.to_thread(artifact_status, artifact, self.root)

    async def _snapshot(self, states: list[TargetState]) -> None:
        """Keep the text of each file version findings point into, so they can be placed
        in later versions of it (read off the event loop)."""
        wanted = {
            p: sha
            for s in states
            for p, sha in s.dependencies.items()
            if holds_file(sha) and self.texts.get(sha) is None
        }
        reads = await asyncio.to_thread(lambda: [read_source(p) for p in wanted])
        for read in reads:
            if read.sha == wanted[read.path]:
                self.texts.put(read.sha, read.text)

    async def check(
        self,
        files: Iterable[Path] | None = None,
        *,
        emit: bool = False,
        verify: bool = False,
        rediscover: bool = True,
        select: Callable[[list[TargetDecl]], list[TargetDecl]] | None = None,
    ) -> dict[Path, list[Finding]]:
        """Check the targets of ``files`` (default: all), optionally emitting and verifying
        their artifacts; return every finding of the workspace, by file. ``select`` (run
        off the event loop, after discovery) picks which of those targets run: a shard's
        (``precompile check --shard``); every target is still discovered, so conflicts
        between a selected target and any other are found."""
        if rediscover:
            await self.discover_async(files)
        wanted = None if files is None else {Path(p).resolve() for p in files}
        decls = [s.decl for s in self.targets.values() if wanted is None or s.decl.file in wanted]
        if select is not None:
            decls = await asyncio.to_thread(select, decls)
        if not self.gate.allows("capture its targets"):
            await self.refresh_serving_logs()  # reading logs runs nothing of the workspace
            return self.findings_by_file()
        await self._run_batch(decls, emit=emit, verify=verify)
        await self.refresh_serving_logs()
        return self.findings_by_file()

    async def refresh_serving_logs(self) -> bool:
        """Re-read the configured serving logs (off the event loop) when they, or the
        artifacts they are matched to, changed since the last read, and re-derive every
        target's findings from them. Returns whether anything was re-read. A log runs
        nothing and starts no job: a change to one never triggers a capture."""
        artifacts = {
            s.decl.key: self.emit_paths.artifact_of(s.decl)[0] for s in self.targets.values()
        }
        # Reading a log runs nothing, so an untrusted workspace's logs are read -- but
        # only inside it: its own pyproject.toml may not point the server at files
        # elsewhere on the machine (the gate tells the user once what trust enables).
        patterns = tuple(
            p
            for p in self.config.serving_logs
            if not os.path.isabs(os.path.expanduser(p))
            or self.gate.allows(f"read the serving logs {p!r}, outside the workspace")
        )
        read = await asyncio.to_thread(self.log_reader.read, artifacts, patterns)
        if read is None:
            return False
        self.production, warnings = read
        for warning in warnings:
            self.on_event({"kind": "log", "message": f"precompile: serving log {warning}"})
        for state in self.targets.values():
            self._derive(state)
        return True

    async def _finish(self, states: list[TargetState]) -> None:
        """After new results: what the workspace says of each artifact, the findings, and
        the texts they point into (one trip off the event loop for all of ``states``)."""
        paths = [self.emit_paths.artifact_of(s.decl)[0] for s in states]
        statuses = await asyncio.to_thread(lambda: [artifact_status(p, self.root) for p in paths])
        for state, status in zip(states, statuses):
            state.artifact = status
            self._derive(state)
        await self._snapshot(states)

    async def _run_batch(
        self, decls: list[TargetDecl], *, emit: bool = False, verify: bool = False
    ) -> None:
        total = len(decls)
        done = 0
        working = False

        def submitted() -> None:
            nonlocal working
            if not working:
                working = True
                self.on_event({"kind": "progress", "done": done, "total": total})

        def report(target: str) -> None:
            if working:
                self.on_event({"kind": "progress", "done": done, "total": total, "target": target})

        hits = (
            {}
            if emit or verify
            else await asyncio.to_thread(self.requests.cached_checks, decls, dict(self.seen))
        )
        self.stats.cache_hits += len(hits)
        cached = []
        for key, result in hits.items():
            state = self.targets.get(key)
            if state is not None:
                self._apply(state.decl, result)
                cached.append(state)
        await self._finish(cached)
        done = len(hits)

        async def one(decl: TargetDecl) -> None:
            nonlocal done
            # A target that may not write (its paths shared with another target, outside
            # the workspace, or holding a user's file) is not emitted, nor verified: the
            # artifact there is not its own, and its finding says so once.
            writable = (
                not self.emit_paths.conflicts(decl) and self.emit_paths.write_refusal(decl) is None
            )
            write_failed = None
            if emit and writable:
                emitted = await self.run_target(decl, JobKind.EMIT, submitted)
                failure = emitted.failure
                if failure is not None and failure.type in WRITE_ERRORS:
                    # Refused or failed to write (a full disk): the capture itself was
                    # fine, so the check's findings are still shown, beside this one.
                    write_failed = emitted
                elif failure is not None or emitted.status.failed:
                    self._apply(decl, emitted)
                    done += 1
                    report(decl.key)
                    return
            result = await self.run_target(decl, JobKind.CHECK, submitted)
            state = self.targets.get(decl.key)
            if result.status is not Outcome.CANCELLED and state is not None:
                self._apply(decl, result)
                state.emit_failure = write_failed
                if (
                    verify
                    and writable
                    and write_failed is None
                    and result.failure is None
                    and not result.status.failed
                ):
                    verified = await self.run_target(decl, JobKind.VERIFY, submitted)
                    if verified.status is not Outcome.CANCELLED:
                        state.verified = verified
                await self._finish([state])
            done += 1
            report(decl.key)

        await asyncio.gather(*(one(d) for d in decls if d.key not in hits))
        if working:
            self.stats.rechecks += 1

    async def verify(self, decl: TargetDecl) -> JobResult:
        """Verify a target's artifact and show the outcome among its findings (a failure,
        a stale source) until its next check."""
        verified = await self.run_target(decl, JobKind.VERIFY)
        state = self.targets.get(decl.key)
        if verified.status is not Outcome.CANCELLED and state is not None:
            state.verified = verified
            await self._refresh_artifact(state)
            self._derive(state)
        return verified

    async def emit(self, decl: TargetDecl) -> JobResult:
        """Emit a target's artifact, then re-read what the workspace says of it (a new
        artifact also retires the last verification, which was of the old one)."""
        emitted = await self.run_target(decl, JobKind.EMIT)
        state = self.targets.get(decl.key)
        if state is not None:
            if emitted.status is not Outcome.CANCELLED and emitted.failure is None:
                state.verified = None
                state.emit_failure = None
            elif emitted.failure is not None and emitted.failure.type in WRITE_ERRORS:
                state.emit_failure = emitted
            await self._refresh_artifact(state)
            self._derive(state)
            await self.refresh_serving_logs()  # the artifact's code hash may have changed
        return emitted

    def dependents(self, changed: Iterable[Path]) -> list[TargetDecl]:
        """Targets whose dependencies include one of ``changed``; a target whose module
        did not import depends on every file (the fix may be a module created anywhere)."""
        changed = {Path(p).resolve() for p in changed}
        return [
            s.decl
            for s in self.targets.values()
            if changed & set(s.dependencies)
            or s.decl.file in changed
            or (changed and s.result is not None and import_failed(s.decl, s.result))
        ]

    async def files_changed(self, paths: Iterable[Path]) -> bool:
        """React to ``paths`` that may have changed (saves, watched-file events, any
        number of times for one edit): rediscover the files whose content did change and
        re-check the targets whose results no longer match what they depend on. Returns
        whether anything a client shows may have changed; False means nothing was done."""
        async with self._deciding:
            due, shown = await self._decide(paths)
        if due and self.trusted:
            await self._run_batch(due)
        # A changed serving log (or artifact) is re-read here, and only re-read.
        logs = await self.refresh_serving_logs()
        return bool(due) or shown or logs

    async def _decide(self, paths: Iterable[Path]) -> tuple[list[TargetDecl], bool]:
        """What a batch of changed paths calls for: the targets to re-check, and whether
        any finding a client shows may have changed. Runs under ``_deciding``, so two
        notifications of one save see each other's hashes."""
        candidates = sorted({Path(p).resolve() for p in paths})
        candidates = [p for p in candidates if self.config.may_matter(p)]
        if not candidates:
            return [], False
        reads = await asyncio.to_thread(lambda: [read_source(p) for p in candidates])
        changed = [r for r in reads if self.seen.get(r.path, _MISSING) != r.sha]
        if not changed:
            return [], False
        pyproject = self.root / "pyproject.toml"
        if any(r.path == pyproject for r in changed):
            self.seen[pyproject] = next(r.sha for r in changed if r.path == pyproject)
            self.reconfigure()  # a ConfigError propagates: the old configuration stays
            await self.discover_async()
            return [s.decl for s in self.targets.values()], True
        python = [r.path for r in changed if r.path.suffix == ".py"]
        had_findings = {p for p in python if p in self.discovery_findings}
        scanned = await asyncio.to_thread(scan, python, self.config)
        self._apply_scan(scanned)
        for read in changed:
            self.seen[read.path] = read.sha
        shown = had_findings | {p for p in python if p in self.discovery_findings}
        affected = {d.key: d for d in self.dependents(r.path for r in changed)}
        due = []
        for decl in affected.values():
            state = self.targets[decl.key]
            job = state.jobs.get(JobKind.CHECK)
            if self.up_to_date(state) or (job is not None and job.inputs == self._inputs(state)):
                continue
            due.append(decl)
        return due, bool(shown)

    def findings_by_file(
        self, keys: Iterable[str] | None = None, *, workspace: bool = True
    ) -> dict[Path, list[Finding]]:
        """Every finding, by file; with ``keys``, only those targets' findings, and the
        findings of no target (discovery's) only with ``workspace`` (a shard's report)."""
        by_file: dict[Path, list[Finding]] = {}
        if workspace:
            for path, findings in self.discovery_findings.items():
                by_file.setdefault(path, []).extend(configured(f, self.config) for f in findings)
        chosen = None if keys is None else set(keys)
        for state in self.targets.values():
            if chosen is not None and state.decl.key not in chosen:
                continue
            for finding in state.findings:
                by_file.setdefault(finding.file, []).append(finding)
        return {p: [f for f in fs if f.severity != "off"] for p, fs in by_file.items()}

    async def close(self) -> None:
        for state in self.targets.values():
            for job in state.jobs.values():
                job.task.cancel()
        await self.pool.close()
