"""Issue 29: a store/delete dunder the make_fx trace entered stays in the class records.

The class records leave out ``__setattr__``/``__delattr__`` where the traced call never
ran them (``class_fingerprints.ENTERED_ONLY_DUNDERS``; ``test_call_epoch`` serves those
replaced). Here the traced call stores through a Python ``__setattr__`` (a helper
object's, whose stored value the forward reads back): replacing that method after two
served calls changes what eager computes, and the artifact must refuse, naming it, in a
fresh process -- never serve the stale value.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import precompile
from tests.harness import attack_in_child


class Scaled:
    """Stores every value it is given, scaled by 1.5."""

    def __setattr__(self, name: str, value: Any) -> None:
        # Not through ``object.__setattr__``: no code of the trace names the dunder, so
        # only the capture's record of the functions it entered keeps it compared.
        self.__dict__[name] = value * 1.5


def _tripling(self: Scaled, name: str, value: Any) -> None:
    self.__dict__[name] = value * 3.0


class StoringNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        box = Scaled()
        box.factor = 2.0
        return self.fc(x) * box.factor


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


CHILD = """
import json, warnings
warnings.simplefilter("ignore")
from tests.core.runtime.test_store_dunders import attack
print(json.dumps(attack({artifact!r}, {cache!r})))
"""


def attack(artifact: str, cache: str) -> dict[str, Any]:
    run = precompile.load(artifact, cache)
    torch.manual_seed(1)
    model = StoringNet().eval()
    x = torch.randn(2, 4)
    out: dict[str, Any] = {}
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(run(model, x), model(x))
        before = Scaled.__setattr__
        Scaled.__setattr__ = _tripling  # type: ignore[method-assign]
        try:
            got = run(model, x)
            out["changed"] = ["served", bool(torch.allclose(got, model(x)))]
        except precompile.PrecompileError as error:
            out["changed"] = ["refused", str(error)]
        finally:
            Scaled.__setattr__ = before  # type: ignore[method-assign]
        out["undone"] = bool(torch.allclose(run(model, x), model(x)))
    return out


def test_a_store_dunder_the_trace_entered_is_still_compared(tmp_path: Any) -> None:
    out = attack_in_child(
        CHILD, serve, lambda: StoringNet().eval(), lambda: torch.randn(2, 4), directory=tmp_path
    )
    kind, detail = out["changed"]
    assert kind == "refused", out
    assert "Scaled" in detail or "__setattr__" in detail, detail
    assert out["undone"] is True
