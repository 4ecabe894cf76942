"""The state of objects that keep it in C, where Python can still read it: a
``random.Random``, an ``array.array``, a numpy array, numpy's random generators and seed
sequences, and an iterator's position (a generator's, and any iterator implemented in C
that says where it stands through ``__reduce__``: itertools', a list's, a zip's, ...).

The user-state walk (``user_state.UserState``) compares containers by what they hold;
these objects hold nothing it can walk into, yet fn changes them (``self.rng.random()``
advances a generator, ``self.counts[0] += 1`` writes into an array), and an artifact,
which runs no Python, would not repeat the change. Each is recorded by value, compared
after the trace and put back like a container -- except where Python cannot set the
state back (a count's, a generator's or a cycle's position; a seed sequence's count of
children spawned): the put back fails, and the capture says so (``UserState.restore``).
An object whose state cannot even be read (a ``random.SystemRandom``, an iterator that
does not reduce) is not recorded.
"""

from __future__ import annotations

import array
import pickle
import random
import sys
import types
from typing import Any

#: A numpy array larger than this is not copied at every capture: recorded by its
#: identity only (an in-place change to it is not seen).
_ARRAY_BYTES = 16 * 2**20
#: How deep an iterator's position is followed into what it holds (a zip of iterators,
#: a generator's locals), and how many items of one container it reads.
_POSITION_DEPTH = 4
_POSITION_WIDTH = 64


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
    """A numpy array's copy: compared by its bytes (a NaN or a NaT equals itself; no
    element's ``==`` runs), an object array by its elements' identities."""

    def same(self, obj: Any) -> bool:
        saved = self.saved
        if obj.shape != saved.shape or obj.dtype != saved.dtype:
            return False
        if obj.dtype.hasobject:
            return all(a is b for a, b in zip(obj.ravel().tolist(), saved.ravel().tolist()))
        return bool(obj.tobytes() == saved.tobytes())

    def put_back(self, obj: Any) -> None:
        obj[...] = self.saved


class _NumpyGeneratorState(ValueState):
    """A numpy generator's state (a ``RandomState``, a ``Generator``, a bit generator, a
    seed sequence), through its own public getters; compared pickled (a Mersenne
    Twister's state holds an array). A seed sequence's count of children spawned
    (``Generator.spawn``) is part of it, and cannot be set back."""

    def __init__(self, saved: Any) -> None:
        super().__init__(saved)
        self.pickled = pickle.dumps(saved)

    def same(self, obj: Any) -> bool:
        return pickle.dumps(_generator_state(obj)) == self.pickled

    def put_back(self, obj: Any) -> None:
        nprandom = sys.modules["numpy.random"]
        state, seeds = self.saved
        if seeds != _seed_state(obj):
            raise TypeError("a numpy seed sequence's count of children cannot be set back")
        if isinstance(obj, nprandom.RandomState):
            obj.set_state(state)
        elif isinstance(obj, nprandom.Generator):
            obj.bit_generator.state = state
        elif isinstance(obj, nprandom.BitGenerator):
            obj.state = state


def _numpy_generators() -> tuple[type, ...]:
    """numpy's generator classes, where numpy.random is imported (else no generator
    exists); looked up once it is (the walk asks for every object it reaches)."""
    if _GENERATOR_CLASSES:
        return _GENERATOR_CLASSES[0]
    nprandom = sys.modules.get("numpy.random")
    if nprandom is None:
        return ()
    found = (nprandom.RandomState, nprandom.Generator, nprandom.BitGenerator, nprandom.SeedSequence)
    _GENERATOR_CLASSES.append(found)
    return found


_GENERATOR_CLASSES: list[tuple[type, ...]] = []
#: The containers the walk reads itself: no C state of their own to record.
_CONTAINERS = frozenset({dict, list, tuple, set, frozenset, types.FunctionType, types.CellType})


def _seed_state(obj: Any) -> Any:
    """The state of the seed sequence behind ``obj`` (or ``obj``'s own), where it has
    one."""
    nprandom = sys.modules["numpy.random"]
    if isinstance(obj, nprandom.Generator):
        obj = obj.bit_generator
    if isinstance(obj, nprandom.BitGenerator):
        obj = getattr(obj, "seed_seq", None)
    return obj.state if isinstance(obj, nprandom.SeedSequence) else None


