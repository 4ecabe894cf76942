"""``executor = "ray"``: each capture, emit and verify job is a task of a Ray cluster.

The engine process imports ray (never torch) when the first job is submitted: it
connects to ``ray-address`` or starts a local cluster with ``workers`` CPUs. A task
carries the ``JobRequest`` as the protocol's JSON value and answers the ``JobResult``
the same way, decoded strictly here; the task's body (``precompile_lsp.worker.ray_task``,
imported only in the Ray worker process, which is the torch side) runs the job as a
local worker does, in a forked child with the job's timeout. A target's
``resources={"num_gpus": 1}`` become the task's resources.

An emit's bytes come back with the result: the remote side never writes into the
workspace. Here the engine writes them to the artifact's pair under the same write
policy as every write of the product (``artifact_io.write_files``: only a new path or the
product's own file of that kind is replaced), after the engine's own location checks
that ran before the job was submitted.

A task that dies (its worker process killed, out of memory), loses its node, cannot be
scheduled or does not finish in time is a ``crashed``/``timeout`` result with the
reason, which the engine reports as PC900 like a local worker's crash.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import time
from pathlib import Path
from typing import Any

import precompile
import precompile_lsp
from precompile_lsp import protocol
from precompile_lsp.config import Config
from precompile_lsp.executors import OnStage
from precompile_lsp.protocol import (
    CaptureError,
    JobKind,
    JobRequest,
    JobResult,
    Outcome,
    ProtocolError,
    Stage,
)
from precompile_lsp.trust import TrustGate

#: Beyond a job's own ``timeout`` (which the task enforces on the capture): how long a
#: task may take to be scheduled and to start its worker (importing torch) before the
#: engine gives up on it and cancels it.
SCHEDULING_GRACE_S = 300.0

#: The task's options each resource name sets (the rest are Ray custom resources).
_NAMED = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}


def _run_in_ray_worker(request: Any) -> dict[str, Any]:
    """The Ray task: run in a Ray worker process, where torch may be imported. The
    worker package is imported there, by name, never in the engine's process."""
    task = importlib.import_module("precompile_lsp.worker.ray_task")
    answer: dict[str, Any] = task.run_request(request)
    return answer


def _package_paths() -> list[str]:
    """The folders ``precompile`` and ``precompile_lsp`` are imported from here: a task
    imports the same copy (a checkout's source roots, or site-packages)."""
    paths: list[str] = []
    for package in (precompile, precompile_lsp):
        folder = str(Path(package.__file__ or "").resolve().parent.parent)
        if folder not in paths:
            paths.append(folder)
    return paths


def _quiet_driver(ray: Any) -> None:
    """Keep Ray's driver from printing to this process's stdout, which is the report of
    ``precompile check`` and the language server's protocol channel. ``log_to_driver=
    False`` stops the tasks' own output (a job's output is captured anyway), but the
    driver still prints the cluster's error messages ("A worker died...") to
    ``sys.stdout``; those reach the engine as the task's exception and become the job's
    PC900, so the printing is switched off with the flag Ray's own debugger uses."""
    private = getattr(getattr(ray, "_private", None), "worker", None)
    if private is not None and hasattr(private, "_worker_logs_enabled"):
        private._worker_logs_enabled = False


def _crash(message: str, job: JobRequest) -> JobResult:
    return JobResult(status=Outcome.CRASHED, kind=job.kind, message=message)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[-1] if text else type(error).__name__


def write_pair(job: JobRequest, files: dict[str, bytes]) -> CaptureError | None:
    """Write an emit's returned bytes to the job's artifact pair, under the write policy
    (all or nothing); an unsigned write removes a stale signature beside it, as a local
    emit does. Returns the refusal or failure, or None."""
    from precompile.artifact.pair import default_cache_path, remove_own, write_files
    from precompile.errors import PrecompileError
    from precompile.write_policy import pair_paths

    artifact = job.artifact
    try:
        write_files(
            [
                (artifact, files["artifact"], "artifact"),
                (default_cache_path(artifact), files["cache"], "cache"),
            ]
        )
    except PrecompileError as error:
        return CaptureError(message=error.message, type=type(error).__name__, hint=error.hint)
    remove_own(pair_paths(artifact)[2][0], "signature")
    return None


