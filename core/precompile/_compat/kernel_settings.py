"""The process-wide torch settings a kernel reads in C++ to choose what it computes,
where a trace bakes that choice.

Some torch operations pick their implementation from a global switch when they are
dispatched: ``F.scaled_dot_product_attention`` chooses among its fused kernels and
the math composition by the ``torch.backends.cuda.*_sdp_enabled()`` flags (which
``torch.nn.attention.sdpa_kernel`` sets) and the order of their priority. A make_fx trace
records the operations of the choice the capture's flags made, and Inductor compiles
it, so an artifact runs that choice whatever the flags are when it is called -- where
eager would take another kernel (other numbers), or raise ("No viable backend").
No Python frame reads those flags, so the profile hook that records the settings user
code reads (``capturing.fx_process_state``) cannot see them: this table says, per
operation, what its kernel reads. A trace that dispatched an operation here records
its settings as if fn had read them, and the artifact compares them per call
(``runtime.setting_checks``). Private torch names (the priority order has no public
getter) are named here only, as ``state_checks.state_getter`` reads them again.

Each read is ``(module, attribute path, called)``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

#: What ``scaled_dot_product_attention`` reads to choose its kernel, on every device
#: (the flags of the devices that ignore one are compared all the same: a call under
#: ``sdpa_kernel`` changes several at once).
_SDPA_SETTINGS = (
    ("torch.backends.cuda", "flash_sdp_enabled", True),
    ("torch.backends.cuda", "mem_efficient_sdp_enabled", True),
    ("torch.backends.cuda", "math_sdp_enabled", True),
    ("torch.backends.cuda", "cudnn_sdp_enabled", True),
    ("torch.backends.cuda", "fp16_bf16_reduction_math_sdp_allowed", True),
    ("torch._C", "_get_overrideable_sdp_enabled", True),
    ("torch._C", "_get_sdp_priority_order", True),
)


@functools.cache
def kernel_settings() -> dict[int, tuple[Any, str, tuple[tuple[str, str, bool], ...]]]:
    """By ``id`` of the builtin a trace calls (kept alive here, so the id stays its): the
    builtin, the name users call it by, and the settings its kernel reads. Settings a
    torch build lacks are left out (their getter is not there to read again)."""
    import importlib

    def present(reads: tuple[tuple[str, str, bool], ...]) -> tuple[tuple[str, str, bool], ...]:
        return tuple(
            (module, path, call)
            for module, path, call in reads
            if callable(getattr(importlib.import_module(module), path, None))
        )

    sdpa = torch.nn.functional.scaled_dot_product_attention
    name, reads = "torch.nn.functional.scaled_dot_product_attention", present(_SDPA_SETTINGS)
    found = {id(sdpa): (sdpa, name, reads)}
    # Called as an ATen operator (``torch.ops.aten.scaled_dot_product_attention``): the
    # builtin each of its overloads calls.
    packet = torch.ops.aten.scaled_dot_product_attention
    for overload in (packet, *(getattr(packet, n) for n in packet.overloads())):
        op = getattr(overload, "_op", None)
        if op is not None:
            found[id(op)] = (op, name, reads)
    return found


def graph_kernel_settings(target: Any) -> tuple[str, tuple[tuple[str, str, bool], ...]] | None:
    """The name and settings of a graph node's target (a Dynamo graph's
    ``call_function``: the builtin itself, or an ATen overload of it), or None."""
    found = kernel_settings().get(id(target))
    if found is not None and found[0] is target:
        return found[1], found[2]
    packet = getattr(target, "overloadpacket", target)
    if packet is getattr(torch.ops.aten, "scaled_dot_product_attention", None):
        _, name, reads = kernel_settings()[id(torch.nn.functional.scaled_dot_product_attention)]
        return name, reads
    return None
