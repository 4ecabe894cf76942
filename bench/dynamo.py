"""Multi-graph (Dynamo) artifacts: start-up in fresh processes and per-call dispatch."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import torch

from bench.harness import REPO, Child, fresh_process, fresh_processes, per_call_us, table
from bench.models import build, two_breaks

CAPTURE = """
import torch, logging, precompile, sys
sys.path.insert(0, {repo!r})
torch._logging.set_logs(dynamo=logging.ERROR)
from bench.models import build, two_breaks
model, x = build("mlp")
with precompile.capture(two_breaks, artifact_path={artifact!r}, cache_path={cache!r}, backend={backend!r}) as cap:
    cap(model, x)
    cap(model, torch.randn(16, 32))
print(cap.summary())
"""

CHILD_OURS = """
import warnings, logging; warnings.simplefilter("ignore")
import torch, precompile
torch._logging.set_logs(dynamo=logging.ERROR)
from bench.models import build
model, x = build("mlp")
run = precompile.load({artifact!r}, {cache!r})
run(model, x)
first_result()
"""

CHILD_COMPILE = """
import torch, logging
torch._logging.set_logs(dynamo=logging.ERROR)
from bench.models import build, two_breaks
model, x = build("mlp")
torch.compile(two_breaks, backend={backend!r})(model, x)
first_result()
"""


def _capture(backend: str, workdir: Path) -> tuple[str, str]:
    artifact, cache = (
        str(workdir / f"two_breaks-{backend}.py"),
        str(workdir / f"two_breaks-{backend}.cache"),
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CAPTURE.format(repo=str(REPO), artifact=artifact, cache=cache, backend=backend),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(workdir / "capture-cache")},
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return artifact, cache


def guard_runtime(artifact: str) -> str:
    """Which guards an artifact serves with (its GUARD_RUNTIME path)."""
    import precompile

    return str(precompile.inspect_artifact(artifact)["GUARD_RUNTIME"]["path"])


def _steady(backend: str, artifact: str, cache: str) -> dict[str, float]:
    import precompile

    torch._logging.set_logs(dynamo=logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = precompile.load(artifact, cache)
    model, x = build("mlp")
    torch._dynamo.reset()
    compiled = torch.compile(two_breaks, backend=backend)
    compiled(model, x)
    # The per-call trust check (hooks, module-level functions) on its own: part of
    # "our runnable".
    check = run._namespace["build_dependency_check"]()
    threads = torch.get_num_threads()
    # One intra-op thread: on a shared 2-core machine a second thread's waits swamp the
    # dispatch cost this measures (10x spread between runs).
    torch.set_num_threads(1)
    try:
        return per_call_us(
            {
                "our runnable": lambda: run(model, x),
                "torch.compile (warm)": lambda: compiled(model, x),
                "trust check": lambda: check((model, x), {}),
            },
            calls=500,
        )
    finally:
        torch.set_num_threads(threads)


def run_dynamo_section(workdir: Path, runs: int) -> str:
    warm = {"TORCHINDUCTOR_CACHE_DIR": str(workdir / "warm-cache")}

    def cold(run: int) -> dict[str, str]:
        return {"TORCHINDUCTOR_CACHE_DIR": str(workdir / f"cold-{run}-{os.urandom(4).hex()}")}

    contenders = {
        "`import torch`": Child("import torch\nfirst_result()\n"),
        "`import torch._dynamo.guards`": Child(
            "import torch, torch._dynamo.guards\nfirst_result()\n"
        ),
    }
    artifacts = {}
    for backend in ("eager", "inductor"):
        artifacts[backend] = _capture(backend, workdir)
        compile_child = CHILD_COMPILE.format(backend=backend)
        fresh_process(compile_child, runs=1, env=warm)  # fill the warm cache
        artifact, cache = artifacts[backend]
        contenders.update(
            {
                f"ours, {backend}: load + first call (with cache, empty Inductor cache)": Child(
                    CHILD_OURS.format(artifact=artifact, cache=cache), env_per_run=cold
                ),
                f"torch.compile({backend}) first call, cold cache": Child(
                    compile_child, env_per_run=cold
                ),
                f"torch.compile({backend}) first call, warm cache": Child(compile_child, warm),
            }
        )
    measured = fresh_processes(contenders, runs=runs)
    base = measured["`import torch`"]
    rows = [
        [label, r["first"], r["wall"], f"{r['first'] / base['first']:.2f}x"]
        for label, r in measured.items()
    ]
    findings = {
        backend: (
            measured[f"ours, {backend}: load + first call (with cache, empty Inductor cache)"][
                "first"
            ],
            measured[f"torch.compile({backend}) first call, warm cache"]["first"],
        )
        for backend in artifacts
    }
    call_rows = []
    for backend, (artifact, cache) in artifacts.items():
        us = _steady(backend, artifact, cache)
        call_rows.append(
            [backend, us["our runnable"], us["trust check"], us["torch.compile (warm)"]]
        )
    eager_ratio = findings["eager"][0] / base["first"]
    inductor_ratio = findings["inductor"][0] / base["first"]
    inductor_share = findings["inductor"][0] / findings["inductor"][1]
    guard_paths = ", ".join(
        f"{backend}: `{guard_runtime(artifact)}`" for backend, (artifact, _) in artifacts.items()
    )
    slower = [r[0] for r in call_rows if r[1] > r[3]]
    return "\n\n".join(
        [
            "## Multi-graph (Dynamo) artifacts (issue 4)",
            f"`bench.models.two_breaks` (three graphs, two breaks) captured with two batch sizes. "
            f"Fresh processes, median of {runs}, the contenders interleaved run by run; seconds "
            "from spawn to first result and to exit. The breaks are prints, as in user code. "
            f"Guards served by (`plain`: without importing torch._dynamo; `dynamo`: its "
            f"guard manager): {guard_paths}.",
            table(["what", "first result (s)", "process wall (s)", "vs import torch"], rows),
            "Steady-state dispatch, microseconds per call, interleaved in one process, one "
            "intra-op thread (median of 7 rounds of 500 calls). `trust check` is the part of "
            "each call that checks hooks and module-level functions (issue 17).",
            table(
                ["backend", "our runnable", "of which trust check", "torch.compile (warm)"],
                call_rows,
            ),
            f"Targets: eager backend load + first call <= 2.2x `import torch` (**{eager_ratio:.2f}x**, "
            f"{'met' if eager_ratio <= 2.2 else 'missed'}); Inductor with its cache <= 60% of torch.compile's "
            f"warm-cache first call (**{inductor_share:.0%}**, {'met' if inductor_share <= 0.6 else 'missed'}); "
            f"dispatch no slower than torch.compile ({'met' if not slower else 'missed for ' + ', '.join(slower)}). "
            f"Issue 14: eager <= 1.2x (**{eager_ratio:.2f}x**, {'met' if eager_ratio <= 1.2 else 'missed'}), "
            f"Inductor with its cache <= 1.3x `import torch` (**{inductor_ratio:.2f}x**, "
            f"{'met' if inductor_ratio <= 1.3 else 'missed'}).",
        ]
    )
