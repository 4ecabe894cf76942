"""How a capture swaps one of torch's functions for its own for the length of a block.

Capture patches nest (a Dynamo capture records graph breaks, bypasses and installed
globals at once) and a process may capture on two threads: one reentrant lock for all of
them keeps one thread from restoring what another patched over.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.RLock()


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` inside the block; torch's own is back after it, also
    when the block raises. An attribute ``owner`` only inherits (a descriptor of a base
    class) is deleted again rather than set, so the base's is seen again."""
    with _lock:
        own = vars(owner)
        had = name in own
        original = own.get(name)
        setattr(owner, name, value)
        try:
            yield
        finally:
            if had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