class RayExecutor:
    """Jobs as Ray tasks (see the module's docstring)."""

    kind = "ray"

    def __init__(self, config: Config, gate: TrustGate) -> None:
        self.config = config
        self.gate = gate
        self.running: dict[str, Any] = {}  # job id -> its task's ObjectRef
        #: Job id -> seconds its task took, scheduling included (the result cache
        #: remembers them to balance shards).
        self.seconds: dict[str, float] = {}
        self._ray: Any = None
        self._remote: Any = None
        self._started_cluster = False
        self._connecting: asyncio.Lock | None = None

    def _connect_now(self) -> Any:
        """Import ray and join the cluster (blocking: run off the event loop)."""
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        import ray

        if not ray.is_initialized():
            if self.config.ray_address is not None:
                ray.init(address=self.config.ray_address, log_to_driver=False)
            else:
                ray.init(num_cpus=self.config.workers, include_dashboard=False, log_to_driver=False)
            self._started_cluster = True
        _quiet_driver(ray)
        self._remote = ray.remote(_run_in_ray_worker)
        return ray

    async def _connect(self) -> Any:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._ray is None:
                self._ray = await asyncio.to_thread(self._connect_now)
        return self._ray

    def _options(self, job: JobRequest) -> dict[str, Any]:
        """The task's options: its resources (one CPU unless the target says), no retry
        (a job that killed its worker would kill the next one too; the engine reports
        it), and the environment that makes this package and the workspace importable."""
        resources = dict(job.resources)
        options: dict[str, Any] = {
            "num_cpus": resources.pop("num_cpus", 1),
            "max_retries": 0,
            "retry_exceptions": False,
        }
        for name in ("num_gpus", "memory"):
            if name in resources:
                options[name] = resources.pop(name)
        if resources:
            options["resources"] = resources
        paths = _package_paths()
        inherited = os.environ.get("PYTHONPATH")
        if inherited:
            paths.append(inherited)
        options["runtime_env"] = {
            "env_vars": {
                "PYTHONPATH": os.pathsep.join(paths),
                "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
            }
        }
        return options

    def _unschedulable(self, ray: Any, job: JobRequest) -> str | None:
        """Why no node of the cluster can ever run ``job`` (it asks for more of a
        resource than the whole cluster has), or None."""
        totals = ray.cluster_resources()
        wanted = {"num_cpus": 1.0, **job.resources}
        missing = [
            f"{name}={amount:g} (the cluster has {totals.get(_NAMED.get(name, name), 0):g})"
            for name, amount in wanted.items()
            if amount > totals.get(_NAMED.get(name, name), 0)
        ]
        if not missing:
            return None
        where = self.config.ray_address or "the local Ray cluster"
        return (
            f"no node of {where} has the resources {job.module}.{job.function} asks for: "
            f"{', '.join(missing)}; add such a node, or change the target's resources="
        )

    async def run(self, job_id: str, job: JobRequest, on_stage: OnStage | None = None) -> JobResult:
        if not self.gate.allows(f"capture {job.module}.{job.function}"):
            return JobResult(
                status=Outcome.CANCELLED, message="not run: the workspace is not trusted"
            )
        try:
            ray = await self._connect()
            unschedulable = await asyncio.to_thread(self._unschedulable, ray, job)
        except Exception as error:
            where = self.config.ray_address or "a local Ray cluster"
            return _crash(f"could not start or reach {where}: {_first_line(error)}", job)
        if unschedulable is not None:
            return _crash(unschedulable, job)
        ref = self._remote.options(**self._options(job)).remote(protocol.to_json_value(job))
        self.running[job_id] = ref
        if on_stage is not None:
            on_stage(Stage("running on the Ray cluster"))
        limit = job.timeout + SCHEDULING_GRACE_S
        started = time.monotonic()
        try:
            payload = await asyncio.wait_for(asyncio.wrap_future(ref.future()), limit)
            self.seconds[job_id] = time.monotonic() - started
        except asyncio.CancelledError:
            ray.cancel(ref)  # the task's finally kills the job's process group
            raise
        except TimeoutError:
            ray.cancel(ref, force=True)
            return JobResult(
                status=Outcome.TIMEOUT,
                kind=job.kind,
                message=f"the Ray task did not finish within {limit:g} s (the capture's "
                f"timeout of {job.timeout:g} s plus {SCHEDULING_GRACE_S:g} s to schedule it "
                f"and start its worker); it was cancelled",
            )
        except Exception as error:
            return self._failed(ray, error, job)
        finally:
            self.running.pop(job_id, None)
        return await self._received(payload, job)

    def _failed(self, ray: Any, error: Exception, job: JobRequest) -> JobResult:
        """A task that did not answer, as a job result saying why."""
        errors = ray.exceptions
        if isinstance(error, errors.TaskCancelledError):
            return JobResult(status=Outcome.CANCELLED, kind=job.kind)
        if isinstance(error, errors.WorkerCrashedError | errors.LocalRayletDiedError):
            why = "the Ray worker process running the job died (killed, or out of memory)"
        elif isinstance(
            error, errors.NodeDiedError | errors.ObjectLostError | errors.OwnerDiedError
        ):
            why = "the Ray node running the job was lost"
        elif isinstance(error, errors.OutOfMemoryError):
            why = "Ray killed the job's worker: its node ran out of memory"
        elif isinstance(error, errors.RuntimeEnvSetupError):
            why = "Ray could not set up the job's environment"
        elif isinstance(error, errors.RayTaskError):
            why = "the Ray task failed"
        else:
            why = "the Ray cluster failed the job"
        return _crash(f"{why}: {_first_line(error)}", job)

    async def _received(self, payload: Any, job: JobRequest) -> JobResult:
        """The task's answer, decoded strictly; an emit's bytes written under the write
        policy."""
        try:
            if not isinstance(payload, dict) or not isinstance(payload.get("files"), dict):
                raise ProtocolError(f"expected a result and files, got {type(payload).__name__}")
            result: JobResult = protocol.from_json_value(payload["result"], JobResult)
        except ProtocolError as error:
            return _crash(f"the Ray task sent a result this engine cannot read: {error}", job)
        if job.kind is not JobKind.EMIT or result.status is not Outcome.OK:
            return result
        files = payload["files"]
        if not all(isinstance(files.get(kind), bytes) for kind in ("artifact", "cache")):
            return _crash("the Ray task's emit returned no artifact pair", job)
        refused = await asyncio.to_thread(write_pair, job, files)
        if refused is not None:
            return JobResult(
                status=Outcome.ERROR,
                kind=job.kind,
                error=refused,
                report=result.report,
                dependencies=result.dependencies,
                packages=result.packages,
                output=result.output,
            )
        return result

    async def cancel(self, job_id: str) -> None:
        ref = self.running.get(job_id)
        if ref is not None and self._ray is not None:
            self._ray.cancel(ref)

    async def close(self) -> None:
        """Cancel what runs; stop the local cluster if this executor started it."""
        ray = self._ray
        if ray is None:
            return
        for ref in list(self.running.values()):
            ray.cancel(ref, force=True)
        self.running.clear()
        if self._started_cluster:
            await asyncio.to_thread(ray.shutdown)
        self._ray = None
        self._started_cluster = False
