"""``.precompile/cache/<hash>.json``: a job's result with the hashes of what it depends on.

A result is valid while every workspace file it imported reads as it did and every
third-party distribution it imported has the version it had, so an unchanged target is
never captured again, in the editor or across CI runs. Paths inside the workspace are
stored relative to its root, so a cache restored into another checkout (another CI
runner) still hits. An entry that does not decode as a ``JobResult`` of this protocol is
a miss, never an error. The cache is an optimisation: one that cannot be written
(read-only, full, no permission) is turned off for the run, with one warning, and the
results are what they would have been. Reads files: call off the event loop.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
from collections.abc import Mapping
from pathlib import Path

import attrs

from precompile_lsp import protocol
from precompile_lsp.files import read_source, shown_path
from precompile_lsp.protocol import JobResult, ProtocolError

CACHE_FORMAT = 3
_ROOT_MARK = "${PRECOMPILE_WORKSPACE}/"


@functools.lru_cache(maxsize=512)
def distribution_version(dist: str) -> str | None:
    """An installed distribution's version (remembered: reading it scans site-packages;
    ``distribution_version.cache_clear()`` forgets, e.g. before each batch)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


class ResultCache:
    def __init__(self, root: Path, enabled: bool) -> None:
        self.root = root
        self.directory = root / ".precompile" / "cache"
        self.enabled = enabled
        #: Set by the first failed write: a cache that cannot be written is not tried again.
        self.unwritable = False

    def portable(self, path: str) -> str:
        return shown_path(path, self.root)

    def _local(self, path: str) -> Path:
        return Path(path) if os.path.isabs(path) else self.root / path

    def _path(self, key: str) -> Path:
        return self.directory / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"

    def get(self, key: str, known: Mapping[Path, str | None] | None = None) -> JobResult | None:
        """The cached result for ``key`` if everything it depends on is unchanged.
        ``known``: content hashes the caller read moments ago (the engine's last scan),
        used instead of reading those files again. An entry that cannot be read, is cut
        short, is not UTF-8 or not of the shape ``put`` writes is a miss."""
        if not self.enabled:
            return None
        try:
            data = self._path(key).read_bytes()
        except OSError:
            return None
        decoded = self._decode(data, key)
        if decoded is None:
            return None
        dependencies, packages, result = decoded
        known = known or {}
        for path, digest in dependencies.items():
            local = self._local(path)
            try:
                current = known[local] if local in known else read_source(local).sha
            except ValueError:  # a path no file system has (a NUL in it)
                return None
            if current != digest:
                return None
        for dist, version in packages.items():
            if distribution_version(dist) != version:
                return None
        here = {str(self._local(p)): d for p, d in dependencies.items()}
        return attrs.evolve(result, dependencies=here)

    def _decode(
        self, data: bytes, key: str
    ) -> tuple[dict[str, str], dict[str, str], JobResult] | None:
        """An entry's dependencies, packages and result, or None for anything else."""
        root = json.dumps(str(self.root))[1:-1] + "/"
        try:
            entry = json.loads(data.decode("utf-8").replace(_ROOT_MARK, root))
            if not isinstance(entry, dict):
                return None
            if entry.get("format") != CACHE_FORMAT or entry.get("key") != key:
                return None
            dependencies, packages = entry["dependencies"], entry["packages"]
            for table in (dependencies, packages):
                if not isinstance(table, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in table.items()
                ):
                    return None
            result: JobResult = protocol.from_json_value(entry["result"], JobResult)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, ProtocolError):
            return None
        if not isinstance(result, JobResult):
            return None
        return dependencies, packages, result

    def put(self, key: str, result: JobResult) -> str | None:
        """Store ``result`` under ``key``. The cache is an optimisation: when it cannot be
        written (a read-only workspace, a full disk, no permission) it is not written
        again by this instance, and the first failure returns the one warning to show
        (None otherwise); the result itself is unaffected."""
        if (
            not self.enabled
            or self.unwritable
            or result.status.failed
            or result.status is protocol.Outcome.CANCELLED
        ):
            return None
        entry = {
            "format": CACHE_FORMAT,
            "key": key,
            "dependencies": {self.portable(p): d for p, d in result.dependencies.items()},
            "packages": result.packages,
            "result": protocol.to_json_value(result),
        }
        text = json.dumps(entry, ensure_ascii=False)
        # Every path under the root, anywhere in the result, is stored relative to it.
        text = text.replace(json.dumps(str(self.root))[1:-1] + "/", _ROOT_MARK)
        tmp = self._path(key).with_suffix(f".{os.getpid()}.tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            ignore = self.directory.parent / ".gitignore"
            if not ignore.exists():
                ignore.write_text(
                    "# Created by torch-precompile: results cached by content hash.\n*\n"
                )
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, self._path(key))
        except OSError as error:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            self.unwritable = True
            return (
                f"cannot write the result cache {self.directory}: "
                f"{error.strerror or error}; results are not cached this run, so unchanged "
                f"targets will be captured again next time (the findings are unaffected). "
                f"Make {self.directory.parent} writable, or check with --no-cache"
            )
        return None
