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
import collections
import contextlib
import dataclasses
import itertools
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from precompile.artifact.pair import default_cache_path
from precompile.artifact.signing import default_signature_path
from precompile.write_policy import pair_collision, pair_paths
from precompile_lsp import protocol
from precompile_lsp.config import load_config
from precompile_lsp.discovery import TargetDecl, discover, unreadable_findings
from precompile_lsp.executors import make_executor
from precompile_lsp.files import MAX_SOURCE_BYTES, SourceRead, read_source, shown_path
from precompile_lsp.findings import (
    WRITE_ERRORS,
    Finding,
    artifact_findings,
    conflict_finding,
    emit_failure_finding,
    findings_from_result,
    verify_findings,
    write_refused_finding,
)
from precompile_lsp.protocol import (
    CaptureError,
    JobKind,
    JobRequest,
    JobResult,
    Outcome,
    Stage,
)
from precompile_lsp.result_cache import (
    CACHE_FORMAT,
    ResultCache,
    build_identity,
    distribution_version,
)
from precompile_lsp.serving_logs import (
    Attribution,
    artifact_hash,
    attribute,
    expand,
    production_findings,
    read_logs,
)
from precompile_lsp.staleness import ArtifactStatus, artifact_status
from precompile_lsp.trust import TrustGate


@dataclasses.dataclass
class Stats:
    captures: int = 0
    cache_hits: int = 0
    emits: int = 0
    verifies: int = 0
    #: Jobs handed to a worker (any kind): what "no job runs" is measured by.
    jobs: int = 0
    #: Batches of checks that ran at least one job.
    rechecks: int = 0


@dataclasses.dataclass
class Job:
    """A job in flight: cancelled when a newer one for the same target supersedes it,
    shared when the same work is asked for again."""

    id: str
    task: asyncio.Task[JobResult]
    inputs: dict[Path, str | None]


@dataclasses.dataclass
class TargetState:
    decl: TargetDecl
    #: The last check result, kept until a newer one replaces it, and the declaration
    #: as it was when that result was computed (findings anchored to it stay where the
    #: result put them; a client maps them into newer versions of the file).
    result: JobResult | None = None
    result_decl: TargetDecl | None = None
    #: The last verify outcome, shown until the next check result.
    verified: JobResult | None = None
    #: The last emit, when its write was refused or failed (a full disk): shown beside
    #: the check's findings, not instead of them, until the next check result.
    emit_failure: JobResult | None = None
    artifact: ArtifactStatus | None = None
    findings: list[Finding] = dataclasses.field(default_factory=list)
    #: Content hashes of the files the result was computed from (what it depends on).
    dependencies: dict[Path, str] = dataclasses.field(default_factory=dict)
    jobs: dict[JobKind, Job] = dataclasses.field(default_factory=dict)


