"""Issue 29: what make_fx's own machinery runs during a trace is not what the artifact
depends on.

The capture swaps the traced tensors into the modules (``Module.__setattr__``,
``register_buffer``...) and make_fx builds its graph module (``Module.__init__``,
``named_modules``...); a served call runs the forward alone, so the library functions
only that machinery ran must not be recorded (``fx_watch.CallLog.reached``): replacing
one of them after serving began changes nothing eager computes, and must be served, not
refused, and not compared on every call. A forward that reaches the same functions
itself (``self.modules()``, which calls ``named_modules``; ``self.named_modules()``)
still depends on them: replaced, the next call is refused or answers as eager.

Each model is captured with make_fx on the eager backend and served in a fresh process,
twice before the change (the fast path's epoch stands), then with the library function
replaced on ``nn.Module``, then with it restored.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from tests.harness import capture_pair, run_json


class Plain(nn.Module):
    """Reaches no ``named_modules`` nor ``register_buffer`` in its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Counting(nn.Module):
    """Scales by how many modules ``self.modules()`` yields: torch's ``modules`` calls
    ``named_modules``, which the forward reaches through library code only."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * len(list(self.modules()))


class NamedCounting(nn.Module):
    """Calls ``self.named_modules()`` in its own code."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * len(list(self.named_modules()))


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


_ORIGINAL_NAMED_MODULES = nn.Module.named_modules
_ORIGINAL_REGISTER_BUFFER = nn.Module.register_buffer


def _named_modules_plus_one(self: nn.Module, *args: Any, **kwargs: Any) -> Iterator[Any]:
    """``named_modules`` yielding the root once more to a forward (or torch's
    ``modules``): a forward that counts modules computes another value in eager. Other
    callers (the artifact's own walk of the model's structure) see what they saw."""
    yield from _ORIGINAL_NAMED_MODULES(self, *args, **kwargs)
    if sys._getframe(1).f_code.co_name in ("forward", "modules"):
        yield "again", self


def _register_buffer_logged(self: nn.Module, *args: Any, **kwargs: Any) -> None:
    _ORIGINAL_REGISTER_BUFFER(self, *args, **kwargs)


#: Each replacement on nn.Module, made after two served calls.
REPLACEMENTS = {
    "named_modules": _named_modules_plus_one,
    "register_buffer": _register_buffer_logged,
}

MODELS = {"plain": Plain, "modules": Counting, "named_modules": NamedCounting}

CHILD = """
import json, warnings
warnings.simplefilter("ignore")
from tests.core.capturing.test_fx_machinery_reads import attack
print(json.dumps({{m: attack(m, a, c) for m, (a, c) in {pairs!r}.items()}}))
"""


def attack(model_name: str, artifact: str, cache: str) -> dict[str, Any]:
    """Per replacement: served twice, replaced, served (refused with the message, or
    served with whether it equals eager), restored, served again."""
    run = precompile.load(artifact, cache)
    torch.manual_seed(1)
    model = MODELS[model_name]().eval()
    x = torch.randn(3, 6)
    out: dict[str, Any] = {}
    with torch.no_grad():
        for name, replacement in REPLACEMENTS.items():
            for _ in range(2):
                torch.testing.assert_close(run(model, x), model(x))
            original = vars(nn.Module)[name]
            setattr(nn.Module, name, replacement)
            try:
                try:
                    got = run(model, x)
                    outcome: list[Any] = ["served", bool(torch.equal(got, model(x)))]
                except precompile.PrecompileError as error:
                    outcome = ["refused", str(error)]
            finally:
                setattr(nn.Module, name, original)
            outcome.append(bool(torch.equal(run(model, x), model(x))))
            out[name] = outcome
    return out


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each model captured here, all served in one fresh process."""
    pairs = {}
    for name, cls in MODELS.items():
        torch.manual_seed(0)
        with torch.no_grad():
            pairs[name] = capture_pair(
                serve, cls().eval(), torch.randn(3, 6), directory=tmp_path_factory.mktemp(name)
            )
    return dict(run_json(textwrap.dedent(CHILD.format(pairs=pairs))))


def test_functions_only_the_capture_ran_are_not_depended_on(outcomes: dict[str, Any]) -> None:
    """A forward that never reaches them: replacing either after serving began is
    served, as eager (the capture's own reparametrization and graph-module building
    ran them, a served call does not)."""
    for name in REPLACEMENTS:
        assert outcomes["plain"][name] == ["served", True, True], (name, outcomes["plain"])


@pytest.mark.parametrize("model", ["modules", "named_modules"])
def test_a_forward_that_reaches_named_modules_depends_on_it(
    outcomes: dict[str, Any], model: str
) -> None:
    """``self.modules()`` (torch code) or ``self.named_modules()`` (the user's) in the
    forward: replaced, the call is refused naming it (eager now counts one module more
    than the graph holds); restored, served again."""
    kind, detail, again = outcomes[model]["named_modules"]
    assert kind == "refused", outcomes[model]
    assert "named_modules" in detail, detail
    assert again is True
    # register_buffer is reached by neither forward: served as eager.
    assert outcomes[model]["register_buffer"] == ["served", True, True], outcomes[model]
