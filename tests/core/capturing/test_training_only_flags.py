"""The bytecode proof that a flag decides nothing while its module is in eval
(``neutral_reads.read_only_under_training``), checked against Python's own answer.

The proof is what lets an artifact accept any value of such a flag (it checks the
module's ``training`` flag instead), so it must never accept a read that decides in eval.
Every condition over ``flag``, ``training`` and ``other`` (negations, ``and``/``or``,
grouped both ways) in three forms (a branch, a conditional expression, a value kept) is
run with ``training`` False for both values of ``flag``: wherever the proof holds, the
two runs must agree. The end-to-end cells (served in a fresh process, compared with
eager) are in tests/core/runtime/test_attacks_round3.py and
test_gradient_checkpointing_served.py."""

from __future__ import annotations

import itertools
import types
from typing import Any

import pytest

from precompile.capturing.neutral_reads import read_only_under_training

ATOMS = ["self.flag", "not self.flag", "self.training", "not self.training"]
ATOMS += ["self.other", "not self.other"]
FORMS = {
    "branch": "if {e}:\n        return 1\n    return 0",
    "conditional expression": "return 1 if {e} else 0",
    "value kept": "y = {e}\n    return y",
}


def _conditions() -> list[str]:
    found: set[str] = set()
    for a, b in itertools.permutations(ATOMS, 2):
        for op in ("and", "or"):
            found.add(f"{a} {op} {b}")
            for c in ATOMS:
                for op2 in ("and", "or"):
                    found.add(f"({a} {op} {b}) {op2} {c}")
                    found.add(f"{a} {op} ({b} {op2} {c})")
    return sorted(e for e in found if "flag" in e)


def _function(condition: str, form: str) -> types.FunctionType:
    scope: dict[str, Any] = {}
    exec(f"def f(self):\n    {FORMS[form].format(e=condition)}", scope)
    return scope["f"]  # type: ignore[no-any-return]


def _decides_in_eval(fn: types.FunctionType) -> bool:
    for other in (False, True):
        answers = {
            bool(fn(types.SimpleNamespace(flag=f, training=False, other=other)))
            for f in (False, True)
        }
        if len(answers) > 1:
            return True
    return False


def test_no_condition_the_proof_accepts_decides_in_eval() -> None:
    proved = []
    for condition, form in itertools.product(_conditions(), FORMS):
        fn = _function(condition, form)
        if read_only_under_training(fn.__code__, "flag"):
            assert not _decides_in_eval(fn), (condition, form)
            proved.append((condition, form))
    # The proof is not vacuous: it accepts a large share of the neutral conditions.
    assert len(proved) > 100


@pytest.mark.parametrize(
    "condition",
    [
        "self.flag and self.training",
        "not self.flag and self.training",
        "self.flag and self.training or self.other",
        "(self.flag and self.training) or self.other",
        'getattr(self, "flag", False) and self.training',
    ],
)
@pytest.mark.parametrize("form", ["branch", "conditional expression"])
def test_conditions_serving_code_writes_are_proved(condition: str, form: str) -> None:
    assert read_only_under_training(_function(condition, form).__code__, "flag")


@pytest.mark.parametrize(
    "condition",
    [
        "self.flag or self.training",
        "self.flag",
        "self.flag and self.other",
        "not self.flag or self.training",
        "self.flag and not self.training",
    ],
)
def test_conditions_that_decide_in_eval_are_not_proved(condition: str) -> None:
    assert not read_only_under_training(_function(condition, "branch").__code__, "flag")


def test_a_value_kept_is_not_proved() -> None:
    fn = _function("self.flag and self.training", "value kept")
    assert not read_only_under_training(fn.__code__, "flag")
