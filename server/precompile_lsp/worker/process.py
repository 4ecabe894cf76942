"""The warm worker process: ``python -m precompile_lsp.worker``, run with the workspace's
Python.

It imports torch and precompile -- and does nothing else before forking: no op, no
compile, no capture, because forking a process whose thread pools or compiler workers
have started can deadlock the child. Each job runs in a fresh forked child (clean Dynamo
state, crash isolation, no import cost) in its own process group. Where ``fork`` is
unavailable (or ``PRECOMPILE_WORKER_SPAWN=1``), each job runs in a fresh interpreter
instead.

However a job ends -- result, error, crash, timeout, cancel, the worker stopped -- its
process group is killed (``_end_job``): what ``examples()`` or the target started
(DataLoader workers, multiprocessing pools, a forked helper) does not outlive it. On
Linux the worker is also a child subreaper, so a job's process that left the group
(``setsid()``) re-parents to the worker instead of init, and is killed and reaped too.

It speaks ``precompile_lsp.protocol``: ``Run``/``Cancel`` in on stdin; ``Ready`` once, then
per job ``Started``, a ``Progress`` per stage and ``Finished`` out. The protocol uses a
duplicate of the original stdout; fd 1 itself is pointed at stderr, and in a child at a
capture file, so nothing user code or a C extension prints can corrupt the channel.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import IO, Any

from precompile_lsp import protocol
from precompile_lsp.protocol import (
    CaptureError,
    JobRequest,
    JobResult,
    Outcome,
    ProtocolError,
    Stage,
)
from precompile_lsp.stdio import protect_stdout

OUTPUT_LIMIT = 20_000
#: How long a spawned job's fresh interpreter may take to import torch and precompile
#: before its capture's own timeout starts (a cold disk cache takes tens of seconds).
STARTUP_LIMIT_S = 300.0

#: Imported once by the warm worker so that no child pays for them (measured: a check
#: job in a child drops from ~3.6 s to ~0.5 s). Importing runs no op, compile or
#: capture, and starts no thread pool or compiler worker, so forking stays safe.
WARM_IMPORTS = (
    "precompile",
    "precompile.capture_api",
    "precompile.capturing.dynamo_session",
    "precompile_lsp.worker.jobs",
    "torch._dynamo",
    "torch._dynamo.convert_frame",
    "torch._dynamo.package",
    "torch._dynamo.precompile_context",
    "torch._dynamo.variables",
    "torch._functorch.aot_autograd",
)
#: What only an emit job may need on top: Inductor's compiler (a check captures with the
#: eager backend and a verify loads without compiling, neither imports it). The worker
#: imports it before forking its first emit job, so later ones share it, and a worker
#: that only checks (``precompile check`` without ``--emit``, an editor's session until
#: its first emit) never pays for it.
EMIT_IMPORTS = ("torch._inductor.compile_fx",)


def _send(channel: IO[str], message: protocol.Message) -> None:
    channel.write(protocol.encode(message) + "\n")
    channel.flush()


def _read_output(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return (
        text
        if len(text) <= OUTPUT_LIMIT
        else text[:OUTPUT_LIMIT] + f"\n... ({len(text) - OUTPUT_LIMIT} more characters)"
    )


def _redirect_output(output_path: str) -> None:
    """fd 1 and 2 (and sys.stdout/err) into the job's output file."""
    fd = os.open(output_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)


