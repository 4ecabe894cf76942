"""How a multi-graph (Dynamo) artifact runs one call of its entry, authored as code,
emitted as text (with ``multigraph.py``, whose forward builder wraps its entry in
``serve_as_captured``).

The call runs under the global state the artifact was captured in (grad mode, default
dtype, deterministic mode, no autocast, the captured torch modes); a call whose only
difference from the captured one is ``requires_grad`` or the ``nn.Parameter`` class is
served through stand-ins with the captured flags (``_grad_flag_stand_ins``); and torch's
module trackers' global hooks, which only watch, are set aside for the call
(``_watchers_aside``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

# >>> not emitted: an artifact's prelude binds these and it carries state_checks'
# watches_only
from precompile._compat.prelude import GLOBAL_HOOK_DICTS, dispatch_mode_depth
from precompile.runtime.hook_kinds import watches_only

# <<< not emitted

if TYPE_CHECKING:
    # Bound by the artifact prelude (precompile._compat.prelude).
    _pytree: Any = None
    _any_autocast_enabled: Callable[[], bool] = bool
    _set_grad_enabled: Callable[[bool], None] = print
    _deterministic_enabled: Callable[[], bool] = bool
    GRAD_MODE: bool = False
    GRAD_MODE_READ: str = ""
    GRAD_FLAGS: dict[str, Any] = {}
    GLOBAL_STATE: dict[str, Any] = {}

    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...

    def warn_inference_grad(what: str, more_fixes: str = "") -> None: ...

    def nan_detection_on() -> bool: ...

    def refuse_nan_detection() -> NoReturn: ...

    def refuse_forward_ad_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None: ...

    BACKEND: str = ""

    def autocast_state() -> tuple[tuple[str, str], ...]: ...

    def check_ambient_modes(
        captured: tuple[str, ...], modes_see_ops: bool = False, kernels: str = ""
    ) -> None: ...

    def _opaque_to_dynamo(fn: Callable[..., Any]) -> Callable[..., Any]: ...

    def _ordinary_dispatch() -> Any: ...

    function_mode_depth: Callable[[], int] = int
    AMBIENT_MODES: list[str] = []
    MODES_SEE_OPS: bool = False


#: The parameters whose requires_grad a served call set to the captured value, across
#: this artifact's calls on every thread: id -> [parameter, its own value, calls using
#: it]. The last call using one puts its own value back.
_FLIPPED: dict[int, list[Any]] = {}


#: id(module) -> (a weak reference to it, its named parameters): what
#: ``_grad_flag_stand_ins`` walks on every call of an installed artifact, listed once per
#: module (``named_parameters()`` recurses through every submodule: hundreds of
#: microseconds on a ResNet). A parameter replaced since is missed, so its flag is not
#: set for the call: the guards then refuse, as they would without stand-ins.
_NAMED_PARAMETERS: dict[int, tuple[Any, list[tuple[str, Any]]]] = {}


def _named_parameters(module: Any) -> list[tuple[str, Any]]:
    import weakref

    found = _NAMED_PARAMETERS.get(id(module))
    if found is None or found[0]() is not module:
        if len(_NAMED_PARAMETERS) > 16:
            _NAMED_PARAMETERS.clear()
        found = _NAMED_PARAMETERS[id(module)] = (
            weakref.ref(module),
            list(module.named_parameters()),
        )
    return found[1]


def _grad_flag_stand_ins(
    args: tuple[Any, ...], kwargs: dict[str, Any], training: bool = False
) -> Any:
    """The call as the guards were certified for, where only ``requires_grad`` or the
    ``nn.Parameter`` class differs, or None if nothing would change. For an inference
    artifact: a tensor argument (or an item of a tuple, list or dict argument) that
    requires grad or is an ``nn.Parameter`` is passed as ``t.detach()`` (the same
    storage and metadata; one stand-in per tensor, so tensors passed twice stay one),
    and each parameter of a module argument takes the ``requires_grad`` it had at
    capture (``GRAD_FLAGS["params"]``) for the call. The graphs run with grad off, where
    neither changes a value; only fn's own reads of those flags (or of a tensor
    argument's class) would, and an artifact that has one never gets here. For a training artifact (``training``) only an
    ``nn.Parameter`` that does not require grad stands in: no gradient flows to it in
    eager either (one that requires grad is left to the guards, which name it; a
    frozen parameter to ``_refuse_training_flags``). A list or dict argument is not
    copied (fn may write into it): its items are swapped in place for the call and put
    back after it where fn left the stand-in. Returns (args, kwargs, stand-in id ->
    original, (parameter, captured flag, its name) to set, (list or dict, key,
    stand-in, original) to swap)."""
    import torch

    params = {} if training else GRAD_FLAGS.get("params") or {}
    originals: dict[int, Any] = {}
    memo: dict[int, Any] = {}
    flips: list[tuple[Any, bool, str]] = []
    swaps: list[tuple[Any, Any, Any, Any]] = []

    def tensor(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and (
            (value.requires_grad and not training)
            or (type(value) is torch.nn.Parameter and not (training and value.requires_grad))
        ):
            found = memo.get(id(value))
            if found is None:
                found = memo[id(value)] = value.detach()
                originals[id(found)] = value
            return found
        return value

    def stand_in(key: str, value: Any) -> Any:
        if isinstance(value, torch.nn.Module):
            wanted = params.get(key)
            if wanted is not None:
                wanted_set = set(wanted)
                for name, p in _named_parameters(value):
                    want = name in wanted_set
                    if (p.requires_grad != want or id(p) in _FLIPPED) and p.is_leaf:
                        flips.append((p, want, f"{name} of argument {key}"))
            return value
        if type(value) is tuple:
            return tuple(map(tensor, value))
        if type(value) in (list, dict):
            for k, item in list(value.items() if type(value) is dict else enumerate(value)):
                found = tensor(item)
                if found is not item:
                    swaps.append((value, k, found, item))
            return value
        return tensor(value)

    new_args = tuple(stand_in(str(i), a) for i, a in enumerate(args))
    new_kwargs = {k: stand_in(k, v) for k, v in kwargs.items()}
    if not originals and not flips:
        return None
    return new_args, new_kwargs, originals, flips, swaps


def _refuse_training_flags(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A training artifact's backward computes the gradients of the parameters that
    required grad at capture: a parameter frozen (or unfrozen) since is refused, in
    make_fx's words, when the guards miss (this runs only then)."""
    staged = _grad_flag_stand_ins(args, kwargs)
    for p, want, name in staged[3] if staged is not None else ():
        if p.requires_grad == want:
            continue
        refuse(
            f"precompile: parameter {name} has requires_grad={p.requires_grad} but was "
            f"captured with requires_grad={want}; this training artifact's backward "
            f"computes the gradients of the parameters that required grad at capture. "
            f"Restore it with .requires_grad_({want}), or capture again with the model "
            f"as it is served",
            2,
        )


