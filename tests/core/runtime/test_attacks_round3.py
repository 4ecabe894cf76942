"""Round 3 attacks (issues 26 and 29) on four fast paths, each by class, both tracers.

Each scenario is a tiny module captured in eval (eager backend) by make_fx and by Dynamo;
in a FRESH process the artifact serves two calls on a fresh copy (the fast paths are
taken), then the scenario's change is made and the next call must answer as eager does
on the changed model, or refuse with a PrecompileError -- never answer from the stale
state. The classes attacked: flags read only under ``training`` (the bytecode proof of
``neutral_reads.read_only_under_training``), hooks that only mark grad
(``hook_kinds.marks_grad_only``), hook identity (``hooks_fingerprint``), and the
per-call epoch / inlined guard leaves.
"""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

import precompile
from tests.harness import capture_pair, run_json

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


def serve(model: nn.Module, x: torch.Tensor) -> Any:
    return model(x)


# ---------------------------------------------------------------- 1. training-only flags


class ComputedGetattr(nn.Module):
    """The flag read twice in one code object: once as ``flag and training`` (proved
    neutral) and once by ``getattr`` with a name computed at run time, which decides in
    eval."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x + 100
        name = "".join(["fl", "ag"])
        if getattr(self, name):
            x = x * 3
        return x * 2


class DunderDict(nn.Module):
    """The flag proved neutral, and read again through ``self.__dict__``."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x + 100
        if self.__dict__["flag"]:
            x = x * 3
        return x * 2


