"""Reading workspace files the way every part of the engine agrees on: content hash and
text in one read, and a size limit above which a source is hashed but never parsed."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import tokenize
from pathlib import Path
from typing import BinaryIO

from precompile.artifact.pair import file_sha256, open_regular

#: Sources above this size are not read for targets (generated code, data in .py form):
#: parsing tens of megabytes would stall every client for seconds.
MAX_SOURCE_BYTES = 4 * 1024 * 1024


#: What marks a file as possibly holding targets (discovery's own cheap test): a file
#: too big to parse that contains it is reported, not passed over in silence.
_MARK = b"precompile"


@dataclasses.dataclass(frozen=True)
class SourceRead:
    """One file as the engine read it (off the event loop)."""

    path: Path
    sha: str | None  # None: missing or unreadable
    text: str | None  # None: missing, undecodable, or above MAX_SOURCE_BYTES
    too_big: bool = False
    #: Its size in bytes (when read).
    size: int = 0
    #: Above the limit and mentioning ``precompile``: it may hold targets nobody checks.
    may_hold_targets: bool = False
    #: Why the bytes are not text: the encoding tried, the bad byte and where it is
    #: (1-based line, 0-based column of code points before it).
    decode_error: DecodeProblem | None = None


@dataclasses.dataclass(frozen=True)
class DecodeProblem:
    encoding: str
    offset: int
    byte: int
    line: int
    column: int
    reason: str


def _digest_and_mark(f: BinaryIO) -> tuple[str, bool]:
    """A big file's hash, and whether it mentions ``precompile``, in one streamed read."""
    digest = hashlib.sha256()
    found, tail = False, b""
    while chunk := f.read(1 << 20):
        digest.update(chunk)
        found = found or _MARK in tail + chunk
        tail = chunk[-(len(_MARK) - 1) :]
    return digest.hexdigest(), found


def _decode(path: Path, data: bytes) -> tuple[str | None, DecodeProblem | None]:
    """A source's text as Python reads it: UTF-8 unless a ``.py`` file's coding cookie
    names another encoding."""
    encoding = "utf-8"
    if path.suffix == ".py":
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        except SyntaxError:
            encoding = "utf-8"  # an unknown cookie: reported as UTF-8's failure
    try:
        return data.decode(encoding), None
    except UnicodeDecodeError as error:
        before = data[: error.start]
        line_start = before.rfind(b"\n") + 1
        column = len(before[line_start:].decode(encoding, errors="replace"))
        problem = DecodeProblem(
            encoding=encoding,
            offset=error.start,
            byte=data[error.start],
            line=before.count(b"\n") + 1,
            column=column,
            reason=error.reason,
        )
        return None, problem
    except LookupError:  # a cookie naming an encoding Python does not have
        return None, None


def read_source(path: Path) -> SourceRead:
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_SOURCE_BYTES:
                digest, mentioned = _digest_and_mark(f)
                return SourceRead(
                    path, digest, None, too_big=True, size=size, may_hold_targets=mentioned
                )
            data = f.read()
    except OSError:  # missing, unreadable, or no regular file (a FIFO: never waited on)
        return SourceRead(path, None, None)
    digest = hashlib.sha256(data).hexdigest()
    text, problem = _decode(path, data)
    return SourceRead(path, digest, text, size=len(data), decode_error=problem)


def relative_path(path: Path | str, root: Path) -> str | None:
    """``path`` relative to ``root`` (POSIX separators), or None when it is outside."""
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return None


def shown_path(path: Path | str, root: Path | None) -> str:
    """How a path is shown to a user and stored portably: relative to the workspace
    root when its folder is inside it, else as it is. A symbolic link is shown by its
    own name, not where it leads: a refusal to write through ``artifacts/f.cache`` names
    that file, not the README it points at."""
    if root is None:
        return str(path)
    folder = relative_path(Path(path).parent, root)
    return str(path) if folder is None else (Path(folder) / Path(path).name).as_posix()


#: What a path held where it held no file: nothing (or nothing an import reads: a FIFO,
#: a device), or a folder.
ABSENT = "absent"
DIRECTORY = "directory"


def path_state(path: str | os.PathLike[str]) -> str:
    """What ``path`` holds, as a cached result records what it depends on: a regular
    file's sha256, ``DIRECTORY``, or ``ABSENT``. The same function in the job that records
    and in the engine that compares, so a file appearing where an import looked for one
    (a new module shadowing another, an optional import now found), a folder appearing
    (a namespace package) or a file's bytes changing each make the result stale."""
    digest = file_sha256(path)
    if digest is not None:
        return digest
    return DIRECTORY if os.path.isdir(path) else ABSENT


def holds_file(state: str | None) -> bool:
    """Whether a recorded ``state`` (``path_state``, or None: the engine's word for
    nothing there) is a file's content hash, not a folder or nothing."""
    return state not in (None, ABSENT, DIRECTORY)