class TextStore:
    """Texts of file versions by content hash, so a finding computed against one version
    of a file can be placed in another (the buffer being edited, the file as saved)."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self.texts: collections.OrderedDict[str, str] = collections.OrderedDict()

    def put(self, sha: str | None, text: str | None) -> None:
        if sha is None or text is None:
            return
        self.texts[sha] = text
        self.texts.move_to_end(sha)
        while len(self.texts) > self.limit:
            self.texts.popitem(last=False)

    def get(self, sha: str | None) -> str | None:
        return None if sha is None else self.texts.get(sha)


Event = dict[str, Any]
_MISSING = object()
_REFUSAL_HINT = (
    "point artifact= at a new path inside the workspace (e.g. artifacts/NAME.py), or move "
    "the existing file away if you mean to replace it"
)

#: Fields of a job request that do not change its result: how long it may run (a
#: result that ran out of time is never cached) and where it keeps its temporary files.
_NOT_IN_KEY = ("timeout", "scratch")
#: What the workspace root reads as in a key (not result_cache's mark, which a read expands).
_ROOT_MARK = "<workspace root>"


def _resources(declared: Any) -> dict[str, float]:
    """A target's literal ``resources=`` as the job asks for them (what is not a dict of
    names to numbers is the decorator's error, which its job reports)."""
    if not isinstance(declared, dict):
        return {}
    return {
        str(name): float(amount)
        for name, amount in declared.items()
        if isinstance(amount, (int, float)) and not isinstance(amount, bool)
    }


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
        self.discovery_findings: dict[Path, list[Finding]] = {}
        self.texts = TextStore()
        #: The content hash of each file as the engine last read it.
        self.seen: dict[Path, str | None] = {}
        self.skipped: set[Path] = set()  # too big to read; logged once each
        self._deciding = asyncio.Lock()
        #: Every path a target's emit writes (artifact, cache, signature) -> the targets
        #: that write it, with what each writes there.
        self._by_artifact: dict[Path, list[tuple[TargetDecl, str]]] | None = None
        self._job_ids = itertools.count(1)
        #: What the configured serving logs say of each target (None: none configured),
        #: and what they were read from (re-read only when that changes).
        self.production: Attribution | None = None
        self._logs_stamp: object = None
        self.versions = {
            "python": sys.version.split()[0],
            # The interpreter's build, not only its version: a shared cache-dir serves
            # runners whose Pythons differ in implementation, ABI or build.
            "python-build": build_identity(),
            "torch": distribution_version("torch"),
            "torch-precompile": distribution_version("torch-precompile"),
            "cache": CACHE_FORMAT,
        }

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

    def _scan(self, paths: list[Path]) -> list[tuple[SourceRead, list[TargetDecl], list[Finding]]]:
        """Read and parse ``paths`` for targets (thread-safe: touches no engine state)."""
        scanned: list[tuple[SourceRead, list[TargetDecl], list[Finding]]] = []
        for path in paths:
            read = read_source(path)
            if read.text is None or not self.config.is_included(path):
                unread = unreadable_findings(read) if self.config.is_included(path) else []
                scanned.append((read, [], unread))
                continue
            targets, findings = discover(path, read.text, self.config.module_of(path))
            scanned.append((read, targets, findings))
        return scanned

    def _apply_scan(
        self, scanned: list[tuple[SourceRead, list[TargetDecl], list[Finding]]]
    ) -> list[TargetDecl]:
        """Replace the targets of the scanned files. A target that is still there keeps
        its result, findings and running jobs (its declaration is updated); only a
        target that is gone loses them."""
        found = []
        self._by_artifact = None
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
        self._by_artifact = None
        state = self.targets.pop(key)
        for job in state.jobs.values():
            job.task.cancel()

    def _paths(self, files: Iterable[Path] | None) -> list[Path]:
        return [p.resolve() for p in files] if files is not None else self.config.python_files()

    def discover(self, files: Iterable[Path] | None = None) -> list[TargetDecl]:
        """(Re)discover targets in ``files`` (default: the whole workspace)."""
        return self._apply_scan(self._scan(self._paths(files)))

    async def discover_async(self, files: Iterable[Path] | None = None) -> list[TargetDecl]:
        """``discover``, reading and parsing off the event loop."""
        paths = await asyncio.to_thread(self._paths, files)
        return self._apply_scan(await asyncio.to_thread(self._scan, paths))

    # ------------------------------------------------------------ jobs

    def artifact_of(self, decl: TargetDecl) -> tuple[Path, bool]:
        declared = decl.options.get("artifact")
        if isinstance(declared, str):
            # Like every path of the workspace's configuration: relative to its root.
            return (self.root / declared).resolve(), True
        return self.config.default_artifact(decl.module, decl.function).resolve(), False

    def written_paths(self, decl: TargetDecl) -> list[tuple[Path, str]]:
        """Every path an emit of ``decl`` writes or removes, with its kind: the artifact,
        its ``.cache`` and its ``.sig`` (resolved, so a symlinked folder counts where it
        leads). Temporaries and backups are random siblings created exclusively."""
        artifact, _ = self.artifact_of(decl)
        return [(Path(p).resolve(), kind) for p, kind in pair_paths(str(artifact))]

    def _index(self) -> dict[Path, list[tuple[TargetDecl, str]]]:
        """Each written path -> the targets that write it (rebuilt when targets or the
        configuration change: asking for every target must not cost targets squared)."""
        if self._by_artifact is None:
            index: dict[Path, list[tuple[TargetDecl, str]]] = {}
            for key in sorted(self.targets):
                declared = self.targets[key].decl
                for path, kind in self.written_paths(declared):
                    index.setdefault(path, []).append((declared, kind))
            self._by_artifact = index
        return self._by_artifact

    def shared_paths(
        self, decl: TargetDecl
    ) -> list[tuple[TargetDecl, list[tuple[Path, str, str]]]]:
        """Each other target that writes one of ``decl``'s paths, with every path they
        share: ``(path, what decl writes there, what the other writes there)``."""
        index: dict[str, tuple[TargetDecl, list[tuple[Path, str, str]]]] = {}
        for path, kind in self.written_paths(decl):
            for other, other_kind in self._index().get(path, []):
                if other.key == decl.key:
                    continue
                paths = index.setdefault(other.key, (other, []))[1]
                if paths and paths[0][1:] == ("artifact", "artifact"):
                    continue  # one artifact path: its .cache and .sig go without saying
                if all(path != p for p, _, _ in paths):
                    paths.append((path, kind, other_kind))
        return list(index.values())

    def conflicts(self, decl: TargetDecl) -> list[TargetDecl]:
        """Other targets whose emit writes one of the paths ``decl``'s emit writes (the
        artifact, or its ``.cache`` or ``.sig``): neither may be emitted."""
        return [other for other, _ in self.shared_paths(decl)]

    def write_refusal(self, decl: TargetDecl) -> str | None:
        """Why an emit of ``decl`` may not write where its artifact= points, by where the
        path is: outside the workspace (``../``, an absolute path, a symlinked folder that
        leads out) unless it is the artifact-dir the workspace's [tool.precompile] names;
        or a path that is its own cache or signature path. Whether the files there are
        ours is the write policy's call (``ArtifactStatus.refused``)."""
        artifact, _ = self.artifact_of(decl)
        allowed = [self.root, self.config.artifact_dir.resolve()]
        shown = shown_path(artifact, self.root)
        for path, _kind in self.written_paths(decl):
            if not any(path == a or a in path.parents for a in allowed):
                return (
                    f"{shown_path(path, self.root)} is outside the workspace {self.root}; "
                    f"the tools write only inside it (or into the artifact-dir that "
                    f"[tool.precompile] names)"
                )
        collision = pair_collision(str(artifact))
        if collision is not None:
            return collision.replace(str(artifact), shown)
        return None

    def options_of(self, decl: TargetDecl) -> dict[str, Any]:
        """What the job is run with: literal decorator options over the workspace's."""
        return {
            "backend": decl.options.get("backend") or self.config.backend,
            "tracer": decl.options.get("tracer") or self.config.tracer,
        }

    def job_request(self, decl: TargetDecl, kind: JobKind) -> JobRequest:
        artifact, declared = self.artifact_of(decl)
        options = self.options_of(decl)
        return JobRequest(
            kind=kind,
            module=decl.module,
            function=decl.function,
            root=str(self.root),
            source_roots=[str(r) for r in self.config.source_roots],
            artifact=str(artifact),
            artifact_declared=declared,
            backend=options["backend"],
            tracer=options["tracer"],
            timeout=self.config.timeout,
            trusted_keys=self.trusted_keys if kind is JobKind.VERIFY else [],
            resources=_resources(decl.options.get("resources")),
        )

    def _cache_key(self, decl: TargetDecl, kind: JobKind) -> str:
        """Everything a job's result depends on besides the files and packages it imports
        (which its cache entry records, with their hashes and versions).

        That is every field of the job request -- so a field added to the request is in
        the key without anyone remembering to add it -- except those in
        ``_NOT_IN_KEY``, with workspace paths made relative (a cache restored into
        another checkout still hits); the interpreter the job runs in; the decorator's
        literal options; the versions; and the content of every file the request names
        that the job reads (``_read_inputs``: for a verification the artifact, its
        ``.cache`` and ``.sig``, each present or absent, and the trusted keys). Reads
        files: call off the event loop."""
        asked = protocol.to_json_value(self.job_request(decl, kind))
        for name in _NOT_IN_KEY:
            asked.pop(name, None)
        request = json.dumps(asked, sort_keys=True).replace(
            json.dumps(str(self.root))[1:-1], _ROOT_MARK
        )
        read = {
            self.cache.portable(str(p)): read_source(p).sha for p in self._read_inputs(decl, kind)
        }
        parts = [
            kind.value,
            decl.key,
            request,
            self.config.python,
            json.dumps(decl.options, sort_keys=True, default=str),
            json.dumps(self.versions, sort_keys=True),
            json.dumps(read, sort_keys=True),
        ]
        return "\n".join(parts)

    def _read_inputs(self, decl: TargetDecl, kind: JobKind) -> list[Path]:
        """The files a job reads because its request names them (the modules it imports
        are recorded by the job itself). A check captures into a scratch folder, so it
        reads none; a verification loads the pair, checks its signature against the
        trusted keys given as files, and its outcome changes with any of their bytes."""
        if kind is not JobKind.VERIFY:
            return []
        artifact = str(self.artifact_of(decl)[0])
        pair = [artifact, default_cache_path(artifact), default_signature_path(artifact)]
        keys = [k for k in self.trusted_keys if os.path.isfile(k)]
        return [Path(p) for p in pair + keys]

    def _inputs(self, state: TargetState) -> dict[Path, str | None]:
        """The current content hashes of what ``state``'s target depends on: its own file
        and the files its last result was computed from."""
        paths = {state.decl.file, *state.dependencies}
        return {p: self.seen.get(p, state.dependencies.get(p)) for p in sorted(paths)}

    def up_to_date(self, state: TargetState) -> bool:
        """Whether the last result was computed from the files as they read now."""
        if state.result is None:
            return False
        if self.import_failed(state.decl, state.result):
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

        task = asyncio.create_task(self.pool.run(job_id, self.job_request(decl, kind), progress))
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
            None if kind is JobKind.EMIT else await asyncio.to_thread(self._cache_key, decl, kind)
        )
        if job is None:
            if cache_key is not None:
                cached = await asyncio.to_thread(self.cache.get, cache_key, dict(self.seen))
                if cached is not None:
                    self.stats.cache_hits += 1
                    return cached
            if kind is JobKind.EMIT and self.conflicts(decl):
                error = CaptureError(message=self._conflict_text(decl), type="ArtifactConflict")
                return JobResult(status=Outcome.ERROR, kind=kind, error=error)
            if kind is JobKind.EMIT:
                refused = await asyncio.to_thread(self._emit_refusal, decl)
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
        if cache_key is not None and self.cacheable(decl, result):
            warning = await asyncio.to_thread(self._put, cache_key, decl, kind, result, seconds)
            if warning is not None:
                self.on_event({"kind": "warning", "message": f"precompile: {warning}"})
        return result

    def _put(
        self,
        key: str,
        decl: TargetDecl,
        kind: JobKind,
        result: JobResult,
        seconds: float | None = None,
    ) -> str | None:
        """Cache ``result`` under ``key``, the key read before the job ran, unless what
        the key covers changed while it ran (an artifact rewritten during its
        verification): the result may be of either version, so it is of neither.
        Returns the warning of a cache that could not be written (once per engine)."""
        if self._cache_key(decl, kind) != key:
            return None
        return self.cache.put(key, result, seconds)

    @classmethod
    def cacheable(cls, decl: TargetDecl, result: JobResult) -> bool:
        """Whether ``result`` may answer for its target again while what it depends on
        is unchanged. Not when the machinery failed or the job was cancelled, and not
        when the target's module did not import (its own file is then not among the
        files the job recorded): what a failed import depends on has no bound -- a
        module that does not exist yet, anywhere under the source roots or on
        ``sys.path``, a package installed later, the environment -- so a cached failure
        would outlive its fix. Not caching it costs one failed import per check, and a
        demanding user wants the fix seen at once, wherever it was made."""
        if result.status.failed or result.status is Outcome.CANCELLED:
            return False
        return not cls.import_failed(decl, result)

    @staticmethod
    def import_failed(decl: TargetDecl, result: JobResult) -> bool:
        """Whether ``result`` is of a job that could not import its target's module:
        its own file is then not among the files the job recorded."""
        finished = not result.status.failed and result.status is not Outcome.CANCELLED
        return finished and str(decl.file) not in result.dependencies

    def _emit_refusal(self, decl: TargetDecl) -> str | None:
        """Why an emit of ``decl`` may not write at all (reads files: off the loop)."""
        refused = self.write_refusal(decl)
        if refused is not None:
            return refused
        artifact, _ = self.artifact_of(decl)
        return artifact_status(artifact, self.root).refused

    def _conflict_text(self, decl: TargetDecl) -> str:
        shared = "; ".join(
            f"{o.key} writes {shown_path(path, self.root)} too (as its {theirs})"
            for o, paths in self.shared_paths(decl)
            for path, _, theirs in paths
        )
        return (
            f"{decl.key} was not written: {shared}; so neither overwrites the other. Give "
            f"each target its own artifact= path"
        )

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
        self._by_artifact = None
        for state in self.targets.values():
            self._derive(state)

    def running(self, decl: TargetDecl) -> bool:
        state = self.targets.get(decl.key)
        return state is not None and JobKind.CHECK in state.jobs

    def _derive(self, state: TargetState) -> None:
        """A target's findings from its result, artifact status and last verification."""
        decl = state.decl
        findings: list[Finding] = []
        if state.result is not None:
            versions = dict(state.dependencies)
            findings += [
                f.at_versions(versions)
                for f in findings_from_result(state.result, state.result_decl or decl, self.root)
            ]
        decl_version = {decl.file: self.seen.get(decl.file)}
        artifact, declared = self.artifact_of(decl)
        shared = self.shared_paths(decl)
        refused = self.write_refusal(decl)
        if refused is None and state.artifact is not None:
            refused = state.artifact.refused
        if shared:
            findings.append(conflict_finding(decl, shared, self.root))
        elif refused is not None:
            findings.append(write_refused_finding(decl, refused, artifact))
        elif state.artifact is not None:
            findings += artifact_findings(state.artifact, decl, artifact, declared, self.root)
        if state.emit_failure is not None and not (shared or refused):
            # (A refusal the workspace still shows is said once, above.)
            findings += emit_failure_finding(state.emit_failure, decl, artifact)
        if state.verified is not None:
            findings += verify_findings(state.verified, decl)
        if self.production is not None:
            findings += production_findings(
                decl,
                self.production.current.get(decl.key),
                self.production.stale.get(decl.key, []),
                self.production.hashes.get(decl.key),
                self.root,
            )
        state.findings = [
            self._configured(
                f if f.version is not None or f.file != decl.file else f.at_versions(decl_version)
            )
            for f in findings
        ]

    def _configured(self, finding: Finding) -> Finding:
        """A finding as this workspace shows it: its severity, its documentation link."""
        return finding.with_severity(self.config.severity).with_docs(self.config.docs_url)

    def _apply(self, decl: TargetDecl, result: JobResult) -> None:
        state = self.targets.get(decl.key)
        if state is None:
            return
        state.result = result
        state.result_decl = decl
        state.verified = None
        state.emit_failure = None
        state.dependencies = {Path(p): d for p, d in result.dependencies.items()}
        self._derive(state)

    async def _refresh_artifact(self, state: TargetState) -> None:
        artifact, _ = self.artifact_of(state.decl)
        state.artifact = await asyncio.to_thread(artifact_status, artifact, self.root)

    async def _snapshot(self, states: list[TargetState]) -> None:
        """Keep the text of each file version findings point into, so they can be placed
        in later versions of it (read off the event loop)."""
        wanted = {
            p: sha
            for s in states
            for p, sha in s.dependencies.items()
            if self.texts.get(sha) is None
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
        artifacts = {s.decl.key: self.artifact_of(s.decl)[0] for s in self.targets.values()}
        # Reading a log runs nothing, so an untrusted workspace's logs are read -- but
        # only inside it: its own pyproject.toml may not point the server at files
        # elsewhere on the machine (the gate tells the user once what trust enables).
        patterns = tuple(
            p
            for p in self.config.serving_logs
            if not os.path.isabs(os.path.expanduser(p))
            or self.gate.allows(f"read the serving logs {p!r}, outside the workspace")
        )
        read = await asyncio.to_thread(self._read_serving_logs, artifacts, patterns)
        if read is None:
            return False
        self.production, warnings = read
        for warning in warnings:
            self.on_event({"kind": "log", "message": f"precompile: serving log {warning}"})
        for state in self.targets.values():
            self._derive(state)
        return True

    def _read_serving_logs(
        self, artifacts: dict[str, Path], patterns: tuple[str, ...]
    ) -> tuple[Attribution | None, list[str]] | None:
        """The logs ``patterns`` name: their attribution and warnings, or None when
        nothing they depend on changed (thread-safe: touches no engine state but the
        stamp)."""
        if not patterns:
            if self._logs_stamp is None:
                return None
            self._logs_stamp = None
            return None, []
        files = sorted({p for found in expand(patterns, self.root).values() for p in found})
        hashes = {key: artifact_hash(path) for key, path in sorted(artifacts.items())}

        def stat(path: Path) -> tuple[int, int, int] | None:
            try:
                info = path.stat()
            except OSError:
                return None
            return info.st_ino, info.st_size, info.st_mtime_ns

        stamp = (patterns, [(p, stat(p)) for p in files], hashes)
        if stamp == self._logs_stamp:
            return None
        self._logs_stamp = stamp
        logs = read_logs(files, self.root)
        return attribute(logs, hashes), logs.warnings

    def _cached_checks(self, decls: list[TargetDecl]) -> dict[str, JobResult]:
        """The check results the cache still holds for ``decls`` (file I/O: one trip off
        the event loop for the whole batch, not one per target)."""
        seen = dict(self.seen)
        distribution_version.cache_clear()  # a package may have been installed meanwhile
        hits = {}
        for decl in decls:
            cached = self.cache.get(self._cache_key(decl, JobKind.CHECK), seen)
            if cached is not None:
                hits[decl.key] = cached
        return hits

    async def _finish(self, states: list[TargetState]) -> None:
        """After new results: what the workspace says of each artifact, the findings, and
        the texts they point into (one trip off the event loop for all of ``states``)."""
        paths = [self.artifact_of(s.decl)[0] for s in states]
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

        hits = {} if emit or verify else await asyncio.to_thread(self._cached_checks, decls)
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
            writable = not self.conflicts(decl) and self.write_refusal(decl) is None
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
            or (changed and s.result is not None and self.import_failed(s.decl, s.result))
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
        scanned = await asyncio.to_thread(self._scan, python)
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

    def remembered_seconds(self, decls: Iterable[TargetDecl]) -> dict[str, float | None]:
        """How long each target's last check took, as the result cache remembers it
        (None: not remembered), whether or not that result is still current: what a
        shard split is balanced by. Reads files: call off the event loop."""
        return {d.key: self.cache.seconds(self._cache_key(d, JobKind.CHECK)) for d in decls}

    def findings_by_file(
        self, keys: Iterable[str] | None = None, *, workspace: bool = True
    ) -> dict[Path, list[Finding]]:
        """Every finding, by file; with ``keys``, only those targets' findings, and the
        findings of no target (discovery's) only with ``workspace`` (a shard's report)."""
        by_file: dict[Path, list[Finding]] = {}
        if workspace:
            for path, findings in self.discovery_findings.items():
                by_file.setdefault(path, []).extend(self._configured(f) for f in findings)
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
