"""The model-state check of single-graph artifacts: a sub-builder of the driver, emitted as text.

``build_model_state_check`` returns the closure ``single_graph._build_single_graph_forward``
calls on every call with the module arguments: the model's lifted parameters and
buffers, after proving that nothing the trace read of the model and of the Python
state around it changed since the last verified call (a fast path of identities,
dict version tags, types and one C-level guard), or re-verifying it in full
(``_checked_module_state`` and ``single_graph_checks``) when something did. Emitted
whole into every single-graph artifact before ``single_graph``
(``capturing.carried.SingleGraph.DRIVER``), so like it it imports nothing at module
level and reads the artifact's names declared below.

INVARIANT: ``lift_live_module_state`` orders and names params and buffers exactly as
``precompile.capturing.fx_lifting.lift_module_state`` does at capture (params then buffers, over all
modules, interned by identity, ``m{i}.`` prefixes only with several modules). A test
holds the two in agreement.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import torch as _torch

    # Bound by the artifact prelude (precompile._compat.prelude).
    _dict_version: Callable[[dict[str, Any]], int] = len
    _torch_nn_module: Any = None

    def _global_module_hooks() -> tuple[dict[Any, Any], ...]: ...

    # The artifact's metadata.
    BUFFER_DEVICES: list[str] = []
    BUFFER_DTYPES: list[str] = []
    BUFFER_NAMES: list[str] = []
    BUFFER_SHAPES: list[tuple[int, ...]] = []
    GRAD_ACCESS: list[str] = []
    GRAD_PARAM_INDICES: list[int] = []
    GRAPH_INPUT_STRIDES: list[tuple[int, ...] | None] = []
    MODULE_POSITIONS: list[int] = []
    MODULE_READS: list[list[list[Any] | None]] = []
    MODULE_TRAINING: list[list[tuple[str, bool | None]]] = []
    PARAM_DEVICES: list[str] = []
    PARAM_DTYPES: list[str] = []
    PARAM_NAMES: list[str] = []
    PARAM_REQUIRES_GRAD: list[bool] = []
    PARAM_SHAPES: list[tuple[int, ...]] = []
    STATE_ALIASES: list[list[str]] = []

    # precompile.runtime.value_fingerprints, emitted before this module.
    def shallow_contents(value: Any) -> tuple[Any, ...]: ...

    def same_contents(old: tuple[Any, ...], new: tuple[Any, ...]) -> bool: ...

    # single_graph_checks, emitted before this module.
    def serving_context(identities: dict[str, Any]) -> dict[str, Any]: ...

    def check_entry(entry: Any, context: dict[str, Any]) -> None: ...

    def check_globals(scopes: list[Any], context: dict[str, Any]) -> None: ...

    def check_module_state(mods: list[Any], context: dict[str, Any]) -> None: ...

    def check_class_state(subs: list[Any], context: dict[str, Any]) -> None: ...

    def walk_order_readers() -> list[str]: ...

    def captured_walk(mi: int, module: Any) -> list[tuple[str, Any]]: ...

    # precompile.runtime.single_graph_inputs and single_graph, emitted with this module.
    def check_strides(
        labels: list[str],
        tensors: list[Any],
        expected: list[Any],
        blockers: list[str | None] | None = None,
    ) -> None: ...

    def check_tensor_types(labels: list[str], tensors: list[Any], invariant: int) -> None: ...

    def checks_layout() -> bool: ...

    def requires_grad_is_captured() -> bool: ...

    def metadata_guard(values: list[Any]) -> Any: ...

    # precompile.runtime.refusal, emitted before this module.
    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...


def lift_live_module_state(mods: list[Any]) -> tuple[list[Any], list[str], list[Any]]:
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


def all_state_names(mods: list[Any]) -> dict[str, Any]:
    """Every name of the runtime modules' parameters and buffers -> its tensor, a tied
    tensor under each of its names (``remove_duplicate=False``), named like
    ``lift_live_module_state``."""
    multi = len(mods) > 1
    found: dict[str, Any] = {}
    for kind in ("named_parameters", "named_buffers"):
        for mi, m in enumerate(mods):
            for n, t in getattr(m, kind)(remove_duplicate=False):
                found.setdefault(f"m{mi}.{n}" if multi else n, t)
    return found


def _captured_names(expected: list[str]) -> dict[str, str]:
    """Every name the traced model's parameters and buffers had -> the lifted name of
    its tensor (itself, or for a tied name the first name of that tensor:
    ``STATE_ALIASES``)."""
    lifted = {name: name for name in expected}
    for names in STATE_ALIASES:
        for name in names:
            lifted[name] = names[0]
    return lifted


def _tie_difference(everything: dict[str, Any], expected: list[str]) -> str | None:
    """Where the runtime model shares tensors between other names than the traced one
    did, in words; None where the same names share a tensor. The graph reads one input
    for all the names of a tied tensor: a tie broken (``fc2.weight`` made its own
    tensor) or made (two captured tensors now one, or one name now sharing another's
    tensor) computes other than eager, whatever the walk order. A name that is gone is
    left to the name check."""
    lifted = _captured_names(expected)
    for names in STATE_ALIASES:
        present = [n for n in names if n in everything]
        for name in present[1:]:
            if everything[name] is not everything[present[0]]:
                return (
                    f"{name!r} is no longer the same tensor as {present[0]!r}, as it was "
                    f"when traced (a tied weight): the graph reads one tensor for both"
                )
    owner: dict[int, str] = {}
    for name, t in everything.items():
        if name not in lifted:
            continue
        first = owner.setdefault(id(t), name)
        if lifted[first] != lifted[name]:
            return (
                f"{name!r} is now the same tensor as {first!r}, which were distinct "
                f"tensors when traced: the graph reads them as separate inputs"
            )
    return None


def _by_captured_names(
    mods: list[Any], tensors: list[Any], names: list[str], expected: list[str]
) -> tuple[list[Any], list[str]] | None:
    """The captured parameters and buffers, in the captured order, keyed by name, when
    the runtime model differs from the traced one only where the graph cannot see it:

    - the same names in another order (``del m.fc1; m.fc1 = fc`` moves ``fc1`` last in
      ``_modules``), where no order decided what the trace computed
      (``walk_order_readers``: every tensor reached by name, none by iteration). Every
      name of a tied tensor is a key (``all_state_names``), so a tied weight whose
      first name moved (``fc2.weight`` before ``fc1.weight``) is found under the name
      the capture lifted it by; the ties themselves were compared already
      (``_tie_difference``);
    - buffers added after capture that the trace could not have read: their module's
      reads were seen (``MODULE_READS``), and include neither the name nor the
      module's ``_buffers`` (what ``buffers()``, ``named_buffers()`` and
      ``state_dict()`` enumerate).

    None when that is not so (the caller refuses)."""
    if not MODULE_READS:
        return None
    by_name = all_state_names(mods)
    if not set(expected) <= by_name.keys():
        return None
    lifted = _captured_names(expected)
    if [lifted[n] for n in names if n in lifted] != expected and walk_order_readers():
        return None
    multi = len(mods) > 1
    for name in by_name:
        if name in lifted:
            continue
        mi, path = (int(name.split(".", 1)[0][1:]), name.split(".", 1)[1]) if multi else (0, name)
        owner, _, leaf = path.rpartition(".")
        paths = [n for n, _ in captured_walk(mi, mods[mi])]
        if owner not in paths or len(paths) != len(MODULE_READS[mi]):
            return None
        own = MODULE_READS[mi][paths.index(owner)]
        sub = mods[mi].get_submodule(owner)
        if own is None or "_buffers" in own or leaf in own or leaf not in sub._buffers:
            return None
    return [by_name[n] for n in expected], list(expected)


def _checked_module_state(mods: list[Any]) -> tuple[list[Any], list[str], list[Any]]:
    """Raise the precise invariant-2 message for a runtime model that differs from the
    traced one; if it matches, return its lifted state (as ``lift_live_module_state``). Slow
    on purpose: it runs only when the per-call fast check saw a new model or a change."""
    tensors, names, subs = lift_live_module_state(mods)
    expected = list(PARAM_NAMES) + list(BUFFER_NAMES)
    everything = all_state_names(mods)
    tie = _tie_difference(everything, expected)
    if tie is not None:
        refuse(
            f"precompile: the runtime model's parameters/buffers are tied differently "
            f"from the traced model's: {tie}; tie (or untie) them as when captured, or "
            f"capture again",
            2,
        )
    if names != expected:
        keyed = _by_captured_names(mods, tensors, names, expected)
        if keyed is not None:
            tensors, names = keyed
    if names != expected:
        # By every name a tensor has: a tied tensor met first under another of its
        # captured names (``fc3.weight`` before ``fc1.weight``) is neither.
        lifted = _captured_names(expected)
        missing = [n for n in expected if n not in everything]
        extra = [n for n in names if n not in lifted]
        detail = (
            f"missing {missing}, unexpected {extra}"
            if missing or extra
            else f"same names in another order: {names}; the traced code read "
            f"{', '.join(walk_order_readers())}, so the graph may follow the captured order"
        )
        refuse(
            f"precompile: the runtime model's parameters/buffers differ from the traced "
            f"model's ({detail}); pass a model with the same structure as the one "
            f"captured, or capture again",
            2,
        )
    kinds = ["parameter"] * len(PARAM_NAMES) + ["buffer"] * len(BUFFER_NAMES)
    check_tensor_types([f"{k} {n!r}" for k, n in zip(kinds, names)], tensors, 2)
    shapes = list(PARAM_SHAPES) + list(BUFFER_SHAPES)
    dtypes = list(PARAM_DTYPES) + list(BUFFER_DTYPES)
    devices = list(PARAM_DEVICES) + list(BUFFER_DEVICES)
    for name, t, shape, dtype, device in zip(names, tensors, shapes, dtypes, devices):
        if tuple(t.shape) != tuple(shape):
            refuse(
                f"precompile: the runtime parameter/buffer {name!r} has shape "
                f"{tuple(t.shape)} but the traced model's was {tuple(shape)}; the graph "
                f"is specialized to the traced shapes",
                2,
            )
        if str(t.dtype) != dtype:
            refuse(
                f"precompile: the runtime parameter/buffer {name!r} has dtype {t.dtype} "
                f"but the traced model's was {dtype}; cast the model back (e.g. "
                f".to({dtype})) or capture again",
                2,
            )
        if str(t.device) != device:
            refuse(
                f"precompile: the runtime parameter/buffer {name!r} is on device "
                f"{t.device} but the traced model's was on {device}; move the model "
                f"(.to({device!r})) or capture again",
                2,
            )
    if checks_layout():
        labels = [f"parameter {n!r}" for n in PARAM_NAMES] + [f"buffer {n!r}" for n in BUFFER_NAMES]
        check_strides(labels, tensors, GRAPH_INPUT_STRIDES)
    for name, t, wanted in zip(names, tensors, PARAM_REQUIRES_GRAD):
        if bool(t.requires_grad) != wanted and requires_grad_is_captured():
            refuse(
                f"precompile: parameter {name!r} has requires_grad={t.requires_grad} but "
                f"was captured with requires_grad={wanted}; the capture baked which "
                f"gradients the graph computes. Restore it with "
                f".requires_grad_({wanted}) or capture again",
                2,
            )
    for mi, (m, flags) in enumerate(zip(mods, MODULE_TRAINING)):
        actual = [(n, bool(sub.training), sub) for n, sub in captured_walk(mi, m)]
        for (name, flag), (aname, aflag, asub) in zip(flags, actual):
            if name != aname:
                refuse(
                    f"precompile: the runtime model's submodule {aname!r} stands where "
                    f"the traced model had {name!r}; pass a structurally identical model",
                    2,
                )
            # None: the trace never read this submodule's flag, so its mode changes
            # nothing the graph computes (a Linear's train()).
            if flag is not None and flag != aflag:
                where = f"submodule {name!r}" if name else "the model"
                mode = "train()" if flag else "eval()"
                # The trace read the flag: its value went where the trace cannot show
                # it changed nothing (a branch, or an argument of a torch kernel whose
                # C++ body decides: nn.LSTM passes it to torch's lstm), so the graph
                # holds what the captured mode computes.
                refuse(
                    f"precompile: {where} ({type(asub).__name__}) of module argument "
                    f"{MODULE_POSITIONS[mi]} is in {'training' if aflag else 'eval'} mode "
                    f"but was captured in {'training' if flag else 'eval'} mode; the trace "
                    f"read its training flag, so the graph holds what that mode computed "
                    f"(dropout, batch-norm statistics, or a torch kernel the flag is passed "
                    f"to). Call .{mode} on the model or capture again in this mode",
                    2,
                )
        if len(actual) != len(flags):
            refuse(
                f"precompile: module argument {MODULE_POSITIONS[mi]} has {len(actual)} "
                f"submodules but the traced model had {len(flags)}; pass a structurally "
                f"identical model",
                2,
            )
    return tensors, names, subs


def build_model_state_check(
    scopes: list[tuple[dict[str, Any], dict[str, Any]]], identities: dict[str, Any], entry: Any
) -> tuple[Callable[[tuple[Any, ...]], list[Any]], Callable[[list[Any]], None] | None]:
    """Return ``model_tensors(mods)`` and, where fn reads or writes ``.grad``
    (``GRAD_ACCESS``), ``check_grads(tensors)`` (else None).

    ``model_tensors`` compares the model and the Python state the trace read (the
    ``scopes`` of ``global_scopes``, the captured function's ``entry``) by identity, by
    the version tags of the dicts that hold them, by the types of the submodules, by
    the contents of the few mutable objects that have no version tag, and by one
    C-level guard over the model's tensors' metadata, against what the last verified
    call saw. Only a difference (or a new model) takes the slow path, which names the
    exact mismatch or re-verifies and refreshes the snapshot. The snapshot holds the
    most recent model, so it stays alive until a call with another model replaces it.

    ``model_tensors.recorded()`` gives the watched dicts and their recorded tags, and
    ``model_tensors.rest(mods)`` the same fast path without comparing them: the driver
    folds them into its per-call epoch with other checks' dicts (``single_graph``).
    """
    from operator import attrgetter
    from operator import is_ as _is

    module_positions = tuple(MODULE_POSITIONS)
    # ``Py_TPFLAGS_HEAPTYPE``: a class a class statement made, whose instances' class
    # can be assigned (a builtin's cannot).
    heap_type = 1 << 9
    stride_of = _torch.Tensor.stride if checks_layout() else type
    # One getter for parameters and buffers alike: a buffer's requires_grad is compared
    # against the snapshot too, which only ever makes the fast path more careful.
    # Its type too: ``p.__class__ = Sub`` changes no watched dict, and misses the guard,
    # which compares exact types; the slow path then refuses the subclass.
    tensor_meta = attrgetter("shape", "dtype", "device", "requires_grad", "__class__")
    training = attrgetter("training")
    # The last verified model and state: the module roots, the dicts that hold what the
    # trace read (each submodule's attribute, parameter, buffer, child and hook dicts,
    # the dicts of objects its attributes hold, the globals of the user modules the
    # trace read, torch's global hook dicts) with their version tags, the submodules'
    # types, mutable objects without a version tag with their contents, the lifted
    # tensors, their metadata and a C-level guard over that metadata. Any store into
    # one of those dicts -- a parameter, buffer, child, attribute, hook or global
    # replaced, added or deleted, a training flag flipped -- changes a version, and the
    # next call re-verifies from scratch.
    #
    # What each entry holds: ``roots``, the module arguments; ``dicts`` with their
    # ``versions``; ``empty_dicts``, watched dicts that were empty (an empty dict's whole
    # state is that it is empty); ``unwatched`` submodules whose training flag does not
    # live in their instance dict, with their ``flags``; ``subs`` and their
    # ``sub_types``; ``shallow`` mutable objects without a version tag and their
    # ``shallow_snapshot``; ``func_holders``/``func_attrs``/``func_snapshot``: each
    # holder's instance dict (``m.__dict__ = d`` swaps in another dict without a store
    # into the watched one) and each function's code, defaults and closure cells the
    # trace read, by identity; the lifted ``tensors``, their ``meta`` and a C-level
    # ``tensor_guard`` over it.
    #
    # One tuple, replaced whole by one assignment and read once per call: a call on
    # another thread (a server serving two models of the class at once) sees one
    # consistent snapshot or the next, never one model's checks with another's tensors.
    snap: tuple[Any, ...] | None = None

    def _held(holder: Any, attr: str) -> Any:
        # An emptied cell reads as the cell itself: never what it held.
        try:
            return getattr(holder, attr)
        except ValueError:
            return holder

    def _same_items(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
        # By identity; literals read out of C state (an array's bytes) by value.
        return (len(a) == len(b) and all(map(_is, a, b))) or same_contents(a, b)

    def _verify_model(mods: tuple[Any, ...]) -> list[Any]:
        nonlocal snap
        snap = None
        for i, m in zip(module_positions, mods):
            if not isinstance(m, _torch.nn.Module):
                refuse(
                    f"precompile: argument {i} must be the nn.Module the captured function "
                    f"took there, got {type(m).__name__}",
                    2,
                )
        tensors, _names, sub_list = _checked_module_state(list(mods))
        context = serving_context(identities)
        check_module_state(list(mods), context)
        check_globals(scopes, context)
        check_entry(entry, context)
        check_class_state(sub_list, context)
        # torch's global hook dicts as its module holds them now, and that module's
        # namespace: a dict replaced whole is a store into it.
        global_hooks = _global_module_hooks()
        watched = [
            *context["dicts"],
            *(scope for scope, _ in scopes),
            *global_hooks,
            vars(_torch_nn_module),
        ]
        watched = list({id(d): d for d in watched}.values())
        # An empty dict's whole state is that it is empty (most hook, buffer and child
        # dicts): one truth test each, cheaper than reading a version tag.
        empty_dicts = tuple(d for d in watched if not d)
        dicts = tuple(d for d in watched if d)
        versions = tuple(map(_dict_version, dicts))
        # torch's global hook dicts run their hooks in key order (move_to_end changes it
        # and not their version tags).
        ordered_hooks = [d for d in global_hooks if d]
        found = tuple({id(o): o for o in [*context["shallow"], *ordered_hooks]}.values())
        shallow = tuple(o for o in found if not hasattr(o, "__closure__"))
        shallow_snapshot = tuple(map(shallow_contents, shallow))
        holders = tuple({id(o): o for o in context["holders"]}.values())
        held: list[Any] = []
        attrs: list[str] = []
        for f in found:
            if not hasattr(f, "__closure__"):
                continue
            # Its code, always: ``f.__code__ = g.__code__`` (IPython's autoreload, a hot
            # patch) changes what a call computes without a store into any watched dict.
            # Its defaults and keyword defaults where it has them: where it had none,
            # every traced call passed every argument, so defaults added later change
            # no traced call. Its cells' contents (cells cannot be added).
            held.append(f)
            attrs.append("__code__")
            for name in ("__defaults__", "__kwdefaults__"):
                if getattr(f, name) is not None:
                    held.append(f)
                    attrs.append(name)
            for cell in f.__closure__ or ():
                held.append(cell)
                attrs.append("cell_contents")
        # One identity pass per call covers both: each holder's instance dict (``m.__dict__
        # = d`` swaps it without a store into the watched one) and the class of every
        # watched object a class statement made (``cfg.__class__ = Other`` stores into
        # no dict, and the other class's attributes, properties or ``__getitem__``
        # answer its reads; a builtin type's instances cannot change class) beside the
        # functions' code, defaults and closure cells. (The model's own modules' types
        # are compared with ``sub_types`` below.)
        own_modules = set(map(id, sub_list))
        typed = [
            o
            for o in {id(o): o for o in [*holders, *shallow, *dicts, *empty_dicts]}.values()
            if id(o) not in own_modules and type(o).__flags__ & heap_type
        ]
        held = [*holders, *typed, *held]
        attrs = [*("__dict__" for _ in holders), *("__class__" for _ in typed), *attrs]
        func_holders, func_attrs = tuple(held), tuple(attrs)
        func_snapshot = tuple(map(_held, func_holders, func_attrs))
        subs = tuple(sub_list)
        sub_types = tuple(map(type, subs))
        # A training flag that does not live in the instance dict (a property, say) is
        # invisible to the versions: compare those flags themselves.
        unwatched = [sub for sub in subs if "training" not in vars(sub)]
        flags = tuple(map(training, unwatched))
        meta = tuple(zip(map(tensor_meta, tensors), map(stride_of, tensors)))
        snap = (
            mods,
            dicts,
            versions,
            empty_dicts,
            unwatched,
            flags,
            subs,
            sub_types,
            shallow,
            shallow_snapshot,
            func_holders,
            func_attrs,
            func_snapshot,
            tensors,
            meta,
            metadata_guard(tensors),
        )
        return tensors

    def _model_rest(mods: tuple[Any, ...]) -> list[Any]:
        """The fast path without the comparison of ``dicts``' version tags, for a caller
        that has just compared those tags itself against ``recorded()`` (the driver's
        per-call epoch, folded with other checks' dicts); everything else the fast path
        compares is compared here, against one snapshot read once, and any difference
        re-verifies."""
        nonlocal snap
        held = snap
        if held is None:
            return _verify_model(mods)
        (
            roots,
            _dicts,
            _versions,
            empty_dicts,
            unwatched,
            flags,
            subs,
            sub_types,
            shallow,
            shallow_snapshot,
            func_holders,
            func_attrs,
            func_snapshot,
            tensors,
            meta,
            tensor_guard,
        ) = held
        if (
            all(map(_is, mods, roots))
            and not any(empty_dicts)
            and tuple(map(type, subs)) == sub_types
            and (not unwatched or tuple(map(training, unwatched)) == flags)
            and (
                not shallow
                or all(map(_same_items, map(shallow_contents, shallow), shallow_snapshot))
            )
        ):
            try:
                # Each holder's instance dict, each function's code, defaults and
                # closure cells, by identity; an emptied cell raises, and is never what
                # it held, so it takes the slow path like any change.
                unchanged = not func_holders or all(
                    map(_is, map(getattr, func_holders, func_attrs), func_snapshot)
                )
            except ValueError:
                unchanged = False
            if unchanged:
                if tensor_guard.check(*tensors):
                    return tensors
                if tuple(zip(map(tensor_meta, tensors), map(stride_of, tensors))) == meta:
                    # Same metadata, a guard that no longer passes (a thread state the
                    # guard was built under): a new guard in a new snapshot.
                    snap = (*held[:-1], metadata_guard(tensors))
                    return tensors
        return _verify_model(mods)

    def _model_tensors(mods: tuple[Any, ...]) -> list[Any]:
        held = snap
        if held is not None and tuple(map(_dict_version, held[1])) == held[2]:
            return _model_rest(mods)
        return _verify_model(mods)

    def _recorded() -> tuple[tuple[dict[str, Any], ...], tuple[int, ...]] | None:
        # The watched non-empty dicts and the version tags the last verification
        # recorded (None before one passed): what ``_model_rest`` relies on unchanged.
        held = snap
        return (held[1], held[2]) if held is not None else None

    # A new list of tensors is returned after each verification, the same list while
    # the snapshot stands: a caller keying on it sees when ``recorded()`` changed.
    _model_tensors.rest = _model_rest  # type: ignore[attr-defined]  # read by single_graph
    _model_tensors.recorded = _recorded  # type: ignore[attr-defined]

    grad_indices = tuple(GRAD_PARAM_INDICES)

    def check_grads(state: list[Any]) -> None:
        for idx in grad_indices:
            if state[idx].grad is not None:
                refuse(
                    f"precompile: parameter {PARAM_NAMES[idx]!r} already has a .grad, "
                    f"and fn reads or writes .grad ({GRAD_ACCESS[0]}: gradient "
                    f"clipping, an optimizer step, zero_grad); the trace saw no "
                    f"gradients there, so it would compute with the wrong ones. Clear "
                    f"them first (optimizer.zero_grad(set_to_none=True))",
                    5,
                )

    return _model_tensors, (check_grads if GRAD_ACCESS else None)