def _write_result(result: JobResult, result_path: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(protocol.to_json_value(result), f)


#: The protocol channel's file descriptor (a forked child must not keep it open: the
#: engine would never see the worker's stdout close).
_CHANNEL_FD: int | None = None


def _child(job: JobRequest, result_path: str, output_path: str, stages: int) -> None:
    """In the forked child: own process group, captured output, run, write, exit."""
    os.setsid()
    if _CHANNEL_FD is not None:
        os.close(_CHANNEL_FD)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the engine's requests are the worker's to read, not the job's
    os.close(devnull)
    from precompile_lsp.worker import jobs

    jobs.STAGE_FD = stages
    _redirect_output(output_path)
    _write_result(_run_job_reporting_failure(job), result_path)
    os._exit(0)


def _run_job_reporting_failure(job: JobRequest) -> JobResult:
    """The job's result; whatever the job raised becomes an error result (a finding of
    the target), never a crash of the process running it."""
    try:
        from precompile_lsp.worker.jobs import run_job

        return run_job(job)
    except BaseException as error:
        import traceback

        return JobResult(
            status=Outcome.ERROR,
            kind=job.kind,
            error=CaptureError(message=f"{type(error).__name__}: {error}", type="InternalError"),
            traceback=traceback.format_exc(),
        )


def _describe_exit(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"the capture process crashed ({name})"
    return f"the capture process exited with status {os.WEXITSTATUS(status)} before reporting"


def _stages(fd: int) -> list[Stage]:
    """The stages a child reported so far (non-blocking)."""
    data = b""
    while select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    stages = []
    for line in data.splitlines():
        try:
            stages.append(protocol.from_json_value(json.loads(line), Stage))
        except (ValueError, ProtocolError):
            continue
    return stages


def _read_result(result_path: str, output_path: str) -> JobResult | None:
    try:
        with open(result_path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None
    result: JobResult = protocol.from_json_value(raw, JobResult)
    return _with_output(result, output_path)


def _with_output(result: JobResult, output_path: str) -> JobResult:
    import attrs

    return attrs.evolve(result, output=_read_output(output_path) or None)


def _ended(status: Outcome, message: str, output_path: str) -> JobResult:
    return JobResult(status=status, message=message, output=_read_output(output_path) or None)


Cancelled = Callable[[], bool]
OnStage = Callable[[Stage], None]

#: The job running now: its process group and its folder, for the SIGTERM handler.
_running: dict[str, Any] = {}


def _stop_on_sigterm() -> None:
    """When the engine stops this worker, take the running job with it: the job's child
    has a session of its own (so a timeout can kill everything it started), which a
    signal to this worker's group does not reach."""

    def handler(signum: int, frame: Any) -> None:
        pid, directory = _running.get("pid"), _running.get("directory")
        if pid is not None:
            _end_job(pid)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, handler)


def run_forked(
    job: JobRequest,
    on_cancel: Cancelled | None = None,
    on_stage: OnStage | None = None,
) -> JobResult:
    """Run one job in a forked child; enforce the timeout; honour cancel messages; pass
    on the stages it reports.

    The job's folder -- its result, its output and the ``scratch`` folder the job keeps
    its temporary files in -- belongs to this process, which removes it once the child has
    ended: a child killed on a timeout or a cancel cleans nothing up itself."""
    import attrs

    directory = tempfile.mkdtemp(prefix="precompile-job-")
    result_path, output_path, scratch = (
        os.path.join(directory, "result.json"),
        os.path.join(directory, "output.txt"),
        os.path.join(directory, "scratch"),
    )
    os.mkdir(scratch)
    stage_read, stage_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(stage_read)
        _child(attrs.evolve(job, scratch=scratch), result_path, output_path, stage_write)
    os.close(stage_write)
    _running.update(pid=pid, directory=directory)
    started = time.monotonic()
    reaped: int | None = None  # the leader's wait status, once reaped

    def end() -> int:
        """The job's group ended while its leader is unreaped, then the leader reaped."""
        nonlocal reaped
        _end_job(pid)
        reaped = os.waitpid(pid, 0)[1]
        return reaped

    try:
        while True:
            if _exited(pid):
                status = end()
                break
            if time.monotonic() - started > job.timeout:
                end()
                return _ended(
                    Outcome.TIMEOUT,
                    f"capture timed out after {job.timeout:g} s (the job's whole process "
                    f"group was killed)",
                    output_path,
                )
            for stage in _stages(stage_read):  # drained always: a full pipe would block
                if on_stage is not None:
                    on_stage(stage)
            if on_cancel is not None:
                if on_cancel():  # waits up to 20 ms for a message
                    end()
                    return JobResult(status=Outcome.CANCELLED)
            else:
                time.sleep(0.02)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            result = _read_result(result_path, output_path)
            if result is not None:
                return result
        return _ended(Outcome.CRASHED, _describe_exit(status), output_path)
    finally:
        _running.clear()
        if reaped is None:  # an exception above: nothing of the job survives it either
            end()
        os.close(stage_read)
        shutil.rmtree(directory, ignore_errors=True)


def run_spawned(job: JobRequest, on_cancel: Cancelled | None = None) -> JobResult:
    """Where fork is unavailable: the job in a fresh interpreter (``--job``), with the
    same timeout, cancel and clean-up as a forked child (stages are not reported).

    A forked child starts with torch imported, so its timeout measures the capture. The
    fresh interpreter's clock starts likewise once it has imported what jobs need (it
    creates ``ready`` then): a loaded machine's slow ``import torch`` is not the user's
    capture timing out. Starting up has a limit of its own, ``STARTUP_LIMIT_S``."""
    import attrs

    directory = tempfile.mkdtemp(prefix="precompile-job-")
    job_path, result_path, output_path, scratch, ready_path = (
        os.path.join(directory, name)
        for name in ("job.json", "result.json", "output.txt", "scratch", "ready")
    )
    os.mkdir(scratch)
    with open(job_path, "w", encoding="utf-8") as f:
        json.dump(protocol.to_json_value(attrs.evolve(job, scratch=scratch)), f)
    started = time.monotonic()
    with open(output_path, "wb") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "precompile_lsp.worker",
                "--job",
                job_path,
                result_path,
                ready_path,
            ],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=True,
        )
    _running.update(pid=process.pid, directory=directory)
    try:
        capturing = False
        while not _exited(process.pid):
            if not capturing and os.path.exists(ready_path):
                capturing, started = True, time.monotonic()
            elapsed = time.monotonic() - started
            if not capturing and elapsed > STARTUP_LIMIT_S:
                _end_job(process.pid)
                process.wait()
                return _ended(
                    Outcome.TIMEOUT,
                    f"the capture process did not finish starting (importing torch and "
                    f"precompile) within {STARTUP_LIMIT_S:g} s (its whole process group "
                    f"was killed); the machine may be overloaded",
                    output_path,
                )
            if capturing and elapsed > job.timeout:
                _end_job(process.pid)
                process.wait()
                return _ended(
                    Outcome.TIMEOUT,
                    f"capture timed out after {job.timeout:g} s (the job's whole process "
                    f"group was killed)",
                    output_path,
                )
            if on_cancel is not None and on_cancel():
                _end_job(process.pid)
                process.wait()
                return JobResult(status=Outcome.CANCELLED)
            if on_cancel is None:
                time.sleep(0.02)
        _end_job(process.pid)
        process.wait()
        if process.returncode == 0:
            result = _read_result(result_path, output_path)
            if result is not None:
                return result
        status = process.returncode
        message = (
            f"the capture process crashed ({signal.Signals(-status).name})"
            if status < 0
            else f"the capture process exited with status {status} before reporting"
        )
        return _ended(Outcome.CRASHED, message, output_path)
    finally:
        _running.clear()
        if process.returncode is None:
            _end_job(process.pid)
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _exited(pid: int) -> bool:
    """Whether the job's leader has ended, without reaping it: while it is a zombie its
    pid -- the job's process group id -- cannot be reused, so ``_end_job`` kills the
    job's group and nothing else."""
    try:
        found = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return found is not None and found.si_pid == pid


