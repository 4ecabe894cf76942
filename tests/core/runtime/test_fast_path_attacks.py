"""Issue 29: the per-call fast path over the model's state is attacked by every way of
changing that state, and each change is still caught.

A served call skips re-reading the model when what can change it (dict version tags,
identities, types, one C-level guard over the tensors' metadata) is as the last verified
call left it. Here each kind of change is made to a model whose calls already took that
fast path (two calls first), in a fresh process per tracer, and the next call must either
answer exactly as eager does on the changed model or refuse with a PrecompileError --
never answer from the stale state. Changes that cannot alter the result must be served;
changes eager itself cannot run with must be refused."""

from __future__ import annotations

import copy
import textwrap
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from tests.fixtures.fast_path_net import Net, serve
from tests.harness import capture_pair, run_json, served_or_refused


class DoublingLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


def _set(module: object, name: str, value: object) -> None:
    setattr(module, name, value)


def _no_grad(fn: Callable[[], object]) -> None:
    with torch.no_grad():
        fn()


#: Each change, applied to a model whose calls took the fast path.
CHANGES: dict[str, Callable[[Net], object]] = {
    "nothing": lambda m: None,
    "parameter replaced": lambda m: _set(m.fc1, "weight", nn.Parameter(torch.randn(16, 8))),
    "data assigned": lambda m: _set(m.fc1.weight, "data", torch.randn(16, 8)),
    "buffer reassigned": lambda m: _set(m, "scale", torch.full((4,), 3.0)),
    "in-place mutation": lambda m: _no_grad(lambda: m.fc2.bias.add_(1.0)),
    "in-place no-op (version bump)": lambda m: _no_grad(lambda: m.fc2.bias.add_(0.0)),
    "parameter of another shape": lambda m: _set(m.fc2, "bias", nn.Parameter(torch.randn(1))),
    "data of another dtype": lambda m: _set(m.fc1.weight, "data", m.fc1.weight.data.double()),
    "data of another shape": lambda m: _set(m.fc1.weight, "data", torch.randn(16, 9)),
    "buffer of another dtype": lambda m: _set(m, "scale", torch.ones(4, dtype=torch.float64)),
    "model cast to double": lambda m: m.double(),
    "model moved to meta": lambda m: m.to("meta"),
    "submodule swapped": lambda m: _set(m, "act", nn.Tanh()),
    "class swapped": lambda m: _set(m.fc2, "__class__", DoublingLinear),
    "instance dict replaced": lambda m: _set(
        m.fc2, "__dict__", {**vars(m.fc2), "_forward_hooks": {0: lambda mod, i, o: o * 2}}
    ),
    "requires_grad flipped": lambda m: m.fc1.weight.requires_grad_(False),
    "forward hook added": lambda m: m.fc1.register_forward_hook(lambda mod, i, o: o * 2),
    "forward pre-hook added": lambda m: m.register_forward_pre_hook(lambda mod, a: (a[0] + 1,)),
}

#: Nothing that changes the result: refusing would make the artifact unusable.
MUST_SERVE = {
    "nothing",
    "parameter replaced",
    "data assigned",
    "buffer reassigned",
    "in-place mutation",
    "in-place no-op (version bump)",
}
#: Eager itself cannot run these (or runs them elsewhere): the artifact must refuse.
MUST_REFUSE = {
    "parameter of another shape",
    "data of another dtype",
    "data of another shape",
    "buffer of another dtype",
    "model cast to double",
    "model moved to meta",
}

#: Each change of the input, after calls with the captured kind of input took the fast
#: path; the bool says whether eager can run it (then it must be served as eager, else
#: refused).
INPUT_CHANGES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], bool]] = {
    "input of another batch size": (lambda x: torch.cat([x, x]), False),
    "input of another dtype": (lambda x: x.double(), False),
    "input of another width": (lambda x: torch.randn(3, 9), False),
    "input on meta": (lambda x: x.to("meta"), False),
    "input transposed twice (other strides)": (lambda x: x.t().contiguous().t(), True),
    "input that requires grad (under no_grad)": (lambda x: x.clone().requires_grad_(), True),
    "same input again": (lambda x: x, True),
}

CHILD = """
import json, torch, warnings
warnings.simplefilter("ignore")
import precompile
from tests.core.runtime.test_fast_path_attacks import attack
print(json.dumps(attack({artifact!r}, {cache!r})))
"""


def attack(artifact: str, cache: str) -> dict[str, list[object]]:
    """In this process: load the artifact once; per change, a fresh copy of the model
    served twice (the second call takes the fast path), changed, served again. What the
    third call did: served (with its largest difference from eager) or refused."""
    run = precompile.load(artifact, cache)
    torch.manual_seed(1)
    base = Net().eval()
    x = torch.randn(3, 8)
    outcomes: dict[str, list[object]] = {}
    with torch.no_grad():
        for name, change in CHANGES.items():
            model = copy.deepcopy(base)
            for _ in range(2):
                torch.testing.assert_close(run(model, x), model(x))
            change(model)
            outcomes[name] = served_or_refused(partial(run, model, x), partial(model, x))
        model = copy.deepcopy(base)
        for name, (make, _eager_runs) in INPUT_CHANGES.items():
            for _ in range(2):
                torch.testing.assert_close(run(model, x), model(x))
            changed = make(x)
            outcomes[name] = served_or_refused(
                partial(run, model, changed), partial(model, changed)
            )
    return outcomes


@pytest.fixture(scope="module", params=["make_fx", "dynamo"])
def outcomes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tracer = precompile.MakeFxTracer() if request.param == "make_fx" else precompile.DynamoTracer()
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp(request.param)
    with torch.no_grad():
        artifact, cache = capture_pair(
            serve, Net().eval(), torch.randn(3, 8), directory=directory, tracer=tracer
        )
    return {
        **run_json(textwrap.dedent(CHILD.format(artifact=artifact, cache=cache))),
        "tracer": request.param,
    }


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_each_change_is_caught(outcomes: dict[str, Any], change: str) -> None:
    kind, detail = outcomes[change]
    assert kind in ("served", "refused"), (change, kind, detail)
    if kind == "served":
        assert detail is True, f"{change}: served a result that differs from eager"
    if change in MUST_SERVE:
        assert kind == "served", f"{change}: refused though nothing changes the result: {detail}"
    if change in MUST_REFUSE:
        assert kind == "refused", f"{change}: {kind} ({detail})"


@pytest.mark.parametrize("change", sorted(INPUT_CHANGES))
def test_each_input_change_is_caught(outcomes: dict[str, Any], change: str) -> None:
    kind, detail = outcomes[change]
    if INPUT_CHANGES[change][1]:
        # make_fx's eager graph takes any strides and, under no_grad, any requires_grad:
        # it must serve these. Dynamo's guards pin both (a refusal, never a wrong answer).
        if outcomes["tracer"] == "make_fx" or kind != "refused":
            assert [kind, detail] == ["served", True], (change, kind, detail)
    else:
        assert kind == "refused", (change, kind, detail)


def test_attacks_copy_the_model_before_changing_it() -> None:
    """The changes act on the copy only (a change leaking into the base model would make
    later rows attack an already-changed model)."""
    base = Net()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    for change in CHANGES.values():
        model = copy.deepcopy(base)
        change(model)
    after = base.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert type(base.fc2) is nn.Linear and isinstance(base.act, nn.ReLU)
    assert not base._forward_pre_hooks and not base.fc1._forward_hooks
