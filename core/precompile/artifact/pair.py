"""Reading and writing the artifact pair: path validation and atomic replacement.

A write replaces all its files or none: each file goes to a temporary sibling and is
fsynced; then each target is linked to a backup and renamed over, and any failure or
interrupt during those renames puts every replaced target back (or removes it, where
there was none before). Files are created with the process umask, like any file a tool
writes; only a private key asks for 0600.

Every file the product writes goes through ``write_files``, which applies the write
policy (``precompile.write_policy``: a path is written only if it is new or holds this
product's own file of the same kind) before ``atomic_write_files`` touches anything.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Collection, Sequence
from typing import BinaryIO

from precompile.errors import ArtifactWriteError, PrecompileError

PathLike = str | os.PathLike[str]


def as_path(value: object, what: str) -> str:
    """``value`` as a file path, or a PrecompileError that says what was passed instead."""
    if isinstance(value, bytes):
        raise PrecompileError(
            f"{what} was given bytes; pass a file path (str or os.PathLike)",
            hint="if these are the file's contents, write them to a file first",
        )
    if not isinstance(value, (str, os.PathLike)):
        raise PrecompileError(
            f"{what} must be a file path (str or os.PathLike), got {type(value).__name__}"
        )
    path = os.fspath(value)
    if not path or "\n" in path or "\x00" in path or len(path) > 4096:
        raise PrecompileError(
            f"{what} does not look like a file path (it is empty or holds newlines or NUL "
            f"bytes: file contents where a path belongs?)",
            hint="pass the path of the file, not its contents",
        )
    if os.path.isdir(path):
        raise PrecompileError(f"{what} {path!r} is a directory", hint="pass a file path inside it")
    return path


def validate_pair(artifact_path: object, cache_path: object | None) -> tuple[str, str | None]:
    artifact = as_path(artifact_path, "artifact_path")
    cache = None if cache_path is None else as_path(cache_path, "cache_path")
    if cache is not None and os.path.realpath(cache) == os.path.realpath(artifact):
        raise PrecompileError(
            f"cache_path and artifact_path are the same file ({artifact!r}); the pair is "
            f"two files",
            hint="use e.g. model.py for the artifact and model.cache for the cache",
        )
    return artifact, cache


def default_cache_path(artifact_path: str) -> str:
    """The cache beside an artifact when none is named: ``model.py`` -> ``model.cache``."""
    root, _ = os.path.splitext(artifact_path)
    return root + ".cache"


def open_regular(path: PathLike, *, follow_links: bool = True) -> BinaryIO:
    """``path`` opened for reading if it is a regular file; anything else -- a FIFO, a
    device, a socket, a folder, and a link when not ``follow_links`` -- is an OSError.

    Every read of a file a user could have put there goes through here (a source, an
    artifact, its cache, a result-cache entry, a serving log): the file is opened
    non-blocking and checked on the opened descriptor (``fstat``), so a FIFO named like a
    source, an artifact or a cache entry is never waited on (an open of a FIFO with no
    writer blocks; a read of one blocks until a writer comes), and a file swapped for one
    between a check and the open cannot slip past."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: PathLike, what: str) -> bytes:
    try:
        with open_regular(path) as f:
            return f.read()
    except OSError as error:
        raise PrecompileError(
            f"cannot read the {what} {os.fspath(path)!r}: {error.strerror or error}",
            hint="check the path and its permissions",
        ) from error


