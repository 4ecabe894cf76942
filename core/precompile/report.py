"""The capture report: the JSON-ready contract between a capture and its readers
(the CLI, the daemon, the editor). docs/capture-report.md documents every field."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class PrecompileSummary:
    """The one-line digest of a capture; the ``require_*`` gates read it.

    A capture is complete when every frame it met is served by captured code: none ran
    eagerly because Dynamo gave up (``eager_fallback``), none was bypassed (its guards
    could not be serialized), none hit the recompile limit (``truncated``), none was
    reached but never compiled (``uncovered``), and no capture call failed.
    """

    frames: int = 0
    resume_functions: int = 0
    guarded_codes: int = 0
    backend_graphs: int = 0
    graph_breaks: int = 0
    bypassed: list[str] = dataclasses.field(default_factory=list)
    truncated: list[str] = dataclasses.field(default_factory=list)
    uncovered: list[str] = dataclasses.field(default_factory=list)
    eager_fallback: list[str] = dataclasses.field(default_factory=list)
    capture_errors: list[str] = dataclasses.field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not (
            self.bypassed
            or self.truncated
            or self.uncovered
            or self.eager_fallback
            or self.capture_errors
        )

    def problems(self) -> list[str]:
        return [
            *(f"frame {name} was bypassed" for name in self.bypassed),
            *(f"frame {name} hit the recompile limit (truncated)" for name in self.truncated),
            *(
                f"frame {name} was reached but never compiled (uncovered)"
                for name in self.uncovered
            ),
            *(f"frame {name} runs eagerly: Dynamo gave up on it" for name in self.eager_fallback),
            *self.capture_errors,
        ]

    def __str__(self) -> str:
        head = (
            f"{self.frames} frame{'s' * (self.frames != 1)} ({self.resume_functions} "
            f"continuation{'s' * (self.resume_functions != 1)}), {self.guarded_codes} "
            f"variant{'s' * (self.guarded_codes != 1)}, {self.backend_graphs} "
            f"graph{'s' * (self.backend_graphs != 1)}, {self.graph_breaks} "
            f"graph break{'s' * (self.graph_breaks != 1)}"
        )
        return (
            f"{head}; complete"
            if self.complete
            else f"{head}; INCOMPLETE: {'; '.join(self.problems())}"
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"complete": self.complete, "text": str(self)}


@dataclasses.dataclass
class CaptureReport:
    """What one capture did, where it failed, and which user sources it traced.

    ``target`` names the captured function (name, module, file, line); ``error`` is a
    PrecompileError's ``to_dict()`` when ``ok`` is false; ``sources`` lists each traced
    user file with its sha256 (for staleness); ``timings`` are seconds per phase. Dynamo
    captures add ``frames``, ``graph_breaks``, ``recompiles``, ``guards`` (per frame and
    variant, kept and dropped), ``function_sources`` and ``coverage``.
    """

    target: dict[str, Any]
    tracer: str
    backend: str
    ok: bool = True
    error: dict[str, Any] | None = None
    graph: dict[str, Any] = dataclasses.field(default_factory=dict)
    sources: list[dict[str, str]] = dataclasses.field(default_factory=list)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    serving_mode: str | None = None
    frames: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    graph_breaks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    recompiles: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    guards: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    function_sources: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    coverage: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    summary: PrecompileSummary = dataclasses.field(default_factory=PrecompileSummary)
    #: The guard audit (precompile.capturing.dynamo_guard_audit.GuardAudit), for Dynamo captures.
    audit: Any = None

    def to_dict(self) -> dict[str, Any]:
        data = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("summary", "audit")
        }
        data = dataclasses.asdict(
            dataclasses.replace(self, summary=PrecompileSummary(), audit=None)
        ) | {
            "summary": self.summary.to_dict(),
            "audit": None if self.audit is None else self.audit.to_dict(),
        }
        return data
