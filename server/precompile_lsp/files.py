"""Reading workspace files the way every part of the engine agrees on: content hash and
text in one read, and a size limit above which a source is hashed but never parsed."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

#: Sources above this size are not read for targets (generated code, data in .py form):
#: parsing tens of megabytes would stall every client for seconds.
MAX_SOURCE_BYTES = 4 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class SourceRead:
    """One file as the engine read it (off the event loop)."""

    path: Path
    sha: str | None  # None: missing or unreadable
    text: str | None  # None: missing, not UTF-8, or above MAX_SOURCE_BYTES
    too_big: bool = False


def read_source(path: Path) -> SourceRead:
    try:
        size = path.stat().st_size
        if size > MAX_SOURCE_BYTES:
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            return SourceRead(path, digest, None, too_big=True)
        data = path.read_bytes()
    except OSError:
        return SourceRead(path, None, None)
    digest = hashlib.sha256(data).hexdigest()
    try:
        return SourceRead(path, digest, data.decode("utf-8"))
    except UnicodeDecodeError:
        return SourceRead(path, digest, None)


def relative_path(path: Path | str, root: Path) -> str | None:
    """``path`` relative to ``root`` (POSIX separators), or None when it is outside."""
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return None


def shown_path(path: Path | str, root: Path | None) -> str:
    """How a path is shown to a user and stored portably: relative to the workspace
    root when inside it, else as it is."""
    if root is None:
        return str(path)
    relative = relative_path(path, root)
    return str(path) if relative is None else relative
