"""Dict inputs fn read only by key (``KEYED_DICTS``): a call's dicts rebuilt in the
captured key order, and the words for a dict whose keys differ. Part of the single-graph
input check (``single_graph_inputs``), emitted as text before it
(``capturing.carried.SingleGraph.DRIVER``); the capture side that decides which dicts
qualify is ``capturing.fx_keyed_inputs``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    # precompile.runtime.refusal, emitted before this module.
    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...


def keyed_inputs(value: Any, spec: Any, keyed: list[bool], counter: list[int]) -> Any:
    """``value`` with each dict that fn read only by key (``KEYED_DICTS``, pre-order over
    the captured spec's dicts) rebuilt in the captured key order, without the keys the
    capture did not have: eager computes the same from either, and the graph takes
    its inputs in the captured order. A dict missing a captured key is refused naming
    it. Anything shaped otherwise is returned as is, for the structure check to name."""
    if spec.type is dict:
        index = counter[0]
        counter[0] += 1
        if not isinstance(value, dict):
            return value
        keys = list(spec.context)
        if keyed[index] if index < len(keyed) else False:
            missing = [k for k in keys if k not in value]
            if missing:
                refuse(
                    f"precompile: a dict input has no key {missing[0]!r} (captured with "
                    f"keys {keys}); fn reads that dict by key, so its order and any other "
                    f"keys do not matter, but the graph takes the value of every captured "
                    f"key. Pass a dict with each of them, or capture again without it",
                    3,
                )
            value = {k: value[k] for k in keys}
        elif list(value) != keys:
            return value
        return {
            k: keyed_inputs(value[k], child, keyed, counter)
            for k, child in zip(keys, spec.children())
        }
    if spec.type in (list, tuple) and type(value) is spec.type and len(value) == spec.num_children:
        return spec.type(
            keyed_inputs(item, child, keyed, counter) for item, child in zip(value, spec.children())
        )
    return value


def key_order_difference(spec: Any, expected: Any) -> str | None:
    """The first dict in a call's inputs whose keys are the captured ones in another
    order, in words; None when the nesting differs otherwise."""
    if spec.type is not expected.type or spec.num_children != expected.num_children:
        return None
    keys, captured = spec.context, expected.context
    if isinstance(keys, list) and isinstance(captured, list) and keys != captured:
        if sorted(map(repr, keys)) == sorted(map(repr, captured)):
            return f"a dict input has its keys in the order {keys} but was captured with {captured}"
        return None
    for child, expected_child in zip(spec.children(), expected.children()):
        found = key_order_difference(child, expected_child)
        if found:
            return found
    return None


def key_set_difference(spec: Any, expected: Any) -> str | None:
    """The first dict in a call's inputs whose keys differ from the captured ones (fn
    read it beyond values by key: ``KEYED_DICTS``), in words; None when the nesting
    differs otherwise."""
    if spec.type is not expected.type:
        return None
    if spec.type is dict and list(spec.context) != list(expected.context):
        return f"a dict input has the keys {list(spec.context)} but was captured with {list(expected.context)}"
    if spec.num_children != expected.num_children:
        return None
    for child, expected_child in zip(spec.children(), expected.children()):
        found = key_set_difference(child, expected_child)
        if found:
            return found
    return None
