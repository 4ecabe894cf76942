"""Per-call cost of the library-surface check (``LIBRARY_SURFACE``, issue 26) on the MLP
and ResNet-18 shaped models, both tracers.

Captures each model, reads the artifact's ``LIBRARY_SURFACE`` rows, builds the very check
the artifact runs (``precompile.runtime.surface_checks._build_surface_check``, with the
prelude's ``_dict_version``) and times one call of it: what the check adds to each
served call (before it, nothing ran in its place). Run: ``python bench/run.py surface`` (or ``python -m bench.surface``).
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import timeit
import warnings
from pathlib import Path

import torch

import precompile
from bench.models import build, infer
from precompile._compat import prelude
from precompile.runtime import surface_checks


def added_us(rows: list[dict[str, object]], rounds: int = 7, number: int = 100_000) -> float:
    namespace = vars(surface_checks)
    namespace["LIBRARY_SURFACE"] = rows
    bound: dict[str, object] = {}
    exec(prelude.ARTIFACT_PRELUDE, bound)  # the names an artifact's runtime reads
    namespace["_dict_version"] = bound["_dict_version"]
    check = surface_checks._build_surface_check()
    if check is None:
        return 0.0
    times = [timeit.timeit(check, number=number) / number * 1e6 for _ in range(rounds)]
    return statistics.median(times)


def run_surface_section(workdir: Path, runs: int) -> str:
    """The section of bench/RESULTS.md: each model and tracer's surface rows, the
    namespaces they are watched through, and what the check adds per call. ``runs`` is
    unused: one process times every row (rounds of calls, median)."""
    warnings.simplefilter("ignore")
    torch._logging.set_logs(dynamo=logging.ERROR)
    lines = [
        "## Library surface check (issue 26)",
        "",
        "What the `LIBRARY_SURFACE` check adds to each served call (both tracers, eager "
        "backend): the check the artifact builds (`precompile/runtime/surface_checks.py`) from the "
        "captured rows, timed alone (median of 7 rounds of 100000 calls). Before this change "
        "nothing ran in its place (0 us added); the graph's own call is unchanged.",
        "",
        "| model | tracer | surface rows | owners (modules, classes) | added per call (us) |",
        "|---|---|---|---|---|",
    ]
    mlp: list[float] = []
    for name in ("mlp", "resnet18"):
        for tracer in (precompile.MakeFxTracer, precompile.DynamoTracer):
            model, x = build(name)
            paths = workdir / f"{name}-{tracer.__name__}.py"
            with precompile.capture(
                infer,
                artifact_path=paths,
                cache_path=paths.with_suffix(".cache"),
                tracer=tracer(),
                backend="eager",
            ) as cap:
                cap(model, x)
            rows = precompile.inspect_artifact(paths)["LIBRARY_SURFACE"]
            owners = {(r["module"], r["class"]) for r in rows}
            cost = added_us(rows)
            if name == "mlp":
                mlp.append(cost)
            lines.append(
                f"| {name} | {tracer.__name__} | {len(rows)} | {len(owners)} | {cost:.3f} |"
            )
    lines += ["", f"Target: <= 2 us added per call on the MLP (**{max(mlp):.2f} us** at most)."]
    return "\n".join(lines)


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        print(run_surface_section(Path(directory), 1))


if __name__ == "__main__":
    main()
