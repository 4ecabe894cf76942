"""What a lowered graph baked of a torch Python function's body is on the library
surface (issue 26): Dynamo + Inductor served the unpatched answer when ``torch.relu``
(called inside ``F.relu``, which Dynamo's graph keeps as one call) was replaced before or
after load -- a silent wrong answer found by the mutation-matrix attack. The eager
backend calls ``F.relu`` per call and follows the replacement; both must be exact or
refused naming it, never wrong."""

from __future__ import annotations

import pytest
import torch

import precompile
from tests.fixtures import lowered_surface
from tests.harness import capture_pair, run_json

SERVE = """
import json, warnings
import torch, precompile
from tests.fixtures.lowered_surface import Net
warnings.simplefilter("ignore")
artifact, cache, weights, when = {args!r}
model = Net().eval()
model.load_state_dict(torch.load(weights))
x = torch.randn(1, 3, 6, 6)
old = torch.relu
def patch():
    torch.relu = lambda t: old(t) * 1.5 + 0.25
if when == "before":
    patch()
try:
    run = precompile.load(artifact, cache)
    if when == "after":
        patch()
    with torch.no_grad():
        out = ["served", (run(model, x) - model(x)).abs().max().item()]
except precompile.PrecompileError as error:
    out = ["refused", str(error)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module", params=["eager", "inductor"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    directory = tmp_path_factory.mktemp(f"lowered-{request.param}")
    torch.manual_seed(0)
    model = lowered_surface.Net().eval()
    weights = str(directory / "w.pt")
    torch.save(model.state_dict(), weights)
    with torch.no_grad():
        paths = capture_pair(
            lowered_surface.fn,
            model,
            torch.randn(1, 3, 6, 6),
            directory=directory,
            tracer=precompile.DynamoTracer(),
            backend=request.param,
        )
    return [*paths, weights]


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_torch_function_inside_a_lowered_call_replaced_is_never_served_wrong(
    pair: list[str], when: str
) -> None:
    verdict, detail = run_json(SERVE.format(args=[*pair, when]))
    if verdict == "served":
        assert detail == 0.0, f"served a wrong answer (max diff {detail})"
    else:
        assert "torch.relu" in detail and "replaced" in detail, detail
