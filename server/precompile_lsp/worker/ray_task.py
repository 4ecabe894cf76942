"""The body of a job run as a Ray task (``executor = "ray"``): it runs in a Ray worker
process, which is the torch side, like ``python -m precompile_lsp.worker``.

The task takes a ``JobRequest`` and returns a ``JobResult``, both as the protocol's JSON
values (decoded strictly on each side), plus, for an emit, the pair's bytes. The job
itself runs exactly as a local worker runs it: in a forked child with its own process
group (clean Dynamo state, the timeout, a crash or ``os._exit`` of the target's code is
a ``crashed`` result with the reason, everything it started is killed), or in a fresh
interpreter where fork is unavailable. An emit captures with the artifact's real path
(so the bytes are those a local emit writes) but writes into a folder of this task,
never into the workspace: the engine writes the bytes under its write policy.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from typing import Any

import attrs

from precompile_lsp import protocol
from precompile_lsp.protocol import JobKind, JobRequest, JobResult, Outcome
from precompile_lsp.worker import process

#: Whether this Ray worker process has imported torch and what jobs need (paid once per
#: process, before any fork, like the warm local worker).
_warm = False


def _prepare(job: JobRequest) -> str | None:
    """Set this process up for ``job``: the workspace and its source roots importable and
    the working directory, as a local worker has them. Returns why it cannot run here."""
    global _warm
    if not os.path.isdir(job.root):
        return (
            f"the workspace {job.root} does not exist on the Ray node {socket.gethostname()}; "
            f"the cluster's nodes must see the workspace at the same path (a shared "
            f"filesystem), see docs/cluster.md"
        )
    os.chdir(job.root)
    if not _warm:
        try:
            process.warm_imports()
        except Exception:
            pass  # the job itself reports what failed to import
        _warm = True
    process.warm_for(job)
    return None


def run_request(request: Any) -> dict[str, Any]:
    """Run one job; ``{"result": JobResult as JSON, "files": {kind: bytes}}``."""
    job = protocol.from_json_value(request, JobRequest)
    problem = _prepare(job)
    if problem is not None:
        result = JobResult(status=Outcome.CRASHED, kind=job.kind, message=problem)
        return {"result": protocol.to_json_value(result), "files": {}}
    deliver = tempfile.mkdtemp(prefix="precompile-deliver-") if job.kind is JobKind.EMIT else None
    try:
        job = attrs.evolve(job, deliver=deliver)
        if hasattr(os, "fork") and os.environ.get("PRECOMPILE_WORKER_SPAWN") != "1":
            result = process.run_forked(job)
        else:
            result = process.run_spawned(job)
        files: dict[str, bytes] = {}
        if deliver is not None and result.status is Outcome.OK:
            for kind in ("artifact", "cache"):
                path = os.path.join(deliver, kind)
                if os.path.isfile(path):
                    with open(path, "rb") as f:
                        files[kind] = f.read()
        return {"result": protocol.to_json_value(result), "files": files}
    finally:
        if deliver is not None:
            shutil.rmtree(deliver, ignore_errors=True)
