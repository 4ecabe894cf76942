"""The runtime driver of single-graph artifacts, authored as real code, emitted as text.

An artifact does not import this module: the emitter copies it whole
(``emit.runtime_source``) into every single-graph artifact, after the metadata literals,
the import prelude and the captured graph, so an artifact runs where this package is not
installed and is frozen against later changes to it (its text is hashed into
``code_hash``). Everything defined here is runtime; the capture side calls a few of the
same functions. Writing it as a module rather than a string lets ruff and type
checkers read it.

The names the bodies read from the artifact's namespace -- the metadata constants, the
prelude's torch aliases and the graph's ``call`` -- are declared under TYPE_CHECKING.

INVARIANT: ``_lift_module_state`` orders and names params and buffers exactly as
``precompile.lifting.lift_module_state`` does at capture (params then buffers, over all
modules, interned by identity, ``m{i}.`` prefixes only with several modules). A test
holds the two in agreement.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import torch as _torch

    # Bound by the artifact prelude (precompile._compat.prelude; only _compat names private
    # torch): ARTIFACT_PRELUDE and INDUCTOR_PRELUDE.
    _pytree: Any = None
    _DisableAutocast: Any = None
    _any_autocast_enabled: Callable[[], bool] = bool
    _set_grad_enabled: Callable[[bool], None] = print
    _dict_version: Callable[[dict[str, Any]], int] = len
    _TensorGuards: Any = None
    _view_replay_enabled: Callable[[], bool] = bool
    _set_view_replay_enabled: Callable[[bool], None] = print
    _set_code_exec_strategy: Any = None
    dispatch_tls_local_exclude_set: Any = None
    _SKIP_FRAMES: Any = None

    BACKEND: str = ""
    FN_NAME: str = ""
    NUM_POSITIONAL_ARGS: int = 0
    MODULE_POSITIONS: list[int] = []
    PARAM_NAMES: list[str] = []
    PARAM_SHAPES: list[tuple[int, ...]] = []
    PARAM_DTYPES: list[str] = []
    PARAM_DEVICES: list[str] = []
    PARAM_REQUIRES_GRAD: list[bool] = []
    BUFFER_NAMES: list[str] = []
    BUFFER_SHAPES: list[tuple[int, ...]] = []
    BUFFER_DTYPES: list[str] = []
    BUFFER_DEVICES: list[str] = []
    MODULE_TRAINING: list[list[tuple[str, bool]]] = []
    GRAD_PARAM_INDICES: list[int] = []
    IN_SPEC: str = ""
    OUT_SPEC: str = ""
    USER_INPUT_SHAPES: list[tuple[int | None, ...] | None] = []
    USER_INPUT_DTYPES: list[str | None] = []
    USER_INPUT_DEVICES: list[str | None] = []
    USER_INPUT_BOUNDS: list[dict[int, tuple[int | None, int | None]] | None] = []
    USER_INPUT_SHAPE_IDS: list[dict[int, str] | None] = []
    USER_INPUT_CONSTANTS: list[object] = []

    GRAPH_INPUT_STRIDES: list[tuple[int, ...] | None] = []
    TRAINING: bool = False
    USER_INPUT_REQUIRES_GRAD: list[bool | None] = []
    MODULE_STATE: list[list[Any]] = []
    CLASS_STATE: list[tuple[str, Any]] = []
    READ_NAMES: list[str] = []
    GLOBAL_READS: list[dict[str, Any]] = []
    GLOBAL_HOOKS: Any = ()
    GRAD_ACCESS: list[str] = []
    OUTPUT_DETACH: list[int] = []
    AUTOGRAD: dict[str, Any] | None = None
    DEFAULT_DTYPE: str = ""
    FUNCTION_SOURCES: list[dict[str, Any]] = []
    AUTOCAST: list[tuple[str, str]] = []
    STATE_READS: dict[str, str] = {}
    PROCESS_STATE: list[list[Any]] = []
    ENTRY: dict[str, Any] | None = None
    _GLOBAL_MODULE_HOOKS: tuple[dict[Any, Any], ...] = ()

    def function_source(module_text: str, qualname: str, line: int = 0) -> str | None: ...

    def source_digest(text: str) -> str: ...

    def changed_functions(records: Any, module_text: Any) -> Any: ...

    def new_context(names: Any, training: bool = True) -> dict[str, Any]: ...

    def fingerprint(value: Any, context: dict[str, Any], depth: int = 0) -> Any: ...

    def literal_fingerprint(value: Any) -> tuple[str, Any]: ...

    def module_fingerprint(
        module: Any, context: dict[str, Any], depth: int = 0, children: bool = True
    ) -> tuple[Any, ...]: ...

    def global_hooks_fingerprint(hooks: tuple[dict[Any, Any], ...]) -> Any: ...

    def autocast_state() -> tuple[tuple[str, str], ...]: ...

    def autocast_keys() -> dict[str, Any] | None: ...

    def class_fingerprint(cls: Any, context: dict[str, Any]) -> tuple[Any, ...]: ...

    def reached_classes(start: Any, context: dict[str, Any]) -> list[tuple[Any, Any]]: ...

    def state_getter(module: str, path: str, call: bool) -> Any: ...

    def type_name(cls: Any) -> str: ...

    def shallow_contents(value: Any) -> tuple[Any, ...]: ...

    def describe_value(fp: Any) -> str: ...

    def first_difference(old: Any, new: Any, path: str = "") -> tuple[str, Any, Any]: ...

    _KERNEL_DATA_PTR_ENV: str = ""
    _kernel_data_ptr: int = 0
    _INDUCTOR_ALIGN_BYTES: int = 64

    def call(flat_inputs: list[Any]) -> list[Any]: ...

    def call_backward(flat_inputs: list[Any]) -> list[Any]: ...

    def _relabel_layout_error(error: AssertionError, flat: list[Any]) -> str | None: ...

    def bind_autograd(
        name: str, spec: dict[str, Any], forward_call: Any, backward_call: Any
    ) -> Callable[..., list[Any]]: ...


class PrecompileError(RuntimeError):
    """Raised by an artifact running where the precompile package is not importable.

    Same name and fields as ``precompile.PrecompileError``, so handlers written against
    the name keep working; where the package is importable that class is raised instead.
    """

    def __init__(
        self,
        message: str,
        *,
        invariant: int | None = None,
        location: Any = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.invariant = invariant
        self.location = location
        self.hint = hint
        suffix = "" if invariant is None else f" (invariant {invariant})"
        super().__init__(message + suffix)


def _fail(message: str, invariant: int | None = None) -> NoReturn:
    # Imported at the moment of failure only, so a normal call never touches the
    # package and an artifact runs where it is not installed.
    error_type: Callable[..., Exception]
    try:
        from precompile.errors import PrecompileError as packaged_error

        error_type = packaged_error
    except ImportError:
        error_type = PrecompileError
    raise error_type(message, invariant=invariant) from None


def _lift_module_state(mods: list[Any]) -> tuple[list[Any], list[str], list[Any]]:
    """Params then buffers of the runtime modules, interned by identity, named like the
    capture named them; also every submodule in walk order (for the training flags)."""
    multi = len(mods) > 1
    seen: set[int] = set()
    tensors: list[Any] = []
    names: list[str] = []
    for kind in ("named_parameters", "named_buffers"):
        for mi, m in enumerate(mods):
            for n, t in getattr(m, kind)(remove_duplicate=False):
                if id(t) not in seen:
                    seen.add(id(t))
                    tensors.append(t)
                    names.append(f"m{mi}.{n}" if multi else n)
    subs = [sub for m in mods for sub in m.modules()]
    return tensors, names, subs


def _checked_module_state(mods: list[Any]) -> tuple[list[Any], list[str], list[Any]]:
    """Raise the precise invariant-2 message for a runtime model that differs from the
    traced one; if it matches, return its lifted state (as ``_lift_module_state``). Slow
    on purpose: it runs only when the per-call fast check saw a new model or a change."""
    tensors, names, subs = _lift_module_state(mods)
    expected = list(PARAM_NAMES) + list(BUFFER_NAMES)
    if names != expected:
        missing = [n for n in expected if n not in names]
        extra = [n for n in names if n not in expected]
        detail = (
            f"missing {missing}, unexpected {extra}"
            if missing or extra
            else f"same names in another order: {names}"
        )
        _fail(
            f"precompile: the runtime model's parameters/buffers differ from the traced "
            f"model's ({detail}); pass a model with the same structure as the one "
            f"captured, or capture again",
            2,
        )
    shapes = list(PARAM_SHAPES) + list(BUFFER_SHAPES)
    dtypes = list(PARAM_DTYPES) + list(BUFFER_DTYPES)
    devices = list(PARAM_DEVICES) + list(BUFFER_DEVICES)
    for name, t, shape, dtype, device in zip(names, tensors, shapes, dtypes, devices):
        if tuple(t.shape) != tuple(shape):
            _fail(
                f"precompile: the runtime parameter/buffer {name!r} has shape "
                f"{tuple(t.shape)} but the traced model's was {tuple(shape)}; the graph "
                f"is specialized to the traced shapes",
                2,
            )
        if str(t.dtype) != dtype:
            _fail(
                f"precompile: the runtime parameter/buffer {name!r} has dtype {t.dtype} "
                f"but the traced model's was {dtype}; cast the model back (e.g. "
                f".to({dtype})) or capture again",
                2,
            )
        if str(t.device) != device:
            _fail(
                f"precompile: the runtime parameter/buffer {name!r} is on device "
                f"{t.device} but the traced model's was on {device}; move the model "
                f"(.to({device!r})) or capture again",
                2,
            )
    if _checks_layout():
        labels = [f"parameter {n!r}" for n in PARAM_NAMES] + [f"buffer {n!r}" for n in BUFFER_NAMES]
        _check_strides(labels, tensors, GRAPH_INPUT_STRIDES)
    for name, t, wanted in zip(names, tensors, PARAM_REQUIRES_GRAD):
        if bool(t.requires_grad) != wanted:
            _fail(
                f"precompile: parameter {name!r} has requires_grad={t.requires_grad} but "
                f"was captured with requires_grad={wanted}; the capture baked which "
                f"gradients the graph computes. Restore it with "
                f".requires_grad_({wanted}) or capture again",
                2,
            )
    for mi, (m, flags) in enumerate(zip(mods, MODULE_TRAINING)):
        actual = [(n, bool(sub.training)) for n, sub in m.named_modules()]
        for (name, flag), (aname, aflag) in zip(flags, actual):
            if name != aname:
                _fail(
                    f"precompile: the runtime model's submodule {aname!r} stands where "
                    f"the traced model had {name!r}; pass a structurally identical model",
                    2,
                )
            if flag != aflag:
                where = f"submodule {name!r}" if name else "the model"
                mode = "train()" if flag else "eval()"
                _fail(
                    f"precompile: {where} of module argument {MODULE_POSITIONS[mi]} is in "
                    f"{'training' if aflag else 'eval'} mode but was captured in "
                    f"{'training' if flag else 'eval'} mode; the capture baked that mode "
                    f"(dropout, batch-norm statistics). Call .{mode} on the model or "
                    f"capture again in this mode",
                    2,
                )
        if len(actual) != len(flags):
            _fail(
                f"precompile: module argument {MODULE_POSITIONS[mi]} has {len(actual)} "
                f"submodules but the traced model had {len(flags)}; pass a structurally "
                f"identical model",
                2,
            )
    return tensors, names, subs


def _checks_layout() -> bool:
    """Whether the graph depends on its inputs' strides: Inductor bakes them, and a
    trace whose user code read a layout (``x.is_contiguous()``) took the branch of the
    capture's layout."""
    return BACKEND == "inductor" or "layout" in STATE_READS


