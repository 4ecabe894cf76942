"""The models the benchmarks time: a tiny MLP, a small conv net and a ResNet-18-shaped
net (torchvision's wheel for this torch is a CUDA build, so it is written out here)."""

from __future__ import annotations

import io

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


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm, and a shortcut."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class ResNet18(nn.Module):
    """torchvision's resnet18 layout: a 7x7 stem, four stages of two basic blocks
    (64, 128, 256, 512 channels), global average pooling and a linear head."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages, inplanes = [], 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(
                nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes))
            )
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def infer(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


MODELS = {
    "mlp": (TinyMLP, (8, 32)),
    "conv": (SmallConvNet, (2, 3, 32, 32)),
    "resnet18": (ResNet18, (1, 3, 224, 224)),
}


def build(name: str) -> tuple[nn.Module, torch.Tensor]:
    cls, shape = MODELS[name]
    torch.manual_seed(0)
    return cls().eval(), torch.randn(*shape)


#: Where ``two_breaks`` logs: a print is the graph break users meet most.
LOG = io.StringIO()


def two_breaks(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The Dynamo benchmark's program: three graphs joined by two graph breaks (prints,
    as user code breaks; ``torch._dynamo.graph_break()`` would make the program itself
    import Dynamo, whatever serves it)."""
    h = model.net[1](model.net[0](x))
    print("after the first block", file=LOG)
    h = model.net[3](model.net[2](h))
    print("after the second block", file=LOG)
    return model.net[4](h).softmax(-1)


def train_step(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """One training step's forward and backward (the caller steps the optimizer)."""
    loss = nn.functional.cross_entropy(model(x), target)
    loss.backward()
    return loss.detach()
