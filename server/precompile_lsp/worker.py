"""The warm worker: ``python -m precompile_lsp.worker``, run with the workspace's Python.

It imports torch and precompile -- and does nothing else before forking: no op, no
compile, no capture, because forking a process whose thread pools or compiler workers
have started can deadlock the child. Each job runs in a fresh forked child (clean Dynamo
state, crash isolation, no import cost) in its own process group, so a timeout or a
cancel kills the child and everything it started. Where ``fork`` is unavailable, each job
runs in a fresh process instead (``--job FILE``).

Protocol: one JSON object per line. The engine writes ``{"op": "run", "id", "job"}`` or
``{"op": "cancel", "id"}`` to stdin; the worker answers ``{"ready": ...}`` once, then per
job ``{"id", "started": true}`` when its child is forked (a worker that dies before that
never ran the job, which the engine then runs on a fresh worker), ``{"id", "progress"}``
for each stage the job reports, and ``{"id", "result"}``. The protocol uses a duplicate of the original stdout;
fd 1 itself is pointed at stderr, and in a child at a capture file, so nothing user code
or a C extension prints can corrupt the channel.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import sys
import tempfile
import time
from typing import Any, TextIO

OUTPUT_LIMIT = 20_000

#: Imported once by the warm worker so that no child pays for them (measured: a check
#: job in a child drops from ~3.6 s to ~0.5 s). Importing runs no op, compile or
#: capture, and starts no thread pool or compiler worker, so forking stays safe.
WARM_IMPORTS = (
    "precompile",
    "precompile.capturing",
    "precompile.dynamo_capture",
    "precompile_lsp.jobs",
    "torch._dynamo",
    "torch._dynamo.convert_frame",
    "torch._dynamo.package",
    "torch._dynamo.precompile_context",
    "torch._dynamo.variables",
    "torch._functorch.aot_autograd",
    "torch._inductor.compile_fx",
)


def _protect_stdout() -> TextIO:
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channel


def _send(channel: TextIO, message: dict[str, Any]) -> None:
    channel.write(json.dumps(message) + "\n")
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


def _child(job: dict[str, Any], result_path: str, output_path: str, stages: int) -> None:
    """In the forked child: own process group, captured output, run, write, exit."""
    os.setsid()
    from precompile_lsp import jobs

    jobs.STAGE_FD = stages
    fd = os.open(output_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    result = _run_job_reporting_failure(job)
    sys.stdout.flush()
    sys.stderr.flush()
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(result, f, default=str)
    os._exit(0)


def _run_job_reporting_failure(job: dict[str, Any]) -> dict[str, Any]:
    """The job's result; whatever the job raised becomes an error result (a finding of
    the target), never a crash of the process running it."""
    try:
        from precompile_lsp.jobs import run_job

        return run_job(job)
    except BaseException as error:
        import traceback

        return {
            "status": "error",
            "error": {
                "message": f"{type(error).__name__}: {error}",
                "location": None,
                "hint": None,
            },
            "traceback": traceback.format_exc(),
        }


def _describe_exit(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"the capture process crashed ({name})"
    return f"the capture process exited with status {os.WEXITSTATUS(status)} before reporting"


def _stages(fd: int) -> list[dict[str, Any]]:
    """The stage messages a child wrote so far (non-blocking)."""
    data = b""
    while select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    messages = []
    for line in data.splitlines():
        try:
            messages.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return messages


def run_forked(
    job: dict[str, Any],
    timeout: float,
    on_cancel: Any = None,
    on_stage: Any = None,
) -> dict[str, Any]:
    """Run one job in a forked child; enforce the timeout; honour cancel messages; pass
    on the stages it reports.

    The job's folder -- its result, its output and the ``scratch`` folder the job keeps
    its temporary files in -- belongs to this process, which removes it once the child has
    ended: a child killed on a timeout or a cancel cleans nothing up itself."""
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
        _child({**job, "scratch": scratch}, result_path, output_path, stage_write)
    os.close(stage_write)
    started = time.monotonic()
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() - started > timeout:
                _kill_group(pid)
                os.waitpid(pid, 0)
                return {
                    "status": "timeout",
                    "message": f"capture timed out after {timeout:g} s (the job's whole process group was killed)",
                    "output": _read_output(output_path),
                }
            for stage in _stages(stage_read):  # drained always: a full pipe would block
                if on_stage is not None:
                    on_stage(stage)
            if on_cancel is not None:
                if on_cancel():  # waits up to 20 ms for a message
                    _kill_group(pid)
                    os.waitpid(pid, 0)
                    return {"status": "cancelled"}
            else:
                time.sleep(0.02)
        if os.path.exists(result_path) and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            with open(result_path, encoding="utf-8") as f:
                result = json.load(f)
            result["output"] = _read_output(output_path)
            return result
        return {
            "status": "crashed",
            "message": _describe_exit(status),
            "output": _read_output(output_path),
        }
    finally:
        os.close(stage_read)
        shutil.rmtree(directory, ignore_errors=True)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class _Lines:
    """Lines from a file descriptor, readable with select (a TextIO buffer would hide
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

    def next(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next message, or None (nothing yet within ``timeout``, or closed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer and not self.closed:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
            self._fill(remaining)
            if deadline is not None and time.monotonic() >= deadline:
                break
        if b"\n" not in self.buffer:
            return None
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line) if line.strip() else self.next(timeout)


def serve(channel: TextIO) -> None:
    """The warm loop: read jobs, fork one child each, answer with results."""
    import importlib

    import torch  # noqa: F401  (the point: paid once, shared by every child)

    for name in WARM_IMPORTS:
        importlib.import_module(name)
    _send(channel, {"ready": True, "pid": os.getpid(), "fork": True})
    lines = _Lines(0)
    pending: list[dict[str, Any]] = []
    while True:
        message = pending.pop(0) if pending else lines.next()
        if message is None:
            if lines.closed:
                return
            continue
        if message.get("op") != "run":
            continue
        job_id = message["id"]

        def on_cancel(job_id: str = job_id) -> bool:
            other = lines.next(timeout=0.02)
            if other is None:
                return lines.closed
            if other.get("op") == "cancel" and other.get("id") == job_id:
                return True
            if other.get("op") == "run":
                pending.append(other)
            return False

        _send(channel, {"id": job_id, "started": True})

        def on_stage(stage: dict[str, Any], job_id: str = job_id) -> None:
            _send(channel, {"id": job_id, "progress": stage})

        timeout = float(message["job"].get("timeout", 120))
        result = run_forked(message["job"], timeout, on_cancel, on_stage)
        _send(channel, {"id": job_id, "result": result})


def run_once(job_file: str, result_file: str) -> None:
    """The fallback where fork is unavailable: one job in this fresh process."""
    with open(job_file, encoding="utf-8") as f:
        job = json.load(f)
    result = _run_job_reporting_failure(job)
    with open(result_file, "w", encoding="utf-8") as f:
        json.dump(result, f, default=str)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--job":
        run_once(sys.argv[2], sys.argv[3])
        return
    channel = _protect_stdout()
    if not hasattr(os, "fork"):
        _send(channel, {"ready": True, "pid": os.getpid(), "fork": False})
        return
    serve(channel)


if __name__ == "__main__":
    main()
