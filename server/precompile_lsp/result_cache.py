"""``.precompile/cache/<hash>.json``: a job's result with the hashes of what it depends on.

A result is valid while every workspace file it imported reads as it did and every
third-party distribution it imported has the version it had, so an unchanged target is
never captured again, in the editor or across CI runs. Paths inside the workspace are
stored relative to its root, so a cache restored into another checkout (another CI
runner) still hits. An entry that does not decode as a ``JobResult`` of this protocol is
a miss, never an error. Reads files: call off the event loop.
"""

from __future__ import annotations

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

    def portable(self, path: str) -> str:
        return shown_path(path, self.root)

    def _local(self, path: str) -> Path:
        return Path(path) if os.path.isabs(path) else self.root / path

    def _path(self, key: str) -> Path:
        return self.directory / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"

    def get(self, key: str, known: Mapping[Path, str | None] | None = None) -> JobResult | None:
        """The cached result for ``key`` if everything it depends on is unchanged.
        ``known``: content hashes the caller read moments ago (the engine's last scan),
        used instead of reading those files again."""
        if not self.enabled:
            return None
        try:
            text = self._path(key).read_text(encoding="utf-8")
            entry = json.loads(text.replace(_ROOT_MARK, json.dumps(str(self.root))[1:-1] + "/"))
        except (OSError, json.JSONDecodeError):
            return None
        if not isinstance(entry, dict):
            return None
        if entry.get("format") != CACHE_FORMAT or entry.get("key") != key:
            return None
        known = known or {}
        for path, digest in entry["dependencies"].items():
            local = self._local(path)
            current = known[local] if local in known else read_source(local).sha
            if current != digest:
                return None
        for dist, version in entry["packages"].items():
            if distribution_version(dist) != version:
                return None
        try:
            result: JobResult = protocol.from_json_value(entry["result"], JobResult)
        except ProtocolError:
            return None
        here = {str(self._local(p)): d for p, d in entry["dependencies"].items()}
        return attrs.evolve(result, dependencies=here)

    def put(self, key: str, result: JobResult) -> None:
        if not self.enabled or result.status.failed or result.status is protocol.Outcome.CANCELLED:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        ignore = self.directory.parent / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# Created by torch-precompile: results cached by content hash.\n*\n")
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
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self._path(key))
