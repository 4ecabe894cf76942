"""Issue 29: the make_fx driver's per-call epoch (single_graph ``checked_inputs``).

After a verified call, one comparison of the version tags of every dict the surface
check, the builtins check and the model-state fast path watch stands in for those
three checks' own comparisons. Here each kind of change those checks exist for is made
after calls took that epoch path (two calls first), in a fresh process per backend, and
the next call must refuse with a PrecompileError naming the change or answer exactly
as eager does -- never answer from the stale state; undoing the change serves again.
"""

from __future__ import annotations

import builtins
import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import precompile
from tests.harness import attack_in_child

SCALE = 1.5


def _shift(t: torch.Tensor) -> torch.Tensor:
    # No defaults, no cells: only its code says what it computes.
    return t + 1.0


class EpochNet(nn.Module):
    """Reads a torch function (the surface check), a builtin (the builtins check), a
    module global, a helper function and its own state (the model-state check)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _shift(F.gelu(self.fc(x))) * abs(-SCALE)


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def _patch(owner: Any, name: str, value: Any) -> Callable[[], None]:
    before = getattr(owner, name)
    setattr(owner, name, value)
    return lambda: setattr(owner, name, before)


def _set_scale(value: float) -> Callable[[], None]:
    global SCALE
    before, SCALE = SCALE, value

    def undo() -> None:
        global SCALE
        SCALE = before

    return undo


def _hook(model: EpochNet) -> Callable[[], None]:
    handle = model.fc.register_forward_hook(lambda mod, i, o: o * 2)
    return handle.remove


def _dict_replaced(model: EpochNet) -> Callable[[], None]:
    before = model.fc.__dict__
    model.fc.__dict__ = {**before, "_forward_hooks": {0: lambda mod, i, o: o * 2}}

    def undo() -> None:
        model.fc.__dict__ = before

    return undo


def _other_model_first(model: EpochNet) -> Callable[[], None]:
    """Another model is served (the epoch is rebuilt for it), then this one changed."""
    other = copy.deepcopy(model)
    RUN[0](other, torch.randn(3, 8))
    return _hook(model)


_MODULE_SETATTR = nn.Module.__setattr__
_MODULE_DELATTR = nn.Module.__delattr__


def _doubling_setattr(self: nn.Module, name: str, value: Any) -> None:
    # Stores every tensor doubled: eager differs only where a forward stores one.
    _MODULE_SETATTR(self, name, value * 2 if isinstance(value, torch.Tensor) else value)


class _Doubler(nn.Module):
    def __setattr__(self, name: str, value: Any) -> None:
        # Its code has one free variable (``__class__``), as Module.__setattr__'s has:
        # swapped in, it stores past Module's bookkeeping, every tensor doubled.
        super().__setattr__(name, value * 2 if isinstance(value, torch.Tensor) else value)


def _refusing_delattr(self: nn.Module, name: str) -> None:
    raise AttributeError(f"{name} cannot be deleted")


#: Each change, made after calls took the epoch path; it returns its undo.
CHANGES: dict[str, Callable[[EpochNet], Callable[[], None]]] = {
    "torch function replaced": lambda m: _patch(F, "gelu", lambda t, approximate="none": t * 2),
    "builtin replaced": lambda m: _patch(builtins, "abs", lambda v: 3.0),
    "module global changed": lambda m: _set_scale(2.5),
    # What IPython's autoreload does to an edited function.
    "helper's code replaced": lambda m: _patch(_shift, "__code__", (lambda t: t + 2.0).__code__),
    "forward hook added": _hook,
    "instance dict replaced": _dict_replaced,
    "class swapped": lambda m: _patch(m.fc, "__class__", type("Doubling", (nn.Linear,), {})),
    "weight strides changed in place": lambda m: _patch(
        m.fc.weight, "data", m.fc.weight.data.t().contiguous().t()
    ),
    "another model served, then this one changed": _other_model_first,
    # The traced call never stored or deleted an attribute: eager computes the same.
    "Module.__setattr__ replaced": lambda m: _patch(nn.Module, "__setattr__", _doubling_setattr),
    "Module.__delattr__ replaced": lambda m: _patch(nn.Module, "__delattr__", _refusing_delattr),
    "Module.__setattr__'s code replaced": lambda m: _patch(
        _MODULE_SETATTR, "__code__", _Doubler.__setattr__.__code__
    ),
}

#: The run of the child process, for changes that call it.
RUN: list[Any] = [None]

CHILD = """
import json, warnings
warnings.simplefilter("ignore")
from tests.core.runtime.test_call_epoch import attack
print(json.dumps(attack({artifact!r}, {cache!r})))
"""


def _epoch_dicts(run: Any) -> int | None:
    """How many dicts the driver's epoch folds (None: no epoch stands)."""
    checked = run._forward.covers.__closure__
    names = run._forward.covers.__code__.co_freevars
    inner = dict(zip(names, (c.cell_contents for c in checked)))["checked_inputs"]
    cells = dict(zip(inner.__code__.co_freevars, inner.__closure__))
    held = cells["epoch"].cell_contents[0]
    return None if held is None else len(held[0])


