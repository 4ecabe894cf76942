"""Which variant of a multi-graph (Dynamo) artifact's frame serves a call, and why the
others refused: the one choice standalone serving, installed serving and every covers()
make, authored as code, emitted as text (with ``multigraph.py``, which dispatches on it).

Also what the choice sets aside and puts back (the dim marks a serialized guard cannot
expect) and the words a refusal names a failed guard in (``readable_guard_failure``,
``layout_note``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# >>> not emitted: the capture reports which variant serves (``variant_coverage``) with
# the code the artifact runs; an artifact's prelude binds these and it carries guard_text
from precompile._compat.prelude import disable_dispatch_modes, dispatch_mode_depth
from precompile.runtime.guard_text import guard_failure_text

# <<< not emitted

if TYPE_CHECKING:
    import torch as _torch

    # Bound by the artifact prelude (precompile._compat.prelude).
    _DYNAMO_DIM_MARKS: tuple[str, ...] = ()


def strip_dim_marks(values: Any) -> list[tuple[Any, dict[str, Any]]]:
    """Take the dim marks (``_DYNAMO_DIM_MARKS``: what mark_dynamic / mark_unbacked /
    mark_static leave) off the tensors among ``values`` (and in the lists, tuples and
    dicts among them); what ``restore_dim_marks`` puts back. A serialized guard is
    rebuilt without the capture's tensors, so its dimension-marking guard expects no
    marks, and a marked tensor (the capture's own example, passed again) would miss
    every variant though its sizes pass the shape guards."""
    stripped = []
    for value in values:
        if isinstance(value, dict):
            items = list(value.values())
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            items = [value]
        for t in items:
            attrs = getattr(t, "__dict__", None)
            if isinstance(t, _torch.Tensor) and attrs and _DYNAMO_DIM_MARKS[0] in attrs:
                stripped.append((t, {a: attrs.pop(a) for a in _DYNAMO_DIM_MARKS if a in attrs}))
    return stripped


def restore_dim_marks(stripped: list[tuple[Any, dict[str, Any]]]) -> None:
    for t, attrs in stripped:
        t.__dict__.update(attrs)


def serving_variant(managers: list[Any], f_locals: dict[str, Any]) -> int | None:
    """The variant whose guards pass for these locals: the one choice standalone
    serving and every covers() make. A root's fast path can refuse without running its
    tree once, so each variant is checked twice before the next (plain_guards' checks
    have no such fast path: ``checks_once``)."""
    if dispatch_mode_depth():
        # Served under a dispatch mode (MODES_SEE_OPS): the mode puts torch's Python
        # dispatch key in this thread's state, which the tensor guards would read as
        # another dispatch key set; eager's Python ran on the same tensors, so the
        # guards are checked with the modes set aside, and the graph runs under them.
        with disable_dispatch_modes():
            return _serving_variant_now(managers, f_locals)
    return _serving_variant_now(managers, f_locals)


def variant_chooser(managers: list[Any]) -> Any:
    """``choose(f_locals) -> int | None``: ``serving_variant`` over ``managers``, bound
    once per frame. A frame of one variant whose guards decide in one check (most
    frames: a capture with one specialization) is chosen by that check alone, with no
    search and no second try; under a dispatch mode it takes ``serving_variant``'s path."""
    only = managers[0] if len(managers) == 1 else None
    if only is None or not getattr(only, "checks_once", False):
        return lambda f_locals: serving_variant(managers, f_locals)
    check = only.check

    def choose(f_locals: dict[str, Any]) -> int | None:
        if dispatch_mode_depth():
            return serving_variant(managers, f_locals)
        return 0 if check(f_locals) else None

    choose.only = check  # type: ignore[attr-defined]  # the dispatcher's own fast path
    return choose


def _serving_variant_now(managers: list[Any], f_locals: dict[str, Any]) -> int | None:
    for i, manager in enumerate(managers):
        if manager.check(f_locals) or (
            not getattr(manager, "checks_once", False) and manager.check(f_locals)
        ):
            return i
    return None


def variant_coverage(managers: list[Any], f_locals: dict[str, Any]) -> dict[str, Any]:
    """What covers() answers: the serving variant, and why each one before it refused."""
    chosen = serving_variant(managers, f_locals)
    failures = [
        {"variant": i, "guard": readable_guard_failure(managers[i], f_locals)}
        for i in range(len(managers) if chosen is None else chosen)
    ]
    return {"served_by": chosen, "failures": failures}


def readable_guard_failure(manager: Any, f_locals: dict[str, Any]) -> str:
    """The first guard of a variant that fails for these locals, in the user's words."""
    if dispatch_mode_depth():
        with disable_dispatch_modes():
            info = manager.check_verbose(f_locals)
    else:
        info = manager.check_verbose(f_locals)
    parts = list(getattr(info, "verbose_code_parts", None) or [])
    return guard_failure_text(str(parts[0]), f_locals) if parts else "a guard failed"


def layout_note(failure: str, notes: list[list[str | None]]) -> str:
    """Why a variant still checks the strides a call's tensor failed (``[path or None,
    why]`` from capture): its Python read a layout, so Dynamo baked the answer; or
    Inductor's kernels need that tensor as captured and a copy would not serve it. (The
    eager backend serves any layout where neither holds, Inductor through a copy.)
    Likewise why a library module's value (``model.act.inplace``) is still checked."""
    if " has stride " not in failure:
        # A library value kept checked because the graph could not show its other
        # values harmless (``capturing.neutral_reads``): why.
        kept = [text for path, text in notes if path and f"`{path}` is not " in failure]
        return f" ({'; '.join(str(w) for w in kept)})" if kept else ""
    why = [text for path, text in notes if path is None or f"`{path}` has stride " in failure]
    if not why:
        return ""
    return (
        f" ({'; '.join(str(w) for w in why)}: pass the input in the captured layout, or "
        f"capture a call in this one too)"
    )
