"""Job hygiene: whatever a job starts ends with the job, however the job ends. A target's
``examples()`` that starts a process (as DataLoader workers and multiprocessing pools
do) or one that leaves the job's process group with ``setsid()`` does not outlive the
capture: not after ``precompile check`` exits, and not after an engine's check returns,
on success and on failure."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from precompile_lsp.engine import Engine
from tests.harness import precompile_cli

TARGETS = """import multiprocessing
import os
import time
from pathlib import Path

import torch

import precompile

ROOT = Path(__file__).resolve().parents[2]


def _sleep(name):
    (ROOT / f"{name}.pid").write_text(str(os.getpid()))
    time.sleep(60)


def _wait_for(name):
    while not (ROOT / f"{name}.pid").exists():
        time.sleep(0.01)


def _start_child(name):
    multiprocessing.Process(target=_sleep, args=(name,)).start()
    _wait_for(name)


def _start_escaped(name):
    if os.fork() == 0:  # leaves the job's process group
        os.setsid()
        _sleep(name)
        os._exit(0)
    _wait_for(name)


def calls_ok():
    _start_child("ok-child")
    _start_escaped("ok-escaped")
    return [(torch.nn.Linear(2, 2), torch.ones(1, 2))]


def calls_failing():
    _start_child("failing-child")
    raise RuntimeError("examples broke after starting a process")


@precompile.target(calls_ok)
def ok(model, x):
    return model(x) + 1


@precompile.target(calls_failing)
def failing(model, x):
    return model(x) + 1
"""

PIDS = ("ok-child", "ok-escaped", "failing-child")


def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "__init__.py").write_text("")
    (root / "src" / "pkg" / "targets.py").write_text(TARGETS)
    (root / "pyproject.toml").write_text(
        '[tool.precompile]\nsource-roots = ["src"]\nbackend = "eager"\ntracer = "make_fx"\n'
    )
    return root


def running(pid: int) -> bool:
    """Alive and not a zombie (a zombie has ended; only its parent's wait is missing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def survivors(root: Path, names: tuple[str, ...] = PIDS) -> list[str]:
    """The started processes still running after a short grace (a SIGKILL is not
    instantaneous); each is killed so that a failing test leaves nothing behind."""
    pids = {name: int((root / f"{name}.pid").read_text()) for name in names}
    deadline = time.monotonic() + 3
    while any(running(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [name for name, pid in pids.items() if running(pid)]
    for name in left:
        import os
        import signal

        os.kill(pids[name], signal.SIGKILL)
    return left


def test_processes_a_target_started_do_not_outlive_precompile_check(tmp_path: Path) -> None:
    root = workspace(tmp_path)
    proc = precompile_cli("check", "--no-cache", cwd=root, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # `failing` is a finding
    assert "examples broke" in proc.stdout
    assert survivors(root) == []


def test_an_engine_job_ends_its_processes_when_it_ends(tmp_path: Path) -> None:
    """Checked while the engine (and its warm worker) is still running: it is the job's
    end that ends them, not the engine's."""
    root = workspace(tmp_path)

    async def scenario() -> list[str]:
        engine = Engine(root, trusted=True, use_cache=False)
        try:
            findings = await engine.check()
            codes = {f.target: f.code for fs in findings.values() for f in fs}
            assert "pkg.targets.ok" not in codes and "pkg.targets.failing" in codes
            assert engine.pool.workers and all(w.alive for w in engine.pool.workers)
            return await asyncio.to_thread(survivors, root)
        finally:
            await engine.close()

    assert asyncio.run(scenario()) == []