def _check_strides(labels: list[str], tensors: list[Any], expected: list[Any]) -> None:
    """Raise naming the first tensor whose strides differ from the capture's."""
    if BACKEND == "inductor":
        why = (
            "the Inductor backend bakes each tensor's memory layout (invariants 3 and 6). "
            "Pass it in the captured layout (.contiguous(), or the memory format it had "
            "at capture), or use backend='eager'"
        )
    else:
        why = (
            f"fn reads memory layout ({STATE_READS.get('layout')}), so the trace took the "
            f"branch of the captured layout (invariants 3 and 6). Pass it in the captured "
            f"layout (.contiguous(), or the memory format it had at capture), or make fn "
            f"independent of layout"
        )
    for label, t, strides in zip(labels, tensors, expected):
        if strides is not None and tuple(t.stride()) != tuple(strides):
            _fail(
                f"precompile: {label} has strides {tuple(t.stride())} ({_memory_format(t)} "
                f"memory format) but was captured with strides {tuple(strides)}; {why}",
                6,
            )


def _key_order_difference(spec: Any, expected: Any) -> str | None:
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
        found = _key_order_difference(child, expected_child)
        if found:
            return found
    return None


def _describe_input_mismatch(
    leaves: list[Any], spec_matches: bool, spec: Any = None, expected_spec: Any = None
) -> None:
    """Raise the precise invariant-3/6 message for user inputs that differ from the
    traced example; return quietly if they match."""
    order = None if spec is None else _key_order_difference(spec, expected_spec)
    if not spec_matches and order:
        _fail(
            f"precompile: {order}; the capture flattened it in key order, so its values "
            f"would meet the graph in the wrong places. Pass its keys in the captured "
            f"order, or capture again",
            3,
        )
    if not spec_matches:
        _fail(
            "precompile: the call's inputs are nested differently from the traced "
            "example (lists, tuples, dicts and their lengths are part of the capture); "
            "pass them in the captured structure",
            3,
        )
    if len(leaves) != len(USER_INPUT_SHAPES):
        _fail(
            f"precompile: the call's inputs flatten to {len(leaves)} values but the "
            f"traced example had {len(USER_INPUT_SHAPES)}",
            3,
        )
    for i, leaf in enumerate(leaves):
        shape = USER_INPUT_SHAPES[i]
        if shape is None:
            expected = USER_INPUT_CONSTANTS[i]
            if literal_fingerprint(leaf) != expected:
                baked = describe_value(expected)
                _fail(
                    f"precompile: input value {i} is {leaf!r} but the capture baked "
                    f"{baked}; Python values are specialized at capture. Pass {baked}, or "
                    f"capture again for this value",
                    3,
                )
            continue
        if not isinstance(leaf, _torch.Tensor):
            _fail(
                f"precompile: input {i} is a {type(leaf).__name__} but a tensor was "
                f"traced there",
                3,
            )
        actual = tuple(leaf.shape)
        bounds = USER_INPUT_BOUNDS[i] or {}
        if len(actual) != len(shape) or any(
            e is not None and a != e for a, e in zip(actual, shape)
        ):
            shown = tuple("*" if e is None else e for e in shape)
            _fail(
                f"precompile: input {i} has shape {actual} but the artifact was traced "
                f"with shape {shown} ('*' = dynamic); static dims are specialized. "
                f"Capture with this shape, or mark the dim dynamic with "
                f"torch._dynamo.decorators.mark_unbacked before capture",
                3,
            )
        for dim, (lo, hi) in bounds.items():
            size = actual[dim]
            if (lo is not None and size < lo) or (hi is not None and size > hi):
                _fail(
                    f"precompile: input {i} dim {dim} has size {size}, outside the range "
                    f"[{lo}, {hi}] declared with mark_unbacked at capture",
                    3,
                )
        if str(leaf.dtype) != USER_INPUT_DTYPES[i]:
            _fail(
                f"precompile: input {i} has dtype {leaf.dtype} but the artifact was "
                f"traced with {USER_INPUT_DTYPES[i]}; cast the input (.to("
                f"{USER_INPUT_DTYPES[i]})) or capture again",
                6,
            )
        if str(leaf.device) != USER_INPUT_DEVICES[i]:
            _fail(
                f"precompile: input {i} is on device {leaf.device} but the artifact was "
                f"traced on {USER_INPUT_DEVICES[i]}; move the input "
                f"(.to({USER_INPUT_DEVICES[i]!r})) or capture again",
                6,
            )
    tensor_leaves = [leaf for leaf, shape in zip(leaves, USER_INPUT_SHAPES) if shape is not None]
    if _checks_layout():
        n_state = len(PARAM_NAMES) + len(BUFFER_NAMES)
        labels = [f"input {i}" for i, s in enumerate(USER_INPUT_SHAPES) if s is not None]
        _check_strides(labels, tensor_leaves, GRAPH_INPUT_STRIDES[n_state:])
    for i, leaf in enumerate(leaves):
        if USER_INPUT_SHAPES[i] is None or not leaf.requires_grad:
            continue
        if TRAINING and not USER_INPUT_REQUIRES_GRAD[i]:
            _fail(
                f"precompile: input {i} requires grad but was captured without; the "
                f"captured backward computes no gradient for it, where eager would. Pass "
                f"x.detach(), or capture again with an input that requires grad",
                5,
            )
        if AUTOGRAD is not None and not USER_INPUT_REQUIRES_GRAD[i] and _torch.is_grad_enabled():
            _fail(
                f"precompile: input {i} requires grad but was captured without; the "
                f"captured backward graph computes no gradient for it, where eager would. "
                f"Pass x.detach() or call under torch.no_grad(), or capture again with "
                f"this input requiring grad",
                5,
            )
        if not TRAINING and AUTOGRAD is None and _torch.is_grad_enabled():
            _fail(
                f"precompile: input {i} requires grad, but this artifact was captured for "
                f"inference with inputs that did not (or under torch.no_grad()): it runs "
                f"without autograd, so its outputs would carry no gradient and a backward "
                f"through them would silently leave this input out. Call it under "
                f"torch.no_grad() or pass x.detach(), or capture again with an input that "
                f"requires grad (the artifact then carries the backward)",
                5,
            )
    if not TRAINING and "requires_grad" in STATE_READS:
        for i, leaf in enumerate(leaves):
            wanted = USER_INPUT_REQUIRES_GRAD[i]
            if wanted is not None and bool(leaf.requires_grad) != wanted:
                _fail(
                    f"precompile: input {i} has requires_grad={leaf.requires_grad} but was "
                    f"captured with requires_grad={wanted}, and fn reads requires_grad "
                    f"({STATE_READS['requires_grad']}): the trace took the branch of the "
                    f"captured value. Pass it with requires_grad={wanted} (x.detach() or "
                    f"x.requires_grad_()), or capture again",
                    5,
                )
    if TRAINING:
        for i, leaf in enumerate(leaves):
            if USER_INPUT_REQUIRES_GRAD[i] and not leaf.requires_grad:
                _fail(
                    f"precompile: input {i} does not require grad but was captured "
                    f"requiring it; the captured graph computes with its gradient. Pass "
                    f"it with requires_grad=True, or capture again",
                    5,
                )
    sizes: dict[str, tuple[int, int, int]] = {}
    for i, ids in enumerate(USER_INPUT_SHAPE_IDS):
        for dim, shape_id in (ids or {}).items():
            size = leaves[i].shape[dim]
            if shape_id in sizes and sizes[shape_id][0] != size:
                j, jdim = sizes[shape_id][1:]
                _fail(
                    f"precompile: input {i} dim {dim} has size {size} but input {j} dim "
                    f"{jdim} has size {sizes[shape_id][0]}; both were marked with "
                    f"shape_id {shape_id!r}, so they must be equal",
                    3,
                )
            sizes.setdefault(shape_id, (size, i, dim))


