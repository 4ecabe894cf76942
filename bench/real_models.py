"""Dynamo + Inductor artifacts of a real model: ResNet-18 (torchvision's layout, written
out in bench/models.py) for inference at two batch sizes and as a training step.
Start-up in fresh processes with an empty Inductor cache, counting every process the
load starts (a compiler run would be one); torch.compile with a warm cache beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.dynamo import guard_runtime
from bench.harness import PRELUDE, REPO, Child, fresh_process, fresh_processes, table

SIZE = 112  # image side: ResNet-18's layout and kernels, a quarter of 224's compile time

MODELS = f"""
import torch, logging
from torch import nn
torch._logging.set_logs(dynamo=logging.ERROR)
from bench.models import ResNet18, infer, train_step

def build(kind, batch):
    torch.manual_seed(0)
    model = ResNet18(num_classes=10)
    model = model.train() if kind == "train" else model.eval()
    x = torch.randn(batch, 3, {SIZE}, {SIZE})
    args = (model, x, torch.randint(0, 10, (batch,))) if kind == "train" else (model, x)
    return (train_step if kind == "train" else infer), args
"""

CAPTURE = (
    MODELS
    + """
import precompile
fn, _ = build({kind!r}, 1)
with precompile.capture(fn, artifact_path={artifact!r}, cache_path={cache!r},
                        backend="inductor", training={kind!r} == "train") as cap:
    for batch in {batches!r}:
        cap(*build({kind!r}, batch)[1])
"""
)

#: Counts every process the child starts (a compiler run is one), printed as JSON.
SPY = """
import os as _o, subprocess as _s
_spawned = []
_popen = _s.Popen.__init__
def _record(self, *a, **k):
    _spawned.append(str(a[0] if a else k.get("args")))
    return _popen(self, *a, **k)
_s.Popen.__init__ = _record
for _n in ("fork", "posix_spawn", "posix_spawnp"):
    setattr(_o, _n, lambda *a, _f=getattr(_o, _n), _m=_n, **k: (_spawned.append(_m), _f(*a, **k))[1])
"""

CHILD_OURS = (
    MODELS
    + """
import warnings, json, precompile
warnings.simplefilter("ignore")
fn, args = build({kind!r}, 1)
run = precompile.load({artifact!r}, {cache!r})
run(*args)
first_result()
"""
)

CHILD_COMPILE = (
    MODELS
    + """
fn, args = build({kind!r}, 1)
torch.compile(fn)(*args)
first_result()
"""
)


#: AOTInductor beside ours for inference (it serves no training step): the model exported
#: with a dynamic batch (one package serves batch 1 and 2), compiled ahead of time.
AOTI_COMPILE = (
    MODELS
    + """
_, (model, x) = build("infer", 2)
batch = torch.export.Dim("batch", min=1, max=16)
program = torch.export.export(model, (x,), dynamic_shapes=({{0: batch}},))
torch._inductor.aoti_compile_and_package(program, package_path={path!r})
"""
)

CHILD_AOTI = (
    MODELS
    + """
