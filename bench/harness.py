"""Timing helpers: fresh-process runs and interleaved in-process loops.

A fresh-process run reports two times from the moment of spawn: until the child has its
first result (it prints a marker), and until the process has exited (what a CLI user or a
serverless cold start pays).
"""

from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass
class Child:
    """One fresh-process contender: its script and environment. ``env_per_run(i)`` adds
    variables for run ``i`` (e.g. an empty cache directory)."""

    script: str
    env: dict[str, str] | None = None
    env_per_run: Callable[[int], dict[str, str]] | None = None


def _spawn(child: Child, run: int) -> tuple[float, float]:
    child_env = {**os.environ, **(child.env or {})}
    # Python caches every module's bytecode on a user's machine; a sandbox that turns
    # that off would time compiling this project's modules from source in every child.
    child_env.pop("PYTHONDONTWRITEBYTECODE", None)
    child_env.update(child.env_per_run(run) if child.env_per_run else {})
    t0 = time.time()
    child_env["BENCH_T0"] = repr(t0)
    code = PRELUDE + textwrap.dedent(child.script)
    proc = subprocess.run(
        [sys.executable, "-c", code], env=child_env, capture_output=True, text=True, cwd=REPO
    )
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{proc.stderr[-3000:]}")
    marks = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith(FIRST_RESULT)]
    return (float(marks[0]) if marks else wall), wall


def fresh_processes(contenders: dict[str, Child], *, runs: int) -> dict[str, dict[str, float]]:
    """Median seconds to first result and to exit over ``runs`` fresh processes per
    contender, the contenders interleaved run by run so that drift (frequency scaling,
    page cache, other load) hits them all alike."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for run in range(runs):
        for name, child in contenders.items():
            samples[name].append(_spawn(child, run))
    return {
        name: {
            "first": statistics.median(first for first, _ in values),
            "wall": statistics.median(wall for _, wall in values),
            "runs": runs,
        }
        for name, values in samples.items()
    }


def fresh_process(
    script: str,
    *,
    runs: int,
    env: dict[str, str] | None = None,
    env_per_run: Callable[[int], dict[str, str]] | None = None,
) -> dict[str, float]:
    """``fresh_processes`` for one contender."""
    return fresh_processes({"": Child(script, env, env_per_run)}, runs=runs)[""]


def per_call_us(
    contenders: dict[str, Callable[[], Any]],
    *,
    rounds: int = 7,
    calls: int = 2000,
    warmup: int = 50,
) -> dict[str, float]:
    """Median microseconds per call, the contenders interleaved round by round so that
    drift (frequency scaling, other load) hits them all alike."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for fn in contenders.values():  # warm-up
        for _ in range(warmup):
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
