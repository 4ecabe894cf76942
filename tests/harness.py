"""The one fresh-process harness: every test that loads an artifact where the capture did
not happen, or runs the CLI as a user does, starts its child interpreter through here.

A child is code (``run_python``, ``run_json``), a script file run as ``__main__``
(``run_script``), a module (``run_module``; ``precompile_cli`` for the CLI) or a fixture
module run on a JSON job, ``python -m tests.fixtures.<name> job.json`` (``run_job``). It
runs from the repository root with the worktree first on ``PYTHONPATH`` (``fresh_env``;
``pythonpath`` puts more folders before it). Its result has one format: the last line it
prints is one JSON value (``last_json`` parses it, after asserting the child exited 0 and
showing its stderr if not). A child that reports per cell prints an object keyed by cell,
each cell an object with ``"result"`` (``"exact"``, ``"wrong"``, ``"refused"`` or
``"error"``) and ``"message"`` (the refusal's words). Where tensors must come back
(``run_saving_job``, ``serve_fresh``) the child also writes them with ``torch.save`` to the
``output`` path its job names: a payload next to the result, not a second format.
``watched_load`` is a load under a spy on process creation and compilation.

A child is forked from this process's fork server (``tests/fork_server.py``: an
interpreter that imported torch and nothing of this repository, and reseeds the
generators a fork would copy) where that is the interpreter it would be: the same
environment as the server's (but variables ``import torch`` does not read:
``_NOT_READ_AT_IMPORT``; the child runs in its own), not a module that
must never import torch (``precompile_lsp``: the CLI and the language server), and not
``cold``. A child that asserts what its own imports loaded (``import precompile`` stays
light) passes ``cold=True`` and gets a fresh interpreter, as does every child given an
environment of its own. tests/test_harness.py holds the fork to the fresh interpreter;
``PRECOMPILE_TEST_FRESH_INTERPRETERS=1`` makes every child a fresh interpreter. The raw
runners (``run_python``, ``run_script``, ``run_module``) hand back the process, for tests
that assert on a child that fails (its exit status, its stderr). In an attack child,
``served_or_refused`` is the one outcome of a served call after a change: refused (the
message), served (whether equal to eager) or failed otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parent.parent

T = TypeVar("T")


def together(*calls: Callable[[], T]) -> list[T]:
    """Run independent calls that each wait on a fresh process at the same time: where a
    core is free they overlap, and the results (or the first error) come back in order."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]


#: The environment this process started with: what its fork server runs under.
_START_ENVIRON = dict(os.environ)


