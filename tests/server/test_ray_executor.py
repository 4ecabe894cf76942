"""``executor = "ray"``: jobs run as tasks of a local Ray cluster (``ray.init(num_cpus=2)``,
started by the engine) and give what local workers give -- the same findings, and the
same artifact bytes, which the engine writes itself (the tasks never write into the
workspace); a task whose process dies is a PC900 with the reason; without ray the
setting is a configuration error naming the install."""

from __future__ import annotations

import asyncio
import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.harness import precompile_cli

MODELS = """
import torch
import precompile


def calls():
    torch.manual_seed(0)
    return [(torch.nn.Linear(4, 3), torch.randn(2, 4))]


def wider():
    torch.manual_seed(1)
    return [(torch.nn.Linear(4, 3), torch.randn(5, 4))]


@precompile.target(calls, tracer="make_fx", covers=wider)
def linear(model, x):
    return torch.relu(model(x))


@precompile.target(calls, tracer="make_fx")
def scaled(model, x):
    return model(x).sigmoid() * 2


@precompile.target(calls)
def broken(model, x):
    y = model(x)
    print("a graph break")
    return y - 1
"""

#: make_fx artifacts are reproducible byte for byte from one process to the next; a
#: Dynamo artifact's guard text carries per-process object ids (two local emits differ),
#: so for it the findings and its verification are compared.
REPRODUCIBLE = ("pair.models.linear", "pair.models.scaled")


def _workspace(root: Path, source: str, settings: str) -> Path:
    (root / "src" / "pair").mkdir(parents=True)
    (root / "src" / "pair" / "__init__.py").write_text("")
    (root / "src" / "pair" / "models.py").write_text(source)
    (root / "pyproject.toml").write_text(f'[tool.precompile]\nbackend = "eager"\n{settings}')
    return root