def _autocast_mismatch(live: tuple[tuple[str, str], ...]) -> NoReturn:
    """Raise for a call whose ambient ``torch.autocast`` differs from the capture's."""

    def shown(state: Any) -> str:
        if not state:
            return "without torch.autocast"
        return "under torch.autocast(" + ", ".join(f"{d}: {t}" for d, t in state) + ")"

    captured = tuple(map(tuple, AUTOCAST))
    _fail(
        f"precompile: this call runs {shown(live)} but the artifact was captured "
        f"{shown(captured)}; the graph holds the casts autocast made at capture, so eager "
        f"would compute in other dtypes here. Call it {shown(captured)}, or capture again "
        f"under the autocast state you serve with",
        6,
    )


def _recorded_path(path: str | None) -> str | None:
    """A source path the capture recorded relative to the artifact, resolved against
    where this artifact is now (None when the artifact was executed without a file)."""
    import os

    here = globals().get("__file__")
    if not path:
        return None
    if os.path.isabs(path):
        return path
    if not here:
        return None
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(here)), path))


def _live_module(name: str, path: str | None) -> Any:
    """The module a record names, as this process runs it (imported if it is not yet);
    None for a ``__main__`` that is another script than the one captured from."""
    import importlib
    import os
    import sys

    if name == "__main__":
        main = sys.modules.get("__main__")
        file = getattr(main, "__file__", None)
        recorded = _recorded_path(path)
        if file and recorded and os.path.realpath(file) == os.path.realpath(recorded):
            return main
        return None
    module = sys.modules.get(name)
    if module is not None:
        return module
    try:
        return importlib.import_module(name)
    except Exception as error:
        _fail(
            f"precompile: this artifact was traced through module {name!r}, which is not "
            f"importable here ({type(error).__name__}: {error}), so its code and globals "
            f"cannot be checked. Make it importable, or capture again in this environment",
            3,
        )


