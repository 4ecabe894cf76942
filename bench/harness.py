"""Timing helpers: fresh-process runs and interleaved in-process loops.

A fresh-process run reports two times from the moment of spawn: until the child has its
first result (it prints a marker), and until the process has exited (what a CLI user or a
serverless cold start pays).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIRST_RESULT = "BENCH_FIRST_RESULT"

#: Prepended to every child script: ``first_result()`` prints the marker with the time
#: elapsed since the parent spawned the process.
PRELUDE = f"""\
import os as _os, sys as _sys, time as _time
_sys.path.insert(0, {str(REPO)!r})
def first_result():
    print("{FIRST_RESULT}", _time.time() - float(_os.environ["BENCH_T0"]), flush=True)
"""


def fresh_process(
    script: str,
    *,
    runs: int,
    env: dict[str, str] | None = None,
    env_per_run: Callable[[int], dict[str, str]] | None = None,
) -> dict[str, float]:
    """Median seconds to first result and to exit over ``runs`` fresh processes.
    ``env_per_run(i)`` adds variables for run ``i`` (e.g. an empty cache directory)."""
    firsts, walls = [], []
    code = PRELUDE + textwrap.dedent(script)
    for run in range(runs):
        child_env = {**os.environ, **(env or {}), **(env_per_run(run) if env_per_run else {})}
        t0 = time.time()
        child_env["BENCH_T0"] = repr(t0)
        proc = subprocess.run(
            [sys.executable, "-c", code], env=child_env, capture_output=True, text=True, cwd=REPO
        )
        wall = time.time() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"benchmark child failed:\n{proc.stderr[-3000:]}")
        marks = [
            line.split()[1] for line in proc.stdout.splitlines() if line.startswith(FIRST_RESULT)
        ]
        firsts.append(float(marks[0]) if marks else wall)
        walls.append(wall)
    return {"first": statistics.median(firsts), "wall": statistics.median(walls), "runs": runs}


def per_call_us(
    contenders: dict[str, Callable[[], Any]], *, rounds: int = 7, calls: int = 2000
) -> dict[str, float]:
    """Median microseconds per call, the contenders interleaved round by round so that
    drift (frequency scaling, other load) hits them all alike."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for fn in contenders.values():  # warm-up
        for _ in range(50):
            fn()
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
