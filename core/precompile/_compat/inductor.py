"""Inductor as the captures use it: lowering a graph to its output module, Dynamo
subgraphs' AOTAutograd runtime decisions as literal specs, and the kernel cache an
artifact carries."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch

from precompile._compat.inductor_integers import refuse_wrapping_integer_ops
from precompile._compat.patching import patched
from precompile._compat.tracing import has_symbols


def functional_retrace(gm: torch.fx.GraphModule, fakes: list[Any]) -> torch.fx.GraphModule:
    """Re-trace a captured ATen graph the way Inductor wants it: functional (input
    mutations become trailing ``copy_`` into the inputs; views stay views, so an output
    that aliases an input still does) and decomposed with Inductor's table."""
    from torch.fx.experimental.proxy_tensor import make_fx

    fake_mode = _fake_mode_of(fakes)
    with fake_mode, torch.no_grad():
        functional = make_fx(
            torch.func.functionalize(gm, remove="mutations"),
            decomposition_table=inductor_decompositions(),
        )(*fakes)
    _reroot_views_of_mutated_inputs(functional)
    return functional


def _reroot_views_of_mutated_inputs(gm: torch.fx.GraphModule) -> None:
    """Functionalization turns ``x.add_(1); return x[0]`` into ``new = x + 1;
    copy_(x, new); return new[0]``: the output views a fresh tensor, where eager returns
    a view of the input (writes through it reach the input). Re-root each such output's
    chain of view ops on the input itself, after its ``copy_``."""
    graph = gm.graph
    copied = {
        n.args[1]: n.args[0]
        for n in graph.nodes
        if n.op == "call_function"
        and n.target is torch.ops.aten.copy_.default
        and n.args[0].op == "placeholder"
    }
    if not copied:
        return
    output = graph.output_node()

    def reroot(node: torch.fx.Node) -> torch.fx.Node:
        # The view ops, each a call_function node: its target is the op itself.
        chain: list[tuple[Callable[..., Any], torch.fx.Node]] = []
        base = node
        while base.op == "call_function" and getattr(base.target, "is_view", False):
            chain.append((cast("Callable[..., Any]", base.target), base))
            # A view's first argument is the tensor it views: a node of the graph.
            base = cast(torch.fx.Node, base.args[0])
        if base not in copied:
            return node
        value = copied[base]
        with graph.inserting_before(output):
            for target, view in reversed(chain):
                value = graph.call_function(target, (value, *view.args[1:]), view.kwargs)
                value.meta = dict(view.meta)
        return value

    output.args = torch.utils._pytree.tree_map_only(torch.fx.Node, reroot, output.args)
    graph.eliminate_dead_code()
    gm.recompile()