def _check_function_sources_once() -> None:
    """Refuse to load when a function the trace ran through changed since capture: the
    graph holds what the old code computed."""
    for record, gone in changed_functions(FUNCTION_SOURCES, _module_text):
        _fail(
            f"precompile: {record['function']} ({record['path']}:{record['line']}, module "
            f"{record['module']}) {'is gone or renamed' if gone else 'changed'} since this "
            f"artifact was captured; the graph was traced through the old code. Capture it "
            f"again (re-emit the artifact)",
            3,
        )


def _module_text(name: str, path: str) -> str | None:
    """A module's live source; for a script that ran as ``__main__`` at capture and is
    not this process's ``__main__``, that script's file."""
    import inspect

    try:
        module = _live_module(name, path)
        if module is not None:
            return inspect.getsource(module)
        recorded = _recorded_path(path)
        if recorded:
            with open(recorded, encoding="utf-8") as f:
                return f.read()
    except (OSError, TypeError, UnicodeDecodeError):
        pass
    return None


def _global_scopes() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each module whose globals the trace read, as (its live globals, the record)."""
    scopes = []
    for record in GLOBAL_READS:
        module = _live_module(record["module"], record["path"])
        if module is None:
            names = ", ".join(name for name, _ in record["values"])
            _fail(
                f"precompile: the traced code read globals ({names}) of the script "
                f"{record['path']}, which ran as __main__ at capture; this process runs "
                f"another __main__, so they cannot be checked. Move that code into an "
                f"importable module, or serve from the same script",
                3,
            )
        scopes.append((vars(module), record))
    return scopes


def _known_identities() -> dict[str, Any]:
    """What serving contexts know of the objects the capture told apart by identity
    only (sentinels): each recorded module-level name resolved here, as ``known``
    (id -> (name, object)), whether this ``__main__`` is the capture's (``main``), and
    the recorded names' modules, where another such object's name is looked for (for
    the message; it matches no recorded one). A name that resolves to nothing here is
    absent, and a live object then matches no recorded one."""
    found: set[tuple[str, str]] = set()

    def walk(fp: Any) -> None:
        if isinstance(fp, (tuple, list)):
            if len(fp) == 3 and fp[0] == "sentinel" and isinstance(fp[2], (tuple, list)):
                found.update((str(m), str(n)) for m, n in fp[2])
                return
            for part in fp:
                walk(part)
        elif isinstance(fp, dict):
            for part in fp.values():
                walk(part)

    walk([MODULE_STATE, CLASS_STATE, GLOBAL_READS, ENTRY, GLOBAL_HOOKS])
    main_paths = [r["path"] for r in GLOBAL_READS if r["module"] == "__main__"]
    if ENTRY is not None and ENTRY["module"] == "__main__":
        main_paths.append(ENTRY["file"])
    main = any(_live_module("__main__", path) is not None for path in main_paths)
    known: dict[int, Any] = {}
    for module_name, name in sorted(found):
        if module_name == "__main__" and not main:
            continue
        module = _live_module(module_name, main_paths[0] if main_paths else None)
        namespace = getattr(module, "__dict__", None) or {}
        if name in namespace:
            known[id(namespace[name])] = ((module_name, name), namespace[name])
    near = tuple(sorted({module_name for module_name, _ in found} - {"__main__"}))
    return {"known": known, "main": main, "near": near, "everywhere": False}


def _context(identities: dict[str, Any]) -> dict[str, Any]:
    """A fingerprinting context as serving uses it: the capture's read names, with
    the recorded names of identity-only objects resolved here."""
    context = new_context(frozenset(READ_NAMES), TRAINING)
    context.update(identities)
    return context


def _live_entry(identities: dict[str, Any]) -> Any:
    """The captured function as this process defines it, found by its module and
    qualname (a closure a factory made, by the module-level name bound to it), to check
    the defaults and closure values the graph baked. None when it holds none."""
    import types

    if ENTRY is None:
        return None
    name, qualname = ENTRY["module"], ENTRY["qualname"]
    module = _live_module(name, ENTRY["file"])
    found: list[Any] = []
    if module is not None:
        holder: Any = module
        for part in qualname.split("."):
            holder = getattr(holder, part, None)
        found = [holder] if holder is not None else []
        if not found:
            for value in vars(module).values():
                if isinstance(value, (types.MethodType, staticmethod, classmethod)):
                    value = value.__func__
                if (
                    isinstance(value, types.FunctionType)
                    and value.__qualname__ == qualname
                    and value not in found
                ):
                    found.append(value)
    context = _context(identities)
    matching = [f for f in found if fingerprint(f, context) == ENTRY["fingerprint"]]
    if len(found) == 1 or (found and len(matching) == len(found)):
        return getattr(found[0], "__func__", found[0])
    shown = describe_value(ENTRY["fingerprint"])
    if module is None:
        _fail(
            f"precompile: the captured {shown} holds values the graph baked (its defaults "
            f"or closure variables) and was defined in the script {ENTRY['file']}, which "
            f"ran as __main__ at capture; this process runs another __main__, so they "
            f"cannot be checked. Move the function into an importable module, or pass "
            f"those values to it as arguments",
            3,
        )
    if not found:
        _fail(
            f"precompile: the captured {shown} holds values the graph baked (its "
            f"defaults or closure variables), and module {name} binds no module-level "
            f"name to a function {qualname} to check them against. Bind it to a "
            f"module-level name, or pass those values to it as arguments",
            3,
        )
    _fail(
        f"precompile: module {name} binds {len(found)} functions {qualname} with other "
        f"defaults or closure values than each other, so which one is served cannot be "
        f"told; the graph baked those of one of them. Capture a function that takes "
        f"those values as arguments",
        3,
    )


def _check_entry(entry: Any, context: dict[str, Any]) -> None:
    """Raise when the captured function's defaults or closure values differ from what
    the graph baked (fingerprinting it also watches it per call)."""
    if entry is None or ENTRY is None:
        return
    live = fingerprint(entry, context)
    if live != ENTRY["fingerprint"]:
        path, then, now = first_difference(ENTRY["fingerprint"], live, ENTRY["qualname"])
        _fail(
            f"precompile: the captured function {path} is {describe_value(now)} but "
            f"the trace read {describe_value(then)}; the graph baked it. Restore it, "
            f"pass the value as an argument, or capture again (re-emit the artifact)",
            3,
        )


def _check_globals(scopes: list[Any], context: dict[str, Any]) -> None:
    """Raise for a module-level value the traced code read that is not what it was."""
    for scope, record in scopes:
        for name, recorded in record["values"]:
            live = fingerprint(scope[name], context) if name in scope else ("absent",)
            if live != recorded:
                path, then, now = first_difference(recorded, live, name)
                shown = "no longer defined" if name not in scope else f"{describe_value(now)}"
                _fail(
                    f"precompile: global {path} of module {record['module']} "
                    f"({record['path']}) is {shown}, but the traced code read "
                    f"{describe_value(then)} and the graph baked it. Restore it, or "
                    f"capture again (re-emit the artifact)",
                    3,
                )
    if global_hooks_fingerprint(_GLOBAL_MODULE_HOOKS) != GLOBAL_HOOKS:
        _fail(
            "precompile: torch's global module hooks (register_module_forward_hook and "
            "friends) differ from those registered at capture; the trace baked the hooks "
            "present then. Register the same hooks, or capture again with these "
            "(re-emit the artifact)",
            2,
        )


def _check_module_state(mods: list[Any], context: dict[str, Any]) -> None:
    """Raise the precise message for a submodule whose type, read attributes or hooks
    differ from what the trace saw (names, order and count were checked already)."""
    hook_kinds = ("forward pre-hooks", "forward hooks", "backward pre-hooks", "backward hooks")
    for mi, (m, records) in enumerate(zip(mods, MODULE_STATE)):
        for (name, sub), record in zip(m.named_modules(), records):
            live = module_fingerprint(sub, context, children=False)
            if live == record:
                continue
            where = f"submodule {name!r}" if name else "the model"
            where += f" of module argument {MODULE_POSITIONS[mi]}"
            if live[0] != record[0]:
                _fail(
                    f"precompile: {where} is a {live[0]} but was captured as a {record[0]}; "
                    f"the trace baked the captured type's code. Pass a model of the "
                    f"captured structure, or capture again (re-emit the artifact)",
                    2,
                )
            old, new = dict(record[1]), dict(live[1])
            for attr in sorted(old.keys() | new.keys()):
                if old.get(attr) == new.get(attr):
                    continue
                if attr not in old:
                    state = f"has an attribute {attr!r} ({describe_value(new[attr])})"
                    state += " that it did not have at capture"
                elif attr not in new:
                    state = f"no longer has the attribute {attr!r}"
                else:
                    path, then, now = first_difference(old[attr], new[attr], attr)
                    state = f"has {path} = {describe_value(now)}"
                    state += f" but the trace read {describe_value(then)}"
                _fail(
                    f"precompile: {where} {state}; the traced code reads it, and the graph "
                    f"baked what it read. Restore it, or capture again (re-emit the "
                    f"artifact)",
                    2,
                )
            for kind, now, then in zip(hook_kinds, live[2], record[2]):
                if now == then:
                    continue
                if len(now) == len(then):
                    i = next(i for i, (a, b) in enumerate(zip(now, then)) if a != b)
                    state = (
                        f"has {kind} {i} = {describe_value(now[i][0])}, which differs from "
                        f"the one captured ({describe_value(then[i][0])}) in its code, "
                        f"defaults, closure values or registration flags"
                    )
                else:
                    state = (
                        f"has {len(now)} {kind} "
                        f"({', '.join(describe_value(h[0]) for h in now) or 'none'}) but "
                        f"was captured with {len(then)} "
                        f"({', '.join(describe_value(h[0]) for h in then) or 'none'})"
                    )
                _fail(
                    f"precompile: {where} {state}; the trace baked the hooks present at "
                    f"capture. Register the same hooks, or capture again with these "
                    f"(re-emit the artifact)",
                    2,
                )


def _check_class_state(subs: list[Any], context: dict[str, Any]) -> None:
    """Raise for a class whose methods, class attributes or special methods that the
    traced code reads differ from what the trace saw (a method monkeypatched,
    ``Net.scale = 2.0``, ``Net.__call__`` replaced, a property swapped): each submodule
    class, and each user class the other checks reached (a global ``Settings``, the
    class of a config object), so this runs after them."""
    recorded = dict(CLASS_STATE)
    for cls, live in reached_classes(dict.fromkeys(map(type, subs)), context):
        then = recorded.get(type_name(cls))
        if then is None or live == then:
            continue  # a type not captured was refused already
        old, new = dict(then), dict(live)
        for name in sorted(old.keys() | new.keys()):
            if old.get(name) != new.get(name):
                path, was, now = first_difference(
                    old.get(name, ("absent",)), new.get(name, ("absent",)), name
                )
                if name not in new:
                    state = f"is gone but the trace read {describe_value(was)}"
                elif name not in old:
                    state = (
                        f"is {describe_value(now)}, which no class along its MRO "
                        f"defined when the trace ran"
                    )
                else:
                    state = f"is {describe_value(now)} but the trace read {describe_value(was)}"
                _fail(
                    f"precompile: {type_name(cls)}.{path} {state} (a class attribute or "
                    f"method the traced code reads, or a special method Python calls on "
                    f"it); the graph baked it. Restore it, or capture again (re-emit the "
                    f"artifact)",
                    2,
                )


def _check_process_state(values: list[Any]) -> None:
    """Raise for a torch setting fn read (``PROCESS_STATE``) whose value now differs
    from the trace's: the graph holds the branch of the captured value."""
    context = new_context(frozenset())
    for (_, _, _, site, then), value in zip(PROCESS_STATE, values):
        now = fingerprint(value, context)
        if now != then:
            what, _, where = site.partition(" at ")
            _fail(
                f"precompile: fn reads {what} ({where}), which was {describe_value(then)} "
                f"when the trace ran but is {describe_value(now)} now; the graph baked the "
                f"branch of the captured value. Restore the setting around the call, read "
                f"it outside fn and pass it as an argument (checked per call), or capture "
                f"again under this setting",
                3,
            )


