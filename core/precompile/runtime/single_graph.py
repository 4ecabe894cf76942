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

``_build_single_graph_forward`` composes the checks of a call from sub-builders, each
computing once at load what its check needs and returning the closure the forward
calls: ``single_graph_ambient.build_ambient_checks`` (modes, process state, grad and
inference mode, autocast, default dtype), ``single_graph_inputs.build_input_check``
(the arguments) and ``single_graph_model_state.build_model_state_check`` (the model and
the Python state the trace read), all three emitted before this module.
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
    _deterministic_enabled: Callable[[], bool] = bool
    dispatch_mode_depth: Callable[[], int] = int
    function_mode_depth: Callable[[], int] = int

    MODES_SEE_OPS: bool = False
    BACKEND: str = ""
    FN_NAME: str = ""
    PARAM_NAMES: list[str] = []
    GRAD_PARAM_INDICES: list[int] = []
    OUT_SPEC: str = ""
    USER_INPUT_SHAPES: list[tuple[int | None, ...] | None] = []

    TRAINING: bool = False
    OUTPUT_DETACH: list[int] = []
    INPUT_MUTATIONS: dict[str, Any] | None = None
    AUTOGRAD: dict[str, Any] | None = None

    def _opaque_to_dynamo(fn: Callable[..., Any]) -> Callable[..., Any]: ...

    # precompile.runtime.surface_checks, emitted before this module.
    def _build_surface_check() -> Any: ...

    # The graph's entry: FX code names its parameter flat_inputs, Inductor's args.
    def call(flat_inputs: list[Any], /) -> list[Any]: ...

    # precompile.runtime.lowered_inputs, emitted where the graph writes an input (Inductor).
    def check_written_inputs(inputs: Any, mutated: Any, labels: Any) -> None: ...

    def call_backward(flat_inputs: list[Any]) -> list[Any]: ...

    # single_graph_checks, emitted before this module.
    def check_function_sources_once() -> None: ...

    def global_scopes() -> list[tuple[dict[str, Any], dict[str, Any]]]: ...

    def known_identities() -> dict[str, Any]: ...

    def serving_context(identities: dict[str, Any]) -> dict[str, Any]: ...

    def live_entry(identities: dict[str, Any]) -> Any: ...

    def check_globals(scopes: list[Any], context: dict[str, Any]) -> None: ...

    def _relabel_layout_error(error: AssertionError, flat: list[Any]) -> str | None: ...

    def bind_autograd(
        name: str, spec: dict[str, Any], forward_call: Any, backward_call: Any
    ) -> Callable[..., list[Any]]: ...

    # precompile.runtime.single_graph_ambient, emitted before this module.
    def warn_inference_grad(what: str, more_fixes: str = "") -> None: ...

    def nan_detection_on() -> bool: ...

    def refuse_nan_detection() -> NoReturn: ...

    def refuse_forward_ad_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None: ...

    def load_spec(text: str) -> Any: ...

    def build_ambient_checks() -> (
        tuple[Callable[[], None], Callable[[], None], tuple[Any, ...] | None]
    ): ...

    def ambient_now() -> tuple[Any, ...]: ...

    # The sub-builders of the call's checks, emitted before this module.
    def build_input_check() -> (
        Callable[
            [tuple[Any, ...], dict[str, Any], bool],
            tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]],
        ]
    ): ...

    def build_model_state_check(
        scopes: list[tuple[dict[str, Any], dict[str, Any]]], identities: dict[str, Any], entry: Any
    ) -> tuple[Callable[[tuple[Any, ...]], list[Any]], Callable[[list[Any]], None] | None]: ...

    # precompile.runtime.refusal, emitted before this module.
    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...