def mutated_placeholders(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """The positions of the inputs a functional graph (``functional_retrace``'s) writes:
    the placeholders its trailing ``copy_`` nodes copy into."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    written = {
        n.args[0]
        for n in gm.graph.nodes
        if n.op == "call_function"
        and n.target is torch.ops.aten.copy_.default
        and n.args[0].op == "placeholder"
    }
    return tuple(i for i, node in enumerate(placeholders) if node in written)


def recorded_mutated_inputs(record: dict[str, Any] | None, num_inputs: int) -> tuple[int, ...]:
    """The inputs a subgraph ``compile_fx_recorded`` compiled writes (its data or its
    metadata), from AOTAutograd's input metadata; whether the write stays in the graph
    or AOTAutograd's runtime copies it back, the lowered graph assumed the input shares
    memory with no other. Without that metadata (or where it does not describe the
    inputs one to one) every input counts as written: a call sharing memory between two
    inputs is then refused, never served wrong."""
    runtime = None if record is None else record.get("runtime")
    info = None if runtime is None else runtime["runtime_metadata"].input_info
    if info is None or len(info) != num_inputs:
        return tuple(range(num_inputs))
    return tuple(i for i, x in enumerate(info) if x.mutates_data or x.mutates_metadata)


def _fake_mode_of(fakes: list[Any]) -> Any:
    for fake in fakes:
        mode = getattr(fake, "fake_mode", None)
        if mode is not None:
            return mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def compile_inductor(gm: torch.fx.GraphModule, fakes: list[Any]) -> str:
    """Lower a functional graph with Inductor; return its generated output module."""
    from torch._inductor.compile_fx import compile_fx_inner

    refuse_wrapping_integer_ops(gm)
    with _fake_mode_of(fakes):
        compiled = compile_fx_inner(gm, fakes)
    source = getattr(compiled, "source_code", None)
    if not isinstance(source, str):
        raise RuntimeError("Inductor produced no Python output module for this graph")
    return source


def sets_grad_mode(gm: torch.fx.GraphModule) -> bool:
    """Whether a Dynamo subgraph switches grad mode inside (a ``with torch.no_grad()``
    or ``enable_grad()`` block traced into it)."""
    return any(
        n.op == "call_function" and n.target is torch._C._set_grad_enabled for n in gm.graph.nodes
    )


def lower_dynamo_subgraph(gm: torch.fx.GraphModule) -> tuple[str, tuple[int, ...]]:
    """Lower one Dynamo subgraph for inference the way a single graph is lowered: retraced
    functional on the fake values Dynamo recorded for its inputs (symbolic sizes and
    SymInt inputs included), then Inductor. Dynamo hands backends a fresh fake mode in its
    tracing context; the retrace uses the recorded values' own mode, so the context is
    set aside for it. Returns the output module and the inputs the graph writes."""
    fakes = [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"]
    with torch._guards.tracing(None):
        functional = functional_retrace(gm, fakes)
        return compile_inductor(functional, fakes), mutated_placeholders(functional)


@contextlib.contextmanager
def _inductor_cache_dir(cache_dir: str) -> Iterator[None]:
    """Inductor reads and writes its on-disk cache in ``cache_dir`` meanwhile."""
    import os

    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


@contextlib.contextmanager
def inductor_capture_config(cache_dir: str) -> Iterator[None]:
    """While capturing with Dynamo and Inductor: record each subgraph's bundled
    AOTAutograd artifact (forward and backward, lowered eagerly), and compile into a
    private Inductor cache whose files become the artifact's kernel cache. Random ops
    call torch's own, drawing eager's numbers (``inductor_layout_config``)."""
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    # Which vector ISAs this machine builds and loads, asked here, in the machine's own
    # cache, and remembered for the process. Asked first inside the private cache, it
    # dry-compiled its three probe programs there (seconds of g++ each) in every
    # process that captures, since no private cache has the machine's built probes.
    # Where the machine's cache refuses the probe's files (a read-only cache), nothing
    # is remembered and Inductor asks inside the private cache, as it did before.
    with contextlib.suppress(OSError):
        valid_vec_isa_list()
    with (
        _inductor_cache_dir(cache_dir),
        torch._functorch.config.patch(
            bundled_autograd_cache=True, force_non_lazy_backward_lowering=True
        ),
        config.patch(fallback_random=True),
    ):
        yield


def compile_fx(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Inductor as torch.compile uses it (AOTAutograd, then Inductor)."""
    from torch._inductor.compile_fx import compile_fx as _compile_fx
    from torch._inductor.compile_fx import compile_fx_inner

    def inner(gm_: torch.fx.GraphModule, inputs: list[Any], **kwargs: Any) -> Any:
        refuse_wrapping_integer_ops(gm_)  # every ATen graph Inductor lowers
        return compile_fx_inner(gm_, inputs, **kwargs)

    return _compile_fx(gm, example_inputs, inner_compile=inner)


def compile_fx_recorded(
    gm: torch.fx.GraphModule, example_inputs: list[Any]
) -> tuple[Any, dict[str, Any]]:
    """``compile_fx`` as torch.compile runs it, recording what an artifact needs to run the
    result without AOTAutograd: the Inductor output module of each graph it lowered
    (forward, and backward for a joint graph) and AOTAutograd's runtime decisions (its
    forward metadata, which inputs it detaches, the autograd function's spec)."""
    from torch._functorch._aot_autograd import runtime_wrappers
    from torch._inductor import compile_fx as inductor

    record: dict[str, Any] = {"graphs": [], "runtime": None, "autograd": None}

    def inner(gm_: torch.fx.GraphModule, inputs: list[Any], **kwargs: Any) -> Any:
        refuse_wrapping_integer_ops(gm_)
        compiled = inductor.compile_fx_inner(gm_, inputs, **kwargs)
        kind = "backward" if kwargs.get("is_backward") else "forward"
        record["graphs"].append((kind, getattr(compiled, "source_code", None)))
        return compiled

    create = runtime_wrappers._create_runtime_wrapper
    build = runtime_wrappers._AOTDispatchAutogradFunctionFactory.build

    def recording_create(compiled_fn: Any, **kwargs: Any) -> Any:
        record["runtime"] = kwargs
        return create(compiled_fn, **kwargs)

    def recording_build(self: Any) -> Any:
        record["autograd"] = self.spec
        return build(self)

    # Patched for this compile only: both are looked up at call time.
    with (
        patched(runtime_wrappers, "_create_runtime_wrapper", recording_create),
        patched(runtime_wrappers._AOTDispatchAutogradFunctionFactory, "build", recording_build),
    ):
        compiled = inductor.compile_fx(gm, example_inputs, inner_compile=inner)
    return compiled, record


def _slice_literal(value: slice) -> tuple[int | None, int | None]:
    if value.step not in (None, 1):
        raise ValueError(f"a strided slice {value}")
    return (value.start, value.stop)


def _tangent_format(meta: Any) -> tuple[Any, ...] | None:
    """How AOTAutograd coerces a runtime tangent before its backward: to a memory format,
    or (static shapes) restrided to the traced output's size and stride."""
    fmt = getattr(meta, "memory_format", None)
    if fmt is None:
        return None
    if fmt.memory_format is not None:
        return ("format", str(fmt.memory_format).removeprefix("torch."))
    if has_symbols(fmt.size) or has_symbols(fmt.stride):
        raise ValueError("a tangent layout with symbolic sizes")
    return ("strided", tuple(int(s) for s in fmt.size), tuple(int(s) for s in fmt.stride))


def aot_runtime_spec(record: dict[str, Any], num_inputs: int) -> dict[str, Any]:
    """The literal spec of what AOTAutograd's runtime wrappers do around one compiled
    subgraph, for the artifact's own runtime (``inductor_serving.bind_aot_graph``) to do the same.
    Raises ValueError, naming the feature, for anything that runtime does not reproduce
    (input aliasing, output aliases, tensor subclasses, effect tokens, functionalized RNG,
    metadata mutations): such a subgraph keeps Inductor's pickled artifact."""
    from torch._functorch._aot_autograd.schemas import MutationType, OutputType

    runtime = record["runtime"]
    if runtime is None:
        raise ValueError("AOTAutograd's runtime wrapper was not built (a cache hit?)")
    meta = runtime["runtime_metadata"]
    joint = bool(runtime["trace_joint"])
    kinds = [kind for kind, _ in record["graphs"]]
    if kinds != (["forward", "backward"] if joint else ["forward"]):
        raise ValueError(f"Inductor lowered graphs {kinds}")
    if any(source is None for _, source in record["graphs"]):
        raise ValueError("an Inductor graph without its output module")
    if runtime["disable_amp"]:
        raise ValueError("autocast disabled around the graph")
    if len(meta.input_info) != num_inputs:
        raise ValueError("deduplicated or aliased inputs")
    if meta.tokens or meta.is_rng_op_functionalized or meta.num_graphsafe_rng_states:
        raise ValueError("effect tokens or functionalized RNG")
    if any(type(m).__name__ == "SubclassCreationMeta" for m in meta.subclass_inp_meta):
        raise ValueError("tensor subclass inputs")
    if meta.num_intermediate_bases or meta.num_outputs_aliased or meta.num_unsafe_view_outputs:
        raise ValueError("outputs that alias inputs or intermediates")
    if any(o.output_type != OutputType.non_alias for o in meta.output_info):
        raise ValueError("outputs that alias inputs or intermediates")
    mutations = []
    for index in meta.mutated_inp_runtime_indices:
        info = meta.input_info[index]
        if info.mutates_metadata or info.mutates_storage_metadata or not info.mutates_data:
            raise ValueError("an input whose metadata (size, stride, storage) is mutated")
        mutations.append(index)
    if getattr(meta, "mutated_inp_stream_indices", None) and any(
        s is not None for s in meta.mutated_inp_stream_indices
    ):
        raise ValueError("input mutations on user streams")
    spec: dict[str, Any] = {
        "joint": joint,
        "detach": list(runtime["indices_of_inps_to_detach"]),
        "mutations": mutations,
        "leaf_mutations": [
            i for i in mutations if meta.input_info[i].is_leaf
        ],  # copied into a detached leaf when it requires grad, as AOTAutograd does
        "bump_versions": list(meta.mutated_graph_handled_indices_seen_by_autograd)
        if runtime["keep_input_mutations"]
        else [],
        "outputs": meta.num_outputs,
        "grad_enabled_mutation": meta.grad_enabled_mutation,
    }
    if not joint:
        return spec
    autograd = record["autograd"]
    inner_meta = autograd.fw_metadata
    if autograd.maybe_subclass_meta is not None or autograd.backward_state_indices:
        raise ValueError("tensor subclasses or compiled-autograd backward state")
    if autograd.disable_amp:
        raise ValueError("autocast disabled around the graph")
    if (
        inner_meta.num_backward_tokens
        or inner_meta.num_opaque_objects_saved_for_bw
        or inner_meta.indices_of_inputs_that_requires_grad_with_mutations_in_bw
        or inner_meta.num_graphsafe_rng_states
        or inner_meta.is_rng_op_functionalized
    ):
        raise ValueError("backward tokens, opaque objects, RNG state or mutations in backward")
    mutated_runtime = inner_meta.num_mutated_inp_runtime_indices
    surviving = [
        i
        for i, index in enumerate(inner_meta.mutated_inp_runtime_indices)
        if inner_meta.input_info[index].mutates_data and inner_meta.input_info[index].requires_grad
    ]
    surviving += [
        mutated_runtime + i
        for i, info in enumerate(inner_meta.output_info)
        if info.output_type == OutputType.non_alias
        and issubclass(info.raw_type, torch.Tensor)
        and info.requires_grad_for_backward
    ]
    returns_meta = [
        x for x in inner_meta.input_info if x.mutation_type == MutationType.MUTATED_OUT_GRAPH
    ] + list(inner_meta.output_info)
    tangent_metas = list(inner_meta.subclass_tangent_meta)
    if len(tangent_metas) != len(surviving):
        raise ValueError("tangents that do not match the differentiable outputs")
    spec.update(
        forward_returns=inner_meta.num_forward_returns,
        saved=_slice_literal(inner_meta.tensors_saved_for_backwards_with_vc_check_slice),
        saved_no_check=_slice_literal(inner_meta.tensors_saved_for_backwards_no_vc_check_slice),
        symints=_slice_literal(inner_meta.symints_saved_for_backwards_slice),
        non_differentiable=[
            i
            for i, m in enumerate(returns_meta)
            if i < mutated_runtime + inner_meta.num_outputs and not m.requires_grad
        ],
        grad_outs=inner_meta.num_outputs + mutated_runtime + inner_meta.num_intermediate_bases,
        tangents=[[position, _tangent_format(m)] for position, m in zip(surviving, tangent_metas)],
    )
    return spec


def outputs_need_no_grad(record: dict[str, Any]) -> int | None:
    """For a subgraph ``compile_fx_recorded`` compiled: its number of outputs when none
    of them requires grad and no input it mutates does (run under no_grad it computes
    the same), else None."""
    runtime = record["runtime"]
    if runtime is None:
        return None
    meta = runtime["runtime_metadata"]
    if meta.grad_enabled_mutation is not None or any(o.requires_grad for o in meta.output_info):
        return None
    if any(
        meta.input_info[i].requires_grad
        for i, info in enumerate(meta.input_info)
        if info.mutates_data or info.mutates_metadata
    ):
        return None
    return int(meta.num_outputs)


def inductor_backend_artifact(backend_id: str) -> bytes | None:
    """The pickled bundled artifact Inductor recorded for a Dynamo backend id."""
    import pickle

    from torch._dynamo.precompile_context import PrecompileContext

    artifact = PrecompileContext.serialize_artifact_by_key(backend_id)
    return None if artifact is None else pickle.dumps(artifact, protocol=4)


def complete_inductor_cache(blobs: list[bytes], cache_dir: str) -> None:
    """Load each bundled artifact once, as a serving process will, with the capture's
    private cache as Inductor's: Inductor can leave a kernel's source there unbuilt (the
    capture never ran it, or took the kernel from its in-memory cache, loaded from an
    earlier capture's directory), and without this every process loading the artifact
    would compile that kernel."""
    import pickle

    from torch._inductor.utils import clear_caches

    with _inductor_cache_dir(cache_dir):
        clear_caches()  # so every kernel is found (or built) in cache_dir
        for blob in blobs:
            pickle.loads(blob).after_deserialization()


def inductor_layout_config() -> Any:
    """While lowering a single graph: Inductor's size/stride asserts on, whatever
    ``TORCHINDUCTOR_SIZE_ASSERTS`` says (the artifact's layout checks must not depend on
    the capturing process's environment); and random ops (``torch.rand``, dropout) as
    calls of torch's own, which draw exactly eager's numbers from the generator --
    Inductor's own random kernels draw others, and it cannot lower a make_fx graph's
    random ops at all without torch.compile's seed-replacing pass."""
    from torch._inductor import config

    return config.patch(size_asserts=True, fallback_random=True)


def compile_inductor_backward(gm: torch.fx.GraphModule, fakes: list[Any]) -> str:
    """Lower an AOTAutograd backward graph with Inductor; return its output module."""
    from torch._inductor.compile_fx import compile_fx_inner

    refuse_wrapping_integer_ops(gm)
    with _fake_mode_of(fakes):
        compiled = compile_fx_inner(gm, fakes, is_backward=True)
    source = getattr(compiled, "source_code", None)
    if not isinstance(source, str):
        raise RuntimeError("Inductor produced no Python output module for this graph")
    return source


def inductor_decompositions() -> dict[Any, Callable[..., Any]]:
    """Inductor's decomposition table (what its lowering wants a graph traced with).

    Some of its decompositions ask ``torch._inductor.lowering`` whether to decompose at
    all (max-pool with indices: ``torch._inductor.lowering.should_fallback_...``) as an
    attribute of the package, which torch.compile has imported by then and a make_fx
    capture has not: imported here, or such a graph fails to trace.

    The table as Inductor selects it with random ops left to torch
    (``inductor_layout_config``'s ``fallback_random``): without it Inductor adds its fast
    random decompositions (``exponential_``, ``cauchy_``, ``geometric_``,
    ``log_normal_``, RReLU in training, rewritten over ``rand``), which draw other numbers
    than eager from the same generator and leave it elsewhere."""
    import torch._inductor.lowering  # noqa: F401  (bound as torch._inductor.lowering)
    from torch._inductor import config
    from torch._inductor.decomposition import select_decomp_table

    with config.patch(fallback_random=True):
        return dict(select_decomp_table())


def inductor_autograd_config() -> Any:
    """``inductor_layout_config`` for a forward and backward lowered separately: with
    Inductor's layout optimization off, the forward hands the backward its saved tensors
    in the layout the backward graph was traced (and lowered) for. torch.compile instead
    retraces the backward with the forward's actual output strides."""
    from torch._inductor import config

    return config.patch(size_asserts=True, layout_optimization=False, fallback_random=True)
