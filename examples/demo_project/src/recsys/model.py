"""A tiny two-tower recommender: the model the demo ships."""

import torch
from torch import nn


class TwoTower(nn.Module):
    def __init__(self, users: int = 50, items: int = 80, dim: int = 16) -> None:
        super().__init__()
        self.users = nn.Embedding(users, dim)
        self.items = nn.Embedding(items, dim)
        self.mix = nn.Linear(dim, dim)

    def forward(self, user_ids: torch.Tensor, item_ids: torch.Tensor) -> torch.Tensor:
        u = self.mix(self.users(user_ids))
        return (u * self.items(item_ids)).sum(-1)


def batch(size: int = 8) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return TwoTower().eval(), torch.randint(0, 50, (size,)), torch.randint(0, 80, (size,))
