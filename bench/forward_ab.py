"""A/B of the served MLP call's artifact forward (driver + graph, no serving wrapper)
between two source trees, for refactors that must keep per-call speed (issue 25).

    git archive BASE core bench | tar -x -C /tmp/before
    for r in 1 2 3; do
        PYTHONPATH=/tmp/before/core python bench/forward_ab.py /tmp/before
        PYTHONPATH=$PWD/core python bench/forward_ab.py $PWD
    done

Each run captures the MLP of ``bench.percall`` with make_fx and Dynamo (eager backend;
``python bench/forward_ab.py TREE inductor make_fx`` picks the backend and the tracers)
and times ``run._forward`` and the served call ``run(model, x)`` (the serving wrapper too)
against the raw graph, interleaved, best of 120 rounds of 100 calls (short rounds: on a
loaded machine the best falls in a quiet moment). Prints one JSON object; compare the
best of the runs of each side.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import warnings
from functools import partial
from pathlib import Path


def main(tree: str, backend: str = "eager", tracers: str = "make_fx,dynamo") -> None:
    sys.path.insert(0, tree)  # the tree's bench package (its percall helpers)
    import torch

    from bench import percall

    warnings.simplefilter("ignore")
    torch._logging.set_logs(dynamo=logging.ERROR)
    torch.set_num_threads(1)
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for tracer in tracers.split(","):
            run, model, x, _calls, _rounds = percall._capture("mlp", tracer, backend, Path(workdir))
            for grad in (False, True):
                with torch.set_grad_enabled(grad):
                    raw = percall._recorded_graph(run, model, x)
                    out[f"{tracer}/{backend}/grad {'on' if grad else 'off'}"] = (
                        percall.best_per_call_us(
                            {
                                "forward": partial(run._forward, model, x),
                                "served": partial(run, model, x),
                                "raw": raw,
                            },
                            rounds=120,
                            calls=100,
                            warmup=15,
                        )
                    )
            run.unload()
    print(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:4])
