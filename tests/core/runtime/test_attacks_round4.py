"""Round 4 attacks (issue 26, trust round 3) on the four mechanisms merged at this stop.

A. flags tested at once with ``training`` (``neutral_reads._training_guarded_at``);
B. global module hooks that store (``hook_stores``);
C. Dynamo's nameless functions watched through their read paths;
D. the per-call fast paths (make_fx's inline epoch checks, Dynamo's dependency epoch).

Each scenario is a tiny module captured in eval (eager backend unless it says Inductor) by
make_fx and by Dynamo. In ONE fresh process per tracer, each scenario is played twice
from the same starting state (its ``reset`` run, a fresh model built, its global hooks
installed): once through the loaded artifact and once eagerly -- two calls, the change,
a third call -- and everything each play returns (its three answers and the scenario's
``probe`` of the state it leaves) is compared. Every cell must end "served and equal to
eager" or "refused with a PrecompileError" (at capture or at the call); no-op changes
must be served. Wrong answers and crashes found and left are in ``KNOWN_WRONG``, asserted
so that the test fails when one is fixed. The runner: tests/attack_runner.py.
"""

from __future__ import annotations

import functools
import threading
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.modules.module as nn_module
from torch import nn
from torch.nn.utils import parametrize

import precompile
from tests.attack_runner import Attack, AttackSuite


def serve(model: nn.Module, x: torch.Tensor) -> Any:
    return model(x)


# ---------------------------------------------------------------- A. training-only flags


class TrainingProperty(nn.Module):
    """``training`` is a property: the flag is neutral only while it is False, and it
    is computed from ``force`` (an attribute the artifact never saw decide)."""

    def __init__(self) -> None:
        self.force = False
        super().__init__()
        self.flag = False

    @property  # type: ignore[override]
    def training(self) -> bool:  # type: ignore[override]
        return bool(self.__dict__.get("_t", False)) or self.force

    @training.setter
    def training(self, value: bool) -> None:
        self.__dict__["_t"] = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x + 100
        return x * 2


def _flag_and_force(model: nn.Module) -> None:
    model.flag = True
    model.force = True  # type: ignore[assignment]


class ChildTraining(nn.Module):
    """The flag tested with ANOTHER module's ``training``."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = False
        self.child = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.child.training:
            x = x + 100
        return x * 2


def _flag_and_child_train(model: nn.Module) -> None:
    model.flag = True
    model.child.train()  # type: ignore[union-attr, operator]


class ValueKept(nn.Module):
    """``flag and training`` kept as a value: in eval it is the flag when the flag is
    falsy, ``training`` (False) otherwise -- 0 and False differ in dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.flag: Any = 0

    def forward(self, x: torch.Tensor) -> Any:
        kept = self.flag and self.training
        return x * 2, torch.tensor(kept)


class IsFalse(nn.Module):
    """``(flag and training) is False``: flag None gives None, flag True gives False."""

    def __init__(self) -> None:
        super().__init__()
        self.flag: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self.flag and self.training) is False:
            x = x + 100
        return x * 2


class Matched(nn.Module):
    """A match statement on ``flag and training``."""

    def __init__(self) -> None:
        super().__init__()
        self.flag: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        match self.flag and self.training:
            case None:
                return x * 2
            case _:
                return x * 3


class Ternary(nn.Module):
    """``a if (flag and training) else b`` -- neutral in eval."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + 100 if (self.flag and self.training) else x * 3
        return y * 2


class WhileLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flag = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        while self.flag and self.training:
            x = x + 100
            break
        return x * 2


class LambdaRead(nn.Module):
    """A lambda reads the flag with training; the lambda's result is kept as a value."""

    def __init__(self) -> None:
        super().__init__()
        self.flag: Any = 0

    def forward(self, x: torch.Tensor) -> Any:
        both = lambda: self.flag and self.training  # noqa: E731
        return x * 2, torch.tensor(both())


