"""``.precompile/cache/<hash>.json``: a job's result with the hashes of what it depends on.

A result is valid while every path it depends on holds what it held (``files.path_state``):
each workspace file it imported reads as it did, every place its imports looked and found
nothing still holds nothing (no new module shadows one, no optional import finds one), and
the file recording each third-party distribution it imported (its ``RECORD``) is unchanged
-- else that distribution has the version it had -- so an unchanged target is never
captured again, in the editor or across CI runs. Paths inside the workspace are
stored relative to its root, so a cache restored into another checkout (another CI
runner) still hits. An entry that does not decode as a ``JobResult`` of this protocol is
a miss, never an error. The cache is an optimisation: one that cannot be written
(read-only, full, no permission) is turned off for the run, with one warning, and the
results are what they would have been. Reads files: call off the event loop.

The folder may be shared (``cache-dir``: a CI cache, a mounted volume) by processes
on several machines at once, so:

- an entry is published atomically: written to a temporary file of a name no other
  writer uses, flushed to disk, then renamed over the entry (``os.replace``); a reader
  sees the old entry or the new one, never a mix;
- an entry is verified on read: it embeds its full key and a SHA-256 of its canonical
  content; a cut-short, corrupt or foreign entry (another key whose hash shares the
  file name) is a miss, and the job runs and replaces it;
- the folder is bounded (``cache-max-mb``): after a write, when the entries exceed the
  bound, the least recently used (by modification time, which a hit refreshes) are
  deleted until they fit in 90% of it. Deleting an entry another process is reading is
  harmless: a file already opened reads to its end, and one not yet opened is a miss;
- the engine's key includes the Python build and torch's version (its local part, like
  ``+cpu``, too), so runners with other builds never share entries.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import stat
import sys
import sysconfig
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from precompile.artifact.pair import open_regular
from precompile_lsp import protocol
from precompile_lsp.files import ABSENT, path_state
from precompile_lsp.protocol import JobResult, ProtocolError

CACHE_FORMAT = 5
#: The first bytes of every entry: what eviction checks before it deletes a file.
MAGIC = "torch-precompile-result"
_ENTRY = re.compile(r"^[0-9a-f]{32}\.json$")
_TEMPORARY = re.compile(r"^\.[0-9a-f]{32}\.[0-9a-f]+\.tmp$")
#: A temporary file this old was left by a writer that died: eviction removes it.
_STALE_TEMPORARY_SECONDS = 3600
#: Evict after the first write of a run and then every this many writes.
_EVICT_EVERY = 64
_ROOT_MARK = "${PRECOMPILE_WORKSPACE}/"


@functools.lru_cache(maxsize=512)
def distribution_version(dist: str) -> str | None:
    """An installed distribution's version (remembered: reading it scans site-packages;
    ``distribution_version.cache_clear()`` forgets, e.g. before each batch)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def build_identity() -> str:
    """This interpreter's implementation, full version and build, ABI and platform:
    two runners whose Pythons differ in any of them never share a cached result."""
    return " ".join(
        [
            sys.implementation.cache_tag or sys.implementation.name,
            sys.version.replace("\n", " "),
            str(sysconfig.get_config_var("SOABI")),
            sys.platform,
            platform.machine(),
        ]
    )


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


#: How every cache file is created: new, never through a symbolic link.
_CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def _require(path: Path, test: Callable[[int], bool], what: str) -> None:
    """Raise an OSError unless ``path`` itself (not what a link at it names) is ``what``."""
    if not test(os.lstat(path).st_mode):
        raise OSError(f"{path} is not {what} (a symbolic link is never written through)")


