"""The runtime driver of multi-graph (Dynamo) artifacts, authored as code, emitted as text.

Like ``single_graph.py`` it is copied verbatim into artifacts and never imported by them. A
capture with graph breaks or several specializations is not one graph, so this driver
dispatches: it rebuilds, per captured frame, one dispatcher over that frame's variants
(serialized guards + Dynamo's transformed bytecode) and calls the first variant whose
guards hold. Deliberately standalone: nothing is installed on the program's code
objects and no frame evaluator runs, so an artifact serves exactly what it captured.

The rebuilt bytecode runs, and the guards check, against the LIVE globals of the module
each frame was compiled in: a global rebound after load fails the guard that certified
it. The only names bound there are ones Dynamo minted (normalized by the emitter so the
artifact is reproducible, and tagged so no other artifact or live compile mints them):
the frame's import aliases and builtins-dict key, the compiled subgraphs under their
backend ids, and the continuations under their resume names.

A call no variant covers raises PrecompileError naming the frame and, per variant, the
first guard that failed -- there is no compiler behind an artifact. The exception is a
frame Dynamo gave up on during capture: the capture ran it eagerly, so a miss of it runs
eagerly here too, with a warning once per frame.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

# >>> not emitted: the capture reports which variant serves (``variant_coverage``) with
# the code the artifact runs; an artifact's prelude binds these and it carries guard_text
from precompile._compat.prelude import (
    GLOBAL_HOOK_DICTS,
    disable_dispatch_modes,
    dispatch_mode_depth,
)
from precompile.runtime.guard_text import guard_failure_text
from precompile.runtime.value_fingerprints import watches_only

# <<< not emitted

if TYPE_CHECKING:
    import torch as _torch

    # Bound by the artifact prelude (precompile._compat.prelude).
    _DYNAMO_DIM_MARKS: tuple[str, ...] = ()
    _pytree: Any = None
    _any_autocast_enabled: Callable[[], bool] = bool
    _set_grad_enabled: Callable[[bool], None] = print
    FN_NAME: str = ""
    FN_MODULE: str = ""
    TORCH_VERSION: str = ""
    PYTHON_VERSION: list[int] = []
    GRAD_MODE: bool = False
    GRAD_MODE_READ: str = ""
    GRAD_FLAGS: dict[str, Any] = {}
    GLOBAL_STATE: dict[str, Any] = {}
    FUNCTION_SOURCES: list[dict[str, Any]] = []
    DYNAMO_GLOBALS: list[list[str]] = []
    ARTIFACT_TAG: str = ""
    _FRAMES: str = ""
    _ENTRY_BINDING: str = ""
    _BACKEND_FNS: dict[str, Any] = {}

    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...

    def import_user_module(name: str) -> Any: ...

    def warn_inference_grad(what: str, more_fixes: str = "") -> None: ...

    def dynamo_serving_runtime() -> Any: ...

    def plain_serving_runtime() -> Any: ...

    def disown_cleanup_hooks(scope: dict[str, Any], name: str) -> None: ...

    GUARD_RUNTIME: dict[str, Any] = {}

    def frame_label(name: str, line: int = 0) -> str: ...

    def changed_functions(records: Any, module_text: Any) -> Any: ...

    def changed_function_message(record: dict[str, Any], gone: bool, consequence: str) -> str: ...

    def build_dependency_check() -> Any: ...

    def _build_surface_check() -> Any: ...

    def autocast_state() -> tuple[tuple[str, str], ...]: ...

    def check_ambient_modes(
        captured: tuple[str, ...], modes_see_ops: bool = False, kernels: str = ""
    ) -> None: ...

    def _opaque_to_dynamo(fn: Callable[..., Any]) -> Callable[..., Any]: ...

    def _ordinary_dispatch() -> Any: ...

    function_mode_depth: Callable[[], int] = int
    AMBIENT_MODES: list[str] = []
    MODES_SEE_OPS: bool = False


def _strip_dim_marks(values: Any) -> list[tuple[Any, dict[str, Any]]]:
    """Take the dim marks (``_DYNAMO_DIM_MARKS``: what mark_dynamic / mark_unbacked /
    mark_static leave) off the tensors among ``values`` (and in the lists, tuples and
    dicts among them); what ``_restore_dim_marks`` puts back. A serialized guard is
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


