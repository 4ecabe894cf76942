"""Inductor artifacts draw eager's random numbers. Single-graph ones bake layouts and
may hand back an input object: captured with Inductor's size asserts OFF, served in a
fresh process, every layout change is refused (or served exactly) and no output is an
input or a Parameter object where eager returns a new tensor."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import precompile
from tests.fixtures.fx_trust_models import layout_fn
from tests.harness import capture_pair, run_json

SERVE = """
import json, warnings, torch, precompile
from torch import nn
from tests.fixtures.fx_trust_models import layout_fn
warnings.simplefilter("ignore")
run = precompile.load({artifact!r}, {cache!r})

def model_and_input():
    torch.manual_seed(1)
    return nn.Linear(4, 4), torch.randn(4, 4)

def cell(change):
    model, x = model_and_input()
    model, x = change(model, x)
    expected = layout_fn(model, x)
    try:
        out = run(model, x)
    except precompile.PrecompileError as error:
        return {{"result": "refused", "message": str(error)}}
    same = all(torch.equal(o, e.detach()) for o, e in zip(out, expected))
    return {{"result": "exact" if same else "wrong", "message": ""}}

def transposed(t):
    return t.t().contiguous().t()

def non_contiguous_weight(model, x):
    model.weight.data = transposed(model.weight.data)
    return model, x

def offset(model, x):
    return model, torch.cat([torch.zeros(1), x.flatten()])[1:].view(4, 4)

results = {{
    "contiguous": cell(lambda m, x: (m, x)),
    "transposed input": cell(lambda m, x: (m, transposed(x))),
    "non-contiguous weight": cell(non_contiguous_weight),
    "input with a storage offset": cell(offset),
}}
model, x = model_and_input()
out = run(model, x)
results["detached outputs"] = {{
    "x": out[2] is not x and not out[2].requires_grad and torch.equal(out[2], x),
    "weight": out[3] is not model.weight and not out[3].requires_grad
    and type(out[3]) is torch.Tensor and torch.equal(out[3], model.weight.detach()),
}}
print(json.dumps(results))
"""


def test_layouts_are_checked_whatever_size_asserts_said_at_capture(tmp_path: Path) -> None:
    import torch._inductor.config as inductor_config

    paths = str(tmp_path / "layout.py"), str(tmp_path / "layout.cache")
    torch.manual_seed(0)
    with (
        inductor_config.patch(size_asserts=False),
        precompile.capture(
            layout_fn,
            artifact_path=paths[0],
            cache_path=paths[1],
            tracer=precompile.MakeFxTracer(),
            backend="inductor",
        ) as cap,
    ):
        cap(nn.Linear(4, 4), torch.randn(4, 4))
    results = run_json(
        SERVE.format(artifact=paths[0], cache=paths[1]),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "serve-cache"),
    )
    assert results["contiguous"]["result"] == "exact"
    assert results["input with a storage offset"]["result"] == "exact"
    assert results["transposed input"]["result"] == "refused"
    assert "input 0 has strides (1, 4)" in results["transposed input"]["message"]
    assert results["non-contiguous weight"]["result"] == "refused"
    assert "parameter 'weight' has strides (1, 4)" in results["non-contiguous weight"]["message"]
    assert results["detached outputs"] == {"x": True, "weight": True}


SERVE_RANDOM = """
import json, warnings, torch, precompile
from tests.fixtures.fx_trust_models import RandomNet, random_fn
warnings.simplefilter("ignore")
run = precompile.load({artifact!r}, {cache!r})
torch.manual_seed(0)
model, x = RandomNet().train(), torch.randn(8, 4)
exact = []
for seed in (123, 7):
    torch.manual_seed(seed)
    served, after_served = run(model, x), torch.rand(2)
    torch.manual_seed(seed)
    eager, after_eager = random_fn(model, x), torch.rand(2)
    # The same numbers, and the generator left where eager leaves it.
    exact.append(all(torch.equal(a, b) for a, b in zip(served, eager))
                 and torch.equal(after_served, after_eager))
print(json.dumps({{"exact": exact}}))
"""


@pytest.mark.parametrize("tracer", ["make_fx", "dynamo"])
def test_random_ops_draw_eagers_numbers(tmp_path: Path, tracer: str) -> None:
    # Inductor's own random kernels draw other numbers than eager (and cannot lower a
    # make_fx graph's rand at all); the artifact calls torch's, from the same generator.
    from tests.fixtures.fx_trust_models import RandomNet, random_fn

    torch.manual_seed(0)
    model, x = RandomNet().train(), torch.randn(8, 4)
    artifact, cache = capture_pair(
        random_fn,
        model,
        x,
        directory=tmp_path,
        backend="inductor",
        name="random",
        tracer=precompile.DynamoTracer() if tracer == "dynamo" else None,
    )
    assert run_json(SERVE_RANDOM.format(artifact=artifact, cache=cache)) == {"exact": [True, True]}