class ResultCache:
    def __init__(
        self,
        root: Path,
        enabled: bool,
        directory: Path | None = None,
        max_bytes: int = 512 * 1024 * 1024,
    ) -> None:
        self.root = root
        #: Whether this is the workspace's own ``.precompile/cache`` (which gets a
        #: .gitignore); a ``cache-dir`` the user named is theirs to place.
        self.default = directory is None
        self.directory = root / ".precompile" / "cache" if directory is None else directory
        self.enabled = enabled
        self.max_bytes = max_bytes
        #: Set by the first failed write: a cache that cannot be written is not tried again.
        self.unwritable = False
        self._writes = 0

    def portable(self, path: str) -> str:
        """``path`` relative to the root when it is inside it, else as it is: as named,
        symbolic links not followed -- a link inside the workspace is itself a place
        a result depends on (re-pointed, it leads to other bytes), not the file it
        leads to now."""
        absolute = os.path.abspath(path)
        for root in dict.fromkeys((os.path.abspath(self.root), os.path.realpath(self.root))):
            if absolute.startswith(root + os.sep):
                return absolute[len(root) + 1 :]
        return absolute

    def _local(self, path: str) -> Path:
        return Path(path) if os.path.isabs(path) else self.root / path

    def _path(self, key: str) -> Path:
        return self.directory / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"

    def get(self, key: str, known: dict[Path, str | None] | None = None) -> JobResult | None:
        """The cached result for ``key`` if everything it depends on is unchanged.
        Each path it depends on must hold what it held (``files.path_state``: a file's
        hash, a folder, or nothing where an import looked and found nothing). ``known``:
        content hashes the caller read moments ago (the engine's last scan; None for a
        file it could not read), used instead of reading those files again; what this
        call reads is added to it, so the calls of one batch read each file once (a
        distribution's RECORD). An entry that cannot be read, is cut short, is not UTF-8
        or not of the shape ``put`` writes is a miss."""
        if not self.enabled:
            return None
        entry_path = self._path(key)
        try:
            if self.default:  # entries behind a link are refused, as writes are
                for folder in (self.directory.parent, self.directory):
                    _require(folder, stat.S_ISDIR, "a folder")
            data = self._read_entry(entry_path)
        except OSError:
            return None
        if self._verified(data, key) is None:
            return None
        decoded = self._decode(data, key)
        if decoded is None:
            return None
        dependencies, packages, result = decoded
        known = known if known is not None else {}
        for path, state in dependencies.items():
            local = self._local(path)
            try:
                if local not in known:
                    known[local] = path_state(local)
            except ValueError:  # a path no file system has (a NUL in it)
                return None
            if (known[local] or ABSENT) != state:
                return None
        for dist, version in packages.items():
            if distribution_version(dist) != version:
                return None
        here = {str(self._local(p)): d for p, d in dependencies.items()}
        with contextlib.suppress(OSError):  # recently used: evicted last (a read-only cache: not)
            os.utime(entry_path)
        return attrs.evolve(result, dependencies=here)

    @staticmethod
    def _checksum(entry: Mapping[str, object]) -> str:
        """The SHA-256 of an entry's canonical form, without its own checksum field (of
        the portable text: the same on every machine that shares the folder)."""
        fields = {k: v for k, v in entry.items() if k != "sha256"}
        return _digest(json.dumps(fields, sort_keys=True, ensure_ascii=False).encode())

    def _portable_text(self, text: str) -> str:
        """``text`` as ``put`` stores it: each path under the root made relative to it."""
        escaped = json.dumps(text, ensure_ascii=False)
        return str(json.loads(escaped.replace(json.dumps(str(self.root))[1:-1] + "/", _ROOT_MARK)))

    def _verified(self, data: bytes, key: str) -> dict[str, object] | None:
        """The entry, as stored, if it is one of this format for ``key`` whose checksum
        matches (a cut-short, corrupt or foreign file is None)."""
        try:
            entry = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return None
        if (
            not isinstance(entry, dict)
            or entry.get("magic") != MAGIC
            or entry.get("format") != CACHE_FORMAT
            or entry.get("key") != self._portable_text(key)
            or entry.get("sha256") != self._checksum(entry)
        ):
            return None
        return entry

    def seconds(self, key: str) -> float | None:
        """How long the job the entry for ``key`` holds took (None: no such entry, or it
        does not say), whether or not its result is still current."""
        if not self.enabled:
            return None
        try:
            entry = self._verified(self._read_entry(self._path(key)), key)
        except OSError:
            return None
        value = entry.get("seconds") if entry is not None else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            return None
        return float(value)

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

    def put(self, key: str, result: JobResult, seconds: float | None = None) -> str | None:
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
            "magic": MAGIC,
            "format": CACHE_FORMAT,
            "key": key,
            "seconds": None if seconds is None else round(seconds, 3),
            "dependencies": {self.portable(p): d for p, d in result.dependencies.items()},
            "packages": result.packages,
            "result": protocol.to_json_value(result),
        }
        # Every path under the root, anywhere in the entry, is stored relative to it.
        portable = json.loads(
            json.dumps(entry, ensure_ascii=False).replace(
                json.dumps(str(self.root))[1:-1] + "/", _ROOT_MARK
            )
        )
        portable["sha256"] = self._checksum(portable)
        data = json.dumps(portable, ensure_ascii=False).encode("utf-8")
        final = self._path(key)
        # A name no other writer (another process, thread or machine) uses.
        tmp = self.directory / f".{final.stem}.{uuid.uuid4().hex}.tmp"
        try:
            self._prepare()
            with os.fdopen(os.open(tmp, _CREATE_NEW, 0o666), "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)  # replaces whatever is at ``final``, never follows it
        except OSError as error:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            self.unwritable = True
            where = self.directory.parent if self.default else self.directory
            return (
                f"cannot write the result cache {self.directory}: "
                f"{error.strerror or error}; results are not cached this run, so unchanged "
                f"targets will be captured again next time (the findings are unaffected). "
                f"Make {where} a writable folder (not a symbolic link), or check with --no-cache"
            )
        if self._writes % _EVICT_EVERY == 0:
            self.evict()
        self._writes += 1
        return None

    def _prepare(self) -> None:
        """Make the cache folder, refusing (an OSError) to write through a symbolic link:
        a repository that ships ``.precompile`` (or ``.precompile/cache``, or its
        ``.gitignore``) as a link, dangling or not, would otherwise have the cache
        create files wherever it points, outside the workspace. Each component under
        the root is made with ``mkdir`` (which never follows a link) and then lstat'ed.
        A ``cache-dir`` the user named may itself be anywhere (a link too): only the
        entries inside it are written without following links."""
        if not self.default:
            self.directory.mkdir(parents=True, exist_ok=True)
            return
        for folder in (self.directory.parent, self.directory):
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder)
            _require(folder, stat.S_ISDIR, "a folder")
        ignore = self.directory.parent / ".gitignore"
        try:
            fd = os.open(ignore, _CREATE_NEW, 0o666)
        except FileExistsError:
            _require(ignore, stat.S_ISREG, "a regular file")
            return
        with os.fdopen(fd, "w") as f:
            f.write("# Created by torch-precompile: results cached by content hash.\n*\n")

    @staticmethod
    def _read_entry(path: Path) -> bytes:
        """An entry's bytes; anything but a regular file (a link, a FIFO that would
        block the read) is an OSError, so a miss."""
        with open_regular(path, follow_links=False) as f:
            return f.read()

    def evict(self) -> int:
        """Delete least recently used entries until they fit in 90% of the bound (when
        they exceed it), and temporaries left by writers that died; returns how many
        files went. Only files named and headed like entries are deleted: the folder
        may be one the user named. Any process may run this at any time."""
        now = time.time()
        entries: list[tuple[float, str, int, Path]] = []
        removed = 0
        try:
            listing = list(os.scandir(self.directory))
        except OSError:
            return 0
        for item in listing:
            try:
                stat = item.stat(follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile: another process evicted it
            if _ENTRY.match(item.name) and item.is_file(follow_symlinks=False):
                entries.append((stat.st_mtime, item.name, stat.st_size, Path(item.path)))
            elif (
                _TEMPORARY.match(item.name)
                and now - stat.st_mtime > _STALE_TEMPORARY_SECONDS
                and self._remove(Path(item.path))
            ):
                removed += 1
        total = sum(size for _, _, size, _ in entries)
        if total <= self.max_bytes:
            return removed
        goal = self.max_bytes * 0.9
        for _, _, size, path in sorted(entries):
            if total <= goal:
                break
            if self._is_entry(path) and self._remove(path):
                removed += 1
            total -= size
        return removed

    @staticmethod
    def _is_entry(path: Path) -> bool:
        try:
            with path.open("rb") as f:
                return f.read(64).startswith(b'{"magic": "' + MAGIC.encode())
        except OSError:
            return False

    @staticmethod
    def _remove(path: Path) -> bool:
        try:
            path.unlink()
        except OSError:
            return False  # another process removed it first, or may not: either is fine
        return True
