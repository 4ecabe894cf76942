"""A function the trace compared by identity is recognised by its code in every
process: the digest is ``state_checks.code_fingerprint`` for both tracers' checks, which
orders a frozenset constant, so a process with another string hash seed serves the same
closure (it was refused before: ``model.act is ... <lambda> in this call``) and still
refuses another closure value or another function."""

from __future__ import annotations

import pytest
import torch

import precompile
from tests.fixtures import closure_models
from tests.harness import capture_pair, run_json

SERVE = """
import json, sys, warnings
import torch, precompile
from tests.fixtures.closure_models import Net, make_act
warnings.simplefilter("ignore")
artifact, cache, weights = sys.argv[1:] if len(sys.argv) > 1 else {paths!r}
model = Net().eval()
model.load_state_dict(torch.load(weights))
run = precompile.load(artifact, cache)
x = torch.randn(3, 4)
out = {{}}
for case, act in [("same closure", None), ("other closure value", make_act("tanh"))]:
    if act is not None:
        model.act = act
    try:
        with torch.no_grad():
            out[case] = ["served", (run(model, x) - model(x)).abs().max().item()]
    except precompile.PrecompileError as error:
        out[case] = ["refused", str(error)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    directory = tmp_path_factory.mktemp("closure")
    torch.manual_seed(0)
    model = closure_models.Net().eval()
    weights = str(directory / "w.pt")
    torch.save(model.state_dict(), weights)
    with torch.no_grad():
        artifact, cache = capture_pair(
            closure_models.fn,
            model,
            torch.randn(3, 4),
            directory=directory,
            tracer=precompile.DynamoTracer(),
        )
    return artifact, cache, weights


@pytest.mark.parametrize("seed", ["1", "2", "3"])
def test_a_closure_with_a_frozenset_constant_serves_under_any_hash_seed(
    pair: tuple[str, str, str], seed: str
) -> None:
    result = run_json(SERVE.format(paths=list(pair)), PYTHONHASHSEED=seed)
    assert result["same closure"] == ["served", 0.0], result
    verdict, message = result["other closure value"]
    assert verdict == "refused" and "model.act" in message, result