def _restore_dim_marks(stripped: list[tuple[Any, dict[str, Any]]]) -> None:
    for t, attrs in stripped:
        t.__dict__.update(attrs)


def _mark_ran_before_refusal(error: RuntimeError) -> None:
    """Mark a refusal that escaped a variant (or an eagerly run frame) that had begun to
    run: its graphs and the user's code between graph breaks may have written buffers
    or inputs, so ``load(..., fallback=)`` must not run the call a second time. A frame's
    own guard miss is raised before its variant runs, unmarked; a continuation's miss
    passes through the entry's variant, which marks it. (A try costs a served call
    nothing on Python 3.11+.)"""
    if hasattr(error, "invariant"):  # a PrecompileError, the packaged one or refuse()'s
        error.ran_before_refusal = True  # type: ignore[attr-defined]


def check_versions() -> None:
    """Refuse a foreign Python or torch before anything is unpickled: the artifact holds
    pickled guard state (torch-build-locked) and code objects (Python-version-locked)."""
    import sys

    import torch

    if tuple(PYTHON_VERSION) != tuple(sys.version_info[:2]):
        refuse(
            f"precompile: this artifact was captured on Python {PYTHON_VERSION[0]}."
            f"{PYTHON_VERSION[1]} and cannot load on {sys.version_info[0]}."
            f"{sys.version_info[1]}: it carries serialized code objects, whose bytecode is "
            f"specific to one Python version. Capture it again under this Python"
        )
    if TORCH_VERSION != str(torch.__version__):
        refuse(
            f"precompile: this artifact was captured with torch {TORCH_VERSION} and cannot "
            f"load on torch {torch.__version__}: it carries pickled Dynamo guard state, "
            f"which only the torch build that wrote it can read. Capture it again with "
            f"this torch"
        )


def check_function_sources() -> None:
    """Refuse to serve a function whose source changed since capture: its guards and
    bytecode describe the old code."""
    for record, gone in changed_functions(FUNCTION_SOURCES, _module_text):
        refuse(
            changed_function_message(record, gone, "its guards and bytecode describe the old code")
        )


def _module_text(name: str, path: str) -> str | None:
    import inspect

    try:
        return inspect.getsource(import_user_module(name))
    except (OSError, TypeError):
        return None


def rebuild_global(kind: str, data: str) -> Any:
    """A helper global Dynamo bound at capture (DYNAMO_GLOBALS), rebuilt here: a module,
    a module's globals dict, a function or class by ``module:qualname``, or a small
    pickled value."""
    import base64
    import operator
    import pickle

    if kind == "module":
        return import_user_module(data)
    if kind == "module_dict":
        return vars(import_user_module(data))
    if kind == "object":
        module_name, qualname = data.split(":", 1)
        try:
            return operator.attrgetter(qualname)(import_user_module(module_name))
        except AttributeError:
            refuse(
                f"precompile: this artifact's compiled code reads {module_name}.{qualname}, "
                f"which this process does not define; capture it again"
            )
    return pickle.loads(base64.b64decode(data))


def check_dict_key_order(records: list[dict[str, Any]], scope: dict[str, Any], frame: Any) -> None:
    """Refuse, naming the dict, when a module-level dict whose key order the trace could
    depend on (``_compat.dict_keys``: it iterated the dict, took its length, ...) holds
    other keys at the positions its guards name than it held at capture: the guards read
    it by position, and could not be rebuilt or would never hold. A dict only looked up by
    key is named by key instead, and is not checked here."""
    for record in records:
        if not record["order"] or not record["dict"].startswith("G["):
            continue
        try:
            value = eval(record["dict"], {"__builtins__": {}, "G": scope})
            keys = list(dict.keys(value))
        except Exception:
            continue  # the guards refuse what is not there
        captured = [(p, k) for p, k in record["keys"]]
        if all(p < len(keys) and keys[p] == k for p, k in captured):
            continue
        refuse(
            f"precompile: module {frame['python_module']}'s dict `{record['shown']}` holds "
            f"the keys {keys!r:.300} in this process, but at capture it held "
            f"{[k for _p, k in captured]!r:.300} at positions {[p for p, _k in captured]}; "
            f"the trace depended on the dict's key order ({record['why']}), so the "
            f"artifact's guards read it by position. Fill it in the order the capture saw "
            f"(build or import what registers its keys in that order) before loading, or "
            f"capture again in a process that fills it as production does"
        )


