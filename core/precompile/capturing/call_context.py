"""The ambient context a captured call leaves behind, for both tracers.

An artifact runs its graphs under the context the capture recorded and puts the
caller's back when it returns: it replays what fn computed, not the changes fn makes to
torch's process-wide switches and leaves in place. A fn that calls
``torch.set_grad_enabled(False)`` (no with-block), ``torch.set_default_dtype`` or
``torch.use_deterministic_algorithms`` and returns leaves eager's process changed after
every call, and a served call would not -- the next code the caller runs would see
another default dtype than eager's. So a capture refuses a call that returns with the
context it was called in changed, naming what changed (helper-77's attack found it for
grad mode, which ``snapshot`` cannot see yet).
A change fn makes and undoes inside the call (a with-block) is the captured program's
own business, and served.
"""

from __future__ import annotations

from typing import Any

import torch

from precompile._compat.prelude import dispatch_mode_depth, function_mode_depth
from precompile.errors import PrecompileError
from precompile.locations import definition_location


def snapshot() -> tuple[tuple[str, Any], ...]:
    """The process-wide switches a call may change and leave changed, by name. Not grad
    mode or inference mode: both tracers run fn under the grad mode the capture is for
    (none, for inference), so a ``torch.set_grad_enabled(False)`` fn leaves behind does
    not show here -- not caught yet."""
    return (
        ("the default dtype", torch.get_default_dtype()),
        ("deterministic algorithms", torch.are_deterministic_algorithms_enabled()),
        ("autocast on CPU", torch.is_autocast_enabled("cpu")),
        ("the torch-function modes entered", function_mode_depth()),
        ("the dispatch modes entered", dispatch_mode_depth()),
    )


def refuse_left_changed(entered: tuple[tuple[str, Any], ...], fn: Any) -> None:
    """Refuse a call of ``fn`` that returned with the context it ``entered`` changed."""
    left = snapshot()
    changed = [
        f"{name} {after} (it was {before} when fn was called)"
        for (name, before), (_, after) in zip(entered, left)
        if before != after
    ]
    if changed:
        code = getattr(fn, "__code__", None)
        raise PrecompileError(
            f"{getattr(fn, '__qualname__', fn)} returned with {'; '.join(changed)}: eager "
            f"leaves that change behind after every call, and an artifact does not replay "
            f"it (it runs the captured program under the context it recorded and puts the "
            f"caller's back)",
            location=definition_location(code) if code is not None else None,
            hint="undo the change before fn returns (a with-block, or a try/finally that "
            "puts it back), or make it outside fn, around the call",
        )