def fresh_env(
    *, pythonpath: Sequence[Path] = (), _base: dict[str, str] | None = None, **extra: str
) -> dict[str, str]:
    """This process's environment with ``pythonpath`` and then the repository first on
    ``PYTHONPATH`` (so a child imports the worktree's ``tests`` and sources), plus
    ``extra``."""
    env = dict(os.environ if _base is None else _base)
    env["PYTHONPATH"] = os.pathsep.join(
        [*map(str, pythonpath), str(REPO), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    env.update(extra)
    return env


def _spawn(
    argv: list[str],
    *,
    cwd: Path | None,
    timeout: float,
    pythonpath: Sequence[Path],
    env: dict[str, str],
    cold: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Start the child: forked from this worker's fork server (``tests/fork_server.py``)
    where it would start exactly as that server did -- the same environment, and not a
    module that must never import torch (the CLI, the language server) nor a ``cold``
    child (one that asserts what its own imports loaded) -- else a fresh interpreter."""
    child_env = fresh_env(pythonpath=pythonpath, **env)
    server = None
    cold = cold or os.environ.get("PRECOMPILE_TEST_FRESH_INTERPRETERS") == "1"
    if not cold and not (argv[0] == "-m" and argv[1].startswith("precompile_lsp")):
        server = _fork_server()
    if server is not None and server.serves(child_env):
        forked = server.run(argv, cwd or REPO, timeout, child_env)
        if forked is not None:
            return forked
    return subprocess.run(
        [sys.executable, *argv],
        cwd=cwd or REPO,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class _ForkServer:
    """A running ``tests/fork_server.py`` of this process, and how to start a child of
    it as ``subprocess.run(..., capture_output=True, text=True)`` would."""

    def __init__(self, env: dict[str, str]) -> None:
        import atexit
        import tempfile

        self.env = env
        self.folder = tempfile.mkdtemp(prefix="fork-server-")
        self.socket = os.path.join(self.folder, "socket")
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "fork_server.py"), self.socket],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        atexit.register(self.stop)

    def stop(self) -> None:
        """Kill the server and remove its socket's folder: a test run leaves no folder
        of its own in the temporary directory."""
        import shutil

        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a child in ``env`` starts as one forked from here: the same
        environment but for variables ``import torch`` reads none of (the child runs
        with its own ``env``)."""
        return _read_at_import(env) == _read_at_import(self.env)

    def _connect(self) -> Any:
        import socket
        import time

        while not os.path.exists(self.socket):
            if self.process.poll() is not None:
                return None
            time.sleep(0.02)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.socket)
        except OSError:  # the server died since it started
            conn.close()
            return None
        return conn

    def run(
        self, argv: list[str], cwd: Path, timeout: float, env: dict[str, str]
    ) -> subprocess.CompletedProcess[str] | None:
        """The child's result, as ``subprocess.run`` gives it; None where the server
        could not start (the caller starts a fresh interpreter, as before)."""
        import io
        import selectors
        import signal
        import socket
        import time

        conn = self._connect()
        if conn is None:
            return None
        deadline = time.monotonic() + timeout
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        with conn:
            payload = json.dumps({"argv": argv, "cwd": str(cwd), "env": env}).encode()
            socket.send_fds(conn, [len(payload).to_bytes(8, "big")], [out_w, err_w])
            conn.sendall(payload)
            os.close(out_w)
            os.close(err_w)
            answers = conn.makefile("rb")
            pid = json.loads(answers.readline())["pid"]
            output: dict[int, list[bytes]] = {out_r: [], err_r: []}
            with selectors.DefaultSelector() as selector:
                for fd in output:
                    selector.register(fd, selectors.EVENT_READ)
                open_fds = set(output)
                while open_fds:
                    left = deadline - time.monotonic()
                    ready = selector.select(max(left, 0)) if left > 0 else []
                    if not ready:
                        for fd in output:
                            os.close(fd)
                        os.kill(pid, signal.SIGKILL)
                        raise subprocess.TimeoutExpired([sys.executable, *argv], timeout)
                    for key, _ in ready:
                        chunk = os.read(key.fd, 65536)
                        if chunk:
                            output[key.fd].append(chunk)
                        else:
                            selector.unregister(key.fd)
                            open_fds.discard(key.fd)
                            os.close(key.fd)
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                status = json.loads(answers.readline())["status"]
            except (OSError, ValueError) as error:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired([sys.executable, *argv], timeout) from error

        def text(chunks: list[bytes]) -> str:
            # What text=True gives: the locale's encoding, universal newlines.
            return io.TextIOWrapper(io.BytesIO(b"".join(chunks))).read()

        return subprocess.CompletedProcess(
            [sys.executable, *argv], status, text(output[out_r]), text(output[err_r])
        )


#: Variables ``import torch`` reads none of (their owners are not imported by it, or read
#: them later): pytest's per-test-phase name, the temporary folder (nothing asks for it
#: at import), Inductor's (torch does not import Inductor; Inductor sets some as it
#: runs), the offline switches of Hugging Face's libraries and Ray's settings (fixtures
#: and the Ray executor set them in the worker), this project's own, the terminal width.
_NOT_READ_AT_IMPORT = (
    "PYTEST_",
    "TMPDIR",
    "TORCHINDUCTOR_",
    "_TORCHINDUCTOR_",
    "HF_",
    "TRANSFORMERS_",
    "RAY_",
    "PRECOMPILE_",
    "COLUMNS",
)


def _read_at_import(env: dict[str, str]) -> dict[str, str]:
    """``env`` but the variables ``import torch`` reads none of."""
    return {k: v for k, v in env.items() if not k.startswith(_NOT_READ_AT_IMPORT)}


_FORK_SERVERS: dict[int, _ForkServer] = {}
_FORK_SERVER_LOCK = threading.Lock()


def _fork_server() -> _ForkServer:
    """This process's fork server, started on first use in the environment this process
    started with (a child whose environment differs -- a test changed it, or gave the
    child more -- gets a fresh interpreter)."""
    with _FORK_SERVER_LOCK:
        server = _FORK_SERVERS.get(os.getpid())
        if server is None:
            server = _FORK_SERVERS[os.getpid()] = _ForkServer(fresh_env(_base=_START_ENVIRON))
        return server


def run_python(
    code: str,
    *,
    cwd: Path | None = None,
    timeout: float = 300,
    pythonpath: Sequence[Path] = (),
    cold: bool = False,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; the caller asserts on the result."""
    return _spawn(["-c", code], cwd=cwd, timeout=timeout, pythonpath=pythonpath, env=env, cold=cold)


def run_script(
    script: Path,
    *args: str,
    cwd: Path | None = None,
    timeout: float = 300,
    pythonpath: Sequence[Path] = (),
    cold: bool = False,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """Run the file ``script`` with ``args`` (so its code is ``__main__``, as a user's
    capture script is) in a fresh interpreter; the caller asserts on the result."""
    argv = [str(script), *args]
    return _spawn(argv, cwd=cwd, timeout=timeout, pythonpath=pythonpath, env=env, cold=cold)


def run_module(
    module: str,
    *args: str,
    cwd: Path | None = None,
    timeout: float = 300,
    pythonpath: Sequence[Path] = (),
    cold: bool = False,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """``python -m module ARGS`` in a fresh interpreter; the caller asserts on the result."""
    argv = ["-m", module, *args]
    return _spawn(argv, cwd=cwd, timeout=timeout, pythonpath=pythonpath, env=env, cold=cold)


def precompile_cli(
    *args: str, cwd: Path, timeout: float = 900, **env: str
) -> subprocess.CompletedProcess[str]:
    """``precompile ARGS`` in a fresh process, as a user runs it."""
    return run_module("precompile_lsp.cli", *args, cwd=cwd, timeout=timeout, **env)


def last_json(proc: subprocess.CompletedProcess[str]) -> Any:
    """The child's result: it exited 0 (else its stderr is the failure) and the last line
    it printed, parsed as JSON."""
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_json(
    code: str,
    *,
    cwd: Path | None = None,
    timeout: float = 300,
    pythonpath: Sequence[Path] = (),
    cold: bool = False,
    **env: str,
) -> Any:
    """Run ``code`` in a fresh interpreter that must succeed; its result (``last_json``)."""
    proc = run_python(code, cwd=cwd, timeout=timeout, pythonpath=pythonpath, cold=cold, **env)
    return last_json(proc)


def run_job(
    module: str,
    job: dict[str, Any],
    path: Path,
    timeout: float = 300,
    *,
    pythonpath: Sequence[Path] = (),
    **env: str,
) -> Any:
    """Run ``python -m module path`` in a fresh interpreter on ``job`` (written to
    ``path`` as JSON); its result (``last_json``)."""
    path.write_text(json.dumps(job))
    proc = run_module(module, str(path), timeout=timeout, pythonpath=pythonpath, **env)
    return last_json(proc)


def run_saving_job(
    module: str,
    job: dict[str, Any],
    path: Path,
    timeout: float = 600,
    *,
    pythonpath: Sequence[Path] = (),
    **env: str,
) -> Any:
    """``run_job`` for a child whose results hold tensors: the job names an ``output``
    file next to ``path`` that the child writes with ``torch.save``; what it saved."""
    import torch

    output = path.with_suffix(".pt")
    run_job(module, {**job, "output": str(output)}, path, timeout, pythonpath=pythonpath, **env)
    return torch.load(output, weights_only=False)


def serve_fresh(
    entries: list[dict[str, Any]], tmp_path: Path, *, without_precompile: bool = False
) -> dict[str, Any]:
    """Serve artifacts in one fresh process (see tests/fixtures/serve_artifacts.py); the
    outputs it saved."""
    job = tmp_path / f"job-{len(list(tmp_path.iterdir()))}.json"
    return dict(
        run_saving_job(
            "tests.fixtures.serve_artifacts",
            {"entries": entries, "without_precompile": without_precompile},
            job,
        )
    )


#: A fresh process that records every process it starts (and every fork), loads an
#: artifact, serves it (the ``serve`` code sets ``error``) and prints what the load did, as
#: JSON -- so a test can assert that a load compiled nothing.
_WATCHED_LOAD = """
import glob, json, os, subprocess, sys, traceback, warnings
spawned, first_stack = [], []
def _first(what):
    spawned.append(what)
    if not first_stack:
        first_stack.append("".join(traceback.format_stack()[-14:-2]))
_popen = subprocess.Popen.__init__
def _record(self, *args, **kwargs):
    _first(str(args[0] if args else kwargs.get("args")))
    return _popen(self, *args, **kwargs)
subprocess.Popen.__init__ = _record
for _name in ("fork", "posix_spawn", "posix_spawnp"):
    def _wrap(*a, _orig=getattr(os, _name), _n=_name, **k):
        _first(_n)
        return _orig(*a, **k)
    setattr(os, _name, _wrap)
import ast, builtins
compiled_text = []
_compile = builtins.compile
def _spy_compile(source, filename, mode, flags=0, *args, **kwargs):
    if not flags & ast.PyCF_ONLY_AST and str(filename).startswith("<precompile"):
        compiled_text.append(str(filename))
    return _compile(source, filename, mode, flags, *args, **kwargs)
builtins.compile = _spy_compile
import torch, precompile
warnings.simplefilter("error", precompile.CacheFallbackWarning)
warnings.simplefilter("ignore", precompile.ArtifactTrustWarning)
run = precompile.load({artifact!r}, {cache!r})
{serve}
modules = sorted(sys.modules)
caches = [os.environ["TORCHINDUCTOR_CACHE_DIR"]]
caches += glob.glob(os.path.join(os.environ["TMPDIR"], "torchinductor_*"))
print(json.dumps({{
    "error": error,
    "spawned": spawned,
    "first_stack": first_stack[0] if first_stack else None,
    "modules": modules,
    "compiled_text": compiled_text,
    "cache_files": [os.path.join(d, f) for c in caches for d, _, fs in os.walk(c) for f in fs],
}}))
"""


def watched_load(artifact: str, cache: str, serve: str, inductor_cache: Path) -> dict[str, Any]:
    """Load and serve an artifact in a fresh process whose TORCHINDUCTOR_CACHE_DIR is the
    empty ``inductor_cache`` and whose TMPDIR is empty too -- Inductor keeps precompiled
    headers in a folder of its own there, whatever TORCHINDUCTOR_CACHE_DIR says, and a
    machine that never compiled has none. Returns its serving error, the processes it
    started (and the stack that started the first), the modules it imported, the files
    it wrote into either Inductor folder and the ``<precompile ...>`` text it compiled."""
    inductor_cache.mkdir()
    temp = inductor_cache.with_name(f"{inductor_cache.name}-tmp")
    temp.mkdir()
    return dict(
        run_json(
            _WATCHED_LOAD.format(artifact=artifact, cache=cache, serve=serve),
            TORCHINDUCTOR_CACHE_DIR=str(inductor_cache),
            TMPDIR=str(temp),
        )
    )


def capture_pair(
    fn: Any,
    *args: Any,
    directory: Path,
    name: str = "a",
    tracer: Any = None,
    training: bool = False,
    backend: str = "eager",
) -> tuple[str, str]:
    """Capture ``fn`` called once with ``args`` into ``directory/name.{py,cache}``
    (make_fx unless another tracer is given); the pair's paths."""
    import precompile

    paths = str(directory / f"{name}.py"), str(directory / f"{name}.cache")
    with precompile.capture(
        fn,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=tracer or precompile.MakeFxTracer(),
        backend=backend,
        training=training,
    ) as cap:
        cap(*args)
    return paths


def attack_in_child(
    child: str,
    fn: Any,
    model: Callable[[], Any],
    example: Callable[[], Any],
    *,
    directory: Path,
    tracer: Any = None,
    backend: str = "eager",
) -> Any:
    """The attack tests' one shape: seed 0, build ``model()`` then ``example()``, capture
    ``fn`` under ``no_grad`` into ``directory`` (``capture_pair``), then run ``child`` -- a
    script template naming ``{artifact}`` and ``{cache}`` that attacks the loaded pair --
    in a fresh process; the JSON it prints."""
    import textwrap

    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        artifact, cache = capture_pair(
            fn, model(), example(), directory=directory, tracer=tracer, backend=backend
        )
    return run_json(textwrap.dedent(child.format(artifact=artifact, cache=cache)))


def assert_attack_outcome(
    tracer: str,
    scenario: str,
    outcome: list[Any],
    *,
    no_op: bool,
    known_needless: dict[tuple[str, str], str],
    known_wrong: dict[tuple[str, str], tuple[str, str]] | None = None,
) -> None:
    """The attack files' one verdict on a cell's ``[kind, detail]``: a known wrong cell
    keeps its recorded outcome (so a fix shows); a no-op is served equal to eager, or
    refused in its recorded needless words; any other change is refused, fails as eager
    does, or is served equal to eager."""
    kind, detail = outcome
    if known_wrong and (tracer, scenario) in known_wrong:
        known_kind, words = known_wrong[tracer, scenario]
        assert kind == known_kind and words in str(detail), (tracer, kind, detail)
        return
    if not no_op:
        assert kind in ("refused", "failed as eager does") or [kind, detail] == [
            "served",
            True,
        ], (tracer, kind, detail)
        return
    if kind == "refused" and (tracer, scenario) in known_needless:
        assert known_needless[tracer, scenario] in detail, (tracer, detail)
        return
    assert [kind, detail] == ["served", True], (tracer, kind, detail)


def patched(owner: Any, name: str, value: Any) -> Callable[[], None]:
    """``owner.name = value`` (a function's ``__code__``, ``__defaults__``, an
    attribute), as an attack makes it; returns what puts the old value back."""
    before = getattr(owner, name)
    setattr(owner, name, value)
    return lambda: setattr(owner, name, before)


def set_undoably(owner: Any, name: Any, value: Any) -> Callable[[], None]:
    """``owner[name] = value`` for a dict, else ``owner.name = value``; returns what
    puts the old one back, or deletes one ``owner`` did not hold itself (a class
    attribute it inherited stays inherited)."""
    if isinstance(owner, dict):
        before = owner[name]
        owner[name] = value
        return lambda: owner.__setitem__(name, before)
    had = name in vars(owner)
    old = vars(owner).get(name)
    setattr(owner, name, value)
    return lambda: setattr(owner, name, old) if had else delattr(owner, name)


def patched_cell(fn: Any, value: Any) -> Callable[[], None]:
    """``fn``'s first closure cell set to ``value``; returns what puts it back."""
    cell = fn.__closure__[0]
    before = cell.cell_contents
    cell.cell_contents = value

    def undo() -> None:
        cell.cell_contents = before

    return undo


def assert_same(actual: Any, expected: Any, path: str = "") -> None:
    """Deep comparison: tensors numerically (torch's default tolerances), everything else
    exactly, including which entries are None."""
    import torch

    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {actual!r}"
        torch.testing.assert_close(actual, expected, msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, dict):
        assert (
            isinstance(actual, dict) and actual.keys() == expected.keys()
        ), f"{path}: keys {sorted(actual) if isinstance(actual, dict) else actual!r} != {sorted(expected)}"
        for k in expected:
            assert_same(actual[k], expected[k], f"{path}.{k}")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(
            expected
        ), f"{path}: {actual!r} != {expected!r}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def served_or_refused(call: Callable[[], Any], eager: Callable[[], Any]) -> list[Any]:
    """The attack children's one outcome of a served call, run after a change:
    ``["refused", message]`` for a PrecompileError, ``["failed otherwise", repr]`` for any
    other error, ``["served where eager fails", repr]`` where the artifact answered what
    eager cannot run, else ``["served", equal]``: whether the answer is eager's (``eager``
    runs after ``call``, on the same changed state) in shape, dtype, device and value."""
    import torch

    import precompile

    try:
        got = call()
    except precompile.PrecompileError as error:
        return ["refused", str(error)]
    except Exception as error:  # anything but a refusal naming the change
        return ["failed otherwise", repr(error)]
    try:
        want = eager()
    except Exception as error:  # eager cannot run it, the artifact answered
        return ["served where eager fails", repr(error)]
    same = got.shape == want.shape and got.dtype == want.dtype and got.device == want.device
    return ["served", bool(same and torch.allclose(got, want))]