def _end_job(pgid: int) -> None:
    """End everything a job started: its process group (the leader ``pgid`` made it with
    ``setsid``, so it is the leader's pid), then what escaped the group and re-parented
    to this worker as its subreaper. Called however the job ended."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _end_orphans(exclude=pgid)


def _children() -> set[int]:
    """This process's children (Linux: /proc), zombies included."""
    found: set[int] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children", encoding="ascii") as f:
                found.update(int(p) for p in f.read().split())
    except OSError:
        pass
    return found


def _end_orphans(exclude: int | None = None) -> None:
    """Kill and reap the processes a job left that re-parented to this worker (its child
    subreaper): a worker has no children of its own between jobs. ``exclude`` is the
    job's leader, which its caller reaps for its exit status. Each round reaps what died;
    a killed orphan's own children re-parent here and go in the next round."""
    if not _SUBREAPER:
        return
    deadline = time.monotonic() + 5
    while True:
        orphans = _children() - {exclude}
        for pid in orphans:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in orphans:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        if not orphans or time.monotonic() > deadline:
            return


#: Whether this process is a child subreaper (set by ``serve`` on Linux).
_SUBREAPER = False
_PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    """Linux: orphaned descendants re-parent to this worker rather than init, so a job's
    process that escaped its group with ``setsid()`` is still found and ended."""
    global _SUBREAPER
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        _SUBREAPER = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        _SUBREAPER = False


class _Lines:
    """Messages from a file descriptor, readable with select (a TextIO buffer would hide
    lines select cannot see)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.closed = False

    def _fill(self, timeout: float | None) -> None:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            data = os.read(self.fd, 65536)
            if data:
                self.buffer += data
            else:
                self.closed = True

    def next(self, timeout: float | None = None) -> protocol.Message | None:
        """The next message, or None (nothing yet within ``timeout``, or closed). A line
        that is not a valid message is reported on stderr and skipped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while b"\n" not in self.buffer and not self.closed:
                remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
                self._fill(remaining)
                if deadline is not None and time.monotonic() >= deadline:
                    break
            if b"\n" not in self.buffer:
                return None
            line, self.buffer = self.buffer.split(b"\n", 1)
            if not line.strip():
                continue
            try:
                return protocol.decode(line)
            except ProtocolError as error:
                print(f"precompile worker: ignoring a bad message: {error}", file=sys.stderr)


