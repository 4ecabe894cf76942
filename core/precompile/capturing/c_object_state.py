"""The state of objects that keep it in C, where Python can still read it: a
``random.Random``, an ``array.array``, a numpy array, numpy's random generators, and an
iterator's position (a generator's, an ``itertools.count``'s, a list's, tuple's or
range's iterator).

The user-state walk (``user_state.UserState``) compares containers by what they hold;
these objects hold nothing it can walk into, yet fn changes them (``self.rng.random()``
advances a generator, ``self.counts[0] += 1`` writes into an array), and an artifact,
which runs no Python, would not repeat the change. Each is recorded by value, compared
after the trace and put back like a container -- except a generator's or a count's
position, which Python cannot set back: the put back fails, and the capture says so
(``UserState.restore``).
"""

from __future__ import annotations

import array
import itertools
import pickle
import random
import sys
import types
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


class _NumpyGeneratorState(ValueState):
    """A numpy generator's state (a ``RandomState``, a ``Generator``, a bit generator),
    through its own public getter and setter; compared pickled (a Mersenne Twister's
    state holds an array)."""

    def __init__(self, saved: Any) -> None:
        super().__init__(saved)
        self.pickled = pickle.dumps(saved)

    def same(self, obj: Any) -> bool:
        return pickle.dumps(_generator_state(obj)) == self.pickled

    def put_back(self, obj: Any) -> None:
        nprandom = sys.modules["numpy.random"]
        if isinstance(obj, nprandom.RandomState):
            obj.set_state(self.saved)
        elif isinstance(obj, nprandom.Generator):
            obj.bit_generator.state = self.saved
        else:
            obj.state = self.saved


#: Iterators whose position is C state fn can advance (``next(self.steps)``).
_ITERATORS: tuple[type, ...] = (
    types.GeneratorType,
    itertools.count,
    type(iter([])),
    type(iter(())),
    type(iter(range(0))),
)


class _IteratorState(ValueState):
    """Where an iterator stands: a generator's suspended instruction and locals, or
    what its ``__reduce__`` says (a count's next value; a sequence iterator's sequence
    and index, which ``__setstate__`` sets back)."""

    def same(self, obj: Any) -> bool:
        return _same_position(_position(obj), self.saved)

    def put_back(self, obj: Any) -> None:
        if isinstance(obj, types.GeneratorType) or len(self.saved) < 2:
            raise TypeError(f"a {type(obj).__name__}'s position cannot be set back")
        obj.__setstate__(self.saved[1])


def _position(obj: Any) -> Any:
    if isinstance(obj, types.GeneratorType):
        frame = obj.gi_frame
        return None if frame is None else (frame.f_lasti, tuple(frame.f_locals.values()))
    return tuple(obj.__reduce__()[1:])


def _same_position(a: Any, b: Any) -> bool:
    """Numbers and strings by value, tuples item by item, anything else by identity."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(map(_same_position, a, b))
    if isinstance(a, (int, float, complex, str, bytes)):
        return bool(a == b)
    return a is b


def _numpy_generators() -> tuple[type, ...]:
    """numpy's generator classes, where numpy.random is imported (else no generator
    exists)."""
    nprandom = sys.modules.get("numpy.random")
    if nprandom is None:
        return ()
    return (nprandom.RandomState, nprandom.Generator, nprandom.BitGenerator)


def _generator_state(obj: Any) -> Any:
    nprandom = sys.modules["numpy.random"]
    if isinstance(obj, nprandom.RandomState):
        return obj.get_state(legacy=False)
    if isinstance(obj, nprandom.Generator):
        return obj.bit_generator.state
    return obj.state


def global_generators() -> list[tuple[str, Any]]:
    """The process's random generators outside torch that code draws from through a
    library's module functions, each with the words that name it: numpy's global
    ``RandomState`` (``np.random.rand()``). Where numpy is imported, numpy.random is
    imported here (as numpy does on first use): its global generator then exists before
    the trace, and a draw fn makes from it is a change from a recorded state. (Python's
    own ``random`` module is watched by the trace's profile hook, which names the line
    that drew.)"""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return []
    return [("numpy's global random generator", numpy.random.random_sample.__self__)]


def value_state(value: Any) -> ValueState | None:
    """``value``'s state if it is such an object, else None."""
    if isinstance(value, random.Random):
        return _RandomState(value.getstate())
    if isinstance(value, array.array):
        return _ArrayState(value.tobytes())
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray) and value.nbytes <= _ARRAY_BYTES:
        return _NumpyState(value.copy())
    generators = _numpy_generators()
    if generators and isinstance(value, generators):
        return _NumpyGeneratorState(_generator_state(value))
    if isinstance(value, _ITERATORS):
        return _IteratorState(_position(value))
    return None


def holds_c_state(value: Any) -> bool:
    """Whether ``value`` is one of the objects ``value_state`` records: the user's own
    data, wherever its class is defined."""
    numpy = sys.modules.get("numpy")
    return isinstance(value, (random.Random, array.array, *_ITERATORS, *_numpy_generators())) or (
        numpy is not None and isinstance(value, numpy.ndarray)
    )
