"""The state of objects that keep it in C, where Python can still read it and set it
back: a ``random.Random``, an ``array.array``, a numpy array.

The user-state walk (``user_state.UserState``) compares containers by what they hold;
these objects hold nothing it can walk into, yet fn changes them (``self.rng.random()``
advances a generator, ``self.counts[0] += 1`` writes into an array), and an artifact,
which runs no Python, would not repeat the change. Each is recorded by value, compared
after the trace and put back like a container.
"""

from __future__ import annotations

import array
import random
import sys
from typing import Any

#: A numpy array larger than this is not copied at every capture: recorded by its
#: identity only (an in-place change to it is not seen).
_ARRAY_BYTES = 16 * 2**20


class ValueState:
    """What a C-state object held when the walk recorded it."""

    def __init__(self, saved: Any) -> None:
        self.saved = saved

    def same(self, obj: Any) -> bool:
        raise NotImplementedError

    def put_back(self, obj: Any) -> None:
        raise NotImplementedError


class _RandomState(ValueState):
    def same(self, obj: Any) -> bool:
        return bool(obj.getstate() == self.saved)

    def put_back(self, obj: Any) -> None:
        obj.setstate(self.saved)


class _ArrayState(ValueState):
    def same(self, obj: Any) -> bool:
        return bool(obj.tobytes() == self.saved)

    def put_back(self, obj: Any) -> None:
        obj[:] = array.array(obj.typecode, self.saved)


class _NumpyState(ValueState):
    def same(self, obj: Any) -> bool:
        saved = self.saved
        return bool(
            obj.shape == saved.shape
            and obj.dtype == saved.dtype
            and sys.modules["numpy"].array_equal(obj, saved, equal_nan=obj.dtype.kind in "fc")
        )

    def put_back(self, obj: Any) -> None:
        obj[...] = self.saved


def value_state(value: Any) -> ValueState | None:
    """``value``'s state if it is such an object, else None."""
    if isinstance(value, random.Random):
        return _RandomState(value.getstate())
    if isinstance(value, array.array):
        return _ArrayState(value.tobytes())
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray) and value.nbytes <= _ARRAY_BYTES:
        return _NumpyState(value.copy())
    return None


def holds_c_state(value: Any) -> bool:
    """Whether ``value`` is one of the objects ``value_state`` records: the user's own
    data, wherever its class is defined."""
    numpy = sys.modules.get("numpy")
    return isinstance(value, (random.Random, array.array)) or (
        numpy is not None and isinstance(value, numpy.ndarray)
    )
