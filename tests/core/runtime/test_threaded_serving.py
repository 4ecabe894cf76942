"""One loaded artifact served from several threads at once, each with its own model of
the captured class (a server handling two tenants, or a model and its EMA copy): every
call answers as eager does on the model it was given, or is refused.

The drivers keep what the last verified call saw, to make the next call with the same
model cheap. Before, make_fx's model-state fast path kept it in many separate variables
and re-read the lifted tensors after verifying: with threads switching often, one
thread's call was served with the other thread's model's weights (150 of 150 calls
wrong). The snapshot is now one tuple, replaced whole and read once per call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from tests.harness import attack_in_child

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.k = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.k


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


CHILD = """
import json, sys, threading
import torch
import precompile
from tests.core.runtime.test_threaded_serving import Scaled, serve

run = precompile.load({artifact!r}, {cache!r})
x = torch.randn(3, 4)
models = []
for seed in (0, 9, 17):
    torch.manual_seed(seed)
    models.append(Scaled().eval())
# Switch threads as often as the interpreter allows: a check and the use of what it
# checked are as far apart as they can be.
sys.setswitchinterval(1e-6)
outcomes = {{i: {{"served": 0, "refused": 0, "wrong": 0, "crashed": []}} for i in range(3)}}

def loop(i, model):
    with torch.no_grad():
        for _ in range(120):
            try:
                got = run(model, x)
            except precompile.PrecompileError:
                outcomes[i]["refused"] += 1
                continue
            except Exception as error:
                outcomes[i]["crashed"].append(repr(error))
                continue
            want = serve(model, x)
            outcomes[i]["served" if torch.allclose(got, want) else "wrong"] += 1

threads = [threading.Thread(target=loop, args=(i, m)) for i, m in enumerate(models)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(outcomes))
"""


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_threads_serving_their_own_models_each_get_their_own_answer(
    tracer: str, tmp_path: Path
) -> None:
    outcomes: dict[str, Any] = attack_in_child(
        CHILD,
        serve,
        Scaled,
        lambda: torch.randn(3, 4),
        directory=tmp_path,
        tracer=TRACERS[tracer](),
    )
    for thread, seen in outcomes.items():
        assert seen["wrong"] == 0, (tracer, thread, seen)
        assert seen["crashed"] == [], (tracer, thread, seen)
        # Models of the captured class with the captured state: served, not refused.
        assert seen["served"] == 120, (tracer, thread, seen)
