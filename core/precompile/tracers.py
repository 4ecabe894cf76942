"""Tracer configurations. The objects are plain settings; the work is in the capture."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class MakeFxTracer:
    """One non-strict ``make_fx`` trace on fake tensors: exactly one call, one graph.

    ``decompositions`` is an optional decomposition table (op -> function) applied while
    tracing, as ``make_fx(decomposition_table=...)``.
    """

    decompositions: dict[Any, Callable[..., Any]] | None = None

    name = "make_fx"
