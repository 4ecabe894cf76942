"""The make_fx mutation matrix: tiny models x changes made after capture.

Each model is captured here from a private copy of ``tests/fixtures/fx_trust_models.py``;
its artifact is loaded in ONE fresh process (``tests/fixtures/fx_trust_cells.py``), which
makes every change there and compares the served call with eager. Every cell must be
``exact`` (the eager answer) or ``refused`` with a PrecompileError naming the change --
never ``wrong``. Changes that only touch tensor values must be served exactly.

Issue 26's classes run in the same harness (``ISSUE26_MODELS``, the eager backend and one
model under Inductor): a torch function replaced before or after load, a torch mode,
autocast, deterministic algorithms or the default dtype changed around the call, and
inputs aliased unlike at capture -- each ``exact`` or ``refused`` naming the change; and
the no-op changes serving code always makes (grad and inference mode, ``requires_grad_``,
``eval()`` again, a Parameter or another layout as input, dict keys reordered,
``ReLU.inplace``, an unused buffer, ``train()`` where nothing depends on it, observers) --
each served exactly (but ``FlopCounterMode`` under Inductor, whose kernels dispatch nothing
it could count: refused, saying so).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.fixtures.serving_changes import CONTEXT, INFERENCE_NO_OPS, LIBRARY, NO_OPS
from tests.harness import REPO, capture_pair, run_job

FIXTURE = REPO / "tests" / "fixtures" / "fx_trust_models.py"

#: cell -> words the refusal must contain; None: must be served exactly.
CELLS: dict[str, tuple[str, ...] | None] = {
    "unchanged": None,
    "new weights": None,
    "replaced parameter": None,
    "forward hook": ("forward hooks", "re-emit"),
    "forward pre-hook": ("forward pre-hooks",),
    "global module hook": ("global module hooks",),
    "replaced global hook dict": ("global module hooks",),
    "eps": ("eps = 0.5", "1e-05"),
    "user attribute": ("scale = 3.0",),
    "global float": ("TEMPERATURE", "2.0"),
    "global list": ("OFFSETS",),
    "swap activation": ("SiLU",),
    "training flag": ("mode",),
    "instance forward": ("'forward'",),
    "monkeypatched method": ("forward", "class attribute or method"),
    "source:forward": ("forward", "changed", "re-emit"),
    "source:helper": ("shift", "changed"),
}
MODEL_CELLS: dict[str, dict[str, tuple[str, ...] | None]] = {
    "convbn": {"config object": ("cfg",), "class attribute": ("ConvBNNet.bias_shift is 1.0",)},
    # The step's loss module comes from the factory that defines the step.
    "train_step": {
        "source:factory": ("make_train_step", "changed"),
        # Linear, ReLU and LayerNorm never read their training flag: the graph does not
        # depend on it, so train()/eval() is served, compared with eager (issue 26).
        "training flag": None,
    },
}


def copy_fixture(directory: Path) -> tuple[ModuleType, str]:
    """A private copy of the fixture module (its source is edited by some cells)."""
    name = f"trust_models_{uuid.uuid4().hex[:8]}"
    path = directory / f"{name}.py"
    shutil.copyfile(FIXTURE, path)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module, name


def capture_model(
    module: ModuleType, model: str, directory: Path, hooked: bool = False, backend: str = "eager"
) -> tuple[str, str]:
    _, fn, _, training, _ = module.MODELS[model]
    built, args = module.build(model)
    if hooked:
        next(iter(built.children())).register_forward_hook(module.double_output)
    return capture_pair(
        fn, built, *args, directory=directory, name=model, training=training, backend=backend
    )


def run_cells(
    directory: Path,
    module_name: str,
    model: str,
    paths: tuple[str, str],
    cells: list[str],
    **extra: Any,
) -> dict[str, dict[str, str]]:
    job = {
        "artifact": paths[0],
        "cache": paths[1],
        "path": str(directory),
        "module": module_name,
        "model": model,
        "cells": cells,
        **extra,
    }
    results: dict[str, dict[str, str]] = run_job(
        "tests.fixtures.fx_trust_cells", job, directory / f"job-{model}.json"
    )
    return results


def check(results: dict[str, dict[str, str]], expected: dict[str, tuple[str, ...] | None]) -> None:
    problems = []
    for cell, words in expected.items():
        got = results[cell]
        if words is None:
            if got["result"] != "exact":
                problems.append(f"{cell}: expected exact, got {got}")
        elif got["result"] != "refused" or not all(w in got["message"] for w in words):
            problems.append(f"{cell}: expected a refusal naming {words}, got {got}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("model", ["convbn", "transformer", "lstm", "train_step"])
def test_every_mutation_is_served_exactly_or_refused(model: str, tmp_path: Path) -> None:
    module, name = copy_fixture(tmp_path)
    paths = capture_model(module, model, tmp_path)
    expected = {**CELLS, **MODEL_CELLS.get(model, {})}
    check(run_cells(tmp_path, name, model, paths, list(expected)), expected)


def test_a_hook_present_at_capture_must_be_present_when_serving(tmp_path: Path) -> None:
    module, name = copy_fixture(tmp_path)
    paths = capture_model(module, "convbn", tmp_path, hooked=True)
    expected: dict[str, tuple[str, ...] | None] = {
        "unchanged": None,  # the same hook function, registered in the serving process
        "new weights": None,
        "remove hooks": ("forward hooks", "captured with 1", "trust_models"),
    }
    check(run_cells(tmp_path, name, "convbn", paths, list(expected), hooked=True), expected)


# ---------------------------------------------------------------- issue 26

#: model -> the library functions its eager call may reach: replacing one of them is served
#: exactly or refused naming it; replacing any other must serve (the graph never went there).
REACHES = {
    "convbn": {"relu"},
    "transformer": {"gelu", "sdpa", "softmax", "layernorm"},
    "lstm": {"layernorm"},
    "train_step": {"relu", "layernorm"},
    "self_attention": {"sdpa"},
    "cross_attention": {"sdpa"},
    "dict": {"relu", "layernorm"},
    "bert": {"gelu", "sdpa", "softmax", "layernorm", "registry"},
}
#: Models with no module whose forward depends on ``training`` (no dropout, norm statistics, RNN).
NOTHING_TRAIN_DEPENDENT = {"self_attention", "cross_attention", "dict"}
ISSUE26_MODELS = list(REACHES)


#: Inductor's kernels dispatch no ATen operation: a counter around the call would count
#: none of them, so FlopCounterMode is refused there, saying so (docs/trust.md).
INDUCTOR_REFUSED: dict[str, tuple[str, ...]] = {
    "FlopCounterMode": ("_FlopCounterMode (a TorchDispatchMode)", "Inductor's", "0 FLOPs"),
}


def issue26_expectations(
    model: str, training: bool, backend: str = "eager"
) -> dict[str, tuple[str, ...] | None]:
    """cell -> the words a refusal must contain (exact also passes); None: exact only."""
    expected: dict[str, tuple[str, ...] | None] = {}
    for case, name in LIBRARY.items():
        if case == "registry" and model != "bert":
            continue  # only a transformers model looks its kernel up in the registry
        words = (name,) if case in REACHES[model] else None
        expected[f"patch:{case}"] = expected[f"preload:{case}"] = words
    expected.update(CONTEXT)
    if model == "self_attention":
        expected["distinct tensors"] = ("one tensor",)
    if model == "cross_attention":
        expected["one tensor thrice"] = ("one tensor",)
    no_ops = NO_OPS + ([] if training else INFERENCE_NO_OPS)
    no_ops += ["keys reordered"] if model == "dict" else []
    no_ops += ["relu inplace"] if model in ("convbn", "train_step", "dict") else []
    no_ops += ["train() no-op"] if model in NOTHING_TRAIN_DEPENDENT else []
    expected.update(dict.fromkeys(no_ops))
    if backend == "inductor":
        expected.update(INDUCTOR_REFUSED)
    return expected


def check_served_or_named(
    results: dict[str, dict[str, str]], expected: dict[str, tuple[str, ...] | None]
) -> None:
    """Every cell exact, or (where words are given) refused with a message holding them."""
    problems = []
    for cell, words in expected.items():
        got = results[cell]
        if got["result"] == "exact":
            continue
        if got["result"] == "refused" and words and all(w in got["message"] for w in words):
            continue
        wanted = "exact" if words is None else f"exact or a refusal naming {words}"
        problems.append(f"{cell}: expected {wanted}, got {got['result']}: {got['message'][:800]}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("model", "backend"),
    [(model, "eager") for model in ISSUE26_MODELS] + [("transformer", "inductor")],
)
def test_library_context_and_no_op_changes_are_served_exactly_or_refused_naming_them(
    model: str, backend: str, tmp_path: Path
) -> None:
    module, name = copy_fixture(tmp_path)
    paths = capture_model(module, model, tmp_path, backend=backend)
    expected = issue26_expectations(model, training=module.MODELS[model][3], backend=backend)
    results = run_cells(tmp_path, name, model, paths, ["unchanged", *expected])
    assert results["unchanged"]["result"] == "exact", results["unchanged"]
    check_served_or_named(results, expected)
