"""Per-call cost of the library-surface check (``LIBRARY_SURFACE``, issue 26) on the MLP
and ResNet-18 shaped models, both tracers.

Captures each model, reads the artifact's ``LIBRARY_SURFACE`` rows, builds the very check
the artifact runs (``precompile.surface_checks._build_surface_check``, with the
prelude's ``_dict_version``) and times one call of it: what the check adds to each
served call (before it, nothing ran in its place). Run: ``python -m bench.surface``.
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
from precompile import surface_checks
from precompile._compat import prelude


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


def main() -> None:
    warnings.simplefilter("ignore")
    torch._logging.set_logs(dynamo=logging.ERROR)
    print("| model | tracer | surface rows | owners (modules, classes) | added per call (us) |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as directory:
        for name in ("mlp", "resnet18"):
            for tracer in (precompile.MakeFxTracer, precompile.DynamoTracer):
                model, x = build(name)
                paths = Path(directory) / f"{name}-{tracer.__name__}.py"
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
                print(f"| {name} | {tracer.__name__} | {len(rows)} | {len(owners)} | {cost:.3f} |")


if __name__ == "__main__":
    main()
