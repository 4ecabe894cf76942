"""A third-party-style registry (as ``transformers``' ``ACT2FN`` or timm's layer
registries): functions a factory made, held by name in a module-private dict and handed
out by ``get``. No name another process imports reaches them."""

from __future__ import annotations

from collections.abc import Callable

import torch

_REGISTRY: dict[str, Callable[..., torch.Tensor]] = {}


def make_scaled(scale: float) -> Callable[..., torch.Tensor]:
    def scaled(t: torch.Tensor, bias: float = 0.0) -> torch.Tensor:
        return t * scale + bias

    return scaled


def register(name: str, fn: Callable[..., torch.Tensor]) -> None:
    _REGISTRY[name] = fn


def get(name: str) -> Callable[..., torch.Tensor]:
    return _REGISTRY[name]


register("swish", make_scaled(0.9))