#: [torch.nn.modules.module's globals, what reads its four global hook dicts from them],
#: filled by the first call of ``_watchers_aside``.
_GLOBAL_HOOKS: list[Any] = []


def _watchers_aside() -> Any:
    """Set torch's module trackers' global hooks aside for one served call (what undoes
    it), or None when there is nothing to set aside (no global hook: the per-call cost
    is four dict truth tests) or a hook that is not a tracker's (left for the guards
    and the dependency check to refuse, naming it). A tracker's hooks only watch
    (``hook_kinds.watches_only``): a graph has no module calls for them to note, so
    the served call is eager's with or without them -- but Dynamo's guards compare the
    hook dicts with the capture's (empty), and an installed artifact's frames would
    meet the hooks' own Python (``weakref``) as frames no variant covers. Set aside,
    the guards see the capture's state; the tracker attributes the call to no module,
    as docs/trust.md says. Taken out of and put back into the same dicts, in order."""
    if not _GLOBAL_HOOKS:
        import operator

        import torch.nn.modules.module as hooks_module

        # torch reads the hook dicts as its module's globals: read there, per call.
        _GLOBAL_HOOKS.extend((vars(hooks_module), operator.itemgetter(*GLOBAL_HOOK_DICTS)))
    scope, hook_dicts = _GLOBAL_HOOKS
    if not any(hook_dicts(scope)):
        return None  # no global hook: one C-level read of the four dicts
    import torch.nn.modules.module as hooks_module

    held = [
        (d, list(d.items()))
        for d in (getattr(hooks_module, name) for name in GLOBAL_HOOK_DICTS)
        if d
    ]
    if not held or not all(watches_only(h) for _d, items in held for _k, h in items):
        return None
    ids = {k for _d, items in held for k, _h in items}
    # The flags torch keeps per hook id (forward hooks' always_call / with_kwargs).
    flag_dicts = [
        d
        for d in (
            getattr(hooks_module, "_global_forward_hooks_always_called", None),
            getattr(hooks_module, "_global_forward_hooks_with_kwargs", None),
        )
        if d
    ]
    held += [(d, list(d.items())) for d in flag_dicts if any(k in ids for k in d)]
    for d, items in held:
        for k, _v in items:
            if k in ids:
                d.pop(k, None)

    def restore() -> None:
        for d, items in held:
            kept = [(k, v) for k, v in d.items() if (k, v) not in items]
            d.clear()
            d.update(items)
            d.update(kept)  # hooks registered during the call stay, after the others

    return restore


