"""What a target's job is asked (its ``JobRequest``: options over the workspace's, the
artifact path, the resources it declares), the key its result is cached under --
everything the result depends on besides the files and packages the job imports, which
its cache entry records itself -- and which results may be cached and found again."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from precompile.artifact.pair import default_cache_path
from precompile.artifact.signing import default_signature_path
from precompile_lsp import protocol
from precompile_lsp.config import Config
from precompile_lsp.discovery import TargetDecl
from precompile_lsp.emit_paths import EmitPaths
from precompile_lsp.files import read_source
from precompile_lsp.protocol import JobKind, JobRequest, JobResult, Outcome
from precompile_lsp.result_cache import (
    CACHE_FORMAT,
    ResultCache,
    build_identity,
    distribution_version,
)

#: Fields of a job request that do not change its result: how long it may run (a
#: result that ran out of time is never cached) and where it keeps its temporary files.
NOT_IN_KEY = ("timeout", "scratch")
#: What the workspace root reads as in a key (not result_cache's mark, which a read expands).
ROOT_MARK = "<workspace root>"


def resources(declared: Any) -> dict[str, float]:
    """A target's literal ``resources=`` as the job asks for them (what is not a dict of
    names to numbers is the decorator's error, which its job reports)."""
    if not isinstance(declared, dict):
        return {}
    return {
        str(name): float(amount)
        for name, amount in declared.items()
        if isinstance(amount, (int, float)) and not isinstance(amount, bool)
    }


#: The variables the interpreter reads at start-up to build sys.path.
IMPORT_ENVIRONMENT = (
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONNOUSERSITE",
    "PYTHONUSERBASE",
    "PYTHONPLATLIBDIR",
    "PYTHONSAFEPATH",
)


