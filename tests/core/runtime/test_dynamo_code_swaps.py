"""Issue 26, round 3: a function a Dynamo trace ran, changed in place while serving.

Dynamo guards a function by identity; ``f.__code__ = g.__code__`` (IPython's
autoreload), new ``__defaults__`` or a closure cell's new contents keep the identity,
and the artifact served the traced code. Each change below is made in a fresh serving
process after two served calls (and one before ``precompile.load``); the next call must
refuse with a PrecompileError naming the function, and undoing it serves as eager again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from tests.harness import attack_in_child, patched, patched_cell


def _shift(t: torch.Tensor) -> torch.Tensor:
    return t + 1.0


def _scaled(t: torch.Tensor, k: float = 2.0) -> torch.Tensor:
    return t * k


def _act(t: torch.Tensor) -> torch.Tensor:
    return torch.relu(t)


def _make_adder(amount: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def add(t: torch.Tensor) -> torch.Tensor:
        return t + amount

    return add


_add = _make_adder(0.5)


def _kw(t: torch.Tensor, *, k: float = 1.0) -> torch.Tensor:
    return t - k


def _make_wrapper() -> Callable[[torch.Tensor], torch.Tensor]:
    # ``inner`` has no name another process imports: only ``wrap``'s cell holds it.
    def inner(t: torch.Tensor) -> torch.Tensor:
        return t * 3.0

    def wrap(t: torch.Tensor) -> torch.Tensor:
        return inner(t) - 1.0

    return wrap


_wrap = _make_wrapper()


class SwapNet(nn.Module):
    """Runs a module-level helper, one with a default, one with a keyword default, a
    method of its class, a function held in an attribute, one a factory closed over a
    value and one that calls a function only its closure holds."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.act = _act

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) - 0.25

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _wrap(_kw(_add(_scaled(_shift(self.act(self.encode(x)))))))


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


#: Each change, and the name its refusal must carry.
CHANGES: dict[str, tuple[Callable[[], Callable[[], None]], str]] = {
    "helper's code replaced": (
        lambda: patched(_shift, "__code__", (lambda t: t + 2.0).__code__),
        "_shift",
    ),
    "method's code replaced": (
        lambda: patched(SwapNet.encode, "__code__", (lambda self, x: self.fc(x) + 3.0).__code__),
        "SwapNet.encode",
    ),
    "attribute's function code replaced": (
        lambda: patched(_act, "__code__", (lambda t: torch.sigmoid(t)).__code__),
        "_act",
    ),
    "defaults replaced": (lambda: patched(_scaled, "__defaults__", (5.0,)), "_scaled"),
    "closure cell changed": (lambda: patched_cell(_add, 3.0), "_add"),
    "keyword defaults replaced": (lambda: patched(_kw, "__kwdefaults__", {"k": 4.0}), "_kw"),
    "code of a function a closure holds replaced": (
        lambda: patched(
            _wrap.__closure__[0].cell_contents, "__code__", (lambda t: t * 5.0).__code__
        ),
        "inner",
    ),
}

#: Code swapped in the serving process before ``precompile.load`` (source unchanged).
BEFORE_LOAD = {
    f"{name}, before load": CHANGES[name]
    for name in ("helper's code replaced", "code of a function a closure holds replaced")
}

#: Changes that compute what the trace did: served, as eager. Autoreload recompiles
#: every function of a saved file (the same code, at other lines); defaults reassigned
#: as they were; a cell given an equal value.
SERVED: dict[str, Callable[[], Callable[[], None]]] = {
    "same code compiled again": lambda: patched(
        _shift,
        "__code__",
        _shift.__code__.replace(co_firstlineno=_shift.__code__.co_firstlineno + 7),
    ),
    "equal defaults reassigned": lambda: patched(_scaled, "__defaults__", (float("2.0"),)),
    "cell given an equal value": lambda: patched_cell(_add, float("0.5")),
}

CHILD = """
import json, warnings
warnings.simplefilter("ignore")
from tests.core.runtime.test_dynamo_code_swaps import attack
print(json.dumps(attack({artifact!r}, {cache!r})))
"""


def attack(artifact: str, cache: str) -> dict[str, Any]:
    """In this (fresh) process: a change made before load, then each change after two
    served calls; what the changed call did, and whether the undone call serves as
    eager."""
    torch.manual_seed(1)
    model = SwapNet().eval()
    x = torch.randn(3, 8)
    out: dict[str, Any] = {}
    with torch.no_grad():
        for name, (change, _named) in BEFORE_LOAD.items():
            undo = change()
            try:
                try:
                    got = precompile.load(artifact, cache)(model, x)
                    out[name] = ["served", bool(torch.allclose(got, model(x)))]
                except precompile.PrecompileError as error:
                    out[name] = ["refused", str(error)]
            finally:
                undo()
        run = precompile.load(artifact, cache)
        for name, (change, _named) in [
            *CHANGES.items(),
            *((name, (change, "")) for name, change in SERVED.items()),
        ]:
            for _ in range(2):
                torch.testing.assert_close(run(model, x), model(x))
            undo = change()
            try:
                try:
                    got = run(model, x)
                    outcome: list[Any] = ["served", bool(torch.allclose(got, model(x)))]
                except precompile.PrecompileError as error:
                    outcome = ["refused", str(error)]
            finally:
                undo()
            try:
                again: Any = bool(torch.allclose(run(model, x), model(x)))
            except precompile.PrecompileError as error:
                again = str(error)
            out[name] = [*outcome, again]
    return out


@pytest.fixture(scope="module", params=["eager", "inductor"])
def outcomes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return attack_in_child(
        CHILD,
        serve,
        lambda: SwapNet().eval(),
        lambda: torch.randn(3, 8),
        directory=tmp_path_factory.mktemp(request.param),
        tracer=precompile.DynamoTracer(),
        backend=request.param,
    )


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_function_changed_in_place_after_serving_is_refused(
    outcomes: dict[str, Any], change: str
) -> None:
    kind, detail, again = outcomes[change]
    assert kind == "refused", (change, kind, detail)
    assert CHANGES[change][1] in detail, (change, detail)
    assert again is True, f"{change}: undone, but not served as eager: {again}"


@pytest.mark.parametrize("change", sorted(BEFORE_LOAD))
def test_a_code_swap_before_load_is_refused(outcomes: dict[str, Any], change: str) -> None:
    kind, detail = outcomes[change]
    assert kind == "refused", detail
    assert BEFORE_LOAD[change][1] in detail and "code" in detail, detail


@pytest.mark.parametrize("change", sorted(SERVED))
def test_a_change_that_computes_the_same_is_served(outcomes: dict[str, Any], change: str) -> None:
    assert outcomes[change] == ["served", True, True], (change, outcomes[change])
