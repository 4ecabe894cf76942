"""The models the benchmarks time: a tiny MLP and a small conv net."""

from __future__ import annotations

import torch
from torch import nn


class TinyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, stride=2),
            nn.BatchNorm2d(32),
            nn.ReLU(),
        )
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


def infer(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


MODELS = {
    "mlp": (TinyMLP, (8, 32)),
    "conv": (SmallConvNet, (2, 3, 32, 32)),
}


def build(name: str) -> tuple[nn.Module, torch.Tensor]:
    cls, shape = MODELS[name]
    torch.manual_seed(0)
    return cls().eval(), torch.randn(*shape)


def two_breaks(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The Dynamo benchmark's program: three graphs joined by two graph breaks."""
    h = model.net[1](model.net[0](x))
    torch._dynamo.graph_break()
    h = model.net[3](model.net[2](h))
    torch._dynamo.graph_break()
    return model.net[4](h).softmax(-1)
