"""Shards side by side: N cold eager targets as one `precompile check` vs four
`precompile check --shard K/4` processes run at once (one worker each), then
`precompile merge`. On a machine with fewer cores than shards the four compete for
them; on a CI matrix each shard has a runner of its own.

Run: ``python -m bench.shards [--targets N] [--runs R]`` (or ``python bench/run.py shards``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import REPO, table
from bench.scale import workspace

SHARDS = 4
TARGETS = 40
NOTE = (
    "Read: with 2 cores, 4 shards cannot beat one process: each pays its own engine "
    "start and a worker's torch import, and the four share the cores (and this machine "
    "is shared with other jobs, so the numbers are noisy). What sharding buys is "
    "runners, not cores: on a matrix of 4 runners each shard's wall time is about a "
    "quarter of the captures plus one start."
)


def _env() -> dict[str, str]:
    paths = [str(REPO / "core"), str(REPO / "server"), str(REPO)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _cli(root: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "precompile_lsp.cli", *args],
        cwd=root,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate()
    if process.returncode not in (0, 1):
        raise RuntimeError(err[-3000:])
    return out


def one_shard(root: Path) -> tuple[float, list[dict[str, object]]]:
    started = time.monotonic()
    out = _finish(_cli(root, "check", "--format", "json", "--jobs", "1", "--no-cache"))
    return time.monotonic() - started, json.loads(out)["findings"]


def four_shards(root: Path) -> tuple[float, list[dict[str, object]]]:
    started = time.monotonic()
    reports = [root.parent / f"{root.name}-shard{k}.json" for k in range(1, SHARDS + 1)]
    processes = [
        _cli(
            root,
            "check",
            "--format",
            "json",
            "--jobs",
            "1",
            "--no-cache",
            "--shard",
            f"{k}/{SHARDS}",
            "--shard-balance",
            "count",
            "--output",
            str(report),
        )
        for k, report in enumerate(reports, 1)
    ]
    for process in processes:
        _finish(process)
    merged = _finish(_cli(root, "merge", *map(str, reports)))
    return time.monotonic() - started, json.loads(merged)["findings"]


def run_shards_section(workdir: Path, runs: int, targets: int = TARGETS) -> str:
    rows = []
    for label, measure in (("1 shard", one_shard), (f"{SHARDS} shards side by side", four_shards)):
        walls = []
        for run in range(max(runs, 1)):
            root = workdir / f"shards-{label[0]}-{run}"
            workspace(root, targets)
            wall, findings = measure(root)
            assert findings == [], findings  # every generated target captures cleanly
            walls.append(wall)
        walls.sort()
        rows.append(
            [
                label,
                str(targets),
                f"{walls[len(walls) // 2]:.2f}",
                f"{1000 * walls[len(walls) // 2] / targets:.0f}",
            ]
        )
    cores = os.cpu_count()
    return "\n\n".join(
        [
            "## Shards side by side (issue 28)",
            f"{targets} cold eager targets (a generated workspace, 10 tiny Linear targets per "
            f"file, `--no-cache`), one `precompile check --jobs 1` vs {SHARDS} "
            f"`precompile check --jobs 1 --shard K/{SHARDS}` processes started at once, "
            f"timed until `precompile merge` has written the merged report (median of "
            f"{max(runs, 1)}). This machine has {cores} cores, so the {SHARDS} shards (each "
            f"an engine and a worker that imports torch) compete for them; on a CI matrix "
            f"each has a runner of its own. {targets} targets, not 200, to fit the time "
            f"this machine is shared for.",
            table(["run", "targets", "wall (s)", "per target (ms)"], rows),
            NOTE,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--targets", type=int, default=TARGETS)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        print(run_shards_section(Path(workdir), args.runs, args.targets))


if __name__ == "__main__":
    main()