def _load_spec(text: str) -> Any:
    """A pytree spec from its JSON, importing the modules that register its container
    types (a model's output class, say) when this process has not imported them yet."""
    import importlib
    import json

    try:
        return _pytree.treespec_loads(text)
    except Exception as error:
        first = error
    names: list[str] = []
    stack = [json.loads(text)[1]]
    while stack:
        node = stack.pop()
        if node.get("type"):
            names.append(node["type"])
        stack.extend(node.get("children_spec") or [])
    for name in names:
        parts = name.split(".")
        for end in range(len(parts) - 1, 0, -1):
            try:
                importlib.import_module(".".join(parts[:end]))
                break
            except ImportError:
                continue
    try:
        return _pytree.treespec_loads(text)
    except Exception:
        _fail(
            f"precompile: the artifact's inputs or outputs use container types "
            f"({', '.join(names)}) that are not registered with torch.utils._pytree in "
            f"this process ({type(first).__name__}: {first}). Import the module that "
            f"registers them before loading",
            3,
        )


def _picker(positions: tuple[int, ...]) -> Any:
    """A C-level ``seq -> tuple of seq[i] for i in positions``: itemgetter returns a bare
    item for one position, so that case is wrapped."""
    from operator import itemgetter

    if len(positions) == 1:
        only = itemgetter(positions[0])
        return lambda seq: (only(seq),)
    if not positions:
        return lambda seq: ()
    return itemgetter(*positions)