def _serving_variant(managers: list[Any], f_locals: dict[str, Any]) -> int | None:
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


def _serving_variant_now(managers: list[Any], f_locals: dict[str, Any]) -> int | None:
    for i, manager in enumerate(managers):
        if manager.check(f_locals) or (
            not getattr(manager, "checks_once", False) and manager.check(f_locals)
        ):
            return i
    return None


def variant_coverage(managers: list[Any], f_locals: dict[str, Any]) -> dict[str, Any]:
    """What covers() answers: the serving variant, and why each one before it refused."""
    chosen = _serving_variant(managers, f_locals)
    failures = [
        {"variant": i, "guard": _readable_guard_failure(managers[i], f_locals)}
        for i in range(len(managers) if chosen is None else chosen)
    ]
    return {"served_by": chosen, "failures": failures}


def _readable_guard_failure(manager: Any, f_locals: dict[str, Any]) -> str:
    """The first guard of a variant that fails for these locals, in the user's words."""
    if dispatch_mode_depth():
        with disable_dispatch_modes():
            info = manager.check_verbose(f_locals)
    else:
        info = manager.check_verbose(f_locals)
    parts = list(getattr(info, "verbose_code_parts", None) or [])
    return guard_failure_text(str(parts[0]), f_locals) if parts else "a guard failed"


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


def _watchers_aside() -> Any:
    """Set torch's module trackers' global hooks aside for one served call (what undoes
    it), or None when there is nothing to set aside (no global hook: the per-call cost
    is four dict truth tests) or a hook that is not a tracker's (left for the guards
    and the dependency check to refuse, naming it). A tracker's hooks only watch
    (``value_fingerprints.watches_only``): a graph has no module calls for them to note, so
    the served call is eager's with or without them -- but Dynamo's guards compare the
    hook dicts with the capture's (empty), and an installed artifact's frames would
    meet the hooks' own Python (``weakref``) as frames no variant covers. Set aside,
    the guards see the capture's state; the tracker attributes the call to no module,
    as docs/trust.md says. Taken out of and put back into the same dicts, in order."""
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


def _layout_note(failure: str, notes: list[list[str | None]]) -> str:
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

    def forward(*args: Any, **kwargs: Any) -> Any:
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


def _entry_defaults_check(binding: dict[str, Any]) -> Any:
    """``check()``: refuse a call when the live entry's ``__defaults__`` or
    ``__kwdefaults__`` differ from the captured ones, which the rebuilt entry binds (an
    artifact rebuilds fn from the capture: rebinding them afterwards changes what eager
    computes, not what the artifact computes). Compared by value at load, then by
    identity per call (a new tuple is compared by value again)."""
    import operator

    import torch

    live = operator.attrgetter(FN_NAME)(import_user_module(FN_MODULE))

    def same(a: Any, b: Any) -> bool:
        if a is b:
            return True
        if type(a) is not type(b):
            return False
        if isinstance(a, (tuple, list)):
            return len(a) == len(b) and all(map(same, a, b))
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, torch.Tensor):  # another device must refuse, not raise
            if (a.shape, a.dtype, a.device) != (b.shape, b.dtype, b.device):
                return False
            return bool(torch.equal(a, b)) or (
                a.is_floating_point() and bool(torch.allclose(a, b, 0, 0, equal_nan=True))
            )
        if isinstance(a, float) and a != a:
            return b != b  # NaN: the same default, though it equals nothing
        try:
            return bool(a == b)
        except Exception:
            return False

    seen: list[Any] = [None, None]

    def check() -> None:
        defaults, kwdefaults = live.__defaults__, live.__kwdefaults__
        if defaults is seen[0] and kwdefaults is seen[1]:
            return
        for what, now, captured in (
            ("__defaults__", defaults, binding.get("defaults")),
            ("__kwdefaults__", kwdefaults, binding.get("kwdefaults")),
        ):
            if not same(now, captured):
                refuse(
                    f"precompile: {FN_MODULE}.{FN_NAME}.{what} is {now!r:.200} in this "
                    f"process; the capture traced it with {captured!r:.200}, which this "
                    f"artifact binds. Restore the defaults, or capture again with the new "
                    f"ones (re-emit the artifact)"
                )
        seen[0], seen[1] = defaults, kwdefaults

    check()
    return check


