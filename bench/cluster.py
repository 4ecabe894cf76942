"""The Ray executor on a local cluster against local workers (issue 28, item 5): the same
generated eager targets checked, emitted and verified (`check --emit --verify
--no-cache`) by one `precompile check` process each, 2 workers or a 2-CPU local cluster;
the difference per job is what running jobs as Ray tasks costs.

The Ray run's wall time includes starting and stopping the local cluster, measured on its
own (a process that only does `ray.init(num_cpus=2)` and `ray.shutdown()`) and taken out
of the per-job overhead.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import REPO, table
from bench.scale import workspace

TARGETS = 10
FLAGS = ("--no-cache", "--format", "json")
CLUSTER_ONLY = """
import os, time
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
ray.shutdown()
"""


def _env() -> dict[str, str]:
    paths = [str(REPO / "core"), str(REPO / "server"), str(REPO)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _check(root: Path) -> tuple[float, dict[str, float]]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "precompile_lsp.cli", "check", "--emit", "--verify", *FLAGS],
        cwd=root,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.monotonic() - started
    if proc.returncode not in (0, 1):
        raise RuntimeError(proc.stderr[-3000:])
    document = json.loads(proc.stdout)
    failed = [f for f in document["findings"] if f["code"] == "PC900"]
    if failed:
        raise RuntimeError(f"jobs failed: {failed[:2]}")
    return wall, document["stats"]


def _cluster_only() -> float:
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", CLUSTER_ONLY],
        env=_env(),
        check=True,
        timeout=600,
        capture_output=True,
    )
    return time.monotonic() - started


def run_cluster_section(workdir: Path, runs: int) -> str:
    runs = max(runs, 1)
    roots = {}
    for executor in ("local", "ray"):
        root = workdir / f"cluster-{executor}"
        workspace(root, TARGETS)
        settings = "workers = 2\n" + ('executor = "ray"\n' if executor == "ray" else "")
        with open(root / "pyproject.toml", "a", encoding="utf-8") as f:
            f.write(settings)
        roots[executor] = root
    walls: dict[str, list[float]] = {"local": [], "ray": [], "cluster": []}
    jobs = 0
    for _ in range(runs):  # interleaved, so the shared machine's load falls on both
        for executor, root in roots.items():
            wall, stats = _check(root)
            walls[executor].append(wall)
            jobs = int(stats["captures"] + stats["emits"] + stats["verifies"])
        walls["cluster"].append(_cluster_only())
    local, ray, cluster = (statistics.median(walls[k]) for k in ("local", "ray", "cluster"))
    overhead = (ray - cluster - local) / jobs
    rows = [
        ["local workers (2)", f"{local:.2f}", "-", f"{1000 * local / jobs:.0f}"],
        ["Ray, local cluster (2 CPUs)", f"{ray:.2f}", f"{cluster:.2f}", f"{1000 * ray / jobs:.0f}"],
    ]
    return "\n\n".join(
        [
            "## The Ray executor on a local cluster (issue 28)",
            f"{TARGETS} generated eager-backend targets (bench/scale.py's), "
            f"`precompile check --emit --verify --no-cache`: {jobs} jobs (capture, emit, "
            f"verify per target) in one fresh process per row, median of {runs} interleaved "
            f"runs. `cluster start+stop` is a process that only starts and stops a 2-CPU local "
            f"Ray cluster.",
            table(["executor", "total (s)", "cluster start+stop (s)", "per job (ms)"], rows),
            f"Overhead of a job as a Ray task, cluster start taken out: "
            f"**{1000 * overhead:.0f} ms per job** ((Ray total - cluster start+stop - local "
            f"total) / {jobs}).",
        ]
    )
