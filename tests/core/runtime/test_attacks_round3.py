"""Round 3 attacks (issues 26 and 29) on four fast paths, each by class, both tracers.

Each scenario is a tiny module captured in eval (eager backend) by make_fx and by Dynamo;
in a FRESH process the artifact serves two calls on a fresh copy (the fast paths are
taken), then the scenario's change is made and the next call must answer as eager does
on the changed model (played again eagerly from the same start), or refuse with a
PrecompileError -- never answer from the stale state (the runner:
tests/attack_runner.py). The classes attacked: flags read only under ``training`` (the bytecode proof of
``neutral_reads.read_only_under_training``), hooks that only mark grad
(``hook_kinds.marks_grad_only``), hook identity (``hooks_fingerprint``), and the
per-call epoch / inlined guard leaves.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from tests.attack_runner import TRACERS, Attack, AttackSuite


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
    """``flag and training or other``: in eval the flag decides nothing, and a change of
    it is served (``neutral_reads._training_guarded_at``)."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = False
        self.other = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self.flag and self.training) or self.other:
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


class FrozenMarked(nn.Module):
    """A frozen layer whose output a grad-marking hook makes require grad (transformers'
    ``enable_input_require_grads``): in training, whether a backward runs at all."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4).requires_grad_(False)
        self.fc.register_forward_hook(_marks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * 2


def train_step(model: nn.Module, x: torch.Tensor) -> Any:
    out = model(x)
    marked = out.requires_grad
    if marked:
        out.sum().backward()
    return out.detach(), torch.tensor(marked)


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


def table_model() -> nn.Module:
    """A hook calling the function a dict it closes over holds (docs/trust.md's
    ``table["act"] = torch.tanh``)."""
    model = Hooked().eval()
    table = {"act": torch.relu}
    model.table = table  # type: ignore[assignment]
    model.fc.register_forward_hook(lambda m, a, o: table["act"](o))
    return model


def _swap_table(model: nn.Module) -> None:
    model.table["act"] = torch.tanh  # type: ignore[index, operator]


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


def _class_swap(model: nn.Module) -> None:
    model.__class__ = TripledSubclassed


def _remove_hooks(model: nn.Module) -> None:
    model.fc._forward_hooks.clear()  # type: ignore[union-attr, operator]


def _add_marking_hook(model: nn.Module) -> None:
    model.fc.register_forward_hook(_marks)  # type: ignore[union-attr, operator]


def _call_with(call: Callable[[Any, nn.Module, torch.Tensor], Any]) -> Any:
    """A change that is the call itself: ``call(fn, model, x)`` is made with the artifact
    and with eager alike."""
    return lambda model: call


def _in_thread(fn: Any, model: nn.Module, x: torch.Tensor) -> Any:
    """The call on another thread, where grad mode is on (torch's is per thread)."""
    import threading

    box: list[Any] = []

    def target() -> None:
        try:
            box.append(fn(model, x))
        except Exception as error:
            box.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if isinstance(box[0], Exception):
        raise box[0]
    return box[0].detach()


def _alternating(fn: Any, model: nn.Module, x: torch.Tensor) -> Any:
    """Another model of the captured class with another int attribute, called between
    two calls of the captured one (the epoch formed on the first)."""
    other = IntAttr().eval()
    other.load_state_dict(model.state_dict())
    other.n = 2
    fn(model, x)
    return fn(other, x)


def _alternating_threads(fn: Any, model: nn.Module, x: torch.Tensor) -> Any:
    """Two threads alternating the captured model and one with another int attribute;
    the other model's answers."""
    import threading

    other = IntAttr().eval()
    other.n = 2
    answers: list[Any] = []
    turn = threading.Semaphore(1)

    def loop(m: nn.Module, keep: bool) -> None:
        for _ in range(20):
            with turn:
                try:
                    with torch.no_grad():
                        out = fn(m, x)
                except Exception as error:
                    out = error
                if keep:
                    answers.append(out)

    threads = [
        threading.Thread(target=loop, args=(m, k)) for m, k in ((model, False), (other, True))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a in answers:
        if isinstance(a, Exception):
            raise a
    return answers


SCENARIOS: dict[str, Attack] = {
    # 1. flags read only under training
    "flag read by computed getattr": Attack(lambda: ComputedGetattr().eval(), _set("flag", True)),
    "flag read by __dict__": Attack(lambda: DunderDict().eval(), _set("flag", True)),
    "flag kept by a walrus": Attack(lambda: Walrus().eval(), _set("flag", True)),
    "flag read in another method": Attack(lambda: OtherMethod().eval(), _set("flag", True)),
    "flag read in a comprehension": Attack(lambda: Comprehension().eval(), _set("flag", True)),
    "flag and training or other (no-op)": Attack(
        lambda: AndTrainingOrOther().eval(), _set("flag", True)
    ),
    "not flag and training (no-op)": Attack(lambda: NotFlag().eval(), _set("flag", False)),
    "shared code, eval module's flag (no-op)": Attack(shared_code_model, _set("a.flag", True)),
    "shared code, training module's flag": Attack(shared_code_model, _set("b.flag", True)),
    "shared code, eval module put in training": Attack(
        shared_code_model, lambda m: m.a.train() and None
    ),
    "property flag's attribute": Attack(lambda: PropertyFlag().eval(), _set("level", 1)),
    # 2. grad-marking hooks
    "Tensor.requires_grad_ monkeypatched": Attack(
        lambda: WithMarked().eval(),
        lambda m: setattr(torch.Tensor, "requires_grad_", _requires_grad_doubling),
    ),
    "grad-marking hook removed (no-op)": Attack(lambda: WithMarked().eval(), _remove_hooks),
    "grad-marking hook added (no-op)": Attack(lambda: Hooked().eval(), _add_marking_hook),
    "grad-marking hook removed, training artifact": Attack(
        lambda: FrozenMarked().eval(), _remove_hooks, training=True, fn=train_step
    ),
    # 3. hook identity
    "hook closure's list mutated": Attack(closure_list_model, _mutate_box),
    "hook's global list mutated": Attack(global_list_model, _mutate_global),
    "callable object hook's attribute": Attack(callable_object_model, _set("scaler.k", 3.0)),
    "bound method hook's instance attribute": Attack(bound_method_model, _set("scaler.k", 3.0)),
    "partial hook's list mutated": Attack(partial_model, _mutate_box),
    "hook dict order reversed": Attack(ordered_model, reorder),
    "hook closure's dict entry swapped": Attack(table_model, _swap_table),
    # 4. per-call fast paths
    "int attribute to equal bool": Attack(lambda: IntAttr().eval(), _set("n", True)),
    "int attribute to equal float": Attack(lambda: IntAttr().eval(), _set("n", 1.0)),
    "str attribute to a never-equal subclass": Attack(
        lambda: StrAttr().eval(), _set("mode", NeverEqual("a"))
    ),
    "dict key added that the forward tests": Attack(lambda: DictAttr().eval(), _add_key),
    "dict value changed": Attack(lambda: DictAttr().eval(), _change_value),
    "module __class__ swapped to a subclass": Attack(lambda: Subclassed().eval(), _class_swap),
    "called with a keyword argument (no-op)": Attack(
        lambda: IntAttr().eval(), _call_with(lambda fn, m, x: fn(m, x=x))
    ),
    "called with an extra positional": Attack(
        lambda: IntAttr().eval(), _call_with(lambda fn, m, x: fn(m, x, 2))
    ),
    "called under inference_mode (no-op)": Attack(
        lambda: IntAttr().eval(), _call_with(lambda fn, m, x: _inference(fn, m, x))
    ),
    "called on another thread, grad on (no-op)": Attack(
        lambda: Subclassed().eval(), _call_with(_in_thread)
    ),
    "another model of another int between calls": Attack(
        lambda: IntAttr().eval(), _call_with(_alternating)
    ),
    "two threads alternating two models": Attack(
        lambda: IntAttr().eval(), _call_with(_alternating_threads)
    ),
}


def _inference(fn: Any, model: nn.Module, x: torch.Tensor) -> Any:
    with torch.inference_mode():
        return fn(model, x)


#: Needless refusals found by this round (a no-op refused), by tracer: the words the
#: refusal names. Served exactly is better and passes too; a wrong answer never does.
#: make_fx refuses keyword arguments to a function captured positionally
#: (docs: a documented rule); Dynamo guards the number of a module's forward hooks, so
#: a grad-marking hook removed from an inference artifact's module is refused.
KNOWN_NEEDLESS = {
    ("make_fx", "called with a keyword argument (no-op)"): "keyword arguments ['x']",
    ("dynamo", "grad-marking hook removed (no-op)"): "model.fc._forward_hooks",
}


_REQUIRES_GRAD = torch.Tensor.requires_grad_


def _reset() -> None:
    SCALE[0] = 2.0
    torch.Tensor.requires_grad_ = _REQUIRES_GRAD  # type: ignore[method-assign]


#: Wrong answers this round found and left: such a scenario is attacked with the other
#: tracer only (none left: Dynamo's module-hook check watches what a hook reaches per
#: call since the hook-state round).
KNOWN_WRONG: set[tuple[str, str]] = set()

#: Every scenario's model is an ordinary one: as captured, it is captured and served.
ATTACKS = AttackSuite(
    __name__,
    SCENARIOS,
    serve=serve,
    reset=_reset,
    known_needless=KNOWN_NEEDLESS,
    unchanged_served=True,
)


def test_each_scenario_is_attacked_by_both_tracers_but_the_known_wrong() -> None:
    left = {(t, n) for n in SCENARIOS for t in TRACERS if t not in SCENARIOS[n].tracers}
    assert left == KNOWN_WRONG


@pytest.mark.parametrize(("tracer", "scenario"), ATTACKS.cases(no_ops=False))
def test_a_change_is_refused_or_served_as_eager(
    tracer: str, scenario: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ATTACKS.check(tracer, scenario, tmp_path_factory, no_op=False)


@pytest.mark.parametrize(("tracer", "scenario"), ATTACKS.cases(no_ops=True))
def test_a_change_that_decides_nothing_is_served(
    tracer: str, scenario: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ATTACKS.check(tracer, scenario, tmp_path_factory, no_op=True)
