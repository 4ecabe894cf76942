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


@dataclasses.dataclass(frozen=True)
class DynamoTracer:
    """Execution-driven capture under Dynamo: as many calls as you make; graph breaks and
    recompiles become frames and variants of one artifact.

    ``guard_filter_fn`` may drop more guards from the serialized copy (it is combined with
    the default, which drops only guards that cannot be serialized); ``recompile_limit``
    caps variants per frame; ``dynamic`` is ``torch.compile``'s (None: promote a dim that
    varied across calls). The ``require_*`` gates refuse, at save, a capture that is
    incomplete (frames Dynamo gave up on, bypassed or truncated), or that dropped guards
    which could change dispatch.
    """

    guard_filter_fn: Callable[[list[Any]], list[bool]] | None = None
    recompile_limit: int = 256
    dynamic: bool | None = None
    require_complete: bool = True
    require_no_risky_drops: bool = True
    require_no_dropped_guards: bool = False

    name = "dynamo"
