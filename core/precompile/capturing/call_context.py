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
    """The process-wide switches a call may change and leave changed, by name. Grad mode
    among them: both tracers run fn under the grad mode the capture is for (off, for
    inference), so only a change to the other mode shows here; a make_fx trace also
    follows what fn does to it (``GradModeTrail``), which tells ``set_grad_enabled(False)``
    left behind under a trace already without grad."""
    return (
        ("grad mode", torch.is_grad_enabled()),
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
        _refuse_left(fn, "; ".join(changed))


def _refuse_left(fn: Any, what: str) -> None:
    """Refuse fn, which returned with ``what`` of the context changed."""
    code = getattr(fn, "__code__", None)
    raise PrecompileError(
        f"{getattr(fn, '__qualname__', fn)} returned with {what}: eager leaves that change "
        f"behind after every call, and an artifact does not replay it (it runs the "
        f"captured program under the context it recorded and puts the caller's back)",
        location=definition_location(code) if code is not None else None,
        hint="undo the change before fn returns (a with-block, or a try/finally that puts "
        "it back), or make it outside fn, around the call",
    )


#: The caller's grad mode, as the trail follows it: restored by a with-block's exit.
CALLER = "the caller's"


class GradModeTrail:
    """What fn does to grad mode, followed symbolically from the caller's mode
    (``CALLER``): each ``torch.set_grad_enabled(mode)`` and ``no_grad``/``enable_grad``
    block sets a constant and remembers the mode it found, each exit (and the
    decorator form's immediate restore) puts back what its object found, and a direct
    ``torch._C._set_grad_enabled`` call sets a mode not known here. fn returns with the
    caller's mode unless a set is left in force: ``left`` is then where (the trace's own
    grad mode is the capture's, so a mode left behind that equals it is seen only here).
    The make_fx profile hook feeds it (``capturing.fx_watch``) the calls it sees."""

    def __init__(self) -> None:
        self.state: Any = CALLER
        self.site = ""
        self.found: dict[int, tuple[Any, str]] = {}

    def set(self, owner: Any, mode: Any, site: str) -> None:
        """``owner`` (None for a direct call) sets ``mode`` (None: not known) at ``site``."""
        if owner is not None:
            self.found[id(owner)] = (self.state, self.site)
        self.state, self.site = (bool(mode) if mode is not None else "set directly"), site

    def restore(self, owner: Any) -> None:
        """``owner``'s exit: the mode it found is in force again."""
        if id(owner) in self.found:
            self.state, self.site = self.found.pop(id(owner))

    @property
    def left(self) -> str | None:
        """Where fn set the grad mode it returns with, where that is not the caller's."""
        return None if self.state == CALLER else self.site


def refuse_grad_mode_left(
    trail: GradModeTrail, fn: Any, traced_mode: bool, served_only_so: bool
) -> None:
    """Refuse fn, which returns with a grad mode it set and did not undo (``trail``).
    Not where that mode is the trace's (``traced_mode``) and the artifact serves only
    calls made under it (``served_only_so``: fn read the grad mode, which the artifact
    then checks per call): the caller's mode is then that one too (and ``prev =
    torch.is_grad_enabled(); ...; torch.set_grad_enabled(prev)`` is such a restore)."""
    site = trail.left
    if site is None or (served_only_so and trail.state == traced_mode):
        return
    mode = {True: "grad mode on", False: "grad mode off"}.get(
        trail.state, "the grad mode torch._C._set_grad_enabled set"
    )
    _refuse_left(fn, f"{mode}, set at {site} and not undone")