def warm_imports() -> None:
    """What every job needs before its capture starts: torch, ``WARM_IMPORTS`` and what
    jobs work out about them. The warm worker pays it once before forking; a spawned
    job's interpreter pays it before its capture's clock starts."""
    _import(("torch", *WARM_IMPORTS))


_EMIT_READY = False


def warm_for(job: JobRequest) -> None:
    """What ``job`` needs on top of ``warm_imports``: ``EMIT_IMPORTS`` for an emit job, tried
    once. A failed import leaves the worker serving: the job imports the module again
    and reports what failed (``_run_job_reporting_failure``)."""
    global _EMIT_READY
    if job.kind is protocol.JobKind.EMIT and not _EMIT_READY:
        _EMIT_READY = True
        with contextlib.suppress(Exception):
            _import(EMIT_IMPORTS)


def _import(names: tuple[str, ...]) -> None:
    """Import ``names`` with CPython's collector paused, then collect once, and work out
    again what jobs need to know about the modules imported. Importing torch's compilers
    crosses the collector's thresholds over and over, and each full collection
    traverses the whole heap again (a quarter of the warm-up's time: 3.3 against 2.5 s
    of CPU); collecting once after leaves no import's garbage for every forked child to
    traverse. A collector the user's environment disabled stays disabled (the capture's
    own pause, ``collector.paused``). What each module imported so far was compiled from
    is noted (``sources.note_preloaded``): no job imports those again."""
    import gc
    import importlib

    from precompile.capturing import collector

    with collector.paused():
        for name in names:
            importlib.import_module(name)
    gc.collect()
    from precompile_lsp.worker import sources
    from precompile_lsp.worker.jobs import warm_up

    sources.note_preloaded()
    warm_up()


def serve(channel: IO[str]) -> None:
    """The warm loop: read jobs, run each in a child, answer with results."""
    warm_imports()
    _become_subreaper()
    _stop_on_sigterm()
    global _CHANNEL_FD
    _CHANNEL_FD = channel.fileno()
    fork = hasattr(os, "fork") and os.environ.get("PRECOMPILE_WORKER_SPAWN") != "1"
    _send(channel, protocol.Ready(protocol.PROTOCOL_VERSION, os.getpid(), fork))
    lines = _Lines(0)
    pending: list[protocol.Message] = []
    while True:
        message = pending.pop(0) if pending else lines.next()
        if message is None:
            if lines.closed:
                return
            continue
        if not isinstance(message, protocol.Run):
            continue
        job_id = message.id

        def on_cancel(job_id: str = job_id) -> bool:
            other = lines.next(timeout=0.02)
            if other is None:
                return lines.closed
            if isinstance(other, protocol.Cancel) and other.id == job_id:
                return True
            if isinstance(other, protocol.Run):
                pending.append(other)
            return False

        def on_stage(stage: Stage, job_id: str = job_id) -> None:
            _send(channel, protocol.Progress(job_id, stage))

        _send(channel, protocol.Started(job_id))
        warm_for(message.job)
        if fork:
            result = run_forked(message.job, on_cancel, on_stage)
        else:
            result = run_spawned(message.job, on_cancel)
        _send(channel, protocol.Finished(job_id, result))


def run_once(job_file: str, result_file: str, ready_file: str) -> None:
    """One job in this fresh process (``run_spawned``'s child): ``ready_file`` is created
    once what jobs need is imported, which starts the capture's clock."""
    with open(job_file, encoding="utf-8") as f:
        job = protocol.from_json_value(json.load(f), JobRequest)
    try:
        warm_imports()
    except Exception:
        pass  # the job itself reports what failed to import (_run_job_reporting_failure)
    warm_for(job)
    with open(ready_file, "w", encoding="utf-8"):
        pass
    _write_result(_run_job_reporting_failure(job), result_file)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--job":
        run_once(sys.argv[2], sys.argv[3], sys.argv[4])
        return
    channel = protect_stdout(binary=False)
    assert isinstance(channel, io.TextIOBase)
    serve(channel)