class ComprehensionWalrus(nn.Module):
    """A walrus in a comprehension binds the flag in forward's scope; read plainly after."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if [(kept := self.flag) and self.training for _ in range(1)][0]:  # noqa: RUF015
            x = x + 100
        if kept:
            x = x * 3
        return x * 2


class Truthy:
    """A flag whose truth test stores into the module that tests it."""

    def __init__(self, owner: nn.Module) -> None:
        self.owner = owner

    def __bool__(self) -> bool:
        self.owner.scale = 3.0
        return True


class BoolSideEffect(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flag: Any = False
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x + 100
        return x * self.scale


def _truthy_flag(model: nn.Module) -> None:
    model.flag = Truthy(model)


class ShadowedTraining(nn.Module):
    """``training`` in the instance dict shadowed by a data descriptor set later."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x + 100
        return x * 2


class _AlwaysTraining(ShadowedTraining):
    @property  # type: ignore[override]
    def training(self) -> bool:  # type: ignore[override]
        return True

    @training.setter
    def training(self, value: bool) -> None:
        pass


def _shadow_training(model: nn.Module) -> None:
    model.__class__ = _AlwaysTraining


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flag: Any = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x * 5
        return x + 1


class Raising:
    """A flag whose truth test raises (as a many-valued tensor's or array's does)."""

    def __bool__(self) -> bool:
        raise ValueError("the truth value of this flag is ambiguous")


