"""The engine: discovers targets, runs their jobs in warm workers, caches results, and
turns them into findings. The language server and the CLI are its clients.

The engine process never imports torch: captures run user code, and run it in worker
processes (precompile_lsp.worker). Results are cached on disk (``.precompile/cache``),
keyed by everything they depend on -- the content of every workspace file the capture
imported, the target's options, and the versions of torch, Python, this package and the
third-party packages the capture imported -- so an unchanged target is never captured
again, in the editor or across CI runs. A changed file reschedules only the targets
whose dependencies include it; a newer request for a target cancels the older one.
No user code runs unless the engine is trusted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import importlib.metadata
import itertools
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from precompile_lsp.config import Config, load_config
from precompile_lsp.discovery import TargetDecl, discover
from precompile_lsp.findings import Finding, findings_from_result

CACHE_FORMAT = 1
_ROOT_MARK = "${PRECOMPILE_WORKSPACE}/"


@dataclasses.dataclass
class Stats:
    captures: int = 0
    cache_hits: int = 0
    emits: int = 0
    verifies: int = 0


@dataclasses.dataclass
class TargetState:
    decl: TargetDecl
    result: dict[str, Any] | None = None
    findings: list[Finding] = dataclasses.field(default_factory=list)
    dependencies: set[Path] = dataclasses.field(default_factory=set)


class WorkerClient:
    """One warm worker process, spoken to over its stdin/stdout (see worker.py)."""

    def __init__(self, python: str, root: Path) -> None:
        self.python = python
        self.root = root
        self.process: asyncio.subprocess.Process | None = None
        self.pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.reader: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.failure: str | None = None

    async def start(self) -> None:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        self.process = await asyncio.create_subprocess_exec(
            self.python,
            "-m",
            "precompile_lsp.worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            cwd=str(self.root),
            env=env,
            start_new_session=True,
            limit=64 * 1024 * 1024,
        )
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        while True:
            line = await self.process.stdout.readline()
            if not line:
                break
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue
            if message.get("ready"):
                self.ready.set()
                continue
            future = self.pending.pop(message.get("id"), None)
            if future is not None and not future.done():
                future.set_result(message["result"])
        self.failure = "the worker process exited"
        self.ready.set()
        for future in self.pending.values():
            if not future.done():
                future.set_result(
                    {"status": "crashed", "message": "the worker process died while capturing"}
                )
        self.pending.clear()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None and self.failure is None

    async def run(self, job_id: str, job: dict[str, Any]) -> dict[str, Any]:
        await self.ready.wait()
        if not self.alive:
            return {
                "status": "crashed",
                "message": f"the worker for {self.python} could not start: is torch-precompile installed in that interpreter? (pip install torch-precompile)",
            }
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[job_id] = future
        await self._write({"op": "run", "id": job_id, "job": job})
        try:
            return await future
        except asyncio.CancelledError:
            # Whoever waited is gone: stop the capture too, so the worker is free for the
            # next job instead of finishing work nobody will read.
            if self.pending.pop(job_id, None) is not None and self.alive:
                await self._write({"op": "cancel", "id": job_id})
            raise

    async def cancel(self, job_id: str) -> None:
        if job_id in self.pending and self.alive:
            await self._write({"op": "cancel", "id": job_id})

    async def _write(self, message: dict[str, Any]) -> None:
        assert self.process is not None and self.process.stdin is not None
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode())
            await self.process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            self.failure = "the worker process exited"

    async def close(self) -> None:
        if self.process is not None and self.process.returncode is None:
            try:
                os.killpg(self.process.pid, 9)
            except (ProcessLookupError, PermissionError):
                self.process.kill()
            await self.process.wait()
        if self.reader is not None:
            await asyncio.gather(self.reader, return_exceptions=True)


class WorkerPool:
    """``size`` warm workers; a dead one is replaced before its next job."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.idle: asyncio.Queue[WorkerClient] = asyncio.Queue()
        self.workers: list[WorkerClient] = []
        self.running: dict[str, WorkerClient] = {}
        self.started = False

    async def _spawn(self) -> WorkerClient:
        worker = WorkerClient(self.config.python, self.config.root)
        await worker.start()
        self.workers.append(worker)
        return worker

    async def start(self) -> None:
        if not self.started:
            self.started = True
            for _ in range(self.config.workers):
                self.idle.put_nowait(await self._spawn())

    async def run(self, job_id: str, job: dict[str, Any]) -> dict[str, Any]:
        await self.start()
        worker = await self.idle.get()
        if not worker.alive and worker.ready.is_set():
            self.workers.remove(worker)
            await worker.close()
            worker = await self._spawn()
        self.running[job_id] = worker
        try:
            return await worker.run(job_id, job)
        finally:
            self.running.pop(job_id, None)
            self.idle.put_nowait(worker)

    async def cancel(self, job_id: str) -> None:
        worker = self.running.get(job_id)
        if worker is not None:
            await worker.cancel(job_id)

    async def close(self) -> None:
        for worker in self.workers:
            await worker.close()
        self.workers.clear()
        self.started = False


