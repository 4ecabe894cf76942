"""Findings that are true: covers decided exactly as serving decides (a dynamic variant
serves a bigger batch), a value pinned by a graph break reported where it happens, two
targets that would write one artifact reported at both and neither written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.harness import precompile_cli

MODULE = """import torch
from torch import nn

import precompile


def two_batches():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 4), nn.ReLU()).eval()
    return [(m, torch.randn(2, 8)), (m, torch.randn(3, 8))]


def a_bigger_batch():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 4), nn.ReLU()).eval()
    return [(m, torch.randn(32, 8))]


@precompile.target(two_batches, covers=a_bigger_batch)
def dynamic_batch(model, x):
    return model(x).sum(-1)


def one_vector():
    torch.manual_seed(0)
    return [(torch.randn(4),)]


def two_vectors():
    torch.manual_seed(0)
    return [(torch.randn(4),), (torch.randn(4),)]


@precompile.target(one_vector)
def pinned(x):
    scale = x.sum().item()
    torch._dynamo.graph_break()
    return x * scale


@precompile.target(two_vectors)
def generalized(x):
    scale = x.sum().item()
    torch._dynamo.graph_break()
    return x * scale


@precompile.target(one_vector, artifact="artifacts/shared.py")
def first(x):
    return x + 1


@precompile.target(one_vector, artifact="artifacts/shared.py")
def second(x):
    return x + 2
"""


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("truth") / "ws"
    (root / "src" / "truth").mkdir(parents=True)
    (root / "src" / "truth" / "__init__.py").write_text("")
    (root / "src" / "truth" / "targets.py").write_text(MODULE)
    (root / "pyproject.toml").write_text(
        '[tool.precompile]\nsource-roots = ["src"]\nbackend = "eager"\n'
    )
    proc = precompile_cli("check", "--format", "json", "--emit", cwd=root)
    assert proc.returncode == 1, proc.stderr
    return {"root": root, "doc": json.loads(proc.stdout)}


def _of(checked: dict[str, Any], target: str) -> list[dict[str, Any]]:
    return [f for f in checked["doc"]["findings"] if f["target"] == f"truth.targets.{target}"]


def _line(needle: str, after: str = "") -> int:
    lines = MODULE.splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    return next(i for i, line in enumerate(lines) if i >= start and needle in line) + 1


def test_a_dynamic_variant_serves_the_covers_call(checked: dict[str, Any]) -> None:
    assert [f["code"] for f in _of(checked, "dynamic_batch")] == []
    row = next(t for t in checked["doc"]["targets"] if t["target"].endswith("dynamic_batch"))
    assert "2 variants" in row["summary"]


def test_a_value_pinned_by_a_break_is_reported_where_it_is_computed(
    checked: dict[str, Any],
) -> None:
    [pinned] = [f for f in _of(checked, "pinned") if f["code"] == "PC203"]
    assert pinned["line"] == _line("scale = x.sum().item()", "def pinned")
    assert pinned["file"] == "src/truth/targets.py"
    assert "serves only that value and refuses any other" in pinned["message"]
    assert "L[" not in pinned["message"] and "resume" not in pinned["message"]
    assert pinned["related"][0]["message"] == "target pinned"
    # Captured with two different values, Dynamo makes it dynamic: nothing is pinned.
    assert "PC203" not in [f["code"] for f in _of(checked, "generalized")]


def test_two_targets_sharing_an_artifact_are_reported_and_neither_is_written(
    checked: dict[str, Any],
) -> None:
    root: Path = checked["root"]
    for target, other in (("first", "second"), ("second", "first")):
        [conflict] = [f for f in _of(checked, target) if f["code"] == "PC304"]
        assert conflict["severity"] == "error"
        assert f"truth.targets.{other}" in conflict["message"]
        assert "artifacts/shared.py" in conflict["message"]
        assert conflict["related"][0]["message"] == f"target {other} writes the same artifact"
    assert not (root / "artifacts" / "shared.py").exists()
    proc = precompile_cli("emit", "truth.targets.first", cwd=root)
    assert proc.returncode == 1 and "neither overwrites the other" in proc.stderr
    assert not (root / "artifacts" / "shared.py").exists()