class SelfRebound(nn.Module):
    """The flag proved neutral on ``self``; ``self`` rebound to the child, whose flag of
    the same name decides."""

    def __init__(self, child: bool = True) -> None:
        super().__init__()
        self.flag = False
        if child:
            self.child = SelfRebound(child=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x + 100
        self = self.child
        if self.flag:
            x = x * 3
        return x * 2


# ------------------------------------------------------------------- B. global hooks

HOOK_STATE: dict[str, Any] = {}


def _reset_hook_state() -> None:
    HOOK_STATE.clear()
    HOOK_STATE.update(on=False, scale=1.0, seen=[], buf=torch.zeros(4))


class Counted(nn.Module):
    """Reads what a global hook stores on its child."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fc.count = 0  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + self.fc.count


def _counting_hook(module: Any, args: Any, output: Any) -> None:
    if isinstance(module, nn.Linear):
        module.count = getattr(module, "count", 0) + 1


def _globals_hook(module: Any, args: Any, output: Any) -> None:
    globals()["HOOK_STATE"]["scale"] = HOOK_STATE["scale"] + 1.0


class ReadsScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * HOOK_STATE["scale"]


def _buffer_hook(module: Any, args: Any, output: Any) -> None:
    if isinstance(module, nn.Linear):
        HOOK_STATE["buf"].add_(1)


class ReadsBuf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + HOOK_STATE["buf"]


def _pre_scaling(module: Any, args: Any) -> Any:
    if isinstance(module, nn.Linear):
        return (args[0] * HOOK_STATE["scale"],)
    return None


def _sometimes_store(module: Any, args: Any, output: Any) -> None:
    if HOOK_STATE["on"]:
        HOOK_STATE["seen"].append(1)


class ReadsSeen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + len(HOOK_STATE["seen"])


def _turn_on(model: nn.Module) -> None:
    HOOK_STATE["on"] = True


def _scale_up(model: nn.Module) -> None:
    HOOK_STATE["scale"] = 3.0


def _doubling(module: Any, args: Any, output: Any) -> Any:
    if isinstance(module, nn.Linear):
        return output * 2
    return None


#: handles of hooks a change registers, removed by the play's cleanup
_HANDLES: list[Any] = []


def _add_global_hook(model: nn.Module) -> None:
    _HANDLES.append(nn_module.register_module_forward_hook(_doubling))


def _backward_hook(module: Any, grad_in: Any, grad_out: Any) -> None:
    HOOK_STATE["seen"].append(1)


# ------------------------------------------------------------ C. nameless functions


def make_act(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def act(x: torch.Tensor) -> torch.Tensor:
        return x * k

    return act


def make_plus(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def act(x: torch.Tensor) -> torch.Tensor:
        return x + k

    return act


#: code with the same free variable (``k``) as ``make_act``'s function, another body
_PLUS_CODE = make_plus(0.0).__code__


REGISTRY: dict[str, Any] = {}
NS = types.SimpleNamespace()
WEAK: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_KEEP: list[Any] = []


def _outer(x: torch.Tensor, act: Any = make_act(2.0)) -> torch.Tensor:  # noqa: B008 (the attack)
    return act(x) + 1


@functools.cache
def cached_act(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return make_act(k)


def _reset_nameless() -> None:
    REGISTRY.clear()
    REGISTRY["act"] = make_act(2.0)
    NS.act = make_act(2.0)
    _KEEP.clear()
    _KEEP.append(make_act(2.0))
    WEAK["act"] = _KEEP[0]
    _outer.__defaults__ = (make_act(2.0),)
    cached_act.cache_clear()


class UsesRegistry(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return REGISTRY["act"](x) + 1


class UsesNamespace(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return NS.act(x) + 1


class UsesWeak(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return WEAK["act"](x) + 1


class UsesDefault(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _outer(x)


class UsesCached(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cached_act(2.0)(x) + 1


class UsesHelper(nn.Module):
    def helper(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.helper(x) + 1


def _wraps_swap(model: nn.Module) -> None:
    old = REGISTRY["act"]

    @functools.wraps(old)
    def wrapper(x: torch.Tensor) -> torch.Tensor:
        return old(x) * 5

    REGISTRY["act"] = wrapper


def _wraps_code_swap(model: nn.Module) -> None:
    """The registry's function keeps its identity; its code becomes a wrapper's."""
    REGISTRY["act"].__code__ = _PLUS_CODE


def _ns_code_swap(model: nn.Module) -> None:
    NS.act.__code__ = _PLUS_CODE


def _ns_replace(model: nn.Module) -> None:
    NS.act = make_act(4.0)


def _weak_replace(model: nn.Module) -> None:
    _KEEP.append(make_act(4.0))
    WEAK["act"] = _KEEP[-1]


def _default_code_swap(model: nn.Module) -> None:
    _outer.__defaults__[0].__code__ = _PLUS_CODE  # type: ignore[index]


def _default_closure_cell(model: nn.Module) -> None:
    _outer.__defaults__[0].__closure__[0].cell_contents = 5.0  # type: ignore[index]


def _registry_closure_cell(model: nn.Module) -> None:
    REGISTRY["act"].__closure__[0].cell_contents = 5.0


def _cached_code_swap(model: nn.Module) -> None:
    cached_act(2.0).__code__ = _PLUS_CODE


def _cached_cleared(model: nn.Module) -> None:
    """The cache cleared and the function made again differently (a reloaded config)."""
    cached_act.cache_clear()
    cached_act.__wrapped__.__code__ = _make_act_tripled.__code__  # type: ignore[attr-defined]


def _make_act_tripled(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def act(x: torch.Tensor) -> torch.Tensor:
        return x * k * 3

    return act


_CACHED_CODE = cached_act.__wrapped__.__code__  # type: ignore[attr-defined]


def _method_on_instance(model: nn.Module) -> None:
    model.helper = types.MethodType(lambda self, x: x * 7, model)  # type: ignore[method-assign]


def _forward_on_instance(model: nn.Module) -> None:
    model.forward = types.MethodType(lambda self, x: x * 7, model)  # type: ignore[method-assign]


# ------------------------------------------------------------------ D. fast paths


class Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x))) * self.k

    k = 2.0


class TwoOther(nn.Module):
    """The same forward text as ``Two``, another class with another class attribute."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x))) * self.k

    k = 3.0


class TrainBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return self.fc(x) * 3
        return self.fc(x)


class CallCounter(nn.Module):
    """Counts its calls (an attribute stored by forward itself) and reads ``k``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.calls = 0
        self.k = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.fc(x) * self.k


class StoresLast(nn.Module):
    """Stores an attribute on every call (never reads it) and reads ``k``: the instance
    dict changes on every call, alone."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.k = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last = x.shape[0] * 10
        return self.fc(x) * self.k


class KModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.k = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.k


def _linear_class_setattr(model: nn.Module) -> None:
    """``nn.Linear.__setattr__`` patched in place (restored by the play)."""
    nn.Linear.__setattr__ = _scaling_setattr  # type: ignore[method-assign, assignment]


def _doubled_weight_getattr(self: nn.Module, name: str) -> Any:
    value = nn.Module.__getattr__(self, name)
    return value * 2 if name == "weight" else value


def _linear_class_getattr(model: nn.Module) -> None:
    """``nn.Linear.__getattr__`` patched in place: ``weight`` read doubled."""
    nn.Linear.__getattr__ = _doubled_weight_getattr  # type: ignore[method-assign, assignment]


class StoresScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.base = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fc.scale = self.base * 2
        return self.fc(x) * self.fc.scale


def _scaling_setattr(self: nn.Module, name: str, value: Any) -> None:
    if name == "scale":
        value = value * 3
    nn.Module.__setattr__(self, name, value)


def _linear_setattr(model: nn.Module) -> None:
    """A ``__setattr__`` added to a subclass's class after load (nn.Linear untouched)."""
    model.fc.__class__ = type("ScaledLinear", (nn.Linear,), {"__setattr__": _scaling_setattr})


def _replace_fc_dict(model: nn.Module) -> None:
    fc = model.fc1
    new = dict(fc.__dict__)
    new["_parameters"] = {
        "weight": nn.Parameter(fc.weight.detach() * 2),
        "bias": nn.Parameter(fc.bias.detach()),
    }
    fc.__dict__ = new


def _copy_fc_dict(model: nn.Module) -> None:
    model.fc1.__dict__ = dict(model.fc1.__dict__)


def _readd_fc(model: nn.Module) -> None:
    del model.fc1
    torch.manual_seed(5)
    model.fc1 = nn.Linear(4, 4)


def _readd_same_fc(model: nn.Module) -> None:
    fc = model.fc1
    del model.fc1
    model.fc1 = fc


def _replace_modules(model: nn.Module) -> None:
    model._modules = OrderedDict(model._modules)


def _counter_and_k(model: nn.Module) -> None:
    model.k = 3  # type: ignore[assignment]


def _counter_setattr_k(model: nn.Module) -> Any:
    """A call, then ``k`` changed between two calls that each store ``calls``."""

    def call(fn: Any, m: nn.Module, x: torch.Tensor) -> Any:
        fn(m, x)
        m.k = 3  # type: ignore[assignment]
        return fn(m, x)

    return call


def _checked(fn: Any, m: nn.Module, x: torch.Tensor) -> bool:
    """One call: True when it is refused with a PrecompileError or answers as eager does
    on ``m`` as it is now."""
    try:
        got = fn(m, x)
    except precompile.PrecompileError:
        return True
    return bool(torch.allclose(got, serve(m, x)))


def _twin(m: nn.Module, seed: int) -> nn.Module:
    """Another model of ``m``'s class, other weights, same attributes."""
    torch.manual_seed(seed)
    return type(m)().eval()


def _alternate_then_change(model: nn.Module) -> Any:
    """Two models served alternately (both pass), then the second's ``k`` changed while
    the alternation goes on: every call refused or as eager."""

    def call(fn: Any, m: nn.Module, x: torch.Tensor) -> Any:
        other = _twin(m, 9)
        ok = []
        for i in range(6):
            if i == 3:
                other.k = 5  # type: ignore[assignment]
            ok += [_checked(fn, m, x), _checked(fn, other, x)]
        return torch.tensor(ok)

    return call


def _alternate_weights(model: nn.Module) -> Any:
    def call(fn: Any, m: nn.Module, x: torch.Tensor) -> Any:
        other = _twin(m, 9)
        out = []
        for _ in range(3):
            out += [fn(m, x), fn(other, x)]
        return out

    return call


def _racing_threads(model: nn.Module) -> Any:
    """Two threads, no lock, each serving its own model (both pass) up to 1000 times;
    the second changes its model's ``k`` halfway. Every call refused or as eager; the
    threads stop at the first call that is neither (a race shows when it shows)."""

    def call(fn: Any, m: nn.Module, x: torch.Tensor) -> Any:
        import sys
        import time

        other = _twin(m, 9)
        ok: dict[int, list[bool]] = {0: [], 1: []}
        wrong = threading.Event()
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)

        def yielding(frame: Any, event: str, arg: Any) -> Any:
            # The second thread gives the GIL away at every line the served call's own
            # code runs (not torch's, not this test's), so the first thread's calls run
            # in the middle of the second's checks: the interleavings a loaded server
            # sees, made frequent.
            if event == "call":
                name = frame.f_code.co_filename
                return None if "site-packages" in name or name == __file__ else yielding
            if event == "line":
                time.sleep(0)
            return yielding

        def loop(i: int, mm: nn.Module) -> None:
            if i == 1:
                sys.settrace(yielding)
            with torch.no_grad():
                for n in range(1000):
                    if i == 1 and n == 500:
                        mm.k = 5  # type: ignore[assignment]
                    ok[i].append(_checked(fn, mm, x))
                    if not ok[i][-1]:
                        wrong.set()
                    if wrong.is_set():
                        return

        threads = [threading.Thread(target=loop, args=(i, mm)) for i, mm in enumerate((m, other))]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(interval)
        return torch.tensor(
            [all(ok[0]), all(ok[1]), wrong.is_set() or len(ok[0]) + len(ok[1]) == 2000]
        )

    return call