_, (model, x) = build("infer", 1)
run = torch._inductor.aoti_load_package({path!r})
run(x)
first_result()
"""
)


def _aoti_compile(workdir: Path) -> str:
    path = str(workdir / "resnet-infer.pt2")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(workdir / "capture-aoti")}
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + AOTI_COMPILE.format(path=path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return path


def _capture(kind: str, batches: list[int], workdir: Path) -> tuple[str, str]:
    artifact, cache = str(workdir / f"resnet-{kind}.py"), str(workdir / f"resnet-{kind}.cache")
    code = CAPTURE.format(kind=kind, artifact=artifact, cache=cache, batches=batches)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(workdir / f"capture-{kind}")}
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + code], capture_output=True, text=True, env=env, cwd=REPO
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return artifact, cache


def _spawned(script: str, workdir: Path) -> list[str]:
    """The processes one load + first call starts, with empty Inductor folders."""
    empty = workdir / f"spy-{os.urandom(4).hex()}"
    (empty / "tmp").mkdir(parents=True)
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(empty / "inductor"),
        "TMPDIR": str(empty / "tmp"),
    }
    code = PRELUDE.replace("def first_result():", "def _unused():") + SPY + script
    code += "\nprint('SPAWNED', json.dumps(_spawned))\n"
    code = code.replace("first_result()\n", "")
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    line = next(x for x in proc.stdout.splitlines() if x.startswith("SPAWNED "))
    return json.loads(line.split(" ", 1)[1])


def run_real_models_section(workdir: Path, runs: int) -> str:
    def cold(run: int) -> dict[str, str]:
        fresh = workdir / f"cold-{run}-{os.urandom(4).hex()}"
        (fresh / "tmp").mkdir(parents=True)
        return {"TORCHINDUCTOR_CACHE_DIR": str(fresh / "inductor"), "TMPDIR": str(fresh / "tmp")}

    warm = {"TORCHINDUCTOR_CACHE_DIR": str(workdir / "warm-cache")}
    contenders = {"`import torch`": Child("import torch\nfirst_result()\n")}
    spawned = {}
    guard_paths = {}
    for kind, batches, label in (
        ("infer", [1, 2], "inference, batch 1 and 2"),
        ("train", [1], "training step"),
    ):
        artifact, cache = _capture(kind, batches, workdir)
        guard_paths[label] = guard_runtime(artifact)
        ours = CHILD_OURS.format(kind=kind, artifact=artifact, cache=cache)
        spawned[label] = _spawned(ours, workdir)
        compile_child = CHILD_COMPILE.format(kind=kind)
        fresh_process(compile_child, runs=1, env=warm)  # fill the warm cache
        contenders[f"ours, {label}: load + first call (with cache)"] = Child(ours, env_per_run=cold)
        contenders[f"torch.compile, {label}: first call, warm cache"] = Child(compile_child, warm)
        if kind == "infer":
            contenders[f"AOTInductor, {label}: load + first call"] = Child(
                CHILD_AOTI.format(path=_aoti_compile(workdir)), env_per_run=cold
            )
    measured = fresh_processes(contenders, runs=runs)
    base = measured["`import torch`"]["first"]
    rows = []
    for name, r in measured.items():
        label = next((k for k in spawned if f", {k}:" in name and name.startswith("ours")), None)
        processes = "-" if label is None else str(len(spawned[label]))
        rows.append([name, r["first"], r["wall"], f"{r['first'] / base:.2f}x", processes])
    ours_rows = {
        k: measured[f"ours, {k}: load + first call (with cache)"]["first"] for k in spawned
    }
    verdict = "; ".join(
        f"{k}: **{v / base:.2f}x**, {len(spawned[k])} processes "
        f"({'met' if v / base <= 1.5 and not spawned[k] else 'missed'})"
        for k, v in ours_rows.items()
    )
    return "\n\n".join(
        [
            "## Real models: ResNet-18 with Dynamo + Inductor (issue 14)",
            f"bench.models.ResNet18 (10 classes, {SIZE}x{SIZE} images), captured with "
            "DynamoTracer and Inductor: inference at batch 1 and 2 (a second variant), and a "
            "training step (cross-entropy, backward inside fn). Fresh processes, median of "
            f"{runs}, the contenders interleaved run by run; ours with an empty "
            "TORCHINDUCTOR_CACHE_DIR and TMPDIR each run. `processes` = processes the load and "
            "first call started (a compiler run is one), counted in a separate run.",
            table(
                ["what", "first result (s)", "process wall (s)", "vs import torch", "processes"],
                rows,
            ),
            f"Targets: load + first call <= 1.5x `import torch` with 0 processes -- {verdict}. "
            "Guards served by (`plain`: without importing torch._dynamo; `dynamo`: its guard "
            "manager): " + ", ".join(f"{k}: `{v}`" for k, v in guard_paths.items()) + ".",
        ]
    )
