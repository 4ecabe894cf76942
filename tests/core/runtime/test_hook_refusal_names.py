"""Issue 26, round 3: a module forward hook that reads the list it fills
(``feats.append(out); return out * len(feats)``) answers differently on every call, and
cannot be served. The capture refusal must name the hook (its qualified name and
``file:line``) and say why; it blamed ``Module._call_impl`` (Dynamo's compile-only
branch check), or named only the global (make_fx)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import precompile

FEATS: list[torch.Tensor] = []


def grab(module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
    FEATS.append(out)
    return out * len(FEATS)


class Tapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fc.register_forward_hook(grab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + 1.0


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


#: Where the refusal must point: the hook, by name and definition line.
HOOK_AT = f"grab ({grab.__code__.co_filename}:{grab.__code__.co_firstlineno})"


@pytest.mark.parametrize("tracer", ["make_fx", "dynamo"])
def test_a_hook_reading_the_list_it_fills_is_refused_naming_the_hook(
    tracer: str, tmp_path: object
) -> None:
    FEATS.clear()
    torch.manual_seed(0)
    model, x = Tapped().eval(), torch.randn(2, 4)
    with pytest.raises(precompile.PrecompileError) as refused:
        with (
            torch.no_grad(),
            precompile.capture(
                serve,
                artifact_path=str(tmp_path / "a.py"),  # type: ignore[operator]
                cache_path=str(tmp_path / "a.cache"),  # type: ignore[operator]
                tracer=precompile.DynamoTracer()
                if tracer == "dynamo"
                else precompile.MakeFxTracer(),
                backend="eager",
            ) as cap,
        ):
            cap(model, x)
    message = str(refused.value)
    assert HOOK_AT in message, message
    assert "Module._call_impl" not in message, message
    assert "FEATS" in message, message
    if tracer == "dynamo":
        # Why: the hook changes what it answers from, so each call answers otherwise.
        assert "forward hook on `fc` (Linear)" in message, message
        assert "answers differently on each call" in message, message
