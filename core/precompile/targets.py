"""``@precompile.target``: mark a function the daemon and ``precompile check`` watch.

A runtime no-op: the decorator returns the function unchanged, with its options attached
as ``__precompile_target__``. Discovery reads the decorator from source with ``ast`` and
never imports user code; ``examples`` and ``covers`` are called only in worker processes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

TRACERS = ("dynamo", "make_fx")


class Example:
    """One call of the target: ``Example(model, x, scale=2.0)``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs

    def __repr__(self) -> str:
        parts = [type(a).__name__ for a in self.args] + [
            f"{k}={type(v).__name__}" for k, v in self.kwargs.items()
        ]
        return f"Example({', '.join(parts)})"


@dataclasses.dataclass(frozen=True)
class TargetOptions:
    """What ``@precompile.target`` was given. ``backend`` and ``tracer`` are None when the
    decorator leaves them to the workspace (``[tool.precompile]``: inductor and dynamo
    unless it says otherwise)."""

    examples: Callable[[], Iterable[Any]]
    covers: Callable[[], Iterable[Any]] | None = None
    backend: str | None = None
    tracer: Any = None
    training: bool = False
    artifact: str | None = None
    resources: dict[str, float] | None = None


def as_example(value: Any) -> Example:
    """An ``Example``, or a plain tuple of positional arguments, as an ``Example``."""
    if isinstance(value, Example):
        return value
    if isinstance(value, tuple):
        return Example(*value)
    raise TypeError(
        f"precompile.target: examples and covers must yield precompile.Example(...) or argument "
        f"tuples, got {type(value).__name__}"
    )


def target(
    examples: Callable[[], Iterable[Any]],
    *,
    covers: Callable[[], Iterable[Any]] | None = None,
    backend: str | None = None,
    tracer: Any = None,
    training: bool = False,
    artifact: str | None = None,
    resources: dict[str, float] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark ``fn`` as a precompile target: captured from ``examples()``, expected to serve
    ``covers()``, emitted with ``backend`` to ``artifact``. Returns ``fn`` unchanged.
    ``backend`` and ``tracer`` default to the workspace's ``[tool.precompile]`` settings.
    ``resources`` (a literal dict, e.g. ``{"num_gpus": 1}``) is what a capture of it needs
    of a machine: a cluster executor (``executor = "ray"``) runs its jobs where they are."""
    if not callable(examples):
        raise TypeError(
            "precompile.target: examples must be a zero-argument callable returning calls"
        )
    if covers is not None and not callable(covers):
        raise TypeError(
            "precompile.target: covers must be a zero-argument callable returning calls"
        )
    if backend not in (None, "inductor", "eager"):
        raise ValueError(
            f"precompile.target: backend must be 'inductor' or 'eager', got {backend!r}"
        )
    if isinstance(tracer, str) and tracer not in TRACERS:
        raise ValueError(
            f"precompile.target: tracer must be 'dynamo', 'make_fx' or a tracer object, got {tracer!r}"
        )
    if resources is not None and not (
        isinstance(resources, dict)
        and all(
            isinstance(k, str)
            and isinstance(v, (int, float))
            and not isinstance(v, bool)
            and v >= 0
            for k, v in resources.items()
        )
    ):
        raise TypeError(
            f"precompile.target: resources must be a dict of resource names to non-negative "
            f'numbers, e.g. {{"num_gpus": 1}}, got {resources!r}'
        )
    options = TargetOptions(examples, covers, backend, tracer, training, artifact, resources)

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.__precompile_target__ = options  # type: ignore[attr-defined]  # the mark is an attribute of the function
        return fn

    return mark
