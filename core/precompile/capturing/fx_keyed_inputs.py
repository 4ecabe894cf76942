"""Which dict inputs fn read only by key (make_fx capture side).

The capture flattens a dict input in its key order, and the trace sees a dict rebuilt
from that flattening. A call whose dict has the same keys in another order, or extra
keys, flattens differently; yet where fn only looked values up by key (``d["a"]``,
``d.get("a")`` of a key it had), eager computes the same from such a dict: the order
and the extra keys reach nothing. Where fn observed the key set (iterated the dict,
took its length, tested a key it lacked, unpacked it with ``**``, returned it), they
can change the result, and the call must match the capture.

``watch_dicts`` hands fn, during the trace, every plain ``dict`` of its inputs as a
``_KeyedDict`` that records such observations; the artifact's ``KEYED_DICTS`` lists,
per dict of the input spec (pre-order), whether fn read it only by key. The driver
(``runtime.single_graph_keyed_inputs.keyed_inputs``) rebuilds such dicts of a call in the captured key order,
dropping the extra keys, before it compares the call's structure with the capture's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from precompile._compat.tracing import pytree


class _KeyedDict(dict[Any, Any]):
    """A dict that records, into ``observed``, when fn reads more than values by key."""

    __slots__ = ("_index", "_observed")
    _index: int
    _observed: set[int]

    def _seen(self) -> None:
        if not _quiet[0]:
            self._observed.add(self._index)

    def get(self, key: Any, default: Any = None) -> Any:
        if not dict.__contains__(self, key):
            self._seen()
        return dict.get(self, key, default)

    def __contains__(self, key: Any) -> bool:
        found = dict.__contains__(self, key)
        if not found:
            self._seen()
        return found

    def __getitem__(self, key: Any) -> Any:
        if not dict.__contains__(self, key):
            self._seen()
        return dict.__getitem__(self, key)


def _observing(name: str) -> Any:
    method = getattr(dict, name)

    def observe(self: _KeyedDict, *args: Any, **kwargs: Any) -> Any:
        self._seen()
        return method(self, *args, **kwargs)

    observe.__name__ = name
    return observe


# Everything else a dict offers reads (or changes) its key set or order.
for _name in (
    "__iter__",
    "__len__",
    "__reversed__",
    "__eq__",
    "__ne__",
    "__or__",
    "__ror__",
    "__ior__",
    "__repr__",
    "__setitem__",
    "__delitem__",
    "keys",
    "values",
    "items",
    "copy",
    "pop",
    "popitem",
    "setdefault",
    "update",
    "clear",
):
    setattr(_KeyedDict, _name, _observing(_name))
_KeyedDict.__hash__ = None  # as dict's
# Messages about fn's arguments name what the caller passed: a dict.
_KeyedDict.__name__ = _KeyedDict.__qualname__ = "dict"


def _keyed_flatten(d: _KeyedDict) -> tuple[list[Any], Any]:
    d._seen()  # pytree inside fn visits every key, in order
    return list(dict.values(d)), list(dict.keys(d))


def _keyed_unflatten(values: Any, context: Any) -> dict[Any, Any]:
    return dict(zip(context, values))


_registered = [False]
_quiet = [False]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The capture's own reads of fn's arguments (watching them for changes) are not
    fn's."""
    _quiet[0] = True
    try:
        yield
    finally:
        _quiet[0] = False


def _register() -> None:
    """Let torch's pytree inside fn (``tree_map`` over an input dict) treat a watched dict
    as the dict it is, recording the visit as an observation of its keys."""
    if not _registered[0]:
        pytree.register_pytree_node(_KeyedDict, _keyed_flatten, _keyed_unflatten)
        _registered[0] = True


def watch_dicts(value: Any, observed: set[int], counter: list[int] | None = None) -> Any:
    """``value`` (fn's user arguments, as rebuilt from the input spec) with each plain
    dict, pre-order, replaced by a ``_KeyedDict`` numbered as in ``keyed_flags``."""
    _register()
    counter = [0] if counter is None else counter
    if type(value) is dict:
        watched = _KeyedDict()
        watched._index = counter[0]
        watched._observed = observed
        counter[0] += 1
        for key, item in dict.items(value):
            dict.__setitem__(watched, key, watch_dicts(item, observed, counter))
        return watched
    if type(value) in (list, tuple):
        return type(value)(watch_dicts(item, observed, counter) for item in value)
    return value


def plain(value: Any) -> Any:
    """fn's outputs with each watched dict handed back as the plain dict it stands for
    (returning an input dict observes it: eager would hand back the caller's dict)."""
    if isinstance(value, _KeyedDict):
        value._seen()
        return {key: plain(item) for key, item in dict.items(value)}
    if type(value) in (list, tuple):
        return type(value)(plain(item) for item in value)
    if type(value) is dict:
        return {key: plain(item) for key, item in value.items()}
    return value


def keyed_flags(in_spec: Any, observed: set[int]) -> list[bool]:
    """Per dict of ``in_spec``, pre-order (as ``watch_dicts`` numbers them), whether fn
    read it only by key. Dicts inside other containers than lists and tuples were not
    watched, and count as observed."""
    flags: list[bool] = []
    numbered = [0]

    def walk(spec: Any, watched: bool) -> None:
        if spec.type is dict:
            flags.append(watched and numbered[0] not in observed)
            numbered[0] += watched
        for child in spec.children():
            walk(child, watched and spec.type in (dict, list, tuple))

    walk(in_spec, True)
    return flags
