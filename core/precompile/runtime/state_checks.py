"""The process and ambient state a trace ran under, read the same way at capture and
when serving: torch's autocast state, the torch-function and dispatch modes active, the
torch settings the traced code read (``state_getter``), and ``code_fingerprint``, the
one digest of a function's code every check names code by.

The fingerprints of the Python values a single-graph trace read are in
``value_fingerprints`` (the values, objects, modules and hooks) and
``fingerprint_differences`` (where two fingerprints differ, in words): the three are
carried whole into make_fx's artifacts, in this order, and Dynamo's artifacts carry a
few of their functions (``capturing.carried``). Both sides call these functions -- the
capture imports this module, artifacts carry its functions verbatim -- so "the same
state" means the same thing to both.

Imports nothing at module level and nothing but torch and the standard library inside.
"""

from __future__ import annotations

from typing import Any

# >>> not emitted: artifacts carry this module whole, and their prelude binds these names
from precompile._compat.prelude import (
    dispatch_mode_at,
    dispatch_mode_depth,
    dispatch_tls_local_exclude_set,
    function_mode_at,
    function_mode_depth,
    privateuse1_backend_name,
)

# <<< not emitted


def type_name(cls: Any) -> str:
    """A class as another process names it: ``module.qualname``."""
    return f"{getattr(cls, '__module__', None)}.{getattr(cls, '__qualname__', repr(cls))}"


def code_fingerprint(code: Any) -> str:
    """A digest of what a code object does, independent of where it sits in its file:
    bytecode, names and constants (nested code objects included), but not file names or
    line numbers, so an edit elsewhere in the file does not change it. Frozen-set
    constants are sorted: their iteration order varies between processes."""
    import hashlib
    import types

    digest = hashlib.sha256()

    def constant(value: Any) -> str:
        if isinstance(value, types.CodeType):
            feed(value)
            return "<code>"
        if isinstance(value, frozenset):
            return "frozenset(" + ",".join(sorted(constant(v) for v in value)) + ")"
        if isinstance(value, tuple):
            return "(" + ",".join(constant(v) for v in value) + ")"
        return repr(value)

    def feed(c: Any) -> None:
        digest.update(c.co_code)
        digest.update(repr((c.co_names, c.co_varnames, c.co_freevars, c.co_cellvars)).encode())
        digest.update(repr(c.co_flags).encode())
        for value in c.co_consts:
            digest.update(constant(value).encode("utf-8", "backslashreplace"))

    feed(code)
    return digest.hexdigest()[:24]


#: The device types torch's autocast knows (besides the private-use backend).
AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "ipu", "mtia", "maia")


def autocast_state() -> tuple[tuple[str, str], ...]:
    """The ambient ``torch.autocast`` state: each device type autocast is enabled for,
    with its dtype. make_fx records the casts autocast makes, so a graph holds the
    state of its capture; a call under another state would compute in other dtypes
    in eager."""
    import torch

    devices = (*AUTOCAST_DEVICES, privateuse1_backend_name())
    return tuple(
        (device, str(torch.get_autocast_dtype(device)))
        for device in dict.fromkeys(devices)
        if torch.is_autocast_enabled(device)
    )


def ambient_modes() -> tuple[str, ...]:
    """The torch-function and dispatch modes active now, outermost first, each as
    another process names it (``torch.set_default_device('cpu')`` for the mode that
    call pushes). A mode sees every torch call made under it and may change its result
    (or only watch it, as ``FlopCounterMode`` does); a graph holds the operations of
    its capture, made under the capture's modes, so a call under other modes is one
    the graph cannot be trusted to answer. Called per call only when a mode is active
    or was at capture: the common case is two C calls that return 0."""
    found: list[str] = []
    for kind, depth, at in (
        ("TorchFunctionMode", function_mode_depth, function_mode_at),
        ("TorchDispatchMode", dispatch_mode_depth, dispatch_mode_at),
    ):
        for i in range(depth()):
            mode = at(i)
            cls = type(mode)
            if cls.__name__ == "DeviceContext" and hasattr(mode, "device"):
                found.append(f"torch.set_default_device({str(mode.device)!r})")
            else:
                found.append(f"{type_name(cls)} (a {kind})")
    return tuple(found)


def autocast_keys() -> dict[str, Any] | None:
    """Each autocast device's dispatch key in torch's thread-local excluded set, found
    by toggling that device's autocast once (and restoring it): a device's autocast is
    on exactly when its key is not excluded, so one read of that set then tells every
    device's state. None when some device's key cannot be told (callers then read each
    device with ``autocast_state``)."""
    import torch

    excluded = dispatch_tls_local_exclude_set
    devices = (*AUTOCAST_DEVICES, privateuse1_backend_name())
    keys: dict[str, Any] = {}
    for device in dict.fromkeys(devices):
        try:
            was = torch.is_autocast_enabled(device)
            before = excluded()
            torch.set_autocast_enabled(device, not was)
            after = excluded()
            torch.set_autocast_enabled(device, was)
        except Exception:
            return None
        key = (before - after) | (after - before)
        if key == before - before or excluded() != before:
            return None
        keys[device] = key
    return keys


def state_getter(module: str, path: str, call: bool) -> Any:
    """A zero-argument function that reads one torch setting the way the traced code
    did: attribute ``path`` of ``module`` (``torch.backends.mkldnn``, ``enabled``),
    called when ``call`` (``torch``, ``get_num_threads``)."""
    import functools
    import importlib
    import operator
    import sys

    owner = sys.modules.get(module) or importlib.import_module(module)
    if call:
        return operator.attrgetter(path)(owner)
    return functools.partial(operator.attrgetter(path), owner)