def _with_verification(checked: dict[str, Any], verified: dict[str, Any]) -> dict[str, Any]:
    """A check result with what verifying the artifact found."""
    failures = verified.get("verify_failures", [])
    if verified.get("error"):
        failures = [verified["error"]["message"]]
    elif verified.get("status") in ("timeout", "crashed"):
        failures = [verified.get("message", "the verification did not finish")]
    return {
        **checked,
        "verify_failures": failures,
        "stale": verified.get("stale", checked.get("stale", [])),
    }


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


class ResultCache:
    """``.precompile/cache/<hash>.json``: a result with the hashes of what it depends on.

    Paths inside the workspace are stored relative to its root, so a cache restored into
    another checkout (another CI runner) still hits.
    """

    def __init__(self, root: Path, enabled: bool) -> None:
        self.root = root
        self.directory = root / ".precompile" / "cache"
        self.enabled = enabled

    def _portable(self, path: str) -> str:
        try:
            return Path(path).relative_to(self.root).as_posix()
        except ValueError:
            return path

    def _local(self, path: str) -> Path:
        return Path(path) if os.path.isabs(path) else self.root / path

    def _path(self, key: str) -> Path:
        return self.directory / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        try:
            text = self._path(key).read_text(encoding="utf-8")
            entry = json.loads(text.replace(_ROOT_MARK, json.dumps(str(self.root))[1:-1] + "/"))
        except (OSError, json.JSONDecodeError):
            return None
        if entry.get("format") != CACHE_FORMAT or entry.get("key") != key:
            return None
        for path, digest in entry["dependencies"].items():
            if _sha256(self._local(path)) != digest:
                return None
        for dist, version in entry["packages"].items():
            if _version(dist) != version:
                return None
        result = entry["result"]
        result["dependencies"] = {str(self._local(p)): d for p, d in entry["dependencies"].items()}
        return result

    def put(self, key: str, result: dict[str, Any]) -> None:
        if not self.enabled or result.get("status") in ("timeout", "crashed", "cancelled"):
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        ignore = self.directory.parent / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# Created by torch-precompile: results cached by content hash.\n*\n")
        dependencies = {self._portable(p): d for p, d in result.get("dependencies", {}).items()}
        entry = {
            "format": CACHE_FORMAT,
            "key": key,
            "dependencies": dependencies,
            "packages": result.get("packages", {}),
            "result": result,
        }
        text = json.dumps(entry, default=str, ensure_ascii=False)
        # Every path under the root, anywhere in the result, is stored relative to it.
        text = text.replace(json.dumps(str(self.root))[1:-1] + "/", _ROOT_MARK)
        tmp = self._path(key).with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self._path(key))


Event = dict[str, Any]


