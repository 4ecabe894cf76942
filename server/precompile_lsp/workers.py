"""The engine's side of the worker pipe: warm worker processes and the pool that hands
them jobs.

Each worker is ``python -m precompile_lsp.worker`` run with the workspace's interpreter;
it is spoken to in ``precompile_lsp.protocol`` messages, decoded strictly: a worker that
sends something else, or speaks another protocol version, is treated as dead (its jobs
end as crashed with the reason) rather than misread. A job whose worker died before
forking it never ran, and the pool runs it again on a fresh worker.
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

from precompile_lsp import protocol
from precompile_lsp.config import Config
from precompile_lsp.protocol import JobRequest, JobResult, Outcome, ProtocolError, Stage
from precompile_lsp.trust import TrustGate

OnStage = Callable[[Stage], None]

#: How much of a worker's stderr is kept, to say why it did not start.
STDERR_TAIL = 4000


def start_failure(returncode: int | None, stderr: str) -> str:
    """Why a worker ended before it was ready: how it ended (a signal, an exit status)
    and the end of what it wrote. "Not installed" only when the import of torch or
    torch-precompile is what failed -- a worker killed while importing (the OOM killer,
    a user's kill) is not a missing package."""
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        what = f"it was killed by signal {-returncode} ({name}) while starting"
    elif returncode is not None:
        what = f"it exited with status {returncode} while starting"
    else:
        what = "it closed its output while starting"
    tail = stderr.strip()
    what += f"; the end of its stderr:\n{tail}" if tail else "; it wrote nothing to stderr"
    missing = re.search(r"No module named '?(precompile_lsp|precompile|torch)\b", tail)
    if missing:
        package = "torch" if missing.group(1) == "torch" else "torch-precompile"
        what += f"\n{package} is not installed in that interpreter (pip install {package})"
    return what


class WorkerClient:
    """One warm worker process, spoken to over its stdin/stdout."""

    def __init__(self, python: str, root: Path) -> None:
        self.python = python
        self.root = root
        self.process: asyncio.subprocess.Process | None = None
        self.pending: dict[str, asyncio.Future[JobResult]] = {}
        self.started: set[str] = set()
        self.progress: dict[str, OnStage] = {}
        self.reader: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.failure: str | None = None
        #: The end of the worker's stderr (fd 1 of the worker points there too).
        self.stderr: collections.deque[str] = collections.deque()
        self.stderr_size = 0
        self.stderr_reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        # The worker runs in the workspace folder: without this, ``-m`` would put it first
        # on sys.path and a workspace ``precompile_lsp/`` (or ``precompile/``) would
        # shadow ours. The worker then imports the source roots' modules explicitly.
        env["PYTHONSAFEPATH"] = "1"
        try:
            self.process = await asyncio.create_subprocess_exec(
                self.python,
                "-m",
                "precompile_lsp.worker",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=str(self.root),
                env=env,
                start_new_session=True,
                limit=64 * 1024 * 1024,
            )
        except OSError as error:
            self.failure = f"it could not be run ({error})"
            self.ready.set()
            return
        self.reader = asyncio.create_task(self._read())
        self.stderr_reader = asyncio.create_task(self._read_stderr())

    async def _read_stderr(self) -> None:
        """Keep the last ``STDERR_TAIL`` characters (drained always: a full pipe would
        block the worker)."""
        assert self.process is not None and self.process.stderr is not None
        while chunk := await self.process.stderr.read(65536):
            text = chunk.decode("utf-8", errors="replace")
            self.stderr.append(text)
            self.stderr_size += len(text)
            while self.stderr_size - len(self.stderr[0]) >= STDERR_TAIL:
                self.stderr_size -= len(self.stderr.popleft())

    async def _ended_before_ready(self) -> str:
        """What ended a worker that never said it was ready."""
        assert self.process is not None
        try:
            await asyncio.wait_for(self.process.wait(), 5)
            if self.stderr_reader is not None:
                await asyncio.wait_for(asyncio.shield(self.stderr_reader), 5)
        except TimeoutError:
            pass
        return start_failure(self.process.returncode, "".join(self.stderr)[-STDERR_TAIL:])

    def _dispatch(self, message: protocol.Message) -> None:
        if isinstance(message, protocol.Ready):
            if message.version != protocol.PROTOCOL_VERSION:
                raise ProtocolError(
                    f"the worker speaks protocol {message.version}, this engine "
                    f"{protocol.PROTOCOL_VERSION}: {self.python} has another torch-precompile "
                    f"installed than the one running the engine"
                )
            self.ready.set()
        elif isinstance(message, protocol.Started):
            self.started.add(message.id)
        elif isinstance(message, protocol.Progress):
            callback = self.progress.get(message.id)
            if callback is not None:
                callback(message.progress)
        elif isinstance(message, protocol.Finished):
            future = self.pending.pop(message.id, None)
            if future is not None and not future.done():
                future.set_result(message.result)
        else:
            raise ProtocolError(f"a worker does not send {type(message).__name__}")

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        try:
            while True:
                line = await self.process.stdout.readline()
                if not line:
                    break
                self._dispatch(protocol.decode(line))
        except ProtocolError as error:
            self.failure = f"the worker sent a message this engine cannot read: {error}"
            await self.close()
        if self.failure is None and not self.ready.is_set():
            self.failure = await self._ended_before_ready()
        self.failure = self.failure or "the worker process exited"
        self.ready.set()
        for job_id, future in self.pending.items():
            if future.done():
                continue
            if job_id in self.started:
                message = (
                    self.failure
                    if self.failure != "the worker process exited"
                    else "the worker process died while capturing"
                )
                future.set_result(JobResult(status=Outcome.CRASHED, message=message))
            else:  # it never ran: the pool runs it on a fresh worker
                future.set_result(JobResult(status=Outcome.UNSTARTED, message=self.failure))
        self.pending.clear()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None and self.failure is None

    async def run(self, job_id: str, job: JobRequest, on_stage: OnStage | None = None) -> JobResult:
        await self.ready.wait()
        if not self.alive:
            return JobResult(
                status=Outcome.CRASHED,
                message=f"the worker for {self.python} could not start: {self.failure}",
            )
        future: asyncio.Future[JobResult] = asyncio.get_running_loop().create_future()
        self.pending[job_id] = future
        if on_stage is not None:
            self.progress[job_id] = on_stage
        await self._write(protocol.Run(job_id, job))
        if (self.reader is None or self.reader.done()) and not future.done():
            future.set_result(JobResult(status=Outcome.UNSTARTED))  # died before reading it
        try:
            return await future
        except asyncio.CancelledError:
            # Whoever waited is gone: stop the capture too, so the worker is free for the
            # next job instead of finishing work nobody will read.
            if self.pending.pop(job_id, None) is not None and self.alive:
                await self._write(protocol.Cancel(job_id))
            raise
        finally:
            self.progress.pop(job_id, None)
            self.started.discard(job_id)

    async def cancel(self, job_id: str) -> None:
        if job_id in self.pending and self.alive:
            await self._write(protocol.Cancel(job_id))

    async def _write(self, message: protocol.Message) -> None:
        assert self.process is not None and self.process.stdin is not None
        try:
            self.process.stdin.write((protocol.encode(message) + "\n").encode())
            await self.process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            self.failure = "the worker process exited"

    async def close(self) -> None:
        """Stop the worker and whatever job it runs: SIGTERM first (it kills its job's
        process group, which has a session of its own, and removes the job's folder),
        then SIGKILL for its own group if it has not gone within two seconds."""
        if self.process is not None and self.process.returncode is None:
            try:
                self.process.terminate()
                await asyncio.wait_for(self.process.wait(), 2)
            except (ProcessLookupError, TimeoutError):
                pass
            if self.process.returncode is None:
                try:
                    os.killpg(self.process.pid, 9)
                except (ProcessLookupError, PermissionError):
                    self.process.kill()
                await self.process.wait()
        if self.reader is not None and self.reader is not asyncio.current_task():
            await asyncio.gather(self.reader, return_exceptions=True)
        if self.stderr_reader is not None:
            await asyncio.gather(self.stderr_reader, return_exceptions=True)


class WorkerPool:
    """``size`` warm workers; a dead one is replaced before its next job.

    Starting a worker runs the workspace's interpreter and a job imports the workspace's
    code: both ask the trust ``gate`` first, and an untrusted workspace gets no worker
    and a job that did not run (``CANCELLED``, never cached)."""

    kind = "local"

    def __init__(self, config: Config, gate: TrustGate) -> None:
        self.config = config
        self.gate = gate
        self.idle: asyncio.Queue[WorkerClient] = asyncio.Queue()
        self.workers: list[WorkerClient] = []
        self.running: dict[str, WorkerClient] = {}
        #: How long each finished job ran on its worker (not waiting for one), until the
        #: engine takes it: what the result cache remembers to balance shards by. An
        #: executor that runs jobs elsewhere (a cluster) fills this in the same way.
        self.seconds: dict[str, float] = {}
        self.started = False

    async def _spawn(self) -> WorkerClient:
        worker = WorkerClient(self.config.python, self.config.root)
        await worker.start()
        self.workers.append(worker)
        return worker

    async def start(self) -> None:
        if not self.gate.allows(f"start a worker with the interpreter {self.config.python}"):
            return
        if not self.started:
            self.started = True
            for _ in range(self.config.workers):
                self.idle.put_nowait(await self._spawn())

    async def run(self, job_id: str, job: JobRequest, on_stage: OnStage | None = None) -> JobResult:
        if not self.gate.allows(f"capture {job.module}.{job.function}"):
            return JobResult(
                status=Outcome.CANCELLED, message="not run: the workspace is not trusted"
            )
        await self.start()
        result = JobResult(status=Outcome.CRASHED, message="no worker could start the job")
        for _attempt in range(3):
            worker = await self.idle.get()
            if (worker.ready.is_set() and not worker.alive) or worker.python != self.config.python:
                self.workers.remove(worker)
                await worker.close()
                worker = await self._spawn()
            self.running[job_id] = worker
            started = time.monotonic()
            try:
                result = await worker.run(job_id, job, on_stage)
                self.seconds[job_id] = time.monotonic() - started
            finally:
                self.running.pop(job_id, None)
                self.idle.put_nowait(worker)
            if result.status is not Outcome.UNSTARTED:
                return result
        return JobResult(
            status=Outcome.CRASHED,
            message=f"the worker process died before the job started ({result.message})",
        )

    async def cancel(self, job_id: str) -> None:
        worker = self.running.get(job_id)
        if worker is not None:
            await worker.cancel(job_id)

    async def close(self) -> None:
        for worker in self.workers:
            await worker.close()
        self.workers.clear()
        self.started = False
