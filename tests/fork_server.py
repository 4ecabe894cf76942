"""The test harness's fork server: an interpreter that has imported torch and nothing
else of this repository, and forks one child per fresh process a test asks for.

Why: a test's child interpreter spent about a second of CPU importing torch before it
did anything of its own, and the suite starts hundreds of them on two cores. A child
forked from here starts where a fresh interpreter stands after ``import torch`` (the
first thing every artifact's serving process does): no module of the product or of the
tests imported, no tensor op run (so no thread pool started), torch's default
generator and Python's ``random`` seeded afresh. ``tests/harness.py`` decides which children
may start here (the same environment as this server's, no module that must not import
torch) and starts the others as real interpreters.

Run as ``python tests/fork_server.py SOCKET``: it listens on the Unix socket ``SOCKET``.
A request is an 8-byte big-endian length, sent with two file descriptors (the child's
stdout and stderr), then that many bytes of JSON: ``{"argv": [...], "cwd": "...", "env": {...}}``,
where argv is what follows the interpreter on a command line (``-c CODE ARGS``, ``-m
MODULE ARGS`` or ``SCRIPT ARGS``), and env the child's environment. The server answers one JSON line ``{"pid": N}`` when
the child started and one ``{"status": CODE}`` when it ended (``subprocess``'s
returncode: negative for a signal). It exits when its parent does.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
from typing import Any


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError("the harness closed the request early")
        data += chunk
    return data


def _request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    header, fds, _, _ = socket.recv_fds(conn, 8, 2)
    header += _recv_exact(conn, 8 - len(header))
    return json.loads(_recv_exact(conn, int.from_bytes(header, "big"))), fds


def _answer(conn: socket.socket, message: dict[str, Any]) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the harness gave up on this child (its timeout)


def serve(path: str) -> tuple[dict[str, Any], list[int]]:
    """Accept requests until the parent exits; in a forked child, return its request."""
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)  # the harness connects once the path exists
    running: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        readable, _, _ = select.select([listener], [], [], 0.05)
        if readable:
            conn, _ = listener.accept()
            try:
                request, fds = _request(conn)
            except (OSError, EOFError, ValueError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in running.values():
                    other.close()
                conn.close()
                return request, fds
            for fd in fds:
                os.close(fd)
            _answer(conn, {"pid": pid})
            running[pid] = conn
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = running.pop(pid)
            _answer(conn, {"status": os.waitstatus_to_exitcode(status)})
            conn.close()
    raise SystemExit(0)


def _main_module(**attributes: Any) -> Any:
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__dict__.update(__annotations__={}, __builtins__=builtins, **attributes)
    sys.modules["__main__"] = main
    return main


def _prepare(request: dict[str, Any], fds: list[int]) -> tuple[Any, dict[str, Any], str]:
    """Become the child a command line would start: its streams, folder, ``sys.argv``,
    ``sys.path[0]`` and ``__main__``; the code to run, its namespace and its filename."""
    import importlib.machinery
    import importlib.util
    import random

    stdin = os.open(os.devnull, os.O_RDONLY)
    for target, fd in ((0, stdin), (1, fds[0]), (2, fds[1])):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()  # the harness sends only what no import read (PYTEST_CURRENT_TEST)
    os.environ.update(request["env"])
    # A fresh interpreter seeds both from the OS; a fork copies this server's state.
    random.seed()
    sys.modules["torch"].default_generator.seed()
    argv = request["argv"]
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        main = _main_module(__loader__=importlib.machinery.BuiltinImporter, __spec__=None)
        return argv[1], main.__dict__, "<string>"
    if argv[0] == "-m":
        sys.path[0] = os.getcwd()
        spec = importlib.util.find_spec(argv[1])
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(argv[1] + ".__main__")
        if spec is None or spec.loader is None or spec.origin is None:
            sys.stderr.write(f"{sys.executable}: No module named {argv[1]}\n")
            raise SystemExit(1)
        sys.argv = [spec.origin, *argv[2:]]
        main = _main_module(
            __file__=spec.origin,
            __cached__=spec.cached,
            __loader__=spec.loader,
            __package__=spec.parent,
            __spec__=spec,
        )
        code = spec.loader.get_code(spec.name)  # type: ignore[attr-defined]
        return code, main.__dict__, spec.origin
    script = os.path.abspath(argv[0])
    sys.argv = [argv[0], *argv[1:]]
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    main = _main_module(
        __file__=argv[0],
        __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", script),
        __spec__=None,
    )
    with open(script, "rb") as file:
        return file.read(), main.__dict__, argv[0]


def run(request: dict[str, Any], fds: list[int]) -> None:
    """Run the child's code as the interpreter would run it, and exit as it would."""
    here = run.__code__.co_filename  # this module's globals are no longer __main__'s
    code, namespace, filename = _prepare(request, fds)
    try:
        exec(compile(code, filename, "exec") if not hasattr(code, "co_code") else code, namespace)
    except SystemExit:
        raise
    except BaseException:
        kind, value, trace = sys.exc_info()
        while trace is not None and trace.tb_frame.f_code.co_filename == here:
            trace = trace.tb_next  # the traceback starts at the child's own code
        assert kind is not None and value is not None
        sys.excepthook(kind, value.with_traceback(trace), trace)
        raise SystemExit(1) from None


if __name__ == "__main__":
    import torch  # noqa: F401  (the point: paid once, shared by every child)

    run(*serve(sys.argv[1]))
