"""The stages a long job reports (importing, capturing k of N calls, compiling kernels,
writing, verifying), in words and as a rough percentage: shared by the editor's progress
and the command line's progress line."""

from __future__ import annotations

from typing import Any

#: Rough share of a job done at the start of each stage it reports, for progress bars.
_STAGE_SHARE = {
    "importing": (0, 10),
    "capturing": (10, 60),
    "checking covers": (60, 80),
    "compiling kernels and writing": (70, 95),
    "writing": (90, 95),
    "verifying": (10, 95),
}


def stage_text(event: dict[str, Any]) -> str:
    """``capturing 2 of 3 calls``: what a job is doing, in words."""
    if event.get("total"):
        return f"{event['stage']} {event['done']} of {event['total']} calls"
    return str(event["stage"])


def stage_percentage(event: dict[str, Any]) -> int | None:
    start, end = _STAGE_SHARE.get(event["stage"], (None, None))
    if start is None or end is None:
        return None
    if event.get("total"):
        return int(start + (end - start) * (event["done"] - 1) / event["total"])
    return start