def _generator_state(obj: Any) -> Any:
    nprandom = sys.modules["numpy.random"]
    if isinstance(obj, nprandom.RandomState):
        state = obj.get_state(legacy=False)
    elif isinstance(obj, nprandom.Generator):
        state = obj.bit_generator.state
    elif isinstance(obj, nprandom.BitGenerator):
        state = obj.state
    else:
        state = None
    return state, _seed_state(obj)


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


#: ``Py_TPFLAGS_HEAPTYPE``: a class defined in Python (its instances' state is in their
#: ``__dict__``, walked as any object's).
_HEAP_TYPE = 1 << 9


def _c_iterator(value: Any) -> bool:
    """Whether ``value`` is an iterator whose position is C state: a generator, or an
    instance of a builtin (not heap) type with ``__next__`` (itertools', a list's, a
    dict's, a zip's, a reversed's, ...)."""
    kind = type(value)
    return kind is types.GeneratorType or (
        not kind.__flags__ & _HEAP_TYPE and hasattr(kind, "__next__")
    )


class _IteratorState(ValueState):
    """Where an iterator stands (``_position``). A sequence iterator's index (a list's,
    a tuple's, a range's, a string's, reversed or not) is set back through its
    ``__setstate__``; any other position cannot be (an ``islice``'s count would be,
    but not the position of the iterator it reads)."""

    def __init__(self, saved: Any, index: int | None) -> None:
        super().__init__(saved)
        self.index = index

    def same(self, obj: Any) -> bool:
        return bool(_position(obj, 0) == self.saved)

    def put_back(self, obj: Any) -> None:
        if self.index is None:
            raise TypeError(f"a {type(obj).__name__}'s position cannot be set back")
        obj.__setstate__(self.index)


def _sequence_index(value: Any) -> int | None:
    """A sequence iterator's index, which its ``__setstate__`` sets back; else None."""
    reduced = value.__reduce__()
    if (
        len(reduced) == 3
        and isinstance(reduced[2], int)
        and len(reduced[1]) == 1
        and isinstance(reduced[1][0], (list, tuple, range, str, bytes))
        and hasattr(value, "__setstate__")
    ):
        return reduced[2]
    return None


def _position(value: Any, depth: int) -> Any:
    """A comparable picture of where ``value`` stands: an iterator by what its
    ``__reduce__`` says (followed into the iterators and containers it holds), a
    generator by its suspended instruction, its locals and what it delegates to, a list
    or tuple item by item, a number or string by value, anything else by identity.
    Raises where an iterator cannot say (then it is not recorded)."""
    if isinstance(value, (int, float, complex, str, bytes, bool, type(None))):
        return (type(value), value)
    if depth >= _POSITION_DEPTH:
        return ("id", id(value))
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_position(v, depth + 1) for v in value[:_POSITION_WIDTH]))
    if isinstance(value, types.GeneratorType):
        frame = value.gi_frame
        if frame is None:
            return ("generator done",)
        return (
            "generator",
            frame.f_lasti,
            tuple(_position(v, depth + 1) for v in frame.f_locals.values()),
            _position(value.gi_yieldfrom, depth + 1),
        )
    if _c_iterator(value):
        reduced = value.__reduce__()
        if not isinstance(reduced, tuple):
            raise TypeError(f"a {type(value).__name__} does not say where it stands")
        return tuple(
            ("id", id(part)) if i == 0 else _position(part, depth + 1)
            for i, part in enumerate(reduced)
        )
    return ("id", id(value))


def value_state(value: Any) -> ValueState | None:
    """``value``'s state if it is such an object whose state can be read, else None."""
    try:
        return _value_state(value)
    except Exception:
        # A state no getter reads (a SystemRandom's, an iterator that does not
        # reduce): nothing to compare it with.
        return None


def _value_state(value: Any) -> ValueState | None:
    if type(value) in _CONTAINERS:
        return None
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
    if _c_iterator(value):
        index = None if isinstance(value, types.GeneratorType) else _sequence_index(value)
        return _IteratorState(_position(value, 0), index)
    return None


def holds_c_state(value: Any) -> bool:
    """Whether ``value`` is one of the objects ``value_state`` records: the user's own
    data, wherever its class is defined."""
    numpy = sys.modules.get("numpy")
    return (
        isinstance(value, (random.Random, array.array, *_numpy_generators()))
        or _c_iterator(value)
        or (numpy is not None and isinstance(value, numpy.ndarray))
    )
