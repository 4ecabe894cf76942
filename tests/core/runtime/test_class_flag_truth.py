"""A training-only flag held by the module's CLASS (round 5's needless refusal): read
only as ``self.flag and self.training`` on a submodule in eval, its value decides
nothing after its truth test, which eager runs first. An instance's flag is checked by
the kind of its truth test (``value_fingerprints.truth_kind``); the class's is now
checked the same way (``neutral_reads.class_truth_names`` ->
``class_fingerprints.CLASS_TRUTH``), where no other read can see the class's value:

- served: the flag set on the class to another value of a pure-truth type, before or
  after load, also through a subclass's instance;
- refused, naming the class and the flag: a value whose truth test may store or raise
  (an ``int`` subclass with ``__bool__``, a property with a side effect), the flag
  deleted from the class (eager's read raises);
- still compared by value: a flag the traced code also reads through the class
  (``ClassFlagValue.flag``), and one an instance in training at capture reads (its
  value decided the graph there), an argument's submodule or a module global (whose
  reads the capture does not record: ``fx_watch.recording_module_reads``'s
  ``outside``).

The same holds for a flag that is a property whose getter only returns an attribute
(``return self.mode``, ``neutral_reads.forwarded_attribute``): both tracers check the
attribute by its truth kind where the property itself settled and nothing else reads
the attribute or calls the getter (``self.mode`` read for its value, or
``type(self).flag.fget(self)``, keeps it compared by value).

Each model is captured here and served in ONE fresh process per tracer, compared with
eager on the changed model. Dynamo's TYPE_MATCH on the class flag is a separate
needless refusal (round 5's ``KNOWN_NEEDLESS``): its cells here accept a refusal or an
answer equal to eager.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from tests.harness import capture_pair, run_json

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


class ClassFlag(nn.Module):
    """The flag is a class attribute (no instance value), read only under training."""

    flag: Any = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x + 100
        return x * 2


class SubFlag(ClassFlag):
    """Reads its base's class flag through its own class."""


