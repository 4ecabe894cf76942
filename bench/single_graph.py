"""Single-graph artifacts: start-up cost in fresh processes and per-call overhead."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

from bench.harness import REPO, fresh_process, per_call_us, table
from bench.models import MODELS, build, infer

CHILD_OURS = """
import warnings; warnings.simplefilter("ignore")
import precompile
from bench.models import build
model, x = build({name!r})
run = precompile.load({artifact!r}, {cache!r})
run(model, x)
first_result()
"""

CHILD_EAGER = """
import torch
from bench.models import build, infer
model, x = build({name!r})
infer(model, x)
first_result()
"""

CHILD_AOT_LOAD = """
import torch
from bench.models import build
model, x = build({name!r})
fn = torch.compiler.load_compiled_function(open({path!r}, "rb"))
fn(model, x)
first_result()
"""

AOT_COMPILE = """
import torch, sys
sys.path.insert(0, {repo!r})
from bench.models import build, infer
model, x = build({name!r})
torch.compile(infer, fullgraph=True).aot_compile(((model, x), {{}})).save_compiled_function({path!r})
"""


def capture(name: str, backend: str, workdir: Path) -> tuple[str, str]:
    import precompile

    artifact, cache = (
        str(workdir / f"{name}-{backend}.py"),
        str(workdir / f"{name}-{backend}.cache"),
    )
    model, x = build(name)
    with precompile.capture(
        infer,
        artifact_path=artifact,
        cache_path=cache,
        tracer=precompile.MakeFxTracer(),
        backend=backend,
    ) as cap:
        cap(model, x)
    return artifact, cache


def aot_compile(name: str, workdir: Path, inductor_cache: Path) -> str:
    path = str(workdir / f"{name}-aot.bin")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache)}
    subprocess.run(
        [sys.executable, "-c", AOT_COMPILE.format(repo=str(REPO), name=name, path=path)],
        env=env,
        check=True,
        capture_output=True,
    )
    return path


def import_torch(runs: int) -> dict[str, float]:
    return fresh_process("import torch\nfirst_result()\n", runs=runs)


def steady_state(name: str, artifact: str, cache: str) -> dict[str, float]:
    import precompile

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = precompile.load(artifact, cache)
    model, x = build(name)
    raw = run._namespace["call"]
    state = [*model.parameters(), *model.buffers()]
    return per_call_us(
        {
            "eager module": lambda: infer(model, x),
            "our runnable": lambda: run(model, x),
            "raw inlined call": lambda: raw([*state, x]),
        }
    )


def run_eager_section(workdir: Path, runs: int) -> str:
    base = import_torch(runs)
    inductor_cache = workdir / "inductor-cache"
    start_rows, call_rows = [], []
    for name in MODELS:
        artifact, cache = capture(name, "eager", workdir)
        aot = aot_compile(name, workdir, inductor_cache)
        env = {"TORCHINDUCTOR_CACHE_DIR": str(inductor_cache)}
        fresh_process(CHILD_AOT_LOAD.format(name=name, path=aot), runs=1, env=env)  # warm it
        results = {
            "`python -c 'import torch'`": base,
            "our eager artifact: load + first call": fresh_process(
                CHILD_OURS.format(name=name, artifact=artifact, cache=cache), runs=runs
            ),
            "eager module: first call": fresh_process(CHILD_EAGER.format(name=name), runs=runs),
            "torch aot_compile + load_compiled_function (warm)": fresh_process(
                CHILD_AOT_LOAD.format(name=name, path=aot), runs=runs, env=env
            ),
        }
        for label, r in results.items():
            start_rows.append(
                [name, label, r["first"], r["wall"], f"{r['first'] / base['first']:.2f}x"]
            )
        us = steady_state(name, artifact, cache)
        overhead = us["our runnable"] - us["raw inlined call"]
        call_rows.append(
            [name, us["eager module"], us["our runnable"], us["raw inlined call"], overhead]
        )
    mlp_overhead = call_rows[0][4]
    mlp_start = next(r for r in start_rows if r[0] == "mlp" and r[1].startswith("our"))
    ratio = mlp_start[2] / base["first"]
    return "\n\n".join(
        [
            "## Single graph, eager backend (issue 2)",
            f"Fresh processes, median of {runs}; seconds from spawn to first result and to exit; "
            "`ratio` is time to first result over the `import torch` process's.",
            table(["model", "what", "first result (s)", "process wall (s)", "ratio"], start_rows),
            "Steady state, microseconds per call, interleaved in one process (median of 7 rounds "
            "of 2000 calls). `overhead` = our runnable minus the raw inlined `call`.",
            table(
                ["model", "eager module", "our runnable", "raw inlined call", "overhead"], call_rows
            ),
            f"Targets: load + first call <= 1.1x `import torch` (MLP: **{ratio:.2f}x**, "
            f"{'met' if ratio <= 1.1 else 'missed'}); driver overhead <= 10 us for the MLP "
            f"(**{mlp_overhead:.1f} us**, {'met' if mlp_overhead <= 10 else 'missed'}).",
        ]
    )
