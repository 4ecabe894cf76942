"""CPython's cyclic garbage collector, paused while a capture watches the user's state.

Two reasons, one pause. What the collector does to Python state is not fn's doing:
a collection that lands while fn is traced runs finalizers and weakref callbacks --
Dynamo's cleanup hook deleting a global it bound in a module for code compiled earlier
in the process, a project class's ``__del__`` -- and the make_fx capture, which
compares the user's state before and after the trace to refuse fn's stores, would hold
those changes against fn (a full run of this project's suite refused a capture so).
Paused from the walk before the trace to the put-back after it, the state the capture
compares changes only by what fn's own code ran.

And it is faster: the user-state walk (``user_state.UserState``) copies the contents
of every container it reaches, tens of thousands of new lists and tuples at once, and
each burst crossed the collector's thresholds; in a process with a large heap (a test
run that imported hundreds of modules, a research repository, a language-server
worker) every full collection traverses the whole heap: in this project's own suite,
two thirds of the walk's time (bench/RESULTS.md, "The test suite's time").

What the trace leaves as cyclic garbage waits for the first collection after the pause
(measured: about 15,000 objects, 12 MB, for a capture of a ResNet-18-sized model). The
user's own setting is kept: a collector the user disabled stays disabled, and
``paused`` enables again only what it disabled, however its body ends.
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