class HoldsSub(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = SubFlag()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + 1


class ClassFlagValue(nn.Module):
    """The same flag, also read by value through the class: its value decides."""

    flag: Any = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x + 100
        return x * (3 if ClassFlagValue.flag else 2)


class TwoFlags(nn.Module):
    """Two ClassFlag children, the second in training at capture: its read of the
    flag decided its branch."""

    def __init__(self) -> None:
        super().__init__()
        self.a = ClassFlag()
        self.b = ClassFlag()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(x)


class PropertyFlag(nn.Module):
    """The flag is a property on the class that returns an attribute: the attribute's
    value reaches only the flag's truth test."""

    def __init__(self) -> None:
        super().__init__()
        self.mode: Any = 0
        self.scale = 2.0

    @property
    def flag(self) -> Any:
        return self.mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x + 100
        return x * self.scale


class PropertyFlagValue(PropertyFlag):
    """The same property, its attribute also read for its value."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x + 100
        return x * (self.scale + self.mode)


class PropertyGetterCalled(PropertyFlag):
    """The same property, its getter also called for its value (not through the
    property read that is tested under training)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flag and self.training:
            x = x + 100
        return x * (self.scale + type(self).flag.fget(self))


#: A module global in training: its reads are not recorded (it is no argument's
#: submodule), and its read of the class flag decides its branch.
TRAINING_GLOBAL = ClassFlag().train()


class UsesTrainingGlobal(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = ClassFlag()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + TRAINING_GLOBAL(x)


def _two_flags() -> nn.Module:
    m = TwoFlags().eval()
    m.b.train()
    return m


def _b_trains() -> None:
    MODEL_HELD[0].b.train()


#: The model the last case made (for changes that reach it).
MODEL_HELD: list[Any] = [None]


def _set_and_train_b(value: Any) -> Callable[[], None]:
    def change() -> None:
        ClassFlag.flag = value
        _b_trains()

    return change


MODELS: dict[str, Callable[[], nn.Module]] = {
    "ClassFlag": lambda: ClassFlag().eval(),
    "HoldsSub": lambda: HoldsSub().eval(),
    "ClassFlagValue": lambda: ClassFlagValue().eval(),
    "TwoFlags": _two_flags,
    "TwoEval": lambda: TwoFlags().eval(),
    "UsesTrainingGlobal": lambda: UsesTrainingGlobal().eval(),
    "PropertyFlag": lambda: PropertyFlag().eval(),
    "PropertyFlagValue": lambda: PropertyFlagValue().eval(),
    "PropertyGetterCalled": lambda: PropertyGetterCalled().eval(),
}


class _Bool(int):
    def __bool__(self) -> bool:
        return True


def _noisy(self: Any) -> bool:
    self.noticed = True
    return True


def _set(cls: type, value: Any) -> Callable[[], None]:
    return lambda: setattr(cls, "flag", value)


def _delete(cls: type) -> Callable[[], None]:
    return lambda: delattr(cls, "flag")


def _set_mode(value: Any) -> Callable[[], None]:
    return lambda: setattr(MODEL_HELD[0], "mode", value)


def _set_mode_and_train(value: Any) -> Callable[[], None]:
    def change() -> None:
        MODEL_HELD[0].mode = value
        MODEL_HELD[0].train()

    return change


def _reset() -> None:
    for cls in (ClassFlag, ClassFlagValue):
        cls.flag = False


SERVED = ("served",)
TRUTH = "only as `flag and training`"
#: model -> case -> (change, before load?, per tracer: SERVED, words the refusal must
#: hold, or None: refused or served equal to eager, either is right)
CASES: dict[str, dict[str, tuple[Callable[[], None], bool, dict[str, Any]]]] = {
    "ClassFlag": {
        "set to [1] on the class (no-op)": (
            _set(ClassFlag, [1]),
            False,
            {"make_fx": SERVED, "dynamo": None},
        ),
        "set to a string before load (no-op)": (
            _set(ClassFlag, "yes"),
            True,
            {"make_fx": SERVED, "dynamo": None},
        ),
        "set to an int subclass with __bool__": (
            _set(ClassFlag, _Bool(0)),
            False,
            {"make_fx": ("class ", "ClassFlag has flag set to a", "_Bool", TRUTH), "dynamo": None},
        ),
        "set to a property with a side effect": (
            _set(ClassFlag, property(_noisy)),
            False,
            {"make_fx": ("ClassFlag has flag set to a builtins.property", TRUTH), "dynamo": None},
        ),
        "deleted from the class": (
            _delete(ClassFlag),
            False,
            {"make_fx": ("has no attribute 'flag'", "deleted since capture"), "dynamo": None},
        ),
    },
    "HoldsSub": {
        "set to [1] on the base class (no-op)": (
            _set(ClassFlag, [1]),
            False,
            {"make_fx": SERVED, "dynamo": None},
        ),
    },
    "ClassFlagValue": {
        "set to [1] on the class": (
            _set(ClassFlagValue, [1]),
            False,
            {"make_fx": ("ClassFlagValue.flag is [1]",), "dynamo": None},
        ),
    },
    # Dynamo reads a class attribute once per class and answers b's read from a's
    # guarded value: relaxing that guard for a (in eval) served b's branch wrong.
    "TwoFlags": {
        "set to True on the class": (
            _set(ClassFlag, True),
            False,
            {"make_fx": ("ClassFlag.flag is True",), "dynamo": ("flag` is not False",)},
        ),
    },
    "TwoEval": {
        "set to [1] on the class (no-op)": (
            _set(ClassFlag, [1]),
            False,
            {"make_fx": SERVED, "dynamo": None},
        ),
        "set to True on the class, b put in training": (
            _set_and_train_b(True),
            False,
            {"make_fx": ("submodule 'b'", "training"), "dynamo": ("training",)},
        ),
    },
    "UsesTrainingGlobal": {
        "set to True on the class": (
            _set(ClassFlag, True),
            False,
            {"make_fx": ("ClassFlag.flag is True",), "dynamo": None},
        ),
    },
    "PropertyFlag": {
        "its attribute set to 1 (no-op)": (
            _set_mode(1),
            False,
            {"*": SERVED},
        ),
        "its attribute set to a list before load (no-op)": (
            _set_mode([1]),
            True,
            {"*": SERVED},
        ),
        "its attribute set to an int subclass with __bool__": (
            _set_mode(_Bool(0)),
            False,
            {
                "make_fx": (
                    "the model of module argument 0 has mode set to a",
                    TRUTH.replace("flag", "mode"),
                ),
                "dynamo": None,
            },
        ),
        "its attribute set to 1, model put in training": (
            _set_mode_and_train(1),
            False,
            {"make_fx": ("training",), "dynamo": None},
        ),
    },
    "PropertyFlagValue": {
        "its attribute set to 1": (
            _set_mode(1),
            False,
            {"make_fx": ("has mode = 1",), "dynamo": ("`model.mode` is not 0",)},
        ),
    },
    # Dynamo cannot package a call of a property's getter (PackageError): make_fx only.
    "PropertyGetterCalled": {
        "its attribute set to 1": (_set_mode(1), False, {"make_fx": ("has mode = 1",)}),
    },
}

CHILD = """
import json, warnings
warnings.simplefilter("ignore")
from tests.core.runtime.test_class_flag_truth import attack
print(json.dumps(attack({artifact!r}, {cache!r}, {model!r})))
"""


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def _example() -> torch.Tensor:
    return torch.arange(1.0, 9.0).reshape(2, 4)


def attack(artifact: str, cache: str, model_name: str) -> dict[str, Any]:
    """In the fresh process, per case: a new model, one served call (unless the change
    is made before load), the change, one call compared with eager; classes reset."""
    out: dict[str, Any] = {}
    x = _example()
    for case, (change, before_load, _) in CASES[model_name].items():
        _reset()
        model = MODEL_HELD[0] = MODELS[model_name]()
        with torch.no_grad():
            if before_load:
                change()
                run = precompile.load(artifact, cache)
            else:
                run = precompile.load(artifact, cache)
                torch.testing.assert_close(run(model, x), model(x))
                change()
            try:
                got = run(model, x)
            except precompile.PrecompileError as error:
                out[case] = ["refused", str(error)]
                continue
            try:
                out[case] = ["served", bool(torch.equal(got, model(x)))]
            except Exception as error:
                out[case] = ["served where eager fails", repr(error)]
    _reset()
    return out


_OUTCOMES: dict[tuple[str, str], dict[str, Any]] = {}


def _outcomes(tracer: str, model: str, factory: pytest.TempPathFactory) -> dict[str, Any]:
    if (tracer, model) not in _OUTCOMES:
        _reset()
        with torch.no_grad():
            artifact, cache = capture_pair(
                serve,
                MODELS[model](),
                _example(),
                directory=factory.mktemp(f"{tracer}_{model}"),
                tracer=TRACERS[tracer](),
            )
        child = CHILD.format(artifact=artifact, cache=cache, model=model)
        _OUTCOMES[tracer, model] = run_json(textwrap.dedent(child))
    return _OUTCOMES[tracer, model]


@pytest.mark.parametrize(
    ("tracer", "model", "case"),
    [
        (tracer, model, case)
        for model, cases in CASES.items()
        for case, (_change, _before, expected) in cases.items()
        for tracer in (sorted(TRACERS) if "*" in expected else sorted(expected))
    ],
)
def test_class_flag_served_by_truth_kind_or_refused(
    tracer: str, model: str, case: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    kind, detail = _outcomes(tracer, model, tmp_path_factory)[case]
    expected = CASES[model][case][2]
    wanted = expected.get("*", expected.get(tracer))
    if wanted == SERVED:
        assert [kind, detail] == ["served", True], (tracer, case, detail)
    elif wanted is None:
        assert kind == "refused" or [kind, detail] == ["served", True], (tracer, case, detail)
    else:
        assert kind == "refused", (tracer, case, detail)
        assert detail.startswith("precompile:"), detail
        assert all(words in detail for words in wanted), (tracer, case, detail)