def attack(artifact: str, cache: str) -> dict[str, Any]:
    """Per change: a fresh model served twice, changed, served, the change undone,
    served again. What the changed call did (served with whether it equals eager, or
    refused with the message) and whether the undone call was served as eager."""
    run = precompile.load(artifact, cache)
    RUN[0] = run
    torch.manual_seed(1)
    base = EpochNet().eval()
    x = torch.randn(3, 8)
    out: dict[str, Any] = {}
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(run(base, x), base(x))
        out["epoch after two calls"] = _epoch_dicts(run)
        for name, change in CHANGES.items():
            model = copy.deepcopy(base)
            for _ in range(2):
                torch.testing.assert_close(run(model, x), model(x))
            undo = change(model)
            try:
                try:
                    got = run(model, x)
                    want = model(x)
                    outcome: list[Any] = ["served", bool(torch.allclose(got, want))]
                except precompile.PrecompileError as error:
                    outcome = ["refused", str(error)]
                    if name == "torch function replaced":
                        out["epoch after a refusal"] = _epoch_dicts(run)
            finally:
                undo()
            try:
                again = bool(torch.allclose(run(model, x), model(x)))
            except precompile.PrecompileError as error:
                again = str(error)
            out[name] = [*outcome, again]
    return out


@pytest.fixture(scope="module", params=["eager", "inductor"])
def outcomes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return attack_in_child(
        CHILD,
        serve,
        lambda: EpochNet().eval(),
        lambda: torch.randn(3, 8),
        directory=tmp_path_factory.mktemp(request.param),
        backend=request.param,
    )


#: What a refusal of each change must name.
NAMED = {
    "torch function replaced": "gelu",
    "builtin replaced": "abs",
    "module global changed": "SCALE",
    "helper's code replaced": "_shift",
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_each_change_after_the_epoch_is_caught(outcomes: dict[str, Any], change: str) -> None:
    kind, detail, again = outcomes[change]
    if kind == "served":
        assert detail is True, f"{change}: served a result that differs from eager"
    else:
        assert kind == "refused"
        if change in NAMED:
            assert NAMED[change] in detail, (change, detail)
    assert again is True, f"{change}: undone, but not served as eager: {again}"


def test_changes_eager_computes_differently_are_refused(outcomes: dict[str, Any]) -> None:
    """The graph holds gelu, abs(-1.5), _shift's + 1.0 and no hook: these cannot be
    served as eager."""
    for change in (
        "torch function replaced",
        "builtin replaced",
        "module global changed",
        "helper's code replaced",
    ):
        assert outcomes[change][0] == "refused", (change, outcomes[change])


def test_store_dunders_the_traced_call_never_entered_are_served(outcomes: dict[str, Any]) -> None:
    """``__setattr__``/``__delattr__`` run only on a store or a delete; the traced call
    (and so eager's call) made none, so replacing them changes nothing the call computes:
    served as eager, not refused (class_fingerprints.ENTERED_ONLY_DUNDERS)."""
    for change in (
        "Module.__setattr__ replaced",
        "Module.__delattr__ replaced",
        "Module.__setattr__'s code replaced",
    ):
        assert outcomes[change][:2] == ["served", True], (change, outcomes[change])


def test_the_epoch_stands_after_calls_and_drops_after_a_change(outcomes: dict[str, Any]) -> None:
    """Two plain calls leave an epoch over the checks' dicts (the surface's, the
    builtins, the model's and its module's globals); a refused change leaves none."""
    assert outcomes["epoch after two calls"] is not None
    assert outcomes["epoch after two calls"] >= 4
    assert outcomes["epoch after a refusal"] is None