def read_text(path: PathLike, what: str) -> str:
    data = read_bytes(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PrecompileError(
            f"the {what} {os.fspath(path)!r} is not UTF-8 text ({error.reason} at byte "
            f"{error.start})",
            hint="pass the .py artifact, not the binary .cache",
        ) from error


def _sibling(path: str, kind: str) -> str:
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.{secrets.token_hex(6)}.{kind}")


def _write_temp(path: str, data: bytes, mode: int) -> str:
    """Write ``data`` to a new temporary sibling of ``path``, created with ``mode`` less
    the umask (``tempfile.mkstemp`` would force 0600 on every artifact)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    while True:
        tmp = _sibling(path, "tmp")
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(tmp, flags | getattr(os, "O_BINARY", 0), mode)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _keep_backup(path: str, backup: str) -> None:
    """A second name for the current target, so a rollback can rename it back. A hard
    link keeps the target in place meanwhile; where links are unsupported, a copy."""
    try:
        os.link(path, backup, follow_symlinks=False)
    except (OSError, NotImplementedError):  # no links here, or none to a symlink
        shutil.copy2(path, backup, follow_symlinks=False)


def _fsync_directories(paths: Sequence[str]) -> None:
    """Make the renames durable; a filesystem that cannot fsync a directory is left be."""
    for directory in {os.path.dirname(os.path.abspath(p)) for p in paths}:
        with contextlib.suppress(OSError):
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


class _Swap:
    """Rename temporaries over their targets, all or none.

    Every name is chosen before the first rename, and whether a target was replaced is
    read from the file system (its temporary is gone), not from a flag: an interrupt can
    land between a rename and the next statement, and the rollback must still see it.
    """

    def __init__(self, temps: list[tuple[str, str]], existed: dict[str, bool]) -> None:
        self.steps = [(tmp, path, _sibling(path, "bak")) for tmp, path in temps]
        self.existed = existed
        self.kept: set[str] = set()  # backups a failed restore leaves for the user

    def run(self) -> None:
        for tmp, path, backup in self.steps:
            if self.existed[path]:
                _keep_backup(path, backup)
            os.replace(tmp, path)

    def roll_back(self) -> list[str]:
        """Put back every target that was replaced; the problems, if any, as sentences."""
        problems = []
        for tmp, path, backup in reversed(self.steps):
            if os.path.lexists(tmp):
                continue  # never renamed: the target is as it was
            try:
                if self.existed[path]:
                    os.replace(backup, path)
                else:
                    os.unlink(path)
            except OSError as error:
                where = ""
                if self.existed[path]:
                    self.kept.add(backup)
                    where = f"; its previous version is at {backup}"
                problems.append(
                    f"{path} could not be restored ({error.strerror or error}) and holds "
                    f"the new version{where}"
                )
        return problems

    def clean_up(self) -> None:
        for tmp, _, backup in self.steps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if backup not in self.kept:
                with contextlib.suppress(OSError):
                    os.unlink(backup)


def atomic_write_files(
    files: Sequence[tuple[str, bytes]], *, private: Collection[str] = ()
) -> None:
    """Write every file, or none: temporaries first, then renames with rollback.

    A failure or an interrupt (KeyboardInterrupt included) at any point leaves each
    target exactly as it was, and absent where it was absent, with no temporaries left
    behind; an OSError becomes a PrecompileError that says so, or says precisely what
    could not be restored. Paths in ``private`` are created 0600 (less the umask).
    """
    existed = {path: os.path.lexists(path) for path, _ in files}
    temps: list[tuple[str, str]] = []
    swap: _Swap | None = None
    current = files[0][0] if files else "the artifact"
    try:
        for path, data in files:
            current = path
            temps.append((_write_temp(path, data, 0o600 if path in private else 0o666), path))
        swap = _Swap(temps, existed)
        swap.run()
    except BaseException as error:
        problems = swap.roll_back() if swap is not None else []
        if swap is not None:
            swap.clean_up()
        for tmp, _ in temps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if not isinstance(error, OSError):
            raise
        if problems:
            outcome = "restoring the previous files failed: " + "; ".join(problems)
        elif any(existed.values()):
            outcome = "the previous files are unchanged"
        else:
            outcome = "no file was created"
        raise ArtifactWriteError(
            f"cannot write {_target_of(error, temps, current)}: {error.strerror or error}; {outcome}",
            hint="check that the directory is writable and has space",
        ) from error
    swap.clean_up()
    _fsync_directories([path for _, path in temps])


def write_files(files: Sequence[tuple[str, bytes, str]], *, private: Collection[str] = ()) -> None:
    """Write each ``(path, data, kind)`` atomically, all or none -- after the write
    policy allows every one of them: a path that holds anything but this product's own
    file of ``kind`` refuses the whole write with an OverwriteRefusedError, and nothing
    changes. A write that fails (a full disk) raises an ArtifactWriteError."""
    from precompile.write_policy import check_writes

    check_writes([(path, kind) for path, _, kind in files])
    atomic_write_files([(path, data) for path, data, _ in files], private=private)


def remove_own(path: str, kind: str) -> None:
    """Remove ``path`` if it holds this product's own file of ``kind``; leave anything
    else (a user's file of that name is not ours to delete)."""
    from precompile.write_policy import RECOGNISERS

    try:
        if os.path.isfile(path) and RECOGNISERS[kind](path):
            os.remove(path)
    except OSError:
        pass


def _target_of(error: OSError, temps: list[tuple[str, str]], current: str) -> str:
    """The target an OSError was about (a rename names the temporary first; a failed
    write names nothing, and is about the file being written)."""
    for name in (error.filename, getattr(error, "filename2", None)):
        if name is None:
            continue
        for tmp, path in temps:
            if os.fspath(name) in (tmp, path):
                return path
        return os.fspath(name)
    return current


def file_sha256(path: str | os.PathLike[str]) -> str | None:
    """The sha256 of a file's bytes, None where it cannot be read: how a source record,
    an artifact's code hash and a job's imported files are hashed, by capture, engine
    and worker alike."""
    try:
        with open_regular(path) as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def artifact_relative(path: str | None, artifact_path: str) -> str | None:
    """``path`` as an artifact records it: relative to the artifact's directory, with
    ``/``, so the record is the same on every machine that checks out the repository
    (absolute where no relative path exists, another drive on Windows). A load resolves
    it back against where the artifact is then (``single_graph_checks.recorded_path``)."""
    if not path:
        return None
    base = os.path.dirname(os.path.abspath(artifact_path))
    try:
        shown = os.path.relpath(os.path.abspath(path), base)
    except ValueError:
        shown = os.path.abspath(path)
    return shown.replace(os.sep, "/")