def serve_as_captured(entry: Any, check: Any, installed: bool = False) -> Any:
    """Run ``entry`` under the global state the artifact was captured in: the captured grad
    mode, and the default dtype and deterministic mode checked, since Dynamo's own guard
    on them is left to this driver (it also bundles the thread count, which an artifact
    must not depend on). A call under an ambient autocast is refused (the capture ran
    without one: eager would compute in another dtype), and so is a call in another grad
    mode than the captured one when the trace read the grad mode
    (``GRAD_MODE_READ``: ``torch.is_grad_enabled()``, or ``.requires_grad`` of a tensor
    it computed; eager would take the other branch). Each call first runs
    ``check(args, kwargs)``: what the trace depended on beyond its guards (hooks,
    module-level functions, objects compared by identity; see build_dependency_check)."""
    import threading

    import torch

    def refuse_autocast() -> None:
        active = [f"{device} ({dtype})" for device, dtype in autocast_state()]
        refuse(
            f"precompile: this call runs under torch.autocast ({', '.join(active) or 'on'}), "
            f"and the capture ran without it: eager would compute in the autocast dtype, the "
            f"artifact in the captured one. Call it outside torch.autocast, or enter "
            f"torch.autocast inside fn and capture again (re-emit the artifact)",
            6,
        )

    def refuse_grad_mode(grad: bool) -> None:
        refuse(
            f"precompile: this call runs with grad mode {'on' if grad else 'off'}, and the "
            f"capture traced fn with it {'on' if GRAD_MODE else 'off'}, reading it "
            f"({GRAD_MODE_READ}): eager would take the branch for the other mode. Call "
            f"it under torch.set_grad_enabled({GRAD_MODE}), or capture with "
            f"training={grad} (re-emit the artifact)",
            6,
        )

    dtype = getattr(torch, GLOBAL_STATE["default_dtype"].split(".")[-1])
    deterministic = GLOBAL_STATE["deterministic"]
    # An inference capture serves with grad mode off: a call made with it on, whose
    # model has a parameter (or whose input is a tensor) that requires grad, gets
    # outputs without the gradient eager's would carry. Said once per artifact
    # (InferenceGradWarning); looked for only under grad mode, until said.
    grad_loss_unwarned = [not GRAD_MODE]
    frozen_seen: list[Any] = []

    def _requiring_grad(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """What of this call's arguments requires grad: a tensor argument (or one in a
        list, tuple or dict argument), or a parameter of a module argument; "" if
        nothing. A module found with every parameter frozen is not walked again while
        it is passed (a later requires_grad_ on it is a change Dynamo's guards refuse)."""
        values = [*args, *kwargs.values()]
        names = [*(f"argument {i}" for i in range(len(args))), *map(repr, kwargs)]
        for name, value in zip(names, values):
            items = (
                value.values()
                if isinstance(value, dict)
                else value
                if isinstance(value, (list, tuple))
                else (value,)
            )
            for item in items:
                if isinstance(item, torch.Tensor) and item.requires_grad:
                    return f"{name} (a tensor)"
                if isinstance(item, torch.nn.Module) and not any(
                    item is seen for seen in frozen_seen
                ):
                    for pname, p in item.named_parameters():
                        if p.requires_grad:
                            return f"parameter {pname!r} of {name}"
                    frozen_seen.append(item)
                    del frozen_seen[:-4]
        return ""

    # The torch modes of the capture (almost always none): a call under others is
    # refused naming them, before any other check (Dynamo's own guard on the mode stack
    # would say only ___check_torch_function_mode_stack()).
    captured_modes = tuple(AMBIENT_MODES)
    # A training capture runs with grad on, which inference mode forbids: such a call is
    # refused by the grad-mode check below.
    inference_mode_enabled = torch.is_inference_mode_enabled if not GRAD_MODE else bool

    def _check_ambient_state(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The ambient checks one by one, in the order their refusals are said: the
        torch modes, what the trace depended on (``check``), then the default dtype,
        deterministic mode and autocast."""
        if function_mode_depth() or dispatch_mode_depth() or captured_modes:
            check_ambient_modes(captured_modes, MODES_SEE_OPS)
        check(args, kwargs)
        if torch.get_default_dtype() is not dtype or (
            torch.are_deterministic_algorithms_enabled() != deterministic
        ):
            refuse(
                f"precompile: this artifact was captured with default dtype {dtype} and "
                f"deterministic algorithms {'on' if deterministic else 'off'}; this process has "
                f"{torch.get_default_dtype()} and "
                f"{'on' if torch.are_deterministic_algorithms_enabled() else 'off'}. Restore them "
                f"around the call",
                6,
            )
        if _any_autocast_enabled():
            refuse_autocast()

    # The ambient state of an ordinary call: no torch-function or dispatch mode, the
    # captured default dtype and deterministic mode, no autocast. A call in that state
    # (read as one tuple of C calls) skips the checks of each; any other, or an artifact
    # captured under modes (never equal: None), runs them in order.
    ordinary = None if captured_modes else (0, 0, dtype, deterministic, False)
    default_dtype = torch.get_default_dtype

    # A training capture's Inductor graphs hold the backward AOTAutograd compiled:
    # anomaly detection sees none of it (the eager backend's graphs run eager's).
    backward_compiled = GRAD_MODE and BACKEND == "inductor"
    # Nor do they carry a forward-AD tangent (refuse_forward_ad_inputs).
    forward_ad = torch.autograd.forward_ad if BACKEND == "inductor" else None

    def forward(*args: Any, **kwargs: Any) -> Any:
        if (
            function_mode_depth(),
            dispatch_mode_depth(),
            default_dtype(),
            _deterministic_enabled(),
            _any_autocast_enabled(),
        ) == ordinary:
            check(args, kwargs)
        else:
            _check_ambient_state(args, kwargs)
        if backward_compiled and nan_detection_on():
            refuse_nan_detection()
        if forward_ad is not None and forward_ad._current_level >= 0:
            refuse_forward_ad_inputs(args, kwargs)
        grad = torch.is_grad_enabled()
        if grad != GRAD_MODE:
            if GRAD_MODE_READ:
                refuse_grad_mode(grad)
            if grad and grad_loss_unwarned[0]:
                what = _requiring_grad(args, kwargs)
                if what:
                    grad_loss_unwarned[0] = False
                    warn_inference_grad(what)
            _set_grad_enabled(GRAD_MODE)
        aside = _watchers_aside()
        try:
            if inference_mode_enabled():
                # Served with grad off, as an inference artifact always is; its guards
                # and graphs see the dispatch keys of ordinary code (_ordinary_dispatch),
                # so an ordinary tensor passes the guard the capture made of it.
                with _ordinary_dispatch():
                    return _entry_or_stand_ins(args, kwargs)
            return _entry_or_stand_ins(args, kwargs)
        finally:
            if aside is not None:
                aside()
            if grad != GRAD_MODE:
                _set_grad_enabled(grad)

    # An inference capture's graphs run with grad off, where requires_grad changes no
    # value, but Dynamo's tensor guards compare it (and an input's class: an
    # nn.Parameter where a tensor was captured; a training capture serves that too
    # where the parameter does not require grad). A call its entry refuses before
    # anything ran is tried once more with the flags as captured
    # (_grad_flag_stand_ins); a served call pays nothing for it. Not where the traced
    # code read a flag or the class of a tensor it was passed (GRAD_FLAGS["read"]:
    # isinstance(x, nn.Parameter) would take the other branch in eager).
    stand_ins_apply = not GRAD_FLAGS.get("read")
    flip_lock = threading.Lock()
    # Once a call was served through stand-ins (a frozen model, say: every later call
    # would miss the guards the same way), later calls build them first; a call that
    # needs none then runs as it is. An installed artifact builds them first from the
    # start: Dynamo refuses a frame as it is entered, which may be after other frames
    # ran, so a refused call cannot be tried again.
    stand_ins_first = [installed and stand_ins_apply]

    def _entry_or_stand_ins(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if stand_ins_first[0]:
            with flip_lock:
                staged = _grad_flag_stand_ins(args, kwargs, GRAD_MODE)
                if staged is not None:
                    _set_flags(staged[3])
            return entry(*args, **kwargs) if staged is None else _run_staged(staged)
        try:
            return entry(*args, **kwargs)
        except RuntimeError as error:
            # Only a refusal (a PrecompileError) raised before any graph ran.
            if not hasattr(error, "invariant") or getattr(error, "ran_before_refusal", False):
                raise
            if GRAD_MODE:
                _refuse_training_flags(args, kwargs)
            if not stand_ins_apply:
                raise
            with flip_lock:
                staged = _grad_flag_stand_ins(args, kwargs, GRAD_MODE)
                if staged is None:
                    raise
                _set_flags(staged[3])
        out = _run_staged(staged)
        stand_ins_first[0] = True
        return out

    def _set_flags(flips: list[tuple[Any, bool, str]]) -> None:
        for p, want, _name in flips:
            row = _FLIPPED.get(id(p))
            if row is None:
                _FLIPPED[id(p)] = [p, p.requires_grad, 1]
                p.requires_grad_(want)
            else:
                row[2] += 1

    def _run_staged(staged: Any) -> Any:
        new_args, new_kwargs, originals, flips, swaps = staged
        for container, key, found, _original in swaps:
            container[key] = found
        try:
            out = entry(*new_args, **new_kwargs)
        finally:
            for container, key, found, original in swaps:
                if container[key] is found:
                    container[key] = original
            with flip_lock:
                for p, _want, _name in flips:
                    row = _FLIPPED[id(p)]
                    row[2] -= 1
                    if not row[2]:
                        del _FLIPPED[id(p)]
                        p.requires_grad_(row[1])
        if originals:
            # An output that is an argument itself is the caller's tensor, as in eager.
            if any(id(leaf) in originals for leaf in _pytree.tree_leaves(out)):
                out = _pytree.tree_map(lambda v: originals.get(id(v), v), out)
        return out

    return _opaque_to_dynamo(forward)
