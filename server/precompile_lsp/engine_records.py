"""What the engine keeps per workspace and per target: its counters, the jobs in flight,
each target's last results and findings, and the texts of the file versions findings
point into. Plain records; the engine (``precompile_lsp.engine``) is what changes them."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from pathlib import Path
from typing import Any

from precompile_lsp.discovery import TargetDecl
from precompile_lsp.findings import Finding
from precompile_lsp.protocol import JobKind, JobResult
from precompile_lsp.staleness import ArtifactStatus


@dataclasses.dataclass
class Stats:
    captures: int = 0
    cache_hits: int = 0
    emits: int = 0
    verifies: int = 0
    #: Jobs handed to a worker (any kind): what "no job runs" is measured by.
    jobs: int = 0
    #: Batches of checks that ran at least one job.
    rechecks: int = 0


@dataclasses.dataclass
class Job:
    """A job in flight: cancelled when a newer one for the same target supersedes it,
    shared when the same work is asked for again."""

    id: str
    task: asyncio.Task[JobResult]
    inputs: dict[Path, str | None]


@dataclasses.dataclass
class TargetState:
    decl: TargetDecl
    #: The last check result, kept until a newer one replaces it, and the declaration
    #: as it was when that result was computed (findings anchored to it stay where the
    #: result put them; a client maps them into newer versions of the file).
    result: JobResult | None = None
    result_decl: TargetDecl | None = None
    #: The last verify outcome, shown until the next check result.
    verified: JobResult | None = None
    #: The last emit, when its write was refused or failed (a full disk): shown beside
    #: the check's findings, not instead of them, until the next check result.
    emit_failure: JobResult | None = None
    artifact: ArtifactStatus | None = None
    findings: list[Finding] = dataclasses.field(default_factory=list)
    #: What each path the result was computed from held (what it depends on): a file's
    #: content hash, ``files.DIRECTORY``, or None where an import looked and found nothing.
    dependencies: dict[Path, str | None] = dataclasses.field(default_factory=dict)
    jobs: dict[JobKind, Job] = dataclasses.field(default_factory=dict)


class TextStore:
    """Texts of file versions by content hash, so a finding computed against one version
    of a file can be placed in another (the buffer being edited, the file as saved)."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self.texts: collections.OrderedDict[str, str] = collections.OrderedDict()

    def put(self, sha: str | None, text: str | None) -> None:
        if sha is None or text is None:
            return
        self.texts[sha] = text
        self.texts.move_to_end(sha)
        while len(self.texts) > self.limit:
            self.texts.popitem(last=False)

    def get(self, sha: str | None) -> str | None:
        return None if sha is None else self.texts.get(sha)


Event = dict[str, Any]