class Walrus(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flag = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (kept := self.flag) and self.training:
            x = x + 100
        if kept:
            x = x * 3
        return x * 2


class OtherMethod(nn.Module):
    """Proved in forward, read plainly in a method forward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = False

    def scale(self) -> float:
        return 3.0 if self.flag else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x + 100
        return x * self.scale()


class Comprehension(nn.Module):
    """Proved in forward, read in a comprehension (its own code object in 3.11)."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x + 100
        return sum([x * 3 if self.flag else x for _ in range(1)])


class AndTrainingOrOther(nn.Module):
    """``flag and training or other``: in eval the flag decides nothing (a change of
    it may be served or refused; a wrong answer is the bug)."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = False
        self.other = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training or self.other:
            x = x + 100
        return x * 2


class NotFlag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flag = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.flag and self.training:
            x = x + 100
        return x * 2


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flag = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x * 5
        return x + 1


class SharedCode(nn.Module):
    """Two modules sharing one forward's code: one in eval, one in training."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Gated()
        self.b = Gated()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(x)


def shared_code_model() -> nn.Module:
    model = SharedCode().eval()
    model.b.train()
    return model


class PropertyFlag(nn.Module):
    """A property named like the flag, computing from an attribute that matters."""

    def __init__(self) -> None:
        super().__init__()
        self.level = 0

    @property
    def flag(self) -> bool:
        return self.level > 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x + 100
        return x * (2 + self.level)


# --------------------------------------------------------------- 2. grad-marking hooks


def _marks(module: Any, args: Any, output: Any) -> None:
    output.requires_grad_(True)


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> Any:
        return self.fc(x), x * 2


class WithMarked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fc.register_forward_hook(_marks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * 2


def _requires_grad_doubling(self: torch.Tensor, requires_grad: bool = True) -> torch.Tensor:
    with torch.no_grad():
        self.mul_(2)
    return self


# ----------------------------------------------------------------- 3. hook identity


SCALE = [2.0]


def _scaled_by_list(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
    return output * SCALE[0]


class Scaler:
    def __init__(self, k: float) -> None:
        self.k = k

    def __call__(self, module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        return output * self.k

    def method(self, module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        return output * self.k


def _partial_hook(box: list[float], module: Any, args: Any, output: torch.Tensor) -> Any:
    return output * box[0]


def _add_one(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
    return output + 1


def _double(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
    return output * 2


class Hooked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def closure_list_model() -> nn.Module:
    model = Hooked().eval()
    box = [2.0]
    model.box = box  # type: ignore[assignment]
    model.fc.register_forward_hook(lambda m, a, o: o * box[0])
    return model


def global_list_model() -> nn.Module:
    model = Hooked().eval()
    model.fc.register_forward_hook(_scaled_by_list)
    return model


def callable_object_model() -> nn.Module:
    model = Hooked().eval()
    model.scaler = Scaler(2.0)  # type: ignore[assignment]
    model.fc.register_forward_hook(model.scaler)
    return model


def bound_method_model() -> nn.Module:
    model = Hooked().eval()
    model.scaler = Scaler(2.0)  # type: ignore[assignment]
    model.fc.register_forward_hook(model.scaler.method)
    return model


def partial_model() -> nn.Module:
    model = Hooked().eval()
    model.box = [2.0]  # type: ignore[assignment]
    model.fc.register_forward_hook(functools.partial(_partial_hook, model.box))
    return model


def ordered_model() -> nn.Module:
    model = Hooked().eval()
    model.fc.register_forward_hook(_add_one)
    model.fc.register_forward_hook(_double)
    return model


def reorder(model: nn.Module) -> None:
    hooks = model.fc._forward_hooks
    items = list(hooks.items())
    hooks.clear()
    hooks.update(reversed(items))


# ------------------------------------------------------------- 4. per-call fast paths


class IntAttr(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.n = 1

    def forward(self, x: torch.Tensor) -> Any:
        return x * 2, torch.full((2,), self.n)


class StrAttr(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mode = "a"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "a":
            return x * 2
        return x * 3


class NeverEqual(str):
    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = str.__hash__


class DictAttr(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cfg = {"a": 1}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if "b" in self.cfg:
            return x * 3
        return x * self.cfg["a"]


class Subclassed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class TripledSubclassed(Subclassed):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * 3


def _set(name: str, value: Any) -> Callable[[nn.Module], None]:
    def change(model: nn.Module) -> None:
        owner: Any = model
        *path, last = name.split(".")
        for step in path:
            owner = getattr(owner, step)
        setattr(owner, last, value)

    return change


def _mutate_box(model: nn.Module) -> None:
    model.box[0] = 3.0  # type: ignore[index]


def _mutate_global(model: nn.Module) -> None:
    SCALE[0] = 3.0


def _add_key(model: nn.Module) -> None:
    model.cfg["b"] = 2  # type: ignore[index, operator]


def _change_value(model: nn.Module) -> None:
    model.cfg["a"] = 5  # type: ignore[index, operator]


def _to_tuple_output(model: nn.Module) -> None:
    return None


def _class_swap(model: nn.Module) -> None:
    model.__class__ = TripledSubclassed


#: name -> (model factory, change made after two served calls). Factories are seeded in
#: the runner.
SCENARIOS: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], None]]] = {
    # 1. flags read only under training
    "flag read by computed getattr": (lambda: ComputedGetattr().eval(), _set("flag", True)),
    "flag read by __dict__": (lambda: DunderDict().eval(), _set("flag", True)),
    "flag kept by a walrus": (lambda: Walrus().eval(), _set("flag", True)),
    "flag read in another method": (lambda: OtherMethod().eval(), _set("flag", True)),
    "flag read in a comprehension": (lambda: Comprehension().eval(), _set("flag", True)),
    "flag and training or other (no-op)": (
        lambda: AndTrainingOrOther().eval(),
        _set("flag", True),
    ),
    "not flag and training (no-op)": (lambda: NotFlag().eval(), _set("flag", False)),
    "shared code, eval module's flag (no-op)": (shared_code_model, _set("a.flag", True)),
    "shared code, training module's flag": (shared_code_model, _set("b.flag", True)),
    "shared code, eval module put in training": (
        shared_code_model,
        lambda m: m.a.train() and None,
    ),
    "property flag's attribute": (lambda: PropertyFlag().eval(), _set("level", 1)),
    # 2. grad-marking hooks
    "Tensor.requires_grad_ monkeypatched": (
        lambda: WithMarked().eval(),
        lambda m: setattr(torch.Tensor, "requires_grad_", _requires_grad_doubling),
    ),
    # 3. hook identity
    "hook closure's list mutated": (closure_list_model, _mutate_box),
    "hook's global list mutated": (global_list_model, _mutate_global),
    "callable object hook's attribute": (callable_object_model, _set("scaler.k", 3.0)),
    "bound method hook's instance attribute": (bound_method_model, _set("scaler.k", 3.0)),
    "partial hook's list mutated": (partial_model, _mutate_box),
    "hook dict order reversed": (ordered_model, reorder),
    # 4. per-call fast paths
    "int attribute to equal bool": (lambda: IntAttr().eval(), _set("n", True)),
    "int attribute to equal float": (lambda: IntAttr().eval(), _set("n", 1.0)),
    "str attribute to a never-equal subclass": (
        lambda: StrAttr().eval(),
        _set("mode", NeverEqual("a")),
    ),
    "dict key added that the forward tests": (lambda: DictAttr().eval(), _add_key),
    "dict value changed": (lambda: DictAttr().eval(), _change_value),
    "module __class__ swapped to a subclass": (lambda: Subclassed().eval(), _class_swap),
}

#: scenarios whose change cannot change eager's answer: a refusal of it is a needless one
NO_OPS = {name for name in SCENARIOS if "(no-op)" in name}


def _flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in _flat(value[k])]
    return []


def _same(got: Any, want: Any) -> bool:
    a, b = _flat(got), _flat(want)
    return len(a) == len(b) and all(
        p.dtype == q.dtype and p.shape == q.shape and torch.allclose(p, q) for p, q in zip(a, b)
    )


def attack(pairs: dict[str, list[str]]) -> dict[str, list[Any]]:
    """In this (fresh) process: each scenario's artifact loaded, a fresh model served
    twice, the change made, the next call's outcome: ["served", equal to eager],
    ["refused", message], ["failed otherwise", repr] or ["served where eager fails"]."""
    saved = torch.Tensor.requires_grad_
    outcomes: dict[str, list[Any]] = {}
    x = torch.randn(3, 4)
    for name, (artifact, cache) in pairs.items():
        factory, change = SCENARIOS[name]
        run = precompile.load(artifact, cache)
        torch.manual_seed(0)
        model = factory()
        SCALE[0] = 2.0
        try:
            with torch.no_grad():
                for _ in range(2):
                    assert _same(run(model, x), model(x)), name
                change(model)
                try:
                    got: Any = run(model, x)
                except Exception as error:
                    got = error
                try:
                    want: Any = model(x)
                except Exception as error:
                    want = error
        finally:
            torch.Tensor.requires_grad_ = saved  # type: ignore[method-assign]
        if isinstance(got, precompile.PrecompileError):
            outcomes[name] = ["refused", str(got)]
        elif isinstance(got, Exception):
            outcomes[name] = ["failed otherwise", repr(got)]
        elif isinstance(want, Exception):
            outcomes[name] = ["served where eager fails", repr(want)]
        else:
            outcomes[name] = ["served", _same(got, want)]
    return outcomes


CHILD = """
import json, warnings
warnings.simplefilter("ignore")
from tests.core.runtime.test_attacks_round3 import attack
print(json.dumps(attack({pairs!r})))
"""


def _capture_all(tracer: str, directory: Path) -> dict[str, list[str]]:
    pairs: dict[str, list[str]] = {}
    x = torch.randn(3, 4)
    for k, (name, (factory, _change)) in enumerate(SCENARIOS.items()):
        torch.manual_seed(0)
        SCALE[0] = 2.0
        with torch.no_grad():
            pairs[name] = list(
                capture_pair(
                    serve,
                    factory(),
                    x,
                    directory=directory,
                    name=f"{tracer}_{k}",
                    tracer=TRACERS[tracer](),
                )
            )
    return pairs


@pytest.fixture(scope="module", params=sorted(TRACERS))
def outcomes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tracer = request.param
    pairs = _capture_all(tracer, tmp_path_factory.mktemp(tracer))
    return tracer, run_json(textwrap.dedent(CHILD.format(pairs=pairs)))


@pytest.mark.parametrize("scenario", sorted(set(SCENARIOS) - NO_OPS))
def test_a_change_is_refused_or_served_as_eager(outcomes: Any, scenario: str) -> None:
    tracer, found = outcomes
    kind, detail = found[scenario]
    assert kind == "refused" or [kind, detail] == ["served", True], (tracer, kind, detail)


@pytest.mark.parametrize("scenario", sorted(NO_OPS))
def test_a_change_that_decides_nothing_is_served(outcomes: Any, scenario: str) -> None:
    tracer, found = outcomes
    assert found[scenario] == ["served", True], (tracer, found[scenario])
