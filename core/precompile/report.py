"""The capture report: the JSON-ready contract between a capture and its readers
(the CLI, the daemon, the editor)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class CaptureReport:
    """What one capture did, where it failed, and which user sources it traced.

    ``target`` names the captured function (name, module, file, line); ``error`` is a
    PrecompileError's ``to_dict()`` when ``ok`` is false; ``sources`` lists each traced
    user file with its sha256 (for staleness); ``timings`` are seconds per phase.
    """

    target: dict[str, Any]
    tracer: str
    backend: str
    ok: bool = True
    error: dict[str, Any] | None = None
    graph: dict[str, Any] = dataclasses.field(default_factory=dict)
    sources: list[dict[str, str]] = dataclasses.field(default_factory=list)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
