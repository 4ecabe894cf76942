"""The torch-compatibility module: every use of a private torch name lives here.

Supporting the next torch release means changing this file (and the text it hands to the
emitter for artifacts), nowhere else. Tested against torch 2.13.x. Names that emitted
artifacts need are not imported by them from here -- artifacts must run without this
package -- so this module also owns the *text* of the import prelude they carry.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import traceback
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._ops import HigherOrderOperator
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.utils.stateless import _reparametrize_module

from precompile.locations import StackFrame, live_user_stack

__all__ = [
    "ARTIFACT_PRELUDE",
    "DATA_DEPENDENT_ERRORS",
    "FX_GRAPH_GLOBALS",
    "FakeTensor",
    "FakeTensorMode",
    "HigherOrderOperator",
    "UnsupportedOperatorException",
    "active_trace",
    "make_fx",
    "pytree",
    "recording_user_stacks",
    "reparametrized",
]

#: Exceptions fake tensors raise for an op whose result depends on tensor *values*.
DATA_DEPENDENT_ERRORS: tuple[type[BaseException], ...] = (
    DataDependentOutputException,
    DynamicOutputShapeException,
)

#: The import prelude of every emitted artifact: the names the driver reads, bound from
#: torch under short aliases. Private names appear here as text only.
ARTIFACT_PRELUDE = """\
import torch as _torch
import torch.utils._pytree as _pytree

_DisableAutocast = _torch._C._DisableAutocast
_any_autocast_enabled = _torch._C._is_any_autocast_enabled
_set_grad_enabled = _torch._C._set_grad_enabled
"""

#: Globals that FX-generated graph code references without defining them.
FX_GRAPH_GLOBALS = """\
import torch
import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree
from torch import device

inf = float("inf")
nan = float("nan")
NoneType = type(None)
"""


def reparametrized(module: torch.nn.Module, tensors: dict[str, Any]) -> Any:
    """Swap a module's params/buffers for ``tensors`` (by qualified name) for a block."""
    return _reparametrize_module(module, tensors)


def active_trace() -> str | None:
    """Name the tracer or compiler this process is inside of, if any.

    A capture nested in another trace would record that trace's proxies, not the
    user's computation.
    """
    if torch.compiler.is_compiling():
        return "torch.compile / Dynamo"
    from torch.fx._symbolic_trace import is_fx_symbolic_tracing

    if is_fx_symbolic_tracing():
        return "torch.fx symbolic tracing"
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    mode = _get_current_dispatch_mode()
    if mode is not None:
        return f"a {type(mode).__name__} dispatch mode (make_fx, fake tensors or similar)"
    return None


_stack_patch_lock = threading.Lock()


@contextlib.contextmanager
def recording_user_stacks(
    boundary: types.CodeType,
) -> Iterator[Callable[[str | None], list[StackFrame]]]:
    """Make FX record the full *user* stack of every node, not only ``forward`` frames.

    make_fx keeps only frames named ``forward``, which loses helper functions and the
    traced function itself; and FX stack strings carry no columns. While this is active
    each node's ``stack_trace`` string is also a key into a table of structured frames
    with exact columns; the yielded lookup turns a node's ``stack_trace`` into them.
    """
    from torch.fx.proxy import TracerBase

    table: dict[str, list[StackFrame]] = {}

    def _filter(self: Any, summary: traceback.StackSummary) -> traceback.StackSummary:
        frames = live_user_stack(sys._getframe(1), boundary)
        if not frames:
            return traceback.StackSummary.from_list([])
        result = traceback.StackSummary.from_list(
            [traceback.FrameSummary(f.file, f.line, f.function, lookup_line=False) for f in frames]
        )
        table["".join(result.format()).strip()] = frames
        return result

    with _stack_patch_lock:
        original = TracerBase._filter_traceback_frames
        TracerBase._filter_traceback_frames = _filter  # type: ignore[method-assign]
        try:
            yield lambda stack_trace: table.get(stack_trace or "", [])
        finally:
            TracerBase._filter_traceback_frames = original  # type: ignore[method-assign]