class JobRequests:
    """The requests and cache keys of an engine's jobs. Call ``reconfigured`` when the
    configuration changes."""

    def __init__(
        self,
        root: Path,
        config: Config,
        emit_paths: EmitPaths,
        cache: ResultCache,
        trusted_keys: Sequence[str],
    ) -> None:
        self.root = root
        self.config = config
        self.emit_paths = emit_paths
        self.cache = cache
        #: Public keys a verification's load must find the pair signed by (none: any
        #: pair loads, as a plain ``precompile.load`` would).
        self.trusted_keys = list(trusted_keys)
        self.versions = {
            "python": sys.version.split()[0],
            # The interpreter's build, not only its version: a shared cache-dir serves
            # runners whose Pythons differ in implementation, ABI or build.
            "python-build": build_identity(),
            "torch": distribution_version("torch"),
            "torch-precompile": distribution_version("torch-precompile"),
            "cache": CACHE_FORMAT,
            # What the interpreter puts on sys.path at start-up from the environment the
            # workers inherit: a folder added to PYTHONPATH can make an optional import
            # find a module, and no lookup of the job's looked there.
            "import-environment": {k: os.environ[k] for k in IMPORT_ENVIRONMENT if k in os.environ},
        }

    def reconfigured(self, config: Config) -> None:
        self.config = config

    def options_of(self, decl: TargetDecl) -> dict[str, Any]:
        """What the job is run with: literal decorator options over the workspace's."""
        return {
            "backend": decl.options.get("backend") or self.config.backend,
            "tracer": decl.options.get("tracer") or self.config.tracer,
        }

    def job_request(self, decl: TargetDecl, kind: JobKind) -> JobRequest:
        artifact, declared = self.emit_paths.artifact_of(decl)
        options = self.options_of(decl)
        return JobRequest(
            kind=kind,
            module=decl.module,
            function=decl.function,
            root=str(self.root),
            source_roots=[str(r) for r in self.config.source_roots],
            artifact=str(artifact),
            artifact_declared=declared,
            backend=options["backend"],
            tracer=options["tracer"],
            timeout=self.config.timeout,
            trusted_keys=self.trusted_keys if kind is JobKind.VERIFY else [],
            resources=resources(decl.options.get("resources")),
        )

    def cache_key(self, decl: TargetDecl, kind: JobKind) -> str:
        """Everything a job's result depends on besides the files and packages it imports
        (which its cache entry records, with their hashes and versions).

        That is every field of the job request -- so a field added to the request is in
        the key without anyone remembering to add it -- except those in
        ``NOT_IN_KEY``, with workspace paths made relative (a cache restored into
        another checkout still hits); the interpreter the job runs in; the decorator's
        literal options; the versions; and the content of every file the request names
        that the job reads (``_read_inputs``: for a verification the artifact, its
        ``.cache`` and ``.sig``, each present or absent, and the trusted keys). Reads
        files: call off the event loop."""
        asked = protocol.to_json_value(self.job_request(decl, kind))
        for name in NOT_IN_KEY:
            asked.pop(name, None)
        request = json.dumps(asked, sort_keys=True).replace(
            json.dumps(str(self.root))[1:-1], ROOT_MARK
        )
        read = {
            self.cache.portable(str(p)): read_source(p).sha for p in self._read_inputs(decl, kind)
        }
        parts = [
            kind.value,
            decl.key,
            request,
            self.config.python,
            json.dumps(decl.options, sort_keys=True, default=str),
            json.dumps(self.versions, sort_keys=True),
            json.dumps(read, sort_keys=True),
        ]
        return "\n".join(parts)

    def _read_inputs(self, decl: TargetDecl, kind: JobKind) -> list[Path]:
        """The files a job reads because its request names them (the modules it imports
        are recorded by the job itself). A check captures into a scratch folder, so it
        reads none; a verification loads the pair, checks its signature against the
        trusted keys given as files, and its outcome changes with any of their bytes."""
        if kind is not JobKind.VERIFY:
            return []
        artifact = str(self.emit_paths.artifact_of(decl)[0])
        pair = [artifact, default_cache_path(artifact), default_signature_path(artifact)]
        keys = [k for k in self.trusted_keys if os.path.isfile(k)]
        return [Path(p) for p in pair + keys]

    def put(
        self,
        key: str,
        decl: TargetDecl,
        kind: JobKind,
        result: JobResult,
        seconds: float | None = None,
    ) -> str | None:
        """Cache ``result`` under ``key``, the key read before the job ran, unless what
        the key covers changed while it ran (an artifact rewritten during its
        verification): the result may be of either version, so it is of neither.
        Returns the warning of a cache that could not be written (once per engine)."""
        if self.cache_key(decl, kind) != key:
            return None
        return self.cache.put(key, result, seconds)

    def cached_checks(
        self, decls: list[TargetDecl], seen: dict[Path, str | None]
    ) -> dict[str, JobResult]:
        """The check results the cache still holds for ``decls`` (file I/O: one trip off
        the event loop for the whole batch, not one per target), ``seen`` the content
        hashes the engine last read."""
        distribution_version.cache_clear()  # a package may have been installed meanwhile
        hits = {}
        for decl in decls:
            cached = self.cache.get(self.cache_key(decl, JobKind.CHECK), seen)
            if cached is not None:
                hits[decl.key] = cached
        return hits

    def remembered_seconds(self, decls: Iterable[TargetDecl]) -> dict[str, float | None]:
        """How long each target's last check took, as the result cache remembers it
        (None: not remembered), whether or not that result is still current: what a
        shard split is balanced by. Reads files: call off the event loop."""
        return {d.key: self.cache.seconds(self.cache_key(d, JobKind.CHECK)) for d in decls}


def cacheable(decl: TargetDecl, result: JobResult) -> bool:
    """Whether ``result`` may answer for its target again while what it depends on
    is unchanged. Not when the machinery failed or the job was cancelled, and not
    when the target's module did not import (its own file is then not among the
    files the job recorded): what a failed import depends on has no bound -- a
    module that does not exist yet, anywhere under the source roots or on
    ``sys.path``, a package installed later, the environment -- so a cached failure
    would outlive its fix. Not caching it costs one failed import per check, and a
    demanding user wants the fix seen at once, wherever it was made."""
    if result.status.failed or result.status is Outcome.CANCELLED:
        return False
    return not import_failed(decl, result)


def import_failed(decl: TargetDecl, result: JobResult) -> bool:
    """Whether ``result`` is of a job that could not import its target's module:
    its own file is then not among the files the job recorded."""
    finished = not result.status.failed and result.status is not Outcome.CANCELLED
    return finished and str(decl.file) not in result.dependencies
