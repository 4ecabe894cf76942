"""CPython's cyclic garbage collector, paused while a capture's bookkeeping allocates.

Why: the user-state walk (``user_state.UserState``) copies the contents of every
container it reaches, tens of thousands of new lists and tuples at once, and they live
until the capture ends. Each such burst crosses the collector's thresholds, and in a
process with a large heap (a test run that imported hundreds of modules, a research
repository, a language-server worker) every full collection traverses the whole heap
again: measured in this project's own suite, two thirds of the walk's time was the
collector, 42 full collections over 56 walks (bench/RESULTS.md, "The test suite's time").
The walk itself makes no garbage cycles, so collecting during it finds nothing.

Pausing changes when the collector runs, never what a program computes. The user's own
setting is kept: a collector the user disabled stays disabled, and ``paused`` enables
again only what it disabled, however its body ends. (The switch is the process's: a
``gc.disable()`` another thread makes while a walk runs is undone when the walk ends.)
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No automatic collection in the body; the collector as it was after it."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
