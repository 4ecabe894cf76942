"""Issue 29: the make_fx driver's ambient fast path (``single_graph_ambient.ambient_now``).

A served call whose ambient state -- the torch-function and dispatch mode depths, the
default dtype, deterministic mode, any autocast, read as one tuple of C calls -- is the
ordinary one skips the mode and state checks one by one. Here each piece of that state
is changed after calls took the fast path (two calls first), in a fresh process per
backend, and the next call must refuse with a PrecompileError naming the change or
answer exactly as eager does; a call after the change is undone is served again. An
artifact whose forward read deterministic mode has no such shortcut: changing it is
refused.
"""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import precompile
from tests.harness import capture_pair, run_json


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) + 0.5


class ReadsDeterministic(Net):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.fc(x))
        return out * 2 if torch.are_deterministic_algorithms_enabled() else out


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


class Negating(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        return -out if func is torch.relu else out


class Watching(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


#: Each change of the ambient state, as a context the changed call runs in.
CHANGES: dict[str, Callable[[], Any]] = {
    "torch-function mode entered": Negating,
    "dispatch mode entered": Watching,
    "autocast entered": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    "default dtype changed": lambda: _default_dtype(torch.float64),
    "deterministic algorithms on": _deterministic,
    "inference mode entered": torch.inference_mode,
    "grad mode on": torch.enable_grad,
}

CHILD = """
import json, warnings
warnings.simplefilter("ignore")
from tests.core.runtime.test_ambient_fast_path import attack
print(json.dumps({{k: attack(k, a, c) for k, (a, c) in {pairs!r}.items()}}))
"""

MODELS = {"plain": Net, "reads deterministic": ReadsDeterministic}


def attack(model_name: str, artifact: str, cache: str) -> dict[str, Any]:
    """Per change: served twice (the fast path), changed, served (refused with the
    message, or served with whether it equals eager), undone, served again."""
    run = precompile.load(artifact, cache)
    torch.manual_seed(1)
    model = MODELS[model_name]().eval()
    x = torch.randn(3, 6)
    out: dict[str, Any] = {}
    for name, change in CHANGES.items():
        with torch.no_grad():
            for _ in range(2):
                torch.testing.assert_close(run(model, x), model(x))
            with change():
                try:
                    got = run(model, x)
                    outcome: list[Any] = ["served", bool(torch.equal(got, model(x)))]
                except precompile.PrecompileError as error:
                    outcome = ["refused", str(error)]
            outcome.append(bool(torch.equal(run(model, x), model(x))))
        out[name] = outcome
    return out


@pytest.fixture(scope="module", params=["eager", "inductor"])
def outcomes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    pairs = {}
    for name, cls in MODELS.items():
        torch.manual_seed(0)
        with torch.no_grad():
            pairs[name] = capture_pair(
                serve,
                cls().eval(),
                torch.randn(3, 6),
                directory=tmp_path_factory.mktemp(name.replace(" ", "-")),
                backend=request.param,
            )
    return request.param, run_json(textwrap.dedent(CHILD.format(pairs=pairs)))


#: What a refusal of each change must name.
NAMED = {
    "torch-function mode entered": "Negating",
    "dispatch mode entered": "Watching",
    "autocast entered": "autocast",
    "default dtype changed": "float64",
    "deterministic algorithms on": "deterministic",
}


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_each_ambient_change_after_the_fast_path(outcomes: Any, model: str, change: str) -> None:
    backend, results = outcomes
    kind, detail, again = results[model][change]
    assert again is True, (model, change, again)
    if kind == "served":
        assert detail is True, f"{model}/{change}: served a result that differs from eager"
    else:
        assert kind == "refused"
        assert NAMED.get(change, "precompile") in detail, (change, detail)
    # What eager computes differently under the change is never served.
    must_refuse = {
        "torch-function mode entered",
        "autocast entered",
        "default dtype changed",
    }
    if backend == "inductor":
        must_refuse.add("dispatch mode entered")  # the kernels dispatch no ATen op
    if model == "reads deterministic":
        must_refuse.add("deterministic algorithms on")
    if change in must_refuse:
        assert kind == "refused", (model, change, results[model][change])