def _build_multigraph_forward() -> Any:
    """Rebuild every frame's dispatcher; return the entry, run under the captured
    global state (grad mode as captured, autocast off, default dtype and deterministic
    mode checked)."""
    import base64
    import pickle
    import types
    import warnings

    check_versions()
    check_function_sources()
    # A library function or registry entry replaced before load is refused by its name
    # before the guards are rebuilt: they read what the replacement changed (a
    # registry entry's defaults) and would fail in Dynamo's words.
    _build_surface_check()
    # "plain": guards and code objects carried Dynamo-free (plain_guards), so serving
    # never imports torch._dynamo; "dynamo": Dynamo's guard manager, for guards outside
    # plain_guards' whitelist (GUARD_RUNTIME says which, and why).
    dynamo_free = GUARD_RUNTIME.get("path") == "plain"
    rt = plain_serving_runtime() if dynamo_free else dynamo_serving_runtime()
    frames = pickle.loads(base64.b64decode(_FRAMES))
    binding = pickle.loads(base64.b64decode(_ENTRY_BINDING))
    compiled = {backend_id: rt.disable(fn) for backend_id, fn in _BACKEND_FNS.items()}
    seeded: list[tuple[dict[str, Any], str, Any]] = []
    warned: set[str] = set()

    def seed(scope: dict[str, Any], name: str, value: Any) -> None:
        disown_cleanup_hooks(scope, name)
        scope[name] = value
        seeded.append((scope, name, value))

    scopes: dict[str, dict[str, Any]] = {}

    def scope_of(frame: dict[str, Any]) -> dict[str, Any]:
        name = frame["python_module"]
        scope = scopes.get(name)
        if scope is None:
            scope = scopes[name] = vars(import_user_module(name))
            for backend_id, fn in compiled.items():
                seed(scope, backend_id, fn)
            for module_name, helper, kind, data in DYNAMO_GLOBALS:
                if module_name == name:
                    seed(scope, helper, rebuild_global(kind, data))
        stand_ins = getattr(rt, "stand_ins", {})
        for alias, module_name in frame["import_sources"].items():
            seed(scope, alias, stand_ins.get(module_name) or import_user_module(module_name))
        return scope

    def make_dispatcher(frame: dict[str, Any]) -> Any:
        target = rt.to_code(frame["code"])
        if frame["trivial"] and frame["resume_names"]:
            # Dynamo compiled nothing of this continuation: it ran as plain Python.
            scope = scope_of(frame)

            def plain(closure: Any) -> Any:
                return types.FunctionType(target, scope, target.co_name, None, closure)

            return plain if target.co_freevars else plain(None)
        if not frame["variants"] and not frame["eager_fallback"]:
            cause = (
                "was bypassed during capture (its guards could not be serialized)"
                if frame["bypassed"]
                else "produced no guarded code during capture"
            )
            message = (
                f"precompile: {frame_label(target.co_name)} {cause}, so this artifact has no "
                f"variant of it to serve; fix what the capture report says and capture again"
            )
            if frame["is_entry"]:
                refuse(message)

            def refusing(*_args: Any, **_kwargs: Any) -> Any:
                refuse(message)

            return refusing
        scope = scope_of(frame)
        is_entry = frame["is_entry"]
        defaults = binding.get("defaults") if is_entry else None
        kwdefaults = binding.get("kwdefaults") if is_entry else None

        def function(code: Any, closure: Any) -> Any:
            f = types.FunctionType(code, scope, target.co_name, defaults, closure)
            if kwdefaults:
                f.__kwdefaults__ = dict(kwdefaults)
            return f

        variants = []
        for number, variant in enumerate(frame["variants"]):
            if dynamo_free:
                key = variant["builtins_key"]
            else:
                guards_state = rt.load_guards_state(variant["guards_state"])
                key = guards_state.output_graph.name_of_builtins_dict_key_in_fglobals
            if key:
                builtins = rt.builtins_dict(scope)
                if scope.get(key, builtins) is not builtins:
                    refuse(
                        f"precompile: {key!r} in module {frame['python_module']!r} is bound to "
                        f"something other than the module's builtins, which this artifact's "
                        f"guards read through; unbind it and load again"
                    )
                seed(scope, key, builtins)
            check_dict_key_order(variant.get("dict_keys") or [], scope, frame)
            try:
                if dynamo_free:
                    manager = rt.guard_manager(variant["guards"], scope)
                else:
                    guards_state = rt.name_dict_keys(guards_state, variant.get("dict_keys") or [])
                    manager = rt.load_guard_manager(guards_state, target, scope)
            except Exception as error:
                # Building a guard manager reads the live objects its guards name (a
                # dict's keys by position, an attribute of a global): state a process may
                # not have yet.
                refuse(
                    f"precompile: the guards of {target.co_name} (variant {number}) could not "
                    f"be rebuilt in this process: {type(error).__name__}: {error}. They read "
                    f"state reachable from module {frame['python_module']!r} as it was at "
                    f"capture; do what fills that state first (e.g. build the model, import "
                    f"what registers its classes), then load"
                )
            variants.append((manager, rt.to_code(variant["dynamo_code"])))

        cells = tuple(types.CellType() for _ in target.co_freevars)
        import inspect

        signature = inspect.signature(function(target, cells or None))

        positional = target.co_varnames[: target.co_argcount]
        # A call that passes exactly the positional parameters (every continuation, most
        # entries) binds without inspect: 0x04/0x08 are CO_VARARGS/CO_VARKEYWORDS.
        plain_signature = not (target.co_flags & 0x0C or target.co_kwonlyargcount)

        def locals_of(closure: Any, args: Any, kwargs: Any) -> dict[str, Any]:
            if plain_signature and not kwargs and not closure and len(args) == len(positional):
                return dict(zip(positional, args))
            f_locals: dict[str, Any] = {}
            for name, cell in zip(target.co_freevars, closure or ()):
                try:
                    f_locals[name] = cell.cell_contents
                except ValueError:
                    pass
            f_locals.update(rt.bind_locals(signature, *args, **kwargs))
            for name in positional:
                if name.startswith("."):
                    f_locals[name] = f_locals.pop("implicit" + name[1:])
            return f_locals

        managers = [manager for manager, _body in variants]
        layout_notes = [list(v.get("layout_notes", ())) for v in frame["variants"]]

        def dispatch_with(bound: list[Any], closure: Any, args: Any, kwargs: Any) -> Any:
            f_locals = locals_of(closure, args, kwargs)
            chosen = _serving_variant(managers, f_locals)
            if chosen is None:
                # A tensor still carrying mark_unbacked / mark_dynamic marks (the
                # capture's example passed again) fails the rebuilt guards' marking
                # check, which says nothing about what the variant computes: check it
                # again unmarked (only on a miss, so a served call pays nothing).
                stripped = _strip_dim_marks(f_locals.values())
                if stripped:
                    try:
                        chosen = _serving_variant(managers, f_locals)
                    finally:
                        _restore_dim_marks(stripped)
            if chosen is not None:
                try:
                    return bound[chosen](*args, **kwargs)
                except RuntimeError as error:
                    _mark_ran_before_refusal(error)
                    raise
            if frame["eager_fallback"]:
                if target.co_name not in warned:
                    warned.add(target.co_name)
                    category: type[Warning]
                    try:
                        from precompile.errors import EagerFallbackWarning

                        category = EagerFallbackWarning
                    except ImportError:
                        category = UserWarning
                    warnings.warn(
                        f"precompile: {frame_label(target.co_name)} runs eagerly: Dynamo gave up on "
                        f"it during capture ({frame.get('eager_reason') or 'see the capture report'})",
                        category,
                        stacklevel=3,
                    )
                try:
                    return function(target, closure)(*args, **kwargs)
                except RuntimeError as error:
                    _mark_ran_before_refusal(error)
                    raise
            texts = [_readable_guard_failure(m, f_locals) for m in managers]
            failures = "; ".join(
                f"variant {i}: {text}{_layout_note(text, notes)}"
                for i, (text, notes) in enumerate(zip(texts, layout_notes))
            )
            refuse(
                f"precompile: no captured variant of {frame_label(target.co_name)} serves this call "
                f"({len(bound)} captured: {failures}). The artifact serves only what capture "
                f"exercised: add a call like this one to the capture, or restore the global "
                f"the failing guard reads",
                3,
            )

        def bind(closure: Any) -> list[Any]:
            return [function(body, closure) for _manager, body in variants]

        def coverage(args: Any, kwargs: Any) -> dict[str, Any]:
            f_locals = locals_of(None, args, kwargs)
            stripped = _strip_dim_marks(f_locals.values())  # as dispatch_with retries
            try:
                return variant_coverage(managers, f_locals)
            finally:
                _restore_dim_marks(stripped)

        if target.co_freevars:

            def factory(closure: Any) -> Any:
                bound = bind(closure)

                def dispatch(*args: Any, **kwargs: Any) -> Any:
                    return dispatch_with(bound, closure, args, kwargs)

                return dispatch

            return factory
        bound = bind(None)

        def dispatch(*args: Any, **kwargs: Any) -> Any:
            return dispatch_with(bound, None, args, kwargs)

        dispatch.coverage = coverage  # type: ignore[attr-defined]  # covers() reads it off the entry
        return dispatch

    # Every resume name is checked before anything is seeded, so a refusal leaves each
    # module as it was: a name is rebound only over this artifact's own dispatcher.
    for frame in frames:
        if not (frame["variants"] or frame["eager_fallback"] or frame["trivial"]):
            continue
        module = vars(import_user_module(frame["python_module"]))
        for name in frame["resume_names"]:
            existing = module.get(name)
            owner = getattr(existing, "__precompile_artifact__", None)
            if existing is not None and owner != ARTIFACT_TAG:
                refuse(
                    f"precompile: {name!r} in module {frame['python_module']!r} is held by "
                    + (
                        f"another artifact ({owner}); two artifacts of one function cannot "
                        f"serve in one process"
                        if owner
                        else "something else in this process; load the artifact in a fresh process"
                    )
                )
    entry = None
    for frame in frames:
        dispatcher = make_dispatcher(frame)
        if frame["is_entry"]:
            entry = dispatcher
        else:
            dispatcher.__precompile_artifact__ = ARTIFACT_TAG
        scope = scopes.get(frame["python_module"])
        if scope is not None:
            for name in frame["resume_names"]:
                seed(scope, name, dispatcher)
    if entry is None:
        refuse("precompile: this artifact has no entry frame; capture it again")

    def unload() -> None:
        while seeded:
            scope, name, value = seeded.pop()
            if scope.get(name) is value:
                del scope[name]

    try:
        defaults_ok = _entry_defaults_check(binding)
        dependencies_ok = build_dependency_check()
    except BaseException:
        unload()  # a refused load leaves the process as it found it
        raise

    def check(args: Any, kwargs: Any) -> None:
        defaults_ok()
        dependencies_ok(args, kwargs)

    forward = serve_as_captured(entry, check)

    def covers(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return entry.coverage(args, kwargs)

    forward.covers = covers
    forward.unload = unload
    return forward
