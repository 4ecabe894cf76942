"""The make_fx mutation matrix: tiny models x changes made after capture.

Each model is captured here from a private copy of ``tests/fixtures/fx_trust_models.py``;
its artifact is loaded in ONE fresh process (``tests/fixtures/fx_trust_cells.py``), which
makes every change there and compares the served call with eager. Every cell must be
``exact`` (the eager answer) or ``refused`` with a PrecompileError naming the change --
never ``wrong``. Changes that only touch tensor values must be served exactly.
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

from tests.conftest import REPO, capture_pair, run_job

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
    module: ModuleType, model: str, directory: Path, hooked: bool = False
) -> tuple[str, str]:
    _, fn, _, training, _ = module.MODELS[model]
    built, args = module.build(model)
    if hooked:
        next(iter(built.children())).register_forward_hook(module.double_output)
    return capture_pair(fn, built, *args, directory=directory, name=model, training=training)


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
