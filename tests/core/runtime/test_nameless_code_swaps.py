"""Issue 26, round 3: a function the trace ran that no import name reaches, changed in
place while serving.

A factory-made function (``make_act(1.7)``) has a qualified name no other process
resolves (``make_act.<locals>.act``). A real program reaches one through a dict held by
a module global, a list, a class attribute, a model attribute, a call that returns it,
or a library's registry. Dynamo guards such a function by identity (dropped from its
serialized guards); make_fx reads it while tracing. ``f.__code__ = g.__code__``
(IPython's autoreload), new ``__defaults__`` or a closure cell's new contents keep the
identity, and eager then computes something else. Each change is made in a fresh
serving process after two served calls (and a code swap before ``precompile.load``);
the changed call must be refused naming the function (or served as eager), and undoing
it serves as eager again. Both tracers.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from tests.core.runtime import _nameless_registry as registry
from tests.harness import attack_in_child, patched, patched_cell


def make_act(scale: float) -> Callable[..., torch.Tensor]:
    def act(t: torch.Tensor, bias: float = 0.0) -> torch.Tensor:
        return t * scale + bias

    return act


def make_other(scale: float) -> Callable[..., torch.Tensor]:
    # What a hot patch swaps in: the same free variables, other code.
    def act(t: torch.Tensor, bias: float = 0.0) -> torch.Tensor:
        return torch.sigmoid(t) * scale + bias

    return act


ACTS = {"gelu": make_act(1.7)}
ACT_LIST = [make_act(1.3)]


class Holder:
    act = make_act(1.1)


def _logged(method: Callable[..., Any]) -> Callable[..., Any]:
    # A decorator without functools.wraps: the class holds ``_logged.<locals>.wrapper``.
    def wrapper(self: Any, t: torch.Tensor) -> Any:
        return method(self, t)

    return wrapper


class Decorated:
    @_logged
    def shift(self, t: torch.Tensor) -> torch.Tensor:
        return t + 0.5

    @property
    def scale(self) -> float:
        return 1.5


_STATE = types.SimpleNamespace(act=make_act(0.7))


def get_act() -> Callable[..., torch.Tensor]:
    return _STATE.act


class NamelessNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.act = make_act(2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h = ACTS["gelu"](h)
        h = ACT_LIST[0](h)
        h = Holder.act(h)
        h = self.act(h)
        h = get_act()(h)
        return registry.get("swish")(h)


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


#: Where each function is reached from: site -> the function, given the model.
SITES: dict[str, Callable[[nn.Module], Any]] = {
    "global dict": lambda m: ACTS["gelu"],
    "global list": lambda m: ACT_LIST[0],
    "class attribute": lambda m: vars(Holder)["act"],
    "model attribute": lambda m: m.act,
    "returned by a call": lambda m: get_act(),
    "library registry": lambda m: registry.get("swish"),
}


#: Each change to a function: kind -> (fn -> undo).
KINDS: dict[str, Callable[[Any], Callable[[], None]]] = {
    "code swapped": lambda f: patched(f, "__code__", make_other(1.0).__code__),
    "closure cell changed": lambda f: patched_cell(f, 5.0),
    "defaults changed": lambda f: patched(f, "__defaults__", (0.5,)),
}

CHANGES = [f"{site}: {kind}" for site in SITES for kind in KINDS]
BEFORE_LOAD = [f"{site}: code swapped, before load" for site in SITES]

CHILD = """
import json, warnings
warnings.simplefilter("ignore")
from tests.core.runtime.test_nameless_code_swaps import attack
print(json.dumps(attack({artifact!r}, {cache!r})))
"""


def _outcome(run: Callable[[], Any], model: nn.Module, x: torch.Tensor) -> list[Any]:
    try:
        got = run()(model, x)
    except precompile.PrecompileError as error:
        return ["refused", str(error)]
    return ["served", bool(torch.allclose(got, model(x)))]


def attack(artifact: str, cache: str) -> dict[str, Any]:
    """In this (fresh) process: each site's code swapped before load, then each change
    after two served calls; what the changed call did, and whether the undone call
    serves as eager."""
    torch.manual_seed(1)
    model = NamelessNet().eval()
    x = torch.randn(3, 8)
    out: dict[str, Any] = {}
    with torch.no_grad():
        for site, reach in SITES.items():
            undo = KINDS["code swapped"](reach(model))
            try:
                out[f"{site}: code swapped, before load"] = _outcome(
                    lambda: precompile.load(artifact, cache), model, x
                )
            finally:
                undo()
        run = precompile.load(artifact, cache)
        for site, reach in SITES.items():
            for kind, change in KINDS.items():
                for _ in range(2):
                    torch.testing.assert_close(run(model, x), model(x))
                undo = change(reach(model))
                try:
                    outcome = _outcome(lambda: run, model, x)
                finally:
                    undo()
                again = _outcome(lambda: run, model, x)
                out[f"{site}: {kind}"] = [*outcome, again[1] if again[0] == "served" else again]
    return out


@pytest.fixture(scope="module", params=["make_fx", "dynamo"])
def outcomes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tracer = precompile.DynamoTracer() if request.param == "dynamo" else precompile.MakeFxTracer()
    return attack_in_child(
        CHILD,
        serve,
        lambda: NamelessNet().eval(),
        lambda: torch.randn(3, 8),
        directory=tmp_path_factory.mktemp(request.param),
        tracer=tracer,
    )


@pytest.mark.parametrize("change", CHANGES)
def test_a_nameless_function_changed_after_serving_is_refused(
    outcomes: dict[str, Any], change: str
) -> None:
    kind, detail, again = outcomes[change]
    # Served exactly as eager on the changed program, or refused naming the function.
    assert kind == "refused" or detail is True, (change, kind, detail)
    if kind == "refused":
        assert "act" in detail or "scaled" in detail, (change, detail)
    assert again is True, f"{change}: undone, but not served as eager: {again}"


@pytest.mark.parametrize("change", BEFORE_LOAD)
def test_a_nameless_code_swap_before_load_is_refused(outcomes: dict[str, Any], change: str) -> None:
    kind, detail = outcomes[change]
    assert kind == "refused" or detail is True, (change, kind, detail)


def test_a_nameless_function_no_serving_process_can_find_is_refused_at_capture() -> None:
    """The rows' own rule, on what a trace recorded: a function no name, no read path,
    no argument and no watched closure reaches is refused, naming it, where it is
    defined, and the fix; the same function read at a global path is recorded with it."""
    from precompile.capturing.dynamo_name_records import traced_function_rows

    hidden = make_other(0.3)  # held by nothing a serving process could evaluate
    with pytest.raises(precompile.PrecompileError) as refused:
        traced_function_rows([hidden.__code__])
    message = str(refused.value)
    line = hidden.__code__.co_firstlineno
    assert f"make_other.<locals>.act ({hidden.__code__.co_filename}:{line})" in message, message
    assert "importable by name" in message and "argument" in message, message
    scope = __name__
    rows = traced_function_rows([hidden.__code__], {(scope, "G['HIDDEN'][0]"): hidden})
    assert rows == [
        {
            "module": "",
            "qualname": "make_other.<locals>.act",
            "code": rows[0]["code"],
            "location": f"test_nameless_code_swaps.py:{line}",
            "nameless": "1",
            "reads": [{"scope": scope, "path": "G['HIDDEN'][0]"}],
        }
    ]
    # Reached from fn's arguments (ARG_IDENTITIES watches its code), or made per call
    # by traced code (its maker's digest covers it): no path needed.
    assert traced_function_rows([hidden.__code__], None, [hidden])[0]["nameless"]
    made = traced_function_rows([make_other.__code__, hidden.__code__])
    assert [r["qualname"] for r in made] == ["make_other", "make_other.<locals>.act"], made


def test_a_nameless_function_a_class_holds_is_found_through_the_class() -> None:
    """A decorator's wrapper in a class dict, a property's getter: their qualified names
    resolve elsewhere, and the class's dict is their path."""
    from precompile.capturing.dynamo_name_records import traced_function_rows

    wrapper = vars(Decorated)["shift"]
    getter = vars(Decorated)["scale"].fget
    rows = {r["qualname"]: r for r in traced_function_rows([wrapper.__code__, getter.__code__])}
    assert rows["_logged.<locals>.wrapper"]["reads"] == [
        {"scope": __name__, "path": "G['Decorated'].__dict__['shift']"}
    ]
    assert rows["Decorated.scale"]["reads"] == [
        {"scope": __name__, "path": "G['Decorated'].__dict__['scale'].fget"}
    ]
