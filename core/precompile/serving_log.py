"""The serving log: what ``Serving`` counted, appended as JSON lines for production.

One writer per file (``LogWriter``), one ``os.write`` per record on an ``O_APPEND``
descriptor, so the records of many processes never interleave; a size limit, and a
failure that warns once and turns the log off, never the call. Every runnable with a log
is flushed at exit and every FLUSH_INTERVAL_S from one daemon thread per process
(``register_for_flush``). Imports no torch (``import precompile`` stays light).
"""

from __future__ import annotations

import atexit
import json
import os
import stat
import threading
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from precompile.serving import Serving

#: The serving log's record format; a reader checks ``format`` and ``version``.
LOG_FORMAT = "precompile-serving-log"
LOG_VERSION = 1
#: Seconds between flushes of the serving log.
FLUSH_INTERVAL_S = 60.0
#: Bytes after which a serving-log file is no longer written (noted once in it).
MAX_LOG_BYTES = 64 * 1024 * 1024


class LogWriter:
    """Appends JSON lines to one file, one ``os.write`` per record on an ``O_APPEND``
    descriptor, so records of many processes never interleave within a line. Stops at
    MAX_LOG_BYTES (noting it once) and never raises: a failure warns once and the log
    stops."""

    _writers: ClassVar[dict[str, LogWriter]] = {}
    _writers_lock = threading.Lock()

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._dead = False

    @classmethod
    def for_path(cls, configured: str) -> LogWriter:
        path = resolve_log_path(configured)
        with cls._writers_lock:
            writer = cls._writers.get(path)
            if writer is None:
                writer = cls._writers[path] = cls(path)
            return writer

    def write(self, record: dict[str, Any]) -> None:
        with self._lock:
            if self._dead:
                return
            try:
                if self._fd is None:
                    self._fd = _open_log(self.path)
                line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
                size = os.fstat(self._fd).st_size
                if size + len(line) > MAX_LOG_BYTES:
                    self._dead = True
                    note = {
                        "format": LOG_FORMAT,
                        "version": LOG_VERSION,
                        "pid": os.getpid(),
                        "time": round(time.time(), 3),
                        "note": f"log size limit ({MAX_LOG_BYTES} bytes) reached; this "
                        f"process writes no more records to this file",
                    }
                    os.write(self._fd, (json.dumps(note) + "\n").encode())
                    return
                os.write(self._fd, line)
            except Exception as error:
                self._dead = True
                warnings.warn(
                    f"precompile: cannot write the serving log {self.path!r} ({error}); calls "
                    f"are served and counted (runnable.stats()), but not logged",
                    UserWarning,
                    stacklevel=2,
                )


def _open_log(path: str) -> int:
    """The log's descriptor, for appending to a regular file only. Opened non-blocking
    and without following a link, then fstat'ed: a FIFO with no reader (a log shipper
    that is down) or a device would block a call, or the process exit, forever; it is
    an OSError here instead, so the log is turned off with its one warning."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(path, flags, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def resolve_log_path(configured: str) -> str:
    """Where records go: a directory (existing, or named with a trailing separator) gets
    ``precompile-serving-<pid>.jsonl`` in it; ``{pid}`` in a path is replaced by the
    process id; any other path is one file shared by every process (O_APPEND)."""
    configured = os.path.expanduser(os.fspath(configured))
    if configured.endswith(os.sep) or os.path.isdir(configured):
        os.makedirs(configured, exist_ok=True)
        return os.path.join(configured, f"precompile-serving-{os.getpid()}.jsonl")
    return configured.replace("{pid}", str(os.getpid()))


_servings: weakref.WeakSet[Serving] = weakref.WeakSet()


_flusher: list[threading.Thread] = []


_flusher_lock = threading.Lock()


def register_for_flush(serving: Serving) -> None:
    """Flush ``serving`` at exit and every FLUSH_INTERVAL_S, from one daemon thread per
    process (no thread per call or per runnable)."""
    with _flusher_lock:
        _servings.add(serving)
        if not _flusher:
            atexit.register(flush_all)
            thread = threading.Thread(
                target=_flush_loop, name="precompile-serving-log", daemon=True
            )
            _flusher.append(thread)
            thread.start()


def _flush_loop() -> None:
    while True:
        time.sleep(FLUSH_INTERVAL_S)
        flush_all()


def flush_all() -> None:
    """Flush every live runnable's serving log (at exit, and periodically)."""
    for serving in list(_servings):
        try:
            serving.flush()
        except Exception:  # a log never fails the process
            pass