def _build_single_graph_forward() -> Any:
    """Compute once what every call needs, and return the lean per-call ``forward``.

    Loading checks the code the trace ran through (``_check_function_sources_once``)
    and finds the live modules whose globals it read. Each call is then checked in full,
    but through a fast path: the inputs' (shape, dtype, device, requires_grad, and for
    Inductor strides) are compared as one tuple against the captured ones, and the model
    and the Python state the trace read by identity, by the version tags of the dicts
    that hold them, by the types of the submodules, by the contents of the few mutable
    objects that have no version tag, and by one C-level guard over the model's tensors'
    metadata, against what the last verified call saw. Only a difference (or a new
    model) takes the slow path, which names the exact mismatch or re-verifies and
    refreshes the snapshot. The snapshot holds the most recent model, so it stays alive
    until a call with another model replaces it.
    """
    from operator import attrgetter
    from operator import is_ as _is
    from typing import cast

    _check_function_sources_once()
    scopes = _global_scopes()
    identities = _known_identities()
    entry = _live_entry(identities)
    n_args = NUM_POSITIONAL_ARGS
    module_positions = tuple(MODULE_POSITIONS)
    user_positions = tuple(i for i in range(n_args) if i not in set(module_positions))
    in_spec = _load_spec(IN_SPEC)
    out_spec = _load_spec(OUT_SPEC)
    flat_inputs = in_spec == _pytree.tree_structure(tuple(0 for _ in user_positions))
    single_output = out_spec == _pytree.tree_structure(0)
    tensor_slots = tuple(i for i, s in enumerate(USER_INPUT_SHAPES) if s is not None)
    pick_modules = _picker(module_positions)
    pick_user = _picker(user_positions)
    pick_tensors = _picker(tensor_slots)
    # Each Python value as its literal fingerprint (floats by repr: the sign of a zero,
    # NaN), compared with the capture's in one tuple.
    constant_slots = tuple(i for i, s in enumerate(USER_INPUT_SHAPES) if s is None)
    pick_constants = _picker(constant_slots)
    expected_constants = tuple(USER_INPUT_CONSTANTS[i] for i in constant_slots)
    has_dynamic = any(s is not None and None in s for s in USER_INPUT_SHAPES) or any(
        USER_INPUT_SHAPE_IDS
    )
    input_meta = attrgetter("shape", "dtype", "device", "requires_grad")
    reads_requires_grad = "requires_grad" in STATE_READS
    # An inference artifact expecting an input that requires grad serves it only with
    # grad mode off.
    inference_grad_inputs = (
        not TRAINING
        and AUTOGRAD is None
        and any(USER_INPUT_REQUIRES_GRAD[i] for i in tensor_slots if reads_requires_grad)
    )
    # fn branched on torch.is_grad_enabled(): the trace saw grad mode on for a training
    # capture and for an inference capture of inputs that require grad (AUTOGRAD).
    grad_mode_read = STATE_READS.get("grad_mode")
    traced_grad_mode = TRAINING or AUTOGRAD is not None
    is_grad_enabled = _torch.is_grad_enabled
    # fn branched on torch.is_inference_mode_enabled(): the trace ran outside it (a
    # capture under inference mode that reads it is refused).
    inference_mode_read = STATE_READS.get("inference_mode")
    is_inference_mode_enabled = _torch.is_inference_mode_enabled
    # fn read torch settings (deterministic algorithms, a torch.backends flag): each is
    # read again per call and compared with the last values that verified.
    state_getters = tuple(state_getter(m, p, c) for m, p, c, _, _ in PROCESS_STATE)
    state_seen: list[Any] = [None]
    # Only without dynamic dims: then each tensor slot's shape (tensor_slots holds the
    # slots with one) is all ints, and the emitter writes a dtype and a device exactly
    # where it writes a shape.
    expected_inputs = tuple(
        (
            _torch.Size(cast("tuple[int, ...]", USER_INPUT_SHAPES[i])),
            getattr(_torch, cast(str, USER_INPUT_DTYPES[i]).split(".")[-1]),
            _torch.device(cast(str, USER_INPUT_DEVICES[i])),
            # Inference: an input that requires grad takes the slow path, which refuses
            # it under grad mode (eager's outputs would carry its gradient) -- unless fn
            # reads requires_grad: then the captured value is expected, and grad mode is
            # checked on its own below. An AUTOGRAD capture expects the captured value
            # (another one takes the slow path, which serves or refuses it).
            bool(
                (TRAINING or reads_requires_grad or AUTOGRAD is not None)
                and USER_INPUT_REQUIRES_GRAD[i]
            ),
        )
        for i in tensor_slots
        if not has_dynamic
    )
    # Inductor bakes every graph input's strides (and may return a view of an input
    # built from them), whether or not its own asserts stayed on at capture: compare
    # them per call. The eager graph runs ATen ops, which take any layout.
    stride_of = _torch.Tensor.stride if _checks_layout() else type
    n_state = len(PARAM_NAMES) + len(BUFFER_NAMES)
    expected_input_strides = tuple(GRAPH_INPUT_STRIDES[n_state:]) if _checks_layout() else ()
    check_input_strides = bool(expected_input_strides) and None not in expected_input_strides
    # One getter for parameters and buffers alike: a buffer's requires_grad is compared
    # against the snapshot too, which only ever makes the fast path more careful.
    tensor_meta = attrgetter("shape", "dtype", "device", "requires_grad")
    training = attrgetter("training")
    grad_indices = tuple(GRAD_PARAM_INDICES)
    n_grads = len(grad_indices)
    output_detach = tuple(OUTPUT_DETACH)
    # An inference capture of inputs that require grad: under grad mode the call goes
    # through the captured forward and backward graphs (an autograd.Function), as eager
    # would record it; under no_grad through the forward graph alone, whose results past
    # the outputs (what the backward would need) are dropped.
    autograd_run = (
        bind_autograd(
            FN_NAME,
            AUTOGRAD,
            lambda *flat: call(list(flat)),
            lambda *flat: call_backward(list(flat)),
        )
        if AUTOGRAD is not None
        else None
    )
    n_outputs = AUTOGRAD["outputs"] if AUTOGRAD is not None else None
    # A tensor fn built from Python numbers took the default dtype at capture; the
    # graph carries that dtype where eager would take today's.
    default_dtype = getattr(_torch, DEFAULT_DTYPE.split(".")[-1])
    get_default_dtype = _torch.get_default_dtype
    # The graph holds the casts of the capture's autocast state: a call under another
    # one (autocast entered or left since) would get other dtypes from eager.
    captured_autocast = tuple(map(tuple, AUTOCAST))
    # Captured under autocast: each call compares the autocast keys of torch's
    # thread-local excluded set (every device's on/off in one C call) and the captured
    # devices' dtypes; only a difference reads the full state, for the exact answer.
    keys = autocast_keys() if captured_autocast else None
    autocast_mask: Any = None
    autocast_expected: Any = None
    if keys and all(device in keys for device, _ in captured_autocast):
        all_keys = list(keys.values())
        autocast_mask = all_keys[0]
        for key in all_keys[1:]:
            autocast_mask = autocast_mask | key
        # Excluded: every device's key but those of the devices captured under it.
        autocast_expected = autocast_mask
        for device, _ in captured_autocast:
            autocast_expected = autocast_expected - keys[device]
    autocast_excluded = dispatch_tls_local_exclude_set
    get_autocast_dtype = _torch.get_autocast_dtype
    autocast_devices = tuple(device for device, _ in captured_autocast)
    autocast_dtypes = tuple(getattr(_torch, dtype.split(".")[-1]) for _, dtype in captured_autocast)
    # The last verified model and state: the module roots, the dicts that hold what the
    # trace read (each submodule's attribute, parameter, buffer, child and hook dicts,
    # the dicts of objects its attributes hold, the globals of the user modules the
    # trace read, torch's global hook dicts) with their version tags, the submodules'
    # types, mutable objects without a version tag with their contents, the lifted
    # tensors, their metadata and a C-level guard over that metadata. Any store into
    # one of those dicts -- a parameter, buffer, child, attribute, hook or global
    # replaced, added or deleted, a training flag flipped -- changes a version, and the
    # next call re-verifies from scratch.
    roots: tuple[Any, ...] | None = None
    dicts: tuple[dict[str, Any], ...] = ()
    versions: tuple[int, ...] = ()
    empty_dicts: tuple[dict[str, Any], ...] = ()
    unwatched: list[Any] = []
    flags: tuple[bool, ...] = ()
    subs: tuple[Any, ...] = ()
    sub_types: tuple[type, ...] = ()
    shallow: tuple[Any, ...] = ()
    shallow_snapshot: tuple[Any, ...] = ()
    # Functions the trace read (helpers, methods, the captured function): the objects
    # that hold what a call of each reads besides its arguments (the function's code,
    # defaults and keyword defaults, each closure cell's contents), with the attribute
    # names to read them by and what they held, compared by identity.
    func_holders: tuple[Any, ...] = ()
    func_attrs: tuple[str, ...] = ()
    func_snapshot: tuple[Any, ...] = ()
    tensors: list[Any] = []
    meta: tuple[Any, ...] = ()
    tensor_guard: Any = None

    def _guard(values: list[Any]) -> Any:
        # Checks shape, strides, dtype, device and requires_grad in one C call. It
        # also compares dispatch keys under the ambient state (inference mode, autocast)
        # and strides, which the eager contract does not fix: a miss falls back to
        # comparing the metadata (with strides for Inductor) in Python, and rebuilds the
        # guard when that comparison passes.
        return _TensorGuards(*values, dynamic_dims_sizes=None, dynamic_dims_strides=None)

    def _held(holder: Any, attr: str) -> Any:
        # An emptied cell reads as the cell itself: never what it held.
        try:
            return getattr(holder, attr)
        except ValueError:
            return holder

    def _functions_unchanged() -> bool:
        # One C-level pass over every holder; an emptied cell raises, and is never what
        # it held, so it takes the slow path like any change.
        try:
            return all(map(_is, map(getattr, func_holders, func_attrs), func_snapshot))
        except ValueError:
            return False

    def _same_items(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
        return len(a) == len(b) and all(map(_is, a, b))

    def _verify_model(mods: tuple[Any, ...]) -> list[Any]:
        nonlocal roots, dicts, versions, empty_dicts, unwatched, flags, subs, sub_types, shallow
        nonlocal shallow_snapshot, tensors, meta, tensor_guard, func_holders, func_attrs
        nonlocal func_snapshot
        roots = None
        for i, m in zip(module_positions, mods):
            if not isinstance(m, _torch.nn.Module):
                _fail(
                    f"precompile: argument {i} must be the nn.Module the captured function "
                    f"took there, got {type(m).__name__}",
                    2,
                )
        tensors, _names, sub_list = _checked_module_state(list(mods))
        context = _context(identities)
        _check_module_state(list(mods), context)
        _check_globals(scopes, context)
        _check_entry(entry, context)
        _check_class_state(sub_list, context)
        watched = [*context["dicts"], *(scope for scope, _ in scopes), *_GLOBAL_MODULE_HOOKS]
        watched = list({id(d): d for d in watched}.values())
        # An empty dict's whole state is that it is empty (most hook, buffer and child
        # dicts): one truth test each, cheaper than reading a version tag.
        empty_dicts = tuple(d for d in watched if not d)
        dicts = tuple(d for d in watched if d)
        versions = tuple(map(_dict_version, dicts))
        found = tuple({id(o): o for o in context["shallow"]}.values())
        shallow = tuple(o for o in found if not hasattr(o, "__closure__"))
        shallow_snapshot = tuple(map(shallow_contents, shallow))
        holders: list[Any] = []
        attrs: list[str] = []
        for f in found:
            # A function without defaults or cells was called with every argument: a
            # default added later changes no traced call, and cells cannot be added.
            if hasattr(f, "__closure__") and (f.__defaults__ or f.__kwdefaults__ or f.__closure__):
                holders += [f, f, f]
                attrs += ["__code__", "__defaults__", "__kwdefaults__"]
                for cell in f.__closure__ or ():
                    holders.append(cell)
                    attrs.append("cell_contents")
        func_holders, func_attrs = tuple(holders), tuple(attrs)
        func_snapshot = tuple(map(_held, func_holders, func_attrs))
        subs = tuple(sub_list)
        sub_types = tuple(map(type, subs))
        # A training flag that does not live in the instance dict (a property, say) is
        # invisible to the versions: compare those flags themselves.
        unwatched = [sub for sub in subs if "training" not in vars(sub)]
        flags = tuple(map(training, unwatched))
        meta = tuple(zip(map(tensor_meta, tensors), map(stride_of, tensors)))
        tensor_guard = _guard(tensors)
        roots = mods
        return tensors

    def _model_tensors(mods: tuple[Any, ...]) -> list[Any]:
        nonlocal tensor_guard
        if (
            roots is not None
            and all(map(_is, mods, roots))
            and not any(empty_dicts)
            and tuple(map(_dict_version, dicts)) == versions
            and tuple(map(type, subs)) == sub_types
            and tuple(map(training, unwatched)) == flags
            and (
                not shallow
                or all(map(_same_items, map(shallow_contents, shallow), shallow_snapshot))
            )
            and (not func_holders or _functions_unchanged())
        ):
            if tensor_guard.check(*tensors):
                return tensors
            if tuple(zip(map(tensor_meta, tensors), map(stride_of, tensors))) == meta:
                tensor_guard = _guard(tensors)
                return tensors
        return _verify_model(mods)

    def checked_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], Any]:
        """Every check of a call; the graph's flat inputs and the user's tensors."""
        if kwargs or len(args) != n_args:
            if kwargs:
                _fail(
                    f"precompile: {FN_NAME} was captured with positional arguments only "
                    f"and got keyword arguments {sorted(kwargs)}; pass them positionally",
                    2,
                )
            _fail(
                f"precompile: {FN_NAME} takes {n_args} positional arguments (as captured) "
                f"but got {len(args)}",
                2,
            )
        mods = pick_modules(args)
        user = pick_user(args)
        if flat_inputs:
            leaves = user
        else:
            leaves, spec = _pytree.tree_flatten(user)
            if spec != in_spec:
                _describe_input_mismatch(leaves, False, spec, in_spec)
        try:
            tensors_in = pick_tensors(leaves)
            ok = (
                not has_dynamic
                and tuple(map(input_meta, tensors_in)) == expected_inputs
                and (
                    not check_input_strides
                    or tuple(map(stride_of, tensors_in)) == expected_input_strides
                )
                and (
                    not constant_slots
                    or tuple(map(literal_fingerprint, pick_constants(leaves))) == expected_constants
                )
                and not (inference_grad_inputs and is_grad_enabled())
            )
        except (AttributeError, IndexError, RuntimeError):
            ok = False
        if not ok:
            _describe_input_mismatch(list(leaves), True)
            tensors_in = pick_tensors(leaves)
        state = _model_tensors(mods)
        if state_getters:
            values = [get() for get in state_getters]
            if values != state_seen[0]:
                _check_process_state(values)
                state_seen[0] = values
        if grad_mode_read is not None and is_grad_enabled() != traced_grad_mode:
            mode = "on" if traced_grad_mode else "off"
            kind = "a training" if TRAINING else "an inference"
            if AUTOGRAD is not None:
                kind = "an inference capture of inputs that require grad; such"
            _fail(
                f"precompile: fn reads the grad mode ({grad_mode_read}), which was {mode} "
                f"in the trace ({kind} capture traces with grad "
                f"{'enabled' if traced_grad_mode else 'disabled'}), but this "
                f"call runs with grad mode {'off' if traced_grad_mode else 'on'}: eager "
                f"would take the other branch. Call it under "
                f"{'torch.enable_grad()' if traced_grad_mode else 'torch.no_grad()'}, or "
                f"pass the choice to fn as an argument instead of reading the grad mode",
                5,
            )
        if inference_mode_read is not None and is_inference_mode_enabled():
            _fail(
                f"precompile: fn reads the inference mode ({inference_mode_read}), which "
                f"was off in the trace, but this call runs under torch.inference_mode(): "
                f"eager would take the other branch. Call it outside "
                f"torch.inference_mode(), or pass the choice to fn as an argument instead "
                f"of reading torch.is_inference_mode_enabled()",
                5,
            )
        if (
            (_any_autocast_enabled() or captured_autocast)
            and not (
                autocast_mask is not None
                and autocast_excluded() & autocast_mask == autocast_expected
                and tuple(map(get_autocast_dtype, autocast_devices)) == autocast_dtypes
            )
            and autocast_state() != captured_autocast
        ):
            _autocast_mismatch(autocast_state())
        if get_default_dtype() is not default_dtype:
            _fail(
                f"precompile: the default dtype is {get_default_dtype()} but this artifact "
                f"was captured under {default_dtype}, which tensors fn builds from Python "
                f"numbers took. Restore it (torch.set_default_dtype) around the call, or "
                f"capture again",
                6,
            )
        if GRAD_ACCESS:
            for idx in grad_indices:
                if state[idx].grad is not None:
                    _fail(
                        f"precompile: parameter {PARAM_NAMES[idx]!r} already has a .grad, "
                        f"and fn reads or writes .grad ({GRAD_ACCESS[0]}: gradient "
                        f"clipping, an optimizer step, zero_grad); the trace saw no "
                        f"gradients there, so it would compute with the wrong ones. Clear "
                        f"them first (optimizer.zero_grad(set_to_none=True))",
                        5,
                    )
        return [*state, *tensors_in], tensors_in

    def covers(*args: Any, **kwargs: Any) -> dict[str, Any]:
        """Whether this artifact serves the call, decided by the very checks a call runs
        (no graph runs): served by its one graph, or the refusal."""
        try:
            checked_inputs(args, kwargs)
        except Exception as error:
            if type(error).__name__ != "PrecompileError":
                raise
            return {"served_by": None, "failures": [{"variant": 0, "guard": str(error)}]}
        return {"served_by": 0, "failures": []}

    def _apply_flat(flat: list[Any]) -> Any:
        return autograd_run(*flat)  # type: ignore[misc]  # set whenever this runs

    def forward(*args: Any, **kwargs: Any) -> Any:
        flat, tensors_in = checked_inputs(args, kwargs)
        grad_was_enabled = _torch.is_grad_enabled()
        through_autograd = grad_was_enabled and autograd_run is not None
        run = _apply_flat if through_autograd else call
        if grad_was_enabled and not through_autograd:
            _set_grad_enabled(False)
        try:
            if _any_autocast_enabled():
                # The capture's casts are already in the graph; ambient autocast
                # must not cast a second time.
                with _DisableAutocast():
                    out = run(flat)
            else:
                out = run(flat)
            if n_outputs is not None and not through_autograd:
                out = out[:n_outputs]
            if output_detach and not through_autograd:
                # The graph computes a new tensor there (x.detach(), say) that Inductor
                # returns as the input object itself: hand back a new one, as eager does.
                out = list(out)
                for i in output_detach:
                    out[i] = out[i].detach()
        except AssertionError as error:
            # call() consumed its list: rebuild the inputs for the message.
            message = _relabel_layout_error(error, [*tensors, *tensors_in])
            if message is None:
                raise
            _fail(message, 6)
            raise
        finally:
            if grad_was_enabled and not through_autograd:
                _set_grad_enabled(True)
        if n_grads:
            # Accumulate like eager .backward(): frozen parameters keep .grad None.
            for idx, g in zip(grad_indices, out[len(out) - n_grads :]):
                p = tensors[idx]
                if p.grad is None:
                    p.grad = g
                else:
                    p.grad.add_(g)
            out = out[: len(out) - n_grads]
        if single_output:
            return out[0]
        return _pytree.tree_unflatten(list(out), out_spec)

    forward.covers = covers  # type: ignore[attr-defined]  # loaders call forward.covers()
    return forward


def relabel_layout_error_eager(error: AssertionError, flat: list[Any]) -> str | None:
    """The eager backend has no layout asserts of its own: every AssertionError is the
    user's and passes through unchanged."""
    return None


def _memory_format(t: Any) -> str:
    if t.is_contiguous():
        return "contiguous"
    for name in ("channels_last", "channels_last_3d"):
        fmt = getattr(_torch, name)
        if t.dim() == (4 if name == "channels_last" else 5) and t.is_contiguous(memory_format=fmt):
            return name
    return "non-contiguous"
