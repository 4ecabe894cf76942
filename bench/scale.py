"""How `precompile check` scales: generated workspaces of 10, 50 and 200 targets, with one
and two workers, on a cold result cache and then unchanged (every result from the cache).

Each run is a fresh `precompile check` process; its peak RSS is the engine's (VmHWM of
that process), and a sampler reads the peak RSS of every worker process it starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.harness import REPO, table

SIZES = (10, 50, 200)
PER_FILE = 10

HEADER = """import precompile
import torch
from torch import nn


def calls():
    torch.manual_seed(0)
    return [(nn.Linear(8, 4).eval(), torch.randn(2, 8))]
"""

TARGET = """

@precompile.target(calls)
def target_{i}(model, x):
    return model(x).relu() * {i}
"""

RUNNER = """
import json, sys
from precompile_lsp.cli import main
code = main(sys.argv[1:])
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print("BENCH_ENGINE_PEAK_KB", peak, file=sys.stderr)
raise SystemExit(code)
"""


def workspace(root: Path, targets: int) -> None:
    (root / "src" / "gen").mkdir(parents=True)
    (root / "src" / "gen" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text(
        '[tool.precompile]\nsource-roots = ["src"]\nbackend = "eager"\n'
    )
    for start in range(0, targets, PER_FILE):
        body = HEADER + "".join(
            TARGET.format(i=i) for i in range(start, min(start + PER_FILE, targets))
        )
        (root / "src" / "gen" / f"targets_{start // PER_FILE}.py").write_text(body)


def _children(pid: int) -> set[int]:
    found, frontier = set(), {pid}
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier} - found
        found |= frontier
    return found


def _peak_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def check(root: Path, workers: int) -> dict[str, float]:
    """One `precompile check`: wall time, stats, engine and worker peak RSS (MB)."""
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-c", RUNNER, "check", "--format", "json", "--jobs", str(workers)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    worker_peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal worker_peak
        while not done.is_set():
            for pid in _children(process.pid):
                worker_peak = max(worker_peak, _peak_kb(pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = process.communicate()
    done.set()
    sampler.join()
    wall = time.monotonic() - started
    if process.returncode not in (0, 1):
        raise RuntimeError(err[-3000:])
    stats = json.loads(out)["stats"]
    engine_kb = next(
        int(line.split()[1]) for line in err.splitlines() if line.startswith("BENCH_ENGINE_PEAK_KB")
    )
    return {
        "wall": wall,
        "captures": stats["captures"],
        "cache_hits": stats["cache_hits"],
        "engine_mb": engine_kb / 1024,
        "worker_mb": worker_peak / 1024,
    }


def run_scale_section(workdir: Path, runs: int) -> str:
    rows = []
    for targets in SIZES:
        for workers in (1, 2):
            root = workdir / f"ws-{targets}-{workers}"
            workspace(root, targets)
            cold = check(root, workers)
            assert cold["captures"] == targets, cold
            warm_runs = [check(root, workers) for _ in range(max(runs, 1))]
            warm = sorted(warm_runs, key=lambda r: r["wall"])[len(warm_runs) // 2]
            assert warm["captures"] == 0 and warm["cache_hits"] == targets, warm
            for label, measured in (("cold", cold), ("unchanged", warm)):
                rows.append(
                    [
                        str(targets),
                        str(workers),
                        label,
                        f"{measured['wall']:.2f}",
                        f"{1000 * measured['wall'] / targets:.0f}",
                        f"{measured['engine_mb']:.0f}",
                        f"{measured['worker_mb']:.0f}" if label == "cold" else "-",
                    ]
                )
    unchanged_200 = [float(r[3]) for r in rows if r[0] == "200" and r[2] == "unchanged"]
    engine_200 = [float(r[5]) for r in rows if r[0] == "200" and r[2] == "unchanged"]
    return "\n\n".join(
        [
            "## `precompile check` at scale (issue 14)",
            f"Generated workspaces ({PER_FILE} eager-backend targets per file, a tiny Linear "
            f"model each). Each row is one fresh `precompile check` process: `cold` on an "
            f"empty result cache, `unchanged` a re-run with every result cached (median of "
            f"{max(runs, 1)}). RSS is peak (VmHWM): the engine process's, and the largest of "
            f"its worker processes'.",
            table(
                [
                    "targets",
                    "workers",
                    "cache",
                    "total (s)",
                    "per target (ms)",
                    "engine RSS (MB)",
                    "worker RSS (MB)",
                ],
                rows,
            ),
            f"Targets: `check` of 200 unchanged targets <= 1 s (**{max(unchanged_200):.2f} s**, "
            f"{'met' if max(unchanged_200) <= 1 else 'missed'}); engine RSS <= 80 MB "
            f"(**{max(engine_200):.0f} MB**, {'met' if max(engine_200) <= 80 else 'missed'}).",
        ]
    )
