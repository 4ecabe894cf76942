"""Dims marked with mark_unbacked: captured symbolically, served at any size in range on
both backends (fresh process too), min/max and shared shape ids enforced per call, and a
graph that must guard on a marked dim refused at capture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.decorators import mark_unbacked

import precompile
from precompile import PrecompileError
from tests.fixtures.models import MLP
from tests.harness import run_python


def scored(model: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return model(x).softmax(-1) + bias


def branches_on_batch(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] > 4:  # <guard>
        return model(x)
    return -model(x)


def _marked_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    x, bias = torch.randn(4, 8), torch.randn(4, 4)
    mark_unbacked(x, 0, min=2, max=32, shape_id="batch")
    mark_unbacked(bias, 0, shape_id="batch")
    return x, bias


@pytest.fixture(scope="module", params=["eager", "inductor"])
def dynamic_artifact(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp(f"dynamic-{request.param}")
    paths = directory / "scored.py", directory / "scored.cache"
    with precompile.capture(
        scored,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.MakeFxTracer(),
        backend=request.param,
    ) as cap:
        cap(MLP().eval(), *_marked_inputs())
    return paths


def test_metadata_records_the_dynamic_dims(dynamic_artifact: tuple[Path, Path]) -> None:
    meta = precompile.inspect_artifact(dynamic_artifact[0])
    assert meta["USER_INPUT_SHAPES"] == [(None, 8), (None, 4)]
    assert meta["USER_INPUT_BOUNDS"] == [{0: (2, 32)}, {0: (None, None)}]
    assert meta["USER_INPUT_SHAPE_IDS"] == [{0: "batch"}, {0: "batch"}]


@pytest.mark.parametrize("batch", [2, 5, 17])
def test_served_at_any_size_in_range(dynamic_artifact: tuple[Path, Path], batch: int) -> None:
    run = precompile.load(*dynamic_artifact)
    model, x, bias = MLP().eval(), torch.randn(batch, 8), torch.randn(batch, 4)
    torch.testing.assert_close(run(model, x, bias), scored(model, x, bias))


def test_served_at_three_sizes_in_a_fresh_process(dynamic_artifact: tuple[Path, Path]) -> None:
    code = f"""
import torch, warnings, precompile
warnings.simplefilter("ignore")
from tests.core.capturing.test_dynamic_dims import scored
from tests.fixtures.models import MLP
run = precompile.load({str(dynamic_artifact[0])!r}, {str(dynamic_artifact[1])!r})
model = MLP().eval()
for batch in (3, 9, 32):
    x, bias = torch.randn(batch, 8), torch.randn(batch, 4)
    torch.testing.assert_close(run(model, x, bias), scored(model, x, bias))
print("ok")
"""
    proc = run_python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


@pytest.mark.parametrize(
    ("sizes", "words"),
    [
        ((33, 33), ("size 33", "[2, 32]")),
        ((1, 1), ("size 1", "[2, 32]")),
        ((5, 6), ("input 1 dim 0 has size 6", "shape_id 'batch'")),
    ],
)
def test_bounds_and_shared_shape_ids_are_enforced(
    dynamic_artifact: tuple[Path, Path], sizes: tuple[int, int], words: tuple[str, ...]
) -> None:
    run = precompile.load(*dynamic_artifact)
    with pytest.raises(PrecompileError) as info:
        run(MLP().eval(), torch.randn(sizes[0], 8), torch.randn(sizes[1], 4))
    assert info.value.invariant == 3
    for word in words:
        assert word in str(info.value)


def test_static_dims_stay_static(dynamic_artifact: tuple[Path, Path]) -> None:
    run = precompile.load(*dynamic_artifact)
    with pytest.raises(PrecompileError, match=r"shape \(4, 9\).*\('\*', 8\)"):
        run(MLP().eval(), torch.randn(4, 9), torch.randn(4, 4))


def test_guard_on_a_marked_dim_is_refused(tmp_path: Path) -> None:
    x = torch.randn(6, 8)
    mark_unbacked(x, 0)
    with pytest.raises(PrecompileError) as info:
        with precompile.capture(
            branches_on_batch,
            artifact_path=tmp_path / "g.py",
            cache_path=tmp_path / "g.cache",
            tracer=precompile.MakeFxTracer(),
            backend="eager",
        ) as cap:
            cap(MLP().eval(), x)
    error: Any = info.value
    assert error.invariant == 3 and "mark_unbacked" in str(error)
    source = Path(__file__).read_text().splitlines()
    assert error.location.line == next(
        i + 1 for i, line in enumerate(source) if line.endswith("# <guard>")
    )
    assert not (tmp_path / "g.py").exists()
