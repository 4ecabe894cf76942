"""Workers survive what user code does while captured: a target past its timeout, one that
segfaults, one that prints to stdout and writes to fd 1 from C. Each becomes its finding,
the output never reaches the protocol, a killed job leaves no temporary files, and the
next job still runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.harness import precompile_cli, run_json
from tests.server.conftest import FIXTURES


@pytest.fixture(scope="module")
def rogue(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workspace = tmp_path_factory.mktemp("rogue") / "rogue"
    shutil.copytree(FIXTURES / "misbehaving", workspace)
    temp = tmp_path_factory.mktemp("rogue-tmp")  # the check's own TMPDIR
    proc = precompile_cli("check", "--format", "json", cwd=workspace, TMPDIR=str(temp))
    assert proc.returncode == 1, proc.stderr
    return {
        "workspace": workspace,
        "doc": json.loads(proc.stdout),
        "stdout": proc.stdout,
        "temp": temp,
    }


def _findings(rogue: dict[str, Any], target: str) -> list[dict[str, Any]]:
    return [f for f in rogue["doc"]["findings"] if f["target"] == f"rogue.targets.{target}"]


def test_a_target_past_its_timeout(rogue: dict[str, Any]) -> None:
    (finding,) = _findings(rogue, "sleeps")
    assert finding["code"] == "PC900" and finding["severity"] == "error"
    assert "timed out after 8 s" in finding["message"]


def test_a_killed_job_leaves_no_temporary_files(rogue: dict[str, Any]) -> None:
    # The timed-out job was killed in its covers(), holding its capture's scratch files.
    # Only Inductor's per-user cache folder (made on import, kept by design) may remain.
    left = [p.name for p in rogue["temp"].iterdir() if not p.name.startswith("torchinductor_")]
    assert left == []


def test_a_target_that_segfaults(rogue: dict[str, Any]) -> None:
    (finding,) = _findings(rogue, "crashes")
    assert finding["code"] == "PC900" and "SIGSEGV" in finding["message"]


def test_output_is_captured_and_never_leaks(rogue: dict[str, Any]) -> None:
    # Anything printed to the check's stdout would break the JSON document.
    assert json.loads(rogue["stdout"]) == rogue["doc"]
    (finding,) = _findings(rogue, "prints")
    assert finding["code"] == "PC101"
    for noise in ("NOISE from print", "NOISE from fd 1", "NOISE from C"):
        assert noise in finding["details"], finding["details"]


def test_the_next_job_still_runs(rogue: dict[str, Any]) -> None:
    assert _findings(rogue, "fine") == []
    assert rogue["doc"]["stats"]["captures"] == 4
    targets = {t["target"]: t for t in rogue["doc"]["targets"]}
    assert targets["rogue.targets.fine"]["summary"].endswith("complete")


def test_without_fork_each_job_runs_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """Where fork is unavailable (forced here), jobs run in fresh interpreters with the
    same results, timeouts and clean-up."""
    workspace = tmp_path / "rogue"
    shutil.copytree(FIXTURES / "misbehaving", workspace)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = precompile_cli(
        "check",
        "--format",
        "json",
        "--no-cache",
        cwd=workspace,
        PRECOMPILE_WORKER_SPAWN="1",
        TMPDIR=str(scratch),
    )
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    by_target = {
        t: sorted(f["code"] for f in doc["findings"] if f["target"] == f"rogue.targets.{t}")
        for t in ("fine", "prints", "sleeps", "crashes")
    }
    assert by_target == {"fine": [], "prints": ["PC101"], "sleeps": ["PC900"], "crashes": ["PC900"]}
    assert not [p for p in scratch.iterdir() if p.name.startswith("precompile-")]


def test_stopping_a_worker_stops_the_capture_it_runs(tmp_path: Path) -> None:
    """The job child has a session of its own, out of reach of a signal to the worker's
    group: a worker that is stopped mid-job (no cancel message first) ends its job's
    process group itself and removes the job's folder."""
    import asyncio
    import os
    import sys

    from precompile_lsp.protocol import JobKind, JobRequest
    from precompile_lsp.workers import WorkerClient

    root = tmp_path / "ws"
    (root / "src" / "slowpkg").mkdir(parents=True)
    (root / "src" / "slowpkg" / "__init__.py").write_text("")
    (root / "src" / "slowpkg" / "t.py").write_text(
        "import time\nimport torch\nimport precompile\n\n\n"
        "def calls():\n    time.sleep(600)\n    return [(torch.ones(3),)]\n\n\n"
        "@precompile.target(calls)\ndef slow(x):\n    return x * 2\n"
    )
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    job = JobRequest(
        kind=JobKind.CHECK,
        module="slowpkg.t",
        function="slow",
        root=str(root),
        source_roots=[str(root / "src")],
        artifact=str(root / "artifacts" / "a.py"),
        artifact_declared=False,
        backend="eager",
        tracer="dynamo",
        timeout=600,
    )

    def children(pid: int) -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if entry.isdigit() and int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
        return found

    async def scenario() -> tuple[list[int], bool]:
        os.environ["TMPDIR"] = str(scratch)
        worker = WorkerClient(sys.executable, root)
        await worker.start()
        run = asyncio.create_task(worker.run("job-1", job))
        assert worker.process is not None
        for _ in range(600):
            kids = children(worker.process.pid)
            if kids:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1)  # into calls(), sleeping
        await worker.close()
        await asyncio.sleep(1)
        run.cancel()
        alive = [k for k in kids if Path(f"/proc/{k}").exists() and children(1) is not None]
        still = [
            k
            for k in alive
            if Path(f"/proc/{k}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        ]
        return kids, bool(still)

    previous = os.environ.get("TMPDIR")
    try:
        # A capture that kept the worker's pipe open would hang the close: bounded.
        kids, survived = asyncio.run(asyncio.wait_for(scenario(), 120))
    finally:
        if previous is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = previous
    assert kids, "the worker forked no job"
    assert not survived, f"the capture {kids} outlived its worker"
    assert not [p for p in scratch.iterdir() if p.name.startswith("precompile-job-")]


def test_a_spawned_jobs_slow_start_is_not_its_capture_timing_out(tmp_path: Path) -> None:
    """A fresh interpreter that takes longer to start (import torch on a loaded machine)
    than the capture timeout (8 s here) still captures: the timeout measures the capture,
    as it does for a forked child, which starts with torch imported."""
    import os

    from tests.harness import REPO

    workspace = tmp_path / "rogue"
    shutil.copytree(FIXTURES / "misbehaving", workspace)
    slow = tmp_path / "slow_start"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(
        "import sys, time\n"
        "if len(sys.argv) == 5 and sys.argv[1] == '--job':\n"
        "    with open(sys.argv[2], encoding='utf-8') as f:\n"
        "        if 'targets.fine' in f.read():\n"
        "            time.sleep(10)\n"
    )
    proc = precompile_cli(
        "check",
        "--format",
        "json",
        "--no-cache",
        cwd=workspace,
        PRECOMPILE_WORKER_SPAWN="1",
        PYTHONPATH=os.pathsep.join([str(slow), str(REPO)]),
    )
    doc = json.loads(proc.stdout)
    fine = [f for f in doc["findings"] if f["target"] == "rogue.targets.fine"]
    assert fine == [], fine
    targets = {t["target"]: t for t in doc["targets"]}
    assert targets["rogue.targets.fine"]["summary"].endswith("complete")


def test_only_an_emit_job_pays_for_inductors_compiler(tmp_path: Path) -> None:
    """A check captures with the eager backend and never compiles: its worker no longer
    imports Inductor's compiler while warming up (a fifth of the warm-up). The worker
    imports it before forking its first emit job, so the emit's child finds it there,
    and the artifact it writes serves the right answer. The target's module records, as
    each job's child imports it, whether the compiler was already imported."""
    workspace = tmp_path / "ws"
    (workspace / "src" / "probe").mkdir(parents=True)
    (workspace / "pyproject.toml").write_text(
        '[tool.precompile]\nsource-roots = ["src"]\nbackend = "inductor"\ntracer = "make_fx"\n'
    )
    (workspace / "src" / "probe" / "__init__.py").write_text("")
    record = tmp_path / "imported.txt"
    (workspace / "src" / "probe" / "targets.py").write_text(
        "import os, sys\n"
        "import precompile, torch\n"
        f"with open({str(record)!r}, 'a') as f:\n"
        "    f.write(str('torch._inductor.compile_fx' in sys.modules) + '\\n')\n\n"
        "def calls():\n"
        "    return [(torch.ones(3),)]\n\n"
        "@precompile.target(calls)\n"
        "def double(x):\n"
        "    return x * 2\n"
    )
    checked = precompile_cli("check", "--format", "json", "--no-cache", cwd=workspace)
    assert checked.returncode == 0, checked.stderr
    assert record.read_text().split() == ["False"]
    record.unlink()
    emitted = precompile_cli("emit", "probe.targets.double", cwd=workspace)
    assert emitted.returncode == 0, emitted.stderr
    assert record.read_text().split()[-1] == "True"
    (artifact,) = (workspace / "artifacts").glob("probe.targets.double*.py")
    served = run_json(
        "import json, torch, precompile\n"
        f"run = precompile.load({str(artifact)!r})\n"
        "print(json.dumps(run(torch.ones(3)).tolist()))\n",
        cwd=workspace,
        pythonpath=[workspace / "src"],
    )
    assert served == [2.0, 2.0, 2.0]


def test_a_failed_import_of_inductors_compiler_leaves_the_worker_serving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before its first emit job the worker imports Inductor's compiler; where that
    import fails (a broken install), the worker goes on serving -- the job's own child
    imports it again and reports the failure as the job's -- and does not try again
    before every later job."""
    import types

    from precompile_lsp import protocol
    from precompile_lsp.worker import process

    tried: list[tuple[str, ...]] = []

    def failing(names: tuple[str, ...]) -> None:
        tried.append(names)
        raise ImportError("no compiler in this install")

    monkeypatch.setattr(process, "_import", failing)
    monkeypatch.setattr(process, "_EMIT_READY", False)
    emit = types.SimpleNamespace(kind=protocol.JobKind.EMIT)
    check = types.SimpleNamespace(kind=protocol.JobKind.CHECK)
    for job in (check, emit, emit, check):
        process.warm_for(job)  # type: ignore[arg-type]
    assert tried == [process.EMIT_IMPORTS]
