"""Issue 29: the parts of a served Dynamo call's driver, finer than the per-call section's
breakdown: the frame's guard check and the dependency epoch, each group of checks timed
alone on the MLP of ``bench.percall`` (Inductor backend, grad off), best of interleaved
rounds. Why the Dynamo + Inductor call stays above the raw Inductor call + 3 us is what
these rows say: no part is large, each is a handful of Python-level checks.

    python -m bench.dynamo_parts > bench/results/percall_dyn5.md

The pieces are reached through the loaded artifact's closures (its frame dispatcher's
guard object, the dependency epoch's state), as ``bench.percall`` reaches them; each
lambda below evaluates what the driver's own expression evaluates.
"""

from __future__ import annotations

import logging
import operator
import platform
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch


def parts(workdir: Path) -> list[list[Any]]:
    """Each part timed alone, grad off; rows of (piece, microseconds)."""
    from bench import percall

    run, model, x, _calls, _rounds = percall._capture("mlp", "dynamo", "inductor", workdir)
    for _ in range(3):
        run(model, x)  # the epoch takes its state on a call
    outer = percall._cells(run._forward)
    entry = (
        outer["entry"]
        if "entry" in outer
        else percall._cells(outer["_entry_or_stand_ins"])["entry"]
    )
    frame = percall._cells(entry)
    guards = frame["only"].__self__
    f_locals = dict(zip(frame["positional"], (model, x)))
    found = guards._fast(f_locals, None)
    assert found is not None, "the MLP's guards fail on its own example"

    epoch = outer["check"]
    state = percall._cells(epoch)
    now = state["state"][0]
    positions, instance_dict = state["positions"], state["instance_dict"]
    version = torch._C._dynamo.guards.dict_version
    args = (model, x)
    is_, call = operator.is_, operator.call
    pieces = {
        "served call": lambda: run(model, x),
        "raw Inductor call": percall._recorded_graph(run, model, x),
        "frame guard check, whole (as dispatched)": lambda: guards.check(f_locals),
        "  its tree: dict reads, type/identity/marking leaves": lambda: guards._fast(
            f_locals, None
        ),
        "  its TENSOR_MATCH leaves (one TensorGuards call)": lambda: guards._tensors_hold(found),
        "  its epilogue": lambda: guards._epilogue_holds(f_locals),
        "dependency epoch, whole": lambda: epoch(args, {}),
        f"  argument identities ({len(now[0])})": lambda: all(
            map(is_, map(call, now[0]), map(args.__getitem__, positions))
        ),
        f"  version tags of watched dicts ({len(now[1])})": lambda: tuple(map(version, now[1]))
        == now[2],
        f"  empty hook dicts still empty ({len(now[3])})": lambda: not any(now[3]),
        f"  modules' instance dicts, identity ({len(now[4])})": lambda: all(
            map(is_, map(instance_dict, now[4]), now[5])
        ),
        f"  keyed objects: classes' MROs, the kernel registry ({sum(map(len, now[6][1]))})": (
            lambda: list(map(tuple, map(map, now[6][0], now[6][1]))) == now[6][2]
        ),
        f"  instance dicts' version tags ({len(now[5])})": lambda: tuple(map(version, now[5]))
        != now[7],
    }
    with torch.no_grad():
        us = percall.best_per_call_us(pieces, rounds=60, calls=300)
    run.unload()
    return [[name, value] for name, value in us.items()]


def main() -> None:
    from bench.harness import table

    warnings.simplefilter("ignore")
    torch._logging.set_logs(dynamo=logging.ERROR)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as directory, torch.no_grad():
        rows = parts(Path(directory))
    print(
        "\n".join(
            [
                "## The Dynamo Inductor served call's driver, part by part (issue 29)",
                "",
                "The MLP of the per-call section, Dynamo with Inductor, grad off: "
                "microseconds per call of each part of the driver timed alone, best of 60 "
                "interleaved rounds of 300 calls, one thread (indented rows are parts of "
                "the row above them, each timed on its own, so they do not add up exactly "
                "to it).",
                "",
                table(["piece", "us per call"], rows),
                "",
                f"Machine: Python {platform.python_version()}, torch {torch.__version__}. "
                "Command: `python -m bench.dynamo_parts > bench/results/percall_dyn5.md`.",
            ]
        )
    )


if __name__ == "__main__":
    main()
