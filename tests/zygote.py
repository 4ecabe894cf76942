"""Fresh child interpreters forked from one that has imported torch and nothing else.

Most of the suite's children are ``python -c CODE`` (or ``python -m tests.fixtures.X``)
that import torch first: about 1.5 CPU-seconds each, some 270 of them per run, on a
machine whose two cores the suite keeps busy. A zygote -- one interpreter per test
process, started with the environment a child gets (``harness.fresh_env``) from the
repository root, that imports torch and waits -- forks each such child instead. The
child is a new process (its own pid, session and process group) that has run no test
code: no precompile module, no capture, no compile, no torch op. It runs the code as
``__main__`` in a fresh module and ends as a ``python -c`` would: an uncaught exception
prints its traceback and exits 1, ``SystemExit`` sets the status, non-daemon threads are
joined and ``atexit`` functions run (the interpreter's own shutdown, as the child
returns from the zygote's loop into the end of its script).

What differs from ``python -c`` is fixed at the zygote's start, and a child that could
see it is spawned instead (``harness._spawn`` decides): the hash seed of ``str``
(shared by every forked child: a test comparing two processes' output for determinism
passes ``own_interpreter``), the environment torch read at import (any extra variable,
or an environment changed since the zygote started), ``sys.path`` (extra ``pythonpath``
folders) and the working directory (a folder other than the repository root, where a
module could shadow one the zygote imported). ``PRECOMPILE_TESTS_SPAWN=1`` spawns every
child.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

#: The zygote: imports torch, then serves one request per connection on a Unix socket:
#: fork a child for it, send its pid, and its wait status when it ends. Single-threaded
#: (a fork copies only the calling thread): children are reaped in the select loop.
_SERVER = r"""
import json, os, select, socket, sys, types
import torch
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(sys.argv[1])
sock.listen(64)
print("ready", flush=True)
waiting = {}
while True:
    readable, _, _ = select.select([sock, sys.stdin], [], [], 0.05)
    while waiting:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        conn = waiting.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass
            conn.close()
    if sys.stdin in readable and not sys.stdin.readline():
        os._exit(0)  # the test process is gone
    if sock not in readable:
        continue
    conn, _ = sock.accept()
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    request = json.loads(data)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        break
    conn.sendall(f"{pid}\n".encode())
    waiting[pid] = conn
# The child.
sock.close()
conn.close()
os.setsid()
for fd, path, mode in ((0, os.devnull, os.O_RDONLY), (1, request["out"], os.O_WRONLY), (2, request["err"], os.O_WRONLY)):
    opened = os.open(path, mode)
    os.dup2(opened, fd)
    os.close(opened)
os.environ.clear()
os.environ.update(request["env"])
main = types.ModuleType("__main__")
sys.modules["__main__"] = main
if request["module"]:
    import runpy
    sys.argv = ["-m", *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
else:
    sys.argv = ["-c", *request["args"]]
    exec(compile(request["code"], "<string>", "exec"), main.__dict__)
"""


class Zygote:
    """One test process's zygote, started on first use; ``run`` forks a child."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env = env
        self.cwd = cwd
        self.folder = Path(tempfile.mkdtemp(prefix="zygote-"))
        self.address = str(self.folder / "socket")
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SERVER, self.address],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError("the test zygote did not start")
        self.count = 0
        self.lock = threading.Lock()
        atexit.register(self.close)

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.alive():
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def run(
        self,
        *,
        code: str | None,
        module: str | None,
        args: list[str],
        argv: list[str],
        env: dict[str, str],
        timeout: float,
    ) -> subprocess.CompletedProcess[str]:
        """The child's completed process, as ``subprocess.run(..., capture_output=True,
        text=True, timeout=timeout)`` returns it (``TimeoutExpired`` after killing its
        process group)."""
        with self.lock:
            self.count += 1
            stem = self.folder / f"child-{self.count}"
        out, err = Path(f"{stem}.out"), Path(f"{stem}.err")
        out.touch()
        err.touch()
        request: dict[str, Any] = {
            "code": code,
            "module": module,
            "args": args,
            "env": env,
            "out": str(out),
            "err": str(err),
        }
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(self.address)
            conn.sendall(json.dumps(request).encode() + b"\n")
            reader = conn.makefile("r")
            pid = int(reader.readline())
            conn.settimeout(timeout)
            try:
                status = reader.readline()
            except TimeoutError:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                raise subprocess.TimeoutExpired(
                    [sys.executable, *argv], timeout, out.read_text(), err.read_text()
                ) from None
        completed = subprocess.CompletedProcess(
            [sys.executable, *argv], int(status), out.read_text(), err.read_text()
        )
        out.unlink()
        err.unlink()
        return completed


_ZYGOTE: list[Zygote] = []


def zygote(env: dict[str, str], cwd: Path, base: dict[str, str]) -> Zygote | None:
    """This process's zygote, for a child of ``env`` run in ``cwd``: started on first use
    (again if it died) with ``base``, the environment a child gets where no test changed
    it, or None where the child must be spawned: spawning forced, or an environment
    other than ``base`` (``_read_at_import``)."""
    if os.environ.get("PRECOMPILE_TESTS_SPAWN") == "1":
        return None
    if _read_at_import(env) != _read_at_import(base):
        return None
    if _ZYGOTE and not _ZYGOTE[0].alive():
        _ZYGOTE.clear()
    if not _ZYGOTE:
        _ZYGOTE.append(Zygote(base, cwd))
    return _ZYGOTE[0] if _ZYGOTE[0].cwd == cwd else None


#: Variables no interpreter start and no ``import torch`` reads, which tests set in
#: this process: pytest's (``PYTEST_CURRENT_TEST`` changes per test), precompile's,
#: Hugging Face's and Inductor's (read by the child's own import of precompile,
#: transformers or torch._inductor, none of which ``import torch`` imports: Inductor sets
#: its cache folder, and the address its kernels read, in this process as it runs).
_NOT_READ_AT_IMPORT = (
    "PYTEST_",
    "PRECOMPILE_",
    "_TORCHINDUCTOR_",
    "TORCHINDUCTOR_",
    "HF_",
    "TRANSFORMERS_",
)


def _read_at_import(env: dict[str, str]) -> dict[str, str]:
    """``env`` without ``_NOT_READ_AT_IMPORT``: what a fork and a spawn could see
    differently. The child gets the whole current environment either way."""
    return {k: v for k, v in env.items() if not k.startswith(_NOT_READ_AT_IMPORT)}
