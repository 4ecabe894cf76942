"""Reading and writing the artifact pair: path validation and atomic replacement.

A write never leaves a half-written file: each file goes to a temporary sibling, is
fsynced, and is renamed over the target; a failure before the renames leaves the
previous pair untouched.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

from precompile.errors import PrecompileError

PathLike = str | os.PathLike[str]


def _as_path(value: object, what: str) -> str:
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
    artifact = _as_path(artifact_path, "artifact_path")
    cache = None if cache_path is None else _as_path(cache_path, "cache_path")
    if cache is not None and os.path.realpath(cache) == os.path.realpath(artifact):
        raise PrecompileError(
            f"cache_path and artifact_path are the same file ({artifact!r}); the pair is "
            f"two files",
            hint="use e.g. model.py for the artifact and model.cache for the cache",
        )
    return artifact, cache


def read_bytes(path: PathLike, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
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


def _write_temp(path: str, data: bytes) -> str:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
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


def atomic_write_files(files: list[tuple[str, bytes]]) -> None:
    """Write every file to a temporary sibling first, then rename them all into place."""
    temps: list[tuple[str, str]] = []
    try:
        for path, data in files:
            temps.append((_write_temp(path, data), path))
        for tmp, path in temps:
            os.replace(tmp, path)
    except OSError as error:
        for tmp, _ in temps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise PrecompileError(
            f"cannot write {getattr(error, 'filename', None) or 'the artifact'}: "
            f"{error.strerror or error}; the previous files are unchanged",
            hint="check that the directory is writable and has space",
        ) from error
