"""The protocol channel of a process that speaks over its stdout (the language server, a
worker): a private duplicate of fd 1 for the protocol, and fd 1 itself pointed at
stderr, so that nothing else -- a stray print, a library, a C extension, a child
process -- can write into the protocol stream."""

from __future__ import annotations

import os
import sys
from typing import IO, Literal, overload


@overload
def protect_stdout(binary: Literal[True]) -> IO[bytes]: ...


@overload
def protect_stdout(binary: Literal[False]) -> IO[str]: ...


def protect_stdout(binary: bool) -> IO[bytes] | IO[str]:
    channel: IO[bytes] | IO[str]
    if binary:
        channel = os.fdopen(os.dup(1), "wb", buffering=0)
    else:
        channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channel
