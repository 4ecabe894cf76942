"""The per-call check of the torch settings a trace depended on (``PROCESS_STATE``), for
both drivers: authored as code, emitted verbatim into make_fx's and Dynamo's artifacts.

A trace bakes the branch of each process-wide setting it read: make_fx records those fn
read (``torch.are_deterministic_algorithms_enabled()``, a ``torch.backends`` flag), and
both tracers those a kernel they lowered read in C++ to choose what it computes
(``_compat.kernel_settings``: the attention backend flags). Each record is
``[module, path, called, "WHAT at FILE:LINE", fingerprint]``; a call reads each setting
again (``state_checks.state_getter``) and is refused, naming the setting and the line
that read it, when one differs from the capture's. The values of the last call that
passed are kept, so an unchanged process costs one list comparison -- where every value
is a constant (``KEPT_TYPES``): a setting that is an object changed in place (the decimal
module's current context, whose precision a caller sets) equals itself, so such values
are fingerprinted again on every call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    # precompile.runtime.state_checks, value_fingerprints, fingerprint_differences and
    # refusal, emitted before this module.
    def state_getter(module: str, path: str, call: bool) -> Any: ...

    def new_context(names: Any, training: bool = True) -> dict[str, Any]: ...

    def fingerprint(value: Any, context: dict[str, Any], depth: int = 0) -> Any: ...

    def describe_value(fp: Any) -> str: ...

    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...


#: Values that cannot change in place, so equal to the last call's means unchanged:
#: Python's constants, and torch's devices and dtypes (``torch.get_default_device()``).
KEPT_TYPES = frozenset({bool, int, float, str, type(None)})
KEPT_TORCH_TYPES = frozenset({("torch", "device"), ("torch", "dtype")})


def kept(value: Any) -> bool:
    """Whether ``value`` is one of ``KEPT_TYPES`` or ``KEPT_TORCH_TYPES``, or a tuple of
    them (``gc.get_threshold()``)."""
    kind = type(value)
    if kind is tuple:
        return all(map(kept, value))
    return kind in KEPT_TYPES or (kind.__module__, kind.__qualname__) in KEPT_TORCH_TYPES


def build_setting_check(records: list[list[Any]]) -> Callable[[], None] | None:
    """``check()``, raising for a setting of ``records`` whose value now differs from the
    capture's; None where the trace depended on none."""
    if not records:
        return None
    getters = tuple(state_getter(module, path, call) for module, path, call, _, _ in records)
    seen: list[Any] = [None]

    def check() -> None:
        values = [get() for get in getters]
        if values != seen[0]:
            refuse_changed_setting(records, values)
            if all(map(kept, values)):
                seen[0] = values

    return check


def refuse_changed_setting(records: list[list[Any]], values: list[Any]) -> None:
    """Raise for the settings of ``records`` whose value (``values``, read now) differs
    from the trace's, naming the first with the line that read it and the others with
    their values (``sdpa_kernel`` changes several flags at once): the graph holds the
    branch of the captured values."""
    context = new_context(frozenset())
    changed = []
    for (_, _, _, site, then), value in zip(records, values):
        now = fingerprint(value, context)
        if now != then:
            changed.append((site, then, now))
    if not changed:
        return
    (site, then, now), others = changed[0], changed[1:]
    what, _, where = site.partition(" at ")
    also = "; ".join(
        # The setting's expression alone: the last word of what the capture wrote.
        f"{other.partition(' at ')[0].rpartition(' ')[2]}: {describe_value(was)} then, "
        f"{describe_value(is_)} now"
        for other, was, is_ in others
    )
    refuse(
        f"precompile: fn reads {what} ({where}), which was {describe_value(then)} when the "
        f"trace ran but is {describe_value(now)} now"
        + (f" (changed as well: {also})" if also else "")
        + "; the graph baked the branch of the captured value. Restore the setting around "
        "the call (where fn reads it itself, or read it outside fn and pass it as an "
        "argument, checked per call), or capture again under this setting",
        3,
    )
