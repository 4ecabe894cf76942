"""A model that draws from a ``torch.Generator`` it holds is refused at capture, by both
tracers and both backends, in words that name the generator and the fix.

make_fx held the generator in the graph as an opaque constant, which no artifact can
carry: Inductor's code drew from the process's default generator instead (served, every
call differing from eager's), and the eager backend's code failed to load (a raw
``AttributeError`` out of the capture). Dynamo saved the generator in its guards, which
pickle but do not unpickle (a raw ``SystemError`` out of the capture)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import precompile
from tests.fixtures import held_generator as g
from tests.harness import capture_pair

CELLS = [
    ("make_fx", "eager", "draws random numbers from a torch.Generator object it holds"),
    ("make_fx", "inductor", "draws random numbers from a torch.Generator object it holds"),
    ("dynamo", "eager", "the guards Dynamo saved for this capture cannot be loaded back"),
]
TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


@pytest.mark.parametrize(("tracer", "backend", "words"), CELLS)
def test_a_model_drawing_from_a_generator_it_holds_is_refused(
    tmp_path: Path, tracer: str, backend: str, words: str
) -> None:
    with pytest.raises(precompile.PrecompileError) as refused:
        capture_pair(
            g.step,
            g.Noisy(),
            torch.ones(4, 8),
            directory=tmp_path,
            tracer=TRACERS[tracer](),
            backend=backend,
        )
    assert words in str(refused.value)
    assert "torch.Generator" in (refused.value.hint or "") + str(refused.value)