class Engine:
    def __init__(
        self,
        root: Path,
        *,
        overrides: dict[str, Any] | None = None,
        trusted: bool = False,
        use_cache: bool = True,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.root = root.resolve()
        self.config = load_config(self.root, overrides)
        self.trusted = trusted
        self.cache = ResultCache(self.root, use_cache)
        self.pool = WorkerPool(self.config)
        self.stats = Stats()
        self.on_event = on_event or (lambda event: None)
        self.targets: dict[str, TargetState] = {}
        self.discovery_findings: dict[Path, list[Finding]] = {}
        self.generation = itertools.count(1)
        self.file_generation: dict[Path, int] = {}
        self._inflight: dict[str, tuple[str, asyncio.Task[Any]]] = {}
        self._job_ids = itertools.count(1)
        self.versions = {
            "python": sys.version.split()[0],
            "torch": _version("torch"),
            "torch-precompile": _version("torch-precompile"),
        }

    # ------------------------------------------------------------ discovery

    def discover(self, files: Iterable[Path] | None = None) -> list[TargetDecl]:
        """(Re)discover targets in ``files`` (default: the whole workspace)."""
        paths = [p.resolve() for p in files] if files is not None else self.config.python_files()
        found = []
        for path in paths:
            self.discovery_findings.pop(path, None)
            for key in [k for k, s in self.targets.items() if s.decl.file == path]:
                del self.targets[key]
            if not path.is_file() or not self.config.is_included(path):
                continue
            try:
                source = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            targets, findings = discover(path, source, self.config.module_of(path))
            if findings:
                self.discovery_findings[path] = findings
            for decl in targets:
                self.targets[decl.key] = TargetState(decl)
                found.append(decl)
        return found

    # ------------------------------------------------------------ jobs

    def artifact_of(self, decl: TargetDecl) -> tuple[Path, bool]:
        declared = decl.options.get("artifact")
        if isinstance(declared, str):
            # Like every path of the workspace's configuration: relative to its root.
            return (self.root / declared).resolve(), True
        return self.config.default_artifact(decl.module, decl.function).resolve(), False

    def _job(self, decl: TargetDecl, kind: str) -> dict[str, Any]:
        artifact, declared = self.artifact_of(decl)
        return {
            "kind": kind,
            "module": decl.module,
            "function": decl.function,
            "root": str(self.root),
            "source_roots": [str(r) for r in self.config.source_roots],
            "artifact": str(artifact),
            "artifact_declared": declared,
            "backend": decl.options.get("backend") or self.config.backend,
            "timeout": self.config.timeout,
        }

    def _cache_key(self, decl: TargetDecl, kind: str) -> str:
        artifact, _ = self.artifact_of(decl)
        parts = [
            kind,
            decl.key,
            json.dumps(decl.options, sort_keys=True, default=str),
            json.dumps(self.versions, sort_keys=True),
        ]
        parts.append(self.cache._portable(str(artifact)))
        parts.append(_sha256(artifact) or "no-artifact")
        return "\n".join(parts)

    async def run_target(self, decl: TargetDecl, kind: str = "check") -> dict[str, Any]:
        """Run one job for a target (cached for check/verify), superseding an older one."""
        key = decl.key if kind == "check" else f"{decl.key}:{kind}"
        previous = self._inflight.get(key)
        if previous is not None:
            await self.pool.cancel(previous[0])
            previous[1].cancel()
        cache_key = self._cache_key(decl, kind)
        if kind != "emit":
            cached = self.cache.get(cache_key)
            if cached is not None:
                self.stats.cache_hits += 1
                return cached
        job_id = f"job-{next(self._job_ids)}"
        task = asyncio.create_task(self.pool.run(job_id, self._job(decl, kind)))
        self._inflight[key] = (job_id, task)
        try:
            result = await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we are being cancelled ourselves
            # A newer run of this target superseded this one: only the newer result counts.
            return {"status": "cancelled", "message": "superseded by a newer run"}
        finally:
            if self._inflight.get(key, (None,))[0] == job_id:
                del self._inflight[key]
        if kind == "check":
            self.stats.captures += 1
        elif kind == "emit":
            self.stats.emits += 1
        else:
            self.stats.verifies += 1
        if result.get("status") != "cancelled":
            self.cache.put(cache_key, result)
        return result

    def reconfigure(self, overrides: dict[str, Any] | None = None) -> None:
        """Reload pyproject.toml with the editor's ``overrides`` and re-derive findings
        (severities may have changed). A ConfigError keeps the old configuration."""
        self.config = load_config(self.root, overrides)
        self.pool.config = self.config
        for state in self.targets.values():
            if state.result is not None:
                self._apply(state.decl, state.result)

    def running(self, decl: TargetDecl) -> bool:
        return decl.key in self._inflight

    def _apply(self, decl: TargetDecl, result: dict[str, Any]) -> None:
        state = self.targets.get(decl.key)
        if state is None:
            return
        state.result = result
        state.dependencies = {Path(p) for p in result.get("dependencies", {})} | {decl.file}
        state.findings = [
            f.with_severity(self.config.severity).with_docs(self.config.docs_url)
            for f in findings_from_result(result, decl, self.root)
        ]

    async def check(
        self,
        files: Iterable[Path] | None = None,
        *,
        emit: bool = False,
        verify: bool = False,
        rediscover: bool = True,
    ) -> dict[Path, list[Finding]]:
        """Check the targets of ``files`` (default: all), optionally emitting and verifying
        their artifacts; return every finding of the workspace, by file."""
        if rediscover:
            self.discover(files)
        decls = [
            s.decl
            for s in self.targets.values()
            if files is None or s.decl.file in {Path(p).resolve() for p in files}
        ]
        if not self.trusted:
            self.on_event({"kind": "untrusted"})
            return self.findings_by_file()
        total = len(decls)
        done = 0
        self.on_event({"kind": "progress", "done": 0, "total": total})

        async def one(decl: TargetDecl) -> None:
            nonlocal done
            if emit:
                emitted = await self.run_target(decl, "emit")
                if emitted.get("error"):
                    self._apply(decl, emitted)
                    done += 1
                    self.on_event(
                        {"kind": "progress", "done": done, "total": total, "target": decl.key}
                    )
                    return
            result = await self.run_target(decl, "check")
            if verify and not result.get("error"):
                result = _with_verification(result, await self.run_target(decl, "verify"))
            if result.get("status") != "cancelled":
                self._apply(decl, result)
            done += 1
            self.on_event({"kind": "progress", "done": done, "total": total, "target": decl.key})

        await asyncio.gather(*(one(d) for d in decls))
        return self.findings_by_file()

    async def verify(self, decl: TargetDecl) -> dict[str, Any]:
        """Verify a target's artifact and show the outcome among its findings (a failure,
        a stale source) until its next check."""
        verified = await self.run_target(decl, "verify")
        state = self.targets.get(decl.key)
        checked = state.result if state is not None else None
        if (
            verified.get("status") != "cancelled"
            and checked is not None
            and not checked.get("error")
            and checked.get("status") not in ("timeout", "crashed")
        ):
            self._apply(decl, _with_verification(checked, verified))
        return verified

    def dependents(self, changed: Iterable[Path]) -> list[TargetDecl]:
        """Targets whose dependencies include one of ``changed``."""
        changed = {Path(p).resolve() for p in changed}
        return [
            s.decl
            for s in self.targets.values()
            if s.dependencies & changed or s.decl.file in changed
        ]

    async def files_changed(self, changed: Iterable[Path]) -> dict[Path, list[Finding]]:
        """Rediscover the changed files, then re-check only the targets that depend on them."""
        changed = [Path(p).resolve() for p in changed]
        python = [p for p in changed if p.suffix == ".py"]
        self.discover(python)
        affected = {d.key: d for d in self.dependents(changed)}
        affected.update({k: s.decl for k, s in self.targets.items() if s.decl.file in python})
        if affected:
            await self.check([d.file for d in affected.values()], rediscover=False)
        return self.findings_by_file()

    def findings_by_file(self) -> dict[Path, list[Finding]]:
        by_file: dict[Path, list[Finding]] = {}
        for path, findings in self.discovery_findings.items():
            by_file.setdefault(path, []).extend(
                f.with_severity(self.config.severity).with_docs(self.config.docs_url)
                for f in findings
            )
        for state in self.targets.values():
            for finding in state.findings:
                by_file.setdefault(finding.file, []).append(finding)
        generation = next(self.generation)
        for path in by_file:
            self.file_generation[path] = generation
        return {p: [f for f in fs if f.severity != "off"] for p, fs in by_file.items()}

    async def close(self) -> None:
        for _job_id, task in list(self._inflight.values()):
            task.cancel()
        await self.pool.close()
