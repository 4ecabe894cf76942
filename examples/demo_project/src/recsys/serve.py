"""What recsys ships: each function below is captured into an artifact."""

import precompile
from precompile import Example

from recsys import telemetry
from recsys.model import batch


def examples():
    return [batch(8)]


def traffic():
    """Production traffic also sends batches of 32."""
    model, users, items = batch(32)
    return [Example(model, users, items)]


@precompile.target(examples)
def score(model, users, items):
    """Clean: one graph, serves what it was captured with."""
    return model(users, items).sigmoid()


@precompile.target(examples)
def score_logged(model, users, items):
    """Calls a helper that graph-breaks: the break is reported in telemetry.py."""
    return telemetry.report(model(users, items))


@precompile.target(examples, covers=traffic)
def rank(model, users, items):
    """Captured with batches of 8, but production sends 32: a coverage gap."""
    return model(users, items).topk(3).indices


@precompile.target(examples, artifact="artifacts/recsys.serve.probability.py")
def probability(model, users, items):
    """Its committed artifact was emitted before the last change: stale."""
    return model(users, items).sigmoid()
