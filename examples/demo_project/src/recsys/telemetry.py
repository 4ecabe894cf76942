"""Logging helpers: the kind of code that breaks a graph without anyone noticing."""

import torch


def report(scores: torch.Tensor) -> torch.Tensor:
    print(f"served {scores.numel()} scores")  # Dynamo cannot trace this print
    return scores
