"""Who runs the engine's jobs: the one interface the engine hands capture, emit and
verify jobs to, and the choice of implementation by ``[tool.precompile] executor``.

``local`` (the default) is the pool of warm worker processes (``workers.WorkerPool``);
``ray`` runs each job as a task of a Ray cluster (``ray_executor.RayExecutor``,
docs/cluster.md). Both take a ``JobRequest`` and answer a ``JobResult`` of the same
protocol, ask the same trust gate before anything of the workspace runs, and report a
job whose process died or ran past its timeout as ``crashed``/``timeout`` with the
reason (PC900).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from precompile_lsp.config import Config
from precompile_lsp.protocol import JobRequest, JobResult, Stage
from precompile_lsp.trust import TrustGate

OnStage = Callable[[Stage], None]


class Executor(Protocol):
    """Runs jobs: ``run`` submits one and waits for its result; ``cancel`` stops a
    running one (its ``run`` then answers ``cancelled``); ``close`` stops them all and
    releases what the executor started."""

    config: Config
    #: Which ``[tool.precompile] executor`` this is.
    kind: str
    #: Job id -> seconds the job ran, for the result cache (shards balance by them).
    seconds: dict[str, float]

    async def run(
        self, job_id: str, job: JobRequest, on_stage: OnStage | None = None
    ) -> JobResult: ...

    async def cancel(self, job_id: str) -> None: ...

    async def close(self) -> None: ...


def make_executor(config: Config, gate: TrustGate) -> Executor:
    """The executor ``config`` names. Ray is imported only here, only when named (its
    absence was a ConfigError when the configuration was read)."""
    if config.executor == "ray":
        from precompile_lsp.ray_executor import RayExecutor

        return RayExecutor(config, gate)
    from precompile_lsp.workers import WorkerPool

    return WorkerPool(config, gate)