def _build_single_graph_forward() -> Any:
    """Compute once what every call needs, and return the lean per-call ``forward``.

    Loading checks the code the trace ran through (``check_function_sources_once``)
    and finds the live modules whose globals it read. Each call is then checked in
    full, but through fast paths, by the checks the sub-builders return, always in this
    order: the ambient modes (``build_ambient_checks``), the library surface and the
    builtins, the arguments (``single_graph_inputs.build_input_check``: one tuple of the
    inputs' metadata against the captured one), the model and the Python state the
    trace read (``single_graph_model_state.build_model_state_check``: identities,
    version tags and one C-level guard against the last verified call), then the rest
    of the ambient state (process state, grad and inference mode, autocast, default
    dtype) and the parameters' ``.grad``. Only a difference takes a slow path, which
    names the exact mismatch or re-verifies and refreshes the snapshot.
    """
    # First: a library function replaced before load (at import) is named as such, not
    # as whatever later check its replacement happens to trip.
    surface_ok = _build_surface_check()
    check_function_sources_once()
    scopes = global_scopes()
    # The builtins the traced code (the project's and the library code it ran) resolved,
    # checked before anything else whenever the builtins dict changed.
    builtins_scopes = [
        (scope, record) for scope, record in scopes if record["module"] == "builtins"
    ]
    builtins_seen: list[Any] = [None]
    identities = known_identities()
    entry = live_entry(identities)
    # A call whose ambient state (one tuple of C calls) is the ordinary one skips the
    # mode and state checks, which would pass; any other runs both.
    check_modes, check_ambient, ordinary_state = build_ambient_checks()
    # A training capture's backward is in its graph: anomaly detection sees none of it.
    backward_in_graph = TRAINING
    checked_call = build_input_check()
    model_tensors, check_grads = build_model_state_check(scopes, identities, entry)
    out_spec = load_spec(OUT_SPEC)
    single_output = out_spec == _pytree.tree_structure(0)
    tensor_slots = tuple(i for i, s in enumerate(USER_INPUT_SHAPES) if s is not None)
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
    # Inductor's functional graph writes these inputs assuming no other input shares
    # their memory: a call where one does (x and x[:]) is refused, not served wrong.
    mutated_inputs = tuple(INPUT_MUTATIONS["mutated"]) if INPUT_MUTATIONS else ()
    mutation_labels = INPUT_MUTATIONS["labels"] if INPUT_MUTATIONS else ()

    # The per-call epoch: the dicts the surface check, the builtins check and the
    # model-state fast path watch, in one tuple, with the version tags each of those
    # checks recorded when it last passed (not read anew: a dict changed between a
    # check and the end of the call must still fail the next comparison), and the
    # model's tensors list of that verification. While every tag matches, a call runs
    # those checks' other comparisons only (one C-level map over the dicts instead of
    # three, shared dicts read once); any difference runs the checks as they are.
    # One tuple (dicts, tags, tensors list), replaced whole: a call on another thread
    # reads one consistent epoch or none.
    epoch: list[Any] = [None]
    # The model-state fast path without its own dict comparison (the full check where
    # a builder offers none; then no epoch forms).
    model_rest: Callable[[tuple[Any, ...]], list[Any]] = getattr(
        model_tensors, "rest", model_tensors
    )
    model_recorded = getattr(model_tensors, "recorded", None)
    surface_snapshot = getattr(surface_ok, "snapshot", None) if surface_ok is not None else None

    def _new_epoch(state: list[Any]) -> None:
        """Fold the checks' recorded dicts and tags (and the surface's keyed objects with
        their keys) into the epoch, or leave it unset where one check has none to offer
        (never verified, or disagreeing)."""
        epoch[0] = None
        if model_recorded is None or model_rest is model_tensors:
            return
        if surface_ok is not None and surface_snapshot is None:
            return
        pairs: list[tuple[Any, Any]] = []
        # The surface's objects compared by a key (torch.library's set of kernels, by
        # its size), with the keys it last verified; none: an empty tuple of each.
        keyed: tuple[Any, tuple[Any, ...], tuple[Any, ...]] = (len, (), ())
        if surface_snapshot is not None:
            dicts, versions, key, items, keys = surface_snapshot()
            if versions is None:
                return  # never verified
            if key is not None and items:
                keyed = (key, tuple(items), tuple(keys))
            pairs += zip(dicts, versions)
        if builtins_scopes:
            if builtins_seen[0] is None:
                return
            pairs.append((builtins_scopes[0][0], builtins_seen[0]))
        recorded = model_recorded()
        if recorded is None:
            return
        pairs += zip(*recorded)
        seen: dict[int, tuple[Any, Any]] = {}
        for d, v in pairs:
            if id(d) in seen and seen[id(d)][1] != v:
                # Two checks verified this dict at different tags: the next call
                # compares each on its own.
                return
            seen[id(d)] = (d, v)
        epoch[0] = (
            tuple(d for d, _ in seen.values()),
            tuple(v for _, v in seen.values()),
            state,
            *keyed,
        )

    def _check_written(flat: list[Any], state: list[Any], tensors_in: Any, callers: Any) -> None:
        """Refuse a call where an input the graph writes shares memory with another:
        compared on the caller's tensors, never on a copy the input check made of one
        (``checked_call``), which shares nothing and would hide the tie."""
        mine = flat if callers is tensors_in else [*state, *callers]
        check_written_inputs(mine, mutated_inputs, mutation_labels)

    def checked_inputs(
        args: tuple[Any, ...], kwargs: dict[str, Any], running: bool = True
    ) -> tuple[list[Any], list[Any], tuple[Any, ...]]:
        """Every check of a call; the graph's flat inputs, the model's tensors and the
        user's tensors (an input in another layout copied for Inductor only when
        ``running`` the graph)."""
        ordinary = ambient_now() == ordinary_state
        if not ordinary:
            check_modes()
        held = epoch[0]
        if (
            held is not None
            and tuple(map(_dict_version, held[0])) == held[1]
            and tuple(map(held[3], held[4])) == held[5]
        ):
            # No dict the surface, builtins and model-state checks watch changed since
            # each verified it (nor a keyed object's key): those checks' own
            # comparisons of them would pass.
            mods, tensors_in, callers = checked_call(args, kwargs, running)
            state = model_rest(mods)
            if state is not held[2]:
                _new_epoch(state)
        else:
            epoch[0] = None
            if surface_ok is not None:
                surface_ok()
            if builtins_scopes and _dict_version(builtins_scopes[0][0]) != builtins_seen[0]:
                # First: the checks below call builtins themselves (``len(args)``), and
                # a patched one would make them refuse for the wrong reason.
                check_globals(builtins_scopes, serving_context(identities))
                builtins_seen[0] = _dict_version(builtins_scopes[0][0])
            mods, tensors_in, callers = checked_call(args, kwargs, running)
            state = model_tensors(mods)
            _new_epoch(state)
        if not ordinary:
            check_ambient()
        if check_grads is not None:
            check_grads(state)
        flat = [*state, *tensors_in]
        if mutated_inputs:
            _check_written(flat, state, tensors_in, callers)
        return flat, state, tensors_in

    def covers(*args: Any, **kwargs: Any) -> dict[str, Any]:
        """Whether this artifact serves the call, decided by the very checks a call runs
        (no graph runs): served by its one graph, or the refusal."""
        try:
            checked_inputs(args, kwargs, running=False)
        except Exception as error:
            if type(error).__name__ != "PrecompileError":
                raise
            return {"served_by": None, "failures": [{"variant": 0, "guard": str(error)}]}
        return {"served_by": 0, "failures": []}

    def _apply_flat(flat: list[Any]) -> Any:
        return autograd_run(*flat)  # type: ignore[misc]  # set whenever this runs

    # An inference artifact runs without autograd: under grad mode, with a parameter or
    # an input that requires grad, eager's outputs would carry a gradient and these
    # carry none. Said once per artifact, at the first such call; until then a grad-on
    # call looks at the inputs, and at the parameters once per verified model state
    # (a requires_grad_ since takes the slow path, which lifts them anew).
    grad_loss_unwarned = [not TRAINING and autograd_run is None]
    grad_looked_at: list[Any] = [None]

    def _check_mode_sees_backward(tensors: list[Any]) -> None:
        """A training graph holds the backward as eager's autograd engine dispatched it
        onto parameters whose ``.grad`` was None (each gradient detached into place).
        A dispatch mode around a call onto parameters that already hold a gradient
        would see other operations than in eager (eager adds each into ``.grad`` in
        place as its node runs; the artifact adds them after the graph): refused."""
        held = [PARAM_NAMES[i] for i in grad_indices if tensors[i].grad is not None]
        if held:
            refuse(
                f"precompile: this call runs under a TorchDispatchMode onto parameters that "
                f"already hold a gradient ({held[0]!r}"
                + (f" and {len(held) - 1} more" if len(held) > 1 else "")
                + "): eager's backward adds each gradient into .grad in place as it runs, "
                "where the captured graph (traced with .grad None) detaches it, so the mode "
                "would not see the operations it sees in eager. Set the gradients to None "
                "first (optimizer.zero_grad(), the default set_to_none=True), or call the "
                "artifact outside the mode",
                6,
            )

    def _requiring_grad(tensors_in: Any, tensors: list[Any]) -> str:
        for i, t in enumerate(tensors_in):
            if t.requires_grad:
                return f"input {tensor_slots[i]}"
        if tensors is grad_looked_at[0]:
            return ""
        grad_looked_at[0] = tensors
        names = [n for n, t in zip(PARAM_NAMES, tensors) if t.requires_grad]
        return (
            f"parameter {names[0]!r}" + (f" (and {len(names) - 1} more)" if len(names) > 1 else "")
            if names
            else ""
        )

    # The C calls of a call's fast path, bound once (closure cells, not global and
    # attribute lookups per call).
    function_depth = function_mode_depth
    dispatch_depth = dispatch_mode_depth
    default_dtype = _torch.get_default_dtype
    deterministic = _deterministic_enabled
    autocast_enabled = _any_autocast_enabled
    is_grad_enabled = _torch.is_grad_enabled
    # Inductor's kernels carry no forward-AD tangent: while a dual level is open, the
    # call's tensors are looked at (refuse_forward_ad_inputs).
    forward_ad = _torch.autograd.forward_ad if BACKEND == "inductor" else None

    def forward_packed(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call with its arguments as one tuple and one dict (what the serving wrapper
        holds: no second packing), its checks, its graph and its outputs in one frame.
        Where the ambient state is the ordinary one and the epoch holds, the checks
        ``checked_inputs`` would run on that path run here in the same order (the
        arguments, the model state past the epoch, the gradients, the written inputs);
        any other call runs ``checked_inputs`` itself."""
        held = epoch[0]
        if (
            held is not None
            # ``ambient_now()`` read inline (one frame fewer).
            and (
                function_depth(),
                dispatch_depth(),
                default_dtype(),
                deterministic(),
                autocast_enabled(),
            )
            == ordinary_state
            and tuple(map(_dict_version, held[0])) == held[1]
            and tuple(map(held[3], held[4])) == held[5]
        ):
            mods, tensors_in, callers = checked_call(args, kwargs, True)
            state = model_rest(mods)
            if state is not held[2]:
                _new_epoch(state)
            if check_grads is not None:
                check_grads(state)
            flat = [*state, *tensors_in]
            if mutated_inputs:
                _check_written(flat, state, tensors_in, callers)
        else:
            flat, state, tensors_in = checked_inputs(args, kwargs)
        if n_grads and MODES_SEE_OPS and dispatch_mode_depth():
            _check_mode_sees_backward(state)
        if forward_ad is not None and forward_ad._current_level >= 0:
            refuse_forward_ad_inputs(args, kwargs)
        grad_was_enabled = is_grad_enabled()
        through_autograd = grad_was_enabled and autograd_run is not None
        if (backward_in_graph or through_autograd) and nan_detection_on():
            refuse_nan_detection()
        run = _apply_flat if through_autograd else call
        if grad_was_enabled and not through_autograd:
            if grad_loss_unwarned[0]:
                what = _requiring_grad(tensors_in, state)
                if what:
                    grad_loss_unwarned[0] = False
                    warn_inference_grad(
                        what,
                        "; or capture with an example input that requires grad (the "
                        "artifact then carries the backward)",
                    )
                    # A warning runs user code (a warnings hook) after the checks, and
                    # the graph code trusts what they proved (an Inductor graph does
                    # not repeat their size asserts): this once, check the call again.
                    flat, state, tensors_in = checked_inputs(args, kwargs)
            _set_grad_enabled(False)
        try:
            # Read again here, not taken from the ambient tuple: the checks between
            # may run user code (a pytree flatten, a property, a warning hook).
            if autocast_enabled():
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
        except RuntimeError as error:
            if BACKEND != "eager" or "view size is not compatible" not in str(error):
                raise
            # A view the eager graph keeps because its aliasing is observable (an
            # output views an input, or a write goes through it: graph_layouts) cannot
            # view this call's layout.
            refuse(
                f"precompile: this call passes an input in a memory layout that a view in "
                f"the captured graph cannot take ({error}); the view is kept because an "
                f"output or an in-place write goes through it, so the graph cannot copy "
                f"there instead. Pass the input in the captured layout (.contiguous(), or "
                f"the memory format it had at capture), or return a .clone() of the view",
                6,
            )
        except AssertionError as error:
            # call() consumed its list: rebuild the inputs for the message.
            message = _relabel_layout_error(error, [*state, *tensors_in])
            if message is None:
                raise
            refuse(message, 6)
            raise
        finally:
            if grad_was_enabled and not through_autograd:
                _set_grad_enabled(True)
        if n_grads:
            # Accumulate like eager .backward(): frozen parameters keep .grad None.
            for idx, g in zip(grad_indices, out[len(out) - n_grads :]):
                p = state[idx]
                if p.grad is None:
                    p.grad = g
                else:
                    p.grad.add_(g)
            out = out[: len(out) - n_grads]
        if single_output:
            return out[0]
        return _pytree.tree_unflatten(list(out), out_spec)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return forward_packed(args, kwargs)

    forward.covers = covers  # type: ignore[attr-defined]  # loaders call forward.covers()
    # The serving wrapper calls this one (precompile.serving.Serving.serve_packed).
    forward.packed = _opaque_to_dynamo(forward_packed)  # type: ignore[attr-defined]
    return _opaque_to_dynamo(forward)


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