def _dict_copy_with_k(model: nn.Module) -> None:
    """The instance dict replaced wholesale by a copy holding another ``k``."""
    model.__dict__ = {**model.__dict__, "k": 5}


def _class_k(model: nn.Module) -> None:
    """``k`` changed on the class (a class attribute ``Two`` reads through ``self``)."""
    type(model).k = 4.0  # type: ignore[attr-defined]


def _hook_added(model: nn.Module) -> None:
    model.fc1.register_forward_hook(lambda m, a, o: o * 2)  # type: ignore[union-attr, operator]


def _hook_added_and_removed(model: nn.Module) -> None:
    model.fc1.register_forward_hook(lambda m, a, o: o * 2).remove()  # type: ignore[union-attr, operator]


def _weight_data(model: nn.Module) -> None:
    model.fc1.weight.data = torch.ones(4, 4)  # type: ignore[union-attr]


def _parametrized(model: nn.Module) -> None:
    class Doubled(nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return w * 2

    parametrize.register_parametrization(model.fc1, "weight", Doubled())


CFG: dict[str, Any] = {}
EXTRA: dict[str, float] = {}


def _reset_dicts() -> None:
    CFG.clear()
    CFG["a"] = 1
    EXTRA.clear()


class ReadsDicts(nn.Module):
    """Reads a global dict's key, tests another's presence, and loops over an empty
    global dict (the epoch's dict tags, keys and emptiness)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x) * CFG["a"]
        if "b" in CFG:
            y = y + 10
        for v in EXTRA.values():
            y = y * v
        return y


def _extra_added_and_removed(model: nn.Module) -> None:
    EXTRA["s"] = 3.0
    del EXTRA["s"]


def _module_class_getattr(model: nn.Module) -> None:
    """``nn.Module.__getattr__`` patched in place: ``weight`` read doubled."""
    nn.Module.__getattr__ = _doubled_weight_getattr_module  # type: ignore[method-assign]


_MODULE_GETATTR = nn.Module.__getattr__


def _doubled_weight_getattr_module(self: nn.Module, name: str) -> Any:
    value = _MODULE_GETATTR(self, name)
    return value * 2 if name == "weight" else value


def _inference_call(model: nn.Module) -> Any:
    def call(fn: Any, m: nn.Module, x: torch.Tensor) -> Any:
        with torch.inference_mode():
            return fn(m, x).clone()

    return call


# ------------------------------------------------------------------ the scenarios


FWD = nn_module.register_module_forward_hook
PRE = nn_module.register_module_forward_pre_hook
BWD = nn_module.register_module_full_backward_hook


def _seen(model: nn.Module) -> Any:
    return len(HOOK_STATE["seen"])


def _scale(model: nn.Module) -> Any:
    return HOOK_STATE["scale"]


SCENARIOS: dict[str, Attack] = {
    # A. flags tested with training
    "A training is a property, flag and its input changed": Attack(
        lambda: TrainingProperty().eval(), _flag_and_force
    ),
    "A flag with another module's training, both changed": Attack(
        lambda: ChildTraining().eval(), _flag_and_child_train
    ),
    "A flag and training kept as a value": Attack(
        lambda: ValueKept().eval(), lambda m: setattr(m, "flag", 5)
    ),
    "A (flag and training) is False": Attack(
        lambda: IsFalse().eval(), lambda m: setattr(m, "flag", True)
    ),
    "A match on flag and training": Attack(
        lambda: Matched().eval(), lambda m: setattr(m, "flag", True)
    ),
    "A ternary on flag and training (no-op)": Attack(
        lambda: Ternary().eval(), lambda m: setattr(m, "flag", True)
    ),
    "A while flag and training (no-op)": Attack(
        lambda: WhileLoop().eval(), lambda m: setattr(m, "flag", True)
    ),
    "A lambda keeps flag and training as a value": Attack(
        lambda: LambdaRead().eval(), lambda m: setattr(m, "flag", 5)
    ),
    "A walrus in a comprehension, flag read after": Attack(
        lambda: ComprehensionWalrus().eval(), lambda m: setattr(m, "flag", True)
    ),
    "A flag whose truth test stores": Attack(
        lambda: BoolSideEffect().eval(), _truthy_flag, probe=lambda m: m.scale
    ),
    "A flag set to a value whose truth test raises": Attack(
        lambda: Gated().eval(), lambda m: setattr(m, "flag", Raising())
    ),
    "A flag set to a many-valued tensor": Attack(
        lambda: Gated().eval(), lambda m: setattr(m, "flag", torch.ones(2, dtype=torch.bool))
    ),
    "A self rebound to the child, child's flag": Attack(
        lambda: SelfRebound().eval(), lambda m: setattr(m.child, "flag", True)
    ),
    "A training shadowed by a class property": Attack(
        lambda: ShadowedTraining().eval(), _shadow_training
    ),
    # B. global hooks
    "B global hook stores on the hooked module": Attack(
        lambda: Counted().eval(),
        lambda m: None,
        hooks=((FWD, _counting_hook),),
        probe=lambda m: m.fc.count,
    ),
    "B global hook stores through globals()": Attack(
        lambda: ReadsScale().eval(), lambda m: None, hooks=((FWD, _globals_hook),), probe=_scale
    ),
    "B global hook adds into a tensor in place": Attack(
        lambda: ReadsBuf().eval(),
        lambda m: None,
        hooks=((FWD, _buffer_hook),),
        probe=lambda m: HOOK_STATE["buf"].clone(),
    ),
    "B global pre-hook returns a scaled input, scale changed": Attack(
        lambda: ReadsSeen().eval(), _scale_up, hooks=((PRE, _pre_scaling),)
    ),
    "B global hook stores only once turned on": Attack(
        lambda: ReadsSeen().eval(), _turn_on, hooks=((FWD, _sometimes_store),), probe=_seen
    ),
    "B global backward hook, grad off (no-op)": Attack(
        lambda: ReadsSeen().eval(), lambda m: None, hooks=((BWD, _backward_hook),), probe=_seen
    ),
    "B global hook added after serving": Attack(lambda: ReadsSeen().eval(), _add_global_hook),
    # C. nameless functions
    "C registry function replaced by a functools.wraps wrapper": Attack(
        lambda: UsesRegistry().eval(), _wraps_swap
    ),
    "C registry function's __code__ swapped": Attack(
        lambda: UsesRegistry().eval(), _wraps_code_swap
    ),
    "C registry function's __code__ swapped before load": Attack(
        lambda: UsesRegistry().eval(), _wraps_code_swap, before_load=True
    ),
    "C registry filled after load by the same maker (no-op)": Attack(
        lambda: UsesRegistry().eval(), lambda m: None, after_load=_reset_nameless
    ),
    "C registry function's closure cell changed": Attack(
        lambda: UsesRegistry().eval(), _registry_closure_cell
    ),
    "C SimpleNamespace function's __code__ swapped": Attack(
        lambda: UsesNamespace().eval(), _ns_code_swap
    ),
    "C SimpleNamespace function replaced": Attack(lambda: UsesNamespace().eval(), _ns_replace),
    "C WeakValueDictionary function replaced": Attack(lambda: UsesWeak().eval(), _weak_replace),
    "C default argument function's __code__ swapped": Attack(
        lambda: UsesDefault().eval(), _default_code_swap
    ),
    "C default argument function's closure cell changed": Attack(
        lambda: UsesDefault().eval(), _default_closure_cell
    ),
    "C lru_cache result's __code__ swapped": Attack(lambda: UsesCached().eval(), _cached_code_swap),
    "C lru_cache cleared and its maker changed": Attack(
        lambda: UsesCached().eval(), _cached_cleared
    ),
    "C method replaced on the instance": Attack(lambda: UsesHelper().eval(), _method_on_instance),
    "C forward replaced on the instance": Attack(lambda: UsesHelper().eval(), _forward_on_instance),
    # D. fast paths
    "D __class__ swapped to another class, same forward text": Attack(
        lambda: Two().eval(), lambda m: setattr(m, "__class__", TwoOther)
    ),
    "D fc1.__dict__ replaced with other weights": Attack(lambda: Two().eval(), _replace_fc_dict),
    "D fc1.__dict__ replaced by a copy (no-op)": Attack(lambda: Two().eval(), _copy_fc_dict),
    "D requires_grad_(False) (no-op)": Attack(
        lambda: Two().eval(), lambda m: m.requires_grad_(False) and None
    ),
    "D eval() again (no-op)": Attack(lambda: Two().eval(), lambda m: m.eval() and None),
    "D called under inference_mode (no-op)": Attack(lambda: Two().eval(), _inference_call),
    "D train() on a training branch": Attack(
        lambda: TrainBranch().eval(), lambda m: m.train() and None
    ),
    "D train() then eval() (no-op)": Attack(
        lambda: TrainBranch().eval(), lambda m: m.train().eval() and None
    ),
    "D submodule class gains a __setattr__": Attack(
        lambda: StoresScale().eval(), _linear_setattr, probe=lambda m: m.fc.scale
    ),
    "D del fc1, another Linear set": Attack(lambda: Two().eval(), _readd_fc),
    "D del fc1, the same Linear set again (no-op)": Attack(lambda: Two().eval(), _readd_same_fc),
    "D _modules replaced by an OrderedDict of the same entries": Attack(
        lambda: Two().eval(), _replace_modules
    ),
    "D forward counts its calls, k changed": Attack(
        lambda: CallCounter().eval(), _counter_and_k, probe=lambda m: m.calls
    ),
    "D forward stores an attribute, k changed": Attack(
        lambda: StoresLast().eval(), _counter_and_k, probe=lambda m: m.last
    ),
    "D forward stores an attribute, k changed between two calls": Attack(
        lambda: StoresLast().eval(), _counter_setattr_k, probe=lambda m: m.last
    ),
    "D nn.Linear.__setattr__ patched, forward stores on fc": Attack(
        lambda: StoresScale().eval(), _linear_class_setattr, probe=lambda m: m.fc.scale
    ),
    "D nn.Linear.__setattr__ patched, forward stores nothing (no-op)": Attack(
        lambda: Two().eval(), _linear_class_setattr
    ),
    "D nn.Linear.__getattr__ patched to double weight": Attack(
        lambda: Two().eval(), _linear_class_getattr
    ),
    "D _modules replaced by an equal dict (no-op)": Attack(
        lambda: Two().eval(), lambda m: setattr(m, "_modules", dict(m._modules))
    ),
    "D two models alternately, the second's k changed": Attack(
        lambda: KModel().eval(), _alternate_then_change
    ),
    "D model.__dict__ replaced by a copy with k changed": Attack(
        lambda: KModel().eval(), _dict_copy_with_k
    ),
    "D class attribute k changed on the class": Attack(lambda: Two().eval(), _class_k),
    "D forward hook added to fc1": Attack(lambda: Two().eval(), _hook_added),
    "D forward hook added to fc1 and removed (no-op)": Attack(
        lambda: Two().eval(), _hook_added_and_removed
    ),
    "D fc1.weight.data replaced": Attack(lambda: Two().eval(), _weight_data),
    "D parametrization registered on fc1.weight": Attack(lambda: Two().eval(), _parametrized),
    "D global dict value read changed": Attack(
        lambda: ReadsDicts().eval(), lambda m: CFG.__setitem__("a", 5)
    ),
    "D global dict key tested added": Attack(
        lambda: ReadsDicts().eval(), lambda m: CFG.__setitem__("b", 0)
    ),
    "D global dict key never read added (no-op)": Attack(
        lambda: ReadsDicts().eval(), lambda m: CFG.__setitem__("zz", 0)
    ),
    "D empty global dict filled": Attack(
        lambda: ReadsDicts().eval(), lambda m: EXTRA.__setitem__("s", 3.0)
    ),
    "D empty global dict filled and emptied (no-op)": Attack(
        lambda: ReadsDicts().eval(), _extra_added_and_removed
    ),
    "D nn.Module.__getattr__ patched to double weight": Attack(
        lambda: Two().eval(), _module_class_getattr
    ),
    "D two models of other weights alternately": Attack(lambda: Two().eval(), _alternate_weights),
    "D two racing threads, two models": Attack(lambda: KModel().eval(), _racing_threads),
    "D Inductor: __class__ swapped to another class": Attack(
        lambda: Two().eval(), lambda m: setattr(m, "__class__", TwoOther), backend="inductor"
    ),
    "D Inductor: two models alternately, the second's k changed": Attack(
        lambda: KModel().eval(), _alternate_then_change, backend="inductor"
    ),
    "D Inductor: nn.Linear.__getattr__ patched to double weight": Attack(
        lambda: Two().eval(), _linear_class_getattr, backend="inductor"
    ),
}


def _reset() -> None:
    for handle in _HANDLES:
        handle.remove()
    _HANDLES.clear()
    Two.k = 2.0
    _reset_dicts()
    _reset_hook_state()
    _reset_nameless()
    cached_act.__wrapped__.__code__ = _CACHED_CODE  # type: ignore[attr-defined]


#: Wrong answers and crashes found by this round and left for the coordinator: the
#: outcome each gives now (kind, and words of its detail). The test of such a cell
#: asserts that outcome, so it fails (and shows) once fixed.
#: Fixed after this round and asserted served or refused like every cell: make_fx's
#: two racing threads (one snapshot tuple: test_threaded_serving.py), Dynamo's
#: library-class ``__getattr__`` patched (protocol dunders compared:
#: test_library_class_dunders.py), and the functions only C state holds -- an
#: lru_cache'd maker's result, a WeakValueDictionary entry -- refused at capture by
#: both tracers (test_unwatched_functions.py), and a training-only flag whose truth
#: test stores or raises, checked by the kind of its truth test by both tracers
#: (test_training_flag_truth_test.py).
KNOWN_WRONG: dict[tuple[str, str], tuple[str, str]] = {}

#: Needless refusals of no-ops found by this round: the words the refusal names. The
#: three found (Dynamo's registry filled again by the same maker, make_fx's ``del fc1``
#: with the same Linear set again, make_fx's global dict key never read added) are
#: served since, each beside its near-miss in test_needless_round4.py.
KNOWN_NEEDLESS: dict[tuple[str, str], str] = {}

ATTACKS = AttackSuite(
    __name__,
    SCENARIOS,
    serve=serve,
    reset=_reset,
    classes=(nn.Module, nn.Linear),
    known_needless=KNOWN_NEEDLESS,
    known_wrong=KNOWN_WRONG,
)


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