def _check(workspace: Path) -> tuple[int, dict[str, Any], str]:
    proc = precompile_cli(
        "check", "--emit", "--verify", "--no-cache", "--format", "json", cwd=workspace
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One workspace checked (with --emit --verify) by local workers, then, its artifacts
    removed, by the Ray executor: same paths, so the bytes may be compared."""
    pytest.importorskip(
        "ray", reason="the Ray executor needs ray (pip install torch-precompile[ray])"
    )
    workspace = _workspace(tmp_path_factory.mktemp("ray") / "ws", MODELS, "workers = 2\n")
    local_code, local, local_stderr = _check(workspace)
    assert "Ray" not in local_stderr
    artifacts = workspace / "artifacts"
    local_files = {p.name: p.read_bytes() for p in sorted(artifacts.iterdir())}
    shutil.rmtree(artifacts)
    pyproject = workspace / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + 'executor = "ray"\n')
    ray_code, ray, stderr = _check(workspace)
    ray_files = {p.name: p.read_bytes() for p in sorted(artifacts.iterdir())}
    return {
        "local": (local_code, local, local_files),
        "ray": (ray_code, ray, ray_files),
        "stderr": stderr,
    }


def test_ray_gives_the_findings_local_workers_give(both: dict[str, Any]) -> None:
    local_code, local, _ = both["local"]
    ray_code, ray, _ = both["ray"]
    codes = sorted((f["target"], f["code"]) for f in local["findings"])
    # Real findings on both sides: the unserved covers call and the graph break.
    assert ("pair.models.linear", "PC201") in codes, codes
    assert ("pair.models.broken", "PC101") in codes, codes
    assert ray["findings"] == local["findings"]
    assert ray_code == local_code
    assert ray["stats"]["emits"] == local["stats"]["emits"] == 3
    assert ray["stats"]["verifies"] == local["stats"]["verifies"] == 3
    assert not [f for f in ray["findings"] if f["code"] == "PC900"], both["stderr"]
    # The jobs did go to a cluster: the engine started one (Ray logs it on stderr).
    assert "Started a local Ray instance" in both["stderr"]


def test_ray_emits_byte_identical_artifacts(both: dict[str, Any]) -> None:
    _, _, local_files = both["local"]
    _, _, ray_files = both["ray"]
    assert sorted(ray_files) == sorted(local_files)
    assert len(ray_files) == 6  # three pairs, unsigned: no .sig
    for target in REPRODUCIBLE:
        for suffix in (".py", ".cache"):
            name = target + suffix
            assert ray_files[name] == local_files[name], f"{name} differs"


KILLERS = """
import os
import signal

import torch
import precompile


def kills_itself():
    os.kill(os.getpid(), signal.SIGKILL)
    return [(torch.ones(3),)]


def kills_its_ray_worker():
    os.kill(os.getppid(), signal.SIGKILL)  # the forked job's parent: the Ray worker
    return [(torch.ones(3),)]


def sleeps():
    import time

    time.sleep(120)
    return [(torch.ones(3),)]


def calls():
    return [(torch.ones(3),)]


@precompile.target(sleeps, tracer="make_fx")
def sleeper(x):
    return x + 1


@precompile.target(kills_itself, tracer="make_fx")
def suicide(x):
    return x + 1


@precompile.target(kills_its_ray_worker, tracer="make_fx")
def parricide(x):
    return x + 1


@precompile.target(calls, tracer="make_fx", resources={"num_gpus": 1})
def needs_a_gpu(x):
    return x + 1
"""


def test_a_task_that_dies_or_times_out_is_pc900_with_the_reason(tmp_path: Path) -> None:
    pytest.importorskip(
        "ray", reason="the Ray executor needs ray (pip install torch-precompile[ray])"
    )
    settings = 'workers = 2\nexecutor = "ray"\ntimeout = 5\n'
    workspace = _workspace(tmp_path / "ws", KILLERS, settings)
    proc = precompile_cli("check", "--no-cache", "--format", "json", cwd=workspace)
    assert proc.returncode == 1, proc.stderr
    by_target: dict[str, list[dict[str, Any]]] = {}
    for finding in json.loads(proc.stdout)["findings"]:
        by_target.setdefault(finding["target"].rsplit(".", 1)[1], []).append(finding)
    (suicide,) = by_target["suicide"]
    assert suicide["code"] == "PC900" and "crashed (SIGKILL)" in suicide["message"]
    (parricide,) = by_target["parricide"]
    assert parricide["code"] == "PC900"
    assert "the Ray worker process running the job died" in parricide["message"]
    (sleeper,) = by_target["sleeper"]
    assert sleeper["code"] == "PC900" and "timed out after 5 s" in sleeper["message"]
    (gpu,) = by_target["needs_a_gpu"]
    assert gpu["code"] == "PC900"
    assert "num_gpus=1 (the cluster has 0)" in gpu["message"], gpu["message"]


#: Makes ``ray`` unimportable in the process it is imported into (a sitecustomize).
BLOCKER = """
import sys


class _NoRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError("No module named 'ray'", name=name)
        return None


sys.meta_path.insert(0, _NoRay())
"""


def test_executor_ray_without_ray_is_a_config_error(tmp_path: Path) -> None:
    workspace = _workspace(tmp_path / "ws", MODELS, 'executor = "ray"\n')
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(textwrap.dedent(BLOCKER))
    import os

    path = os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])
    proc = precompile_cli("check", "--format", "json", cwd=workspace, PYTHONPATH=path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "[tool.precompile] executor" in proc.stderr
    assert "pip install torch-precompile[ray]" in proc.stderr
    assert not (workspace / "artifacts").exists()


def test_an_untrusted_workspace_submits_nothing_to_ray(tmp_path: Path) -> None:
    """The trust gate is asked before the cluster is even joined."""
    from precompile_lsp.config import Config
    from precompile_lsp.protocol import JobKind, JobRequest, Outcome
    from precompile_lsp.ray_executor import RayExecutor
    from precompile_lsp.trust import TrustGate

    executor = RayExecutor(Config(root=tmp_path, executor="ray"), TrustGate(trusted=False))
    job = JobRequest(
        kind=JobKind.CHECK,
        module="pair.models",
        function="linear",
        root=str(tmp_path),
        source_roots=[str(tmp_path)],
        artifact=str(tmp_path / "artifacts" / "a.py"),
        artifact_declared=False,
        backend="eager",
        tracer="dynamo",
        timeout=60,
    )
    result = asyncio.run(executor.run("job-1", job))
    assert result.status is Outcome.CANCELLED and "not trusted" in (result.message or "")
    assert executor._ray is None and executor.running == {}


def test_returned_bytes_are_written_under_the_write_policy(tmp_path: Path) -> None:
    """What a task returns is written by the engine like any write of the product: a
    path holding a file that is not an artifact is refused and left as it was."""
    from precompile_lsp.protocol import JobKind, JobRequest
    from precompile_lsp.ray_executor import write_pair

    artifact = tmp_path / "model.py"
    artifact.write_text("print('a user file, not an artifact')\n")
    job = JobRequest(
        kind=JobKind.EMIT,
        module="m",
        function="f",
        root=str(tmp_path),
        source_roots=[str(tmp_path)],
        artifact=str(artifact),
        artifact_declared=True,
        backend="eager",
        tracer="make_fx",
        timeout=60,
    )
    refused = write_pair(job, {"artifact": b"# torch-precompile artifact: x\n", "cache": b"x"})
    assert refused is not None and refused.type == "OverwriteRefusedError"
    assert "is not a torch-precompile artifact" in refused.message
    assert artifact.read_text() == "print('a user file, not an artifact')\n"
    assert not (tmp_path / "model.cache").exists()


def test_resources_must_be_a_dict_of_numbers() -> None:
    import precompile

    precompile.target(lambda: [], resources={"num_gpus": 1, "accelerator_a100": 0.5})
    for bad in ({"num_gpus": "one"}, ["num_gpus"], {"num_gpus": -1}, {"num_gpus": True}):
        with pytest.raises(TypeError, match="resources must be a dict"):
            precompile.target(lambda: [], resources=bad)


def test_changing_the_executor_setting_takes_effect_for_the_next_job(tmp_path: Path) -> None:
    pytest.importorskip(
        "ray", reason="the Ray executor needs ray (pip install torch-precompile[ray])"
    )
    from precompile_lsp.engine import Engine

    workspace = _workspace(tmp_path / "ws", MODELS, "")

    async def scenario() -> tuple[str, str, str]:
        engine = Engine(workspace, trusted=True)
        before = engine.pool.kind
        pyproject = workspace / "pyproject.toml"
        pyproject.write_text(pyproject.read_text() + 'executor = "ray"\n')
        engine.reconfigure()
        during = engine.pool.kind
        pyproject.write_text(pyproject.read_text().replace('executor = "ray"\n', ""))
        engine.reconfigure()
        await engine.close()
        return before, during, engine.pool.kind

    assert asyncio.run(scenario()) == ("local", "ray", "local")
