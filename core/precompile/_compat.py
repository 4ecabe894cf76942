"""The torch-compatibility module: every use of a private torch name lives here.

Supporting the next torch release means changing this file (and the text it hands to the
emitter for artifacts), nowhere else. Tested against torch 2.13.x. Names that emitted
artifacts need are not imported by them from here -- artifacts must run without this
package -- so this module also owns the *text* of the import prelude they carry.

Importing it is cheap: the heavy private modules (fake tensors, make_fx, Inductor) are
imported on first use of the names that need them, so the load path never pays for them.
"""

from __future__ import annotations

import contextlib
import importlib
import platform
import sys
import sysconfig
import threading
import traceback
import types
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
import torch.utils._pytree as pytree  # noqa: F401  (re-exported: the one pytree spelling)

from precompile.guard_text import frame_label, guard_failure_text
from precompile.locations import StackFrame, live_user_stack

#: Names imported on first use (module-level __getattr__), to keep this module cheap.
_LAZY = {
    "FakeTensor": ("torch._subclasses.fake_tensor", "FakeTensor"),
    "FakeTensorMode": ("torch._subclasses.fake_tensor", "FakeTensorMode"),
    "UnsupportedOperatorException": (
        "torch._subclasses.fake_tensor",
        "UnsupportedOperatorException",
    ),
    "HigherOrderOperator": ("torch._ops", "HigherOrderOperator"),
    "make_fx": ("torch.fx.experimental.proxy_tensor", "make_fx"),
}


def __getattr__(name: str) -> Any:
    if name == "DATA_DEPENDENT_ERRORS":
        # Exceptions fake tensors raise for an op whose result depends on tensor values.
        from torch._subclasses.fake_tensor import (
            DataDependentOutputException,
            DynamicOutputShapeException,
        )

        return (DataDependentOutputException, DynamicOutputShapeException)
    if name == "GuardOnDataDependentSymNode":
        # Raised when a trace must branch on a size it treats as unknown (unbacked).
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

        return GuardOnDataDependentSymNode
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The import prelude of every emitted artifact: the names the driver reads, bound from
#: torch under short aliases. Private names appear here as text only.
ARTIFACT_PRELUDE = """\
import torch as _torch
import torch.utils._pytree as _pytree

_DisableAutocast = _torch._C._DisableAutocast
_any_autocast_enabled = _torch._C._is_any_autocast_enabled
_set_grad_enabled = _torch._C._set_grad_enabled
_dict_version = _torch._C._dynamo.guards.dict_version
_TensorGuards = _torch._C._dynamo.guards.TensorGuards
dispatch_tls_local_exclude_set = _torch._C._dispatch_tls_local_exclude_set
privateuse1_backend_name = _torch._C._get_privateuse1_backend_name
"""

#: The prelude's public names for the modules emitted whole (state_checks), which the
#: capture imports from here: one binding each, in the artifact and in this process.
dispatch_tls_local_exclude_set = torch._C._dispatch_tls_local_exclude_set
privateuse1_backend_name = torch._C._get_privateuse1_backend_name
#: ``Tensor.requires_grad``'s descriptor: how a trace's reads of it are recognised.
requires_grad_descriptor = torch._C.TensorBase.__dict__["requires_grad"]

#: What ``autograd_serving.bind_autograd`` needs besides ARTIFACT_PRELUDE: view replay
#: (AOTAutograd turns it on around its forward) and the frame strategy that keeps
#: Dynamo from compiling the runtime's own frames.
AUTOGRAD_PRELUDE = """\
_view_replay_enabled = _torch._C._is_view_replay_enabled
_set_view_replay_enabled = _torch._C._set_view_replay_enabled
_set_code_exec_strategy = _torch._C._dynamo.eval_frame.set_code_exec_strategy
_SKIP_FRAMES = _torch._C._dynamo.eval_frame._FrameExecStrategy(
    _torch._C._dynamo.eval_frame._FrameAction.SKIP, _torch._C._dynamo.eval_frame._FrameAction.SKIP
)
"""

#: What an Inductor artifact's runtime needs besides ARTIFACT_PRELUDE: how a prebuilt
#: kernel (a Python extension module) finds torch's tensor-data accessor, the
#: allocation alignment of torch 2.13's generated code, and AUTOGRAD_PRELUDE (training
#: subgraphs and grad inputs are served through ``bind_autograd``).
INDUCTOR_PRELUDE = (
    """\
_KERNEL_DATA_PTR_ENV = "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"
_kernel_data_ptr = _torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr
_INDUCTOR_ALIGN_BYTES = 64
"""
    + AUTOGRAD_PRELUDE
)

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
    from torch.nn.utils.stateless import _reparametrize_module

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


_stack_patch_lock = threading.RLock()  # the capture patches nest


@contextlib.contextmanager
def recording_user_stacks(
    boundary: types.CodeType,
) -> Iterator[Callable[[str | None], list[StackFrame]]]:
    """Make FX record the full *user* stack of every node, not only ``forward`` frames.

    make_fx keeps only frames named ``forward``, which loses helper functions and the
    traced function itself; and FX stack strings carry no columns. While this is active
    each node's ``stack_trace`` string is also a key into a table of structured frames
    with exact columns; the yielded lookup turns a node's ``stack_trace`` into them. Frames
    are taken inside ``boundary``, the code object that calls the user's function.
    """
    from torch.fx.proxy import TracerBase

    table: dict[str, list[StackFrame]] = {}

    def _filter(
        self: TracerBase, user_stack_summary: traceback.StackSummary
    ) -> traceback.StackSummary:
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
        TracerBase._filter_traceback_frames = _filter  # type: ignore[method-assign]  # a patch for the block
        try:
            yield lambda stack_trace: table.get(stack_trace or "", [])
        finally:
            TracerBase._filter_traceback_frames = original  # type: ignore[method-assign]  # torch's own, back


# ---------------------------------------------------------------- dynamic dims


def unbacked_marks(t: torch.Tensor) -> dict[int, tuple[int | None, int | None, str | None]]:
    """The dims ``torch._dynamo.decorators.mark_unbacked`` marked on ``t``:
    ``{dim: (min, max, shape_id)}``. A ``strict=True`` mark (kept by torch in a set of
    its own) is one too: an unbacked dim that the trace would specialize is refused."""
    dims = {
        *(getattr(t, "_dynamo_unbacked_indices", None) or ()),
        *(getattr(t, "_dynamo_strict_unbacked_indices", None) or ()),
    }
    bounds = getattr(t, "_dynamo_unbacked_bounds", None) or {}
    ids = getattr(t, "_dynamo_shape_ids", None) or {}
    return {d: (*bounds.get(d, (None, None)), ids.get(d)) for d in sorted(dims)}


def dynamic_fakes(static: list[torch.Tensor], marked: list[torch.Tensor]) -> tuple[Any, list[Any]]:
    """Fake tensors over one shape environment: ``static`` ones with static shapes, and
    ``marked`` ones with their mark_unbacked dims as unbacked symbols (bounds and shared
    shape ids applied). Returns the fake mode and the fakes (static, then marked)."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    shape_env = ShapeEnv()
    mode = fake_mode(shape_env=shape_env)
    fakes = [mode.from_tensor(t, static_shapes=True) for t in static]
    with shape_env.ignore_fresh_unbacked_symbols():
        for i, t in enumerate(marked):
            marks = unbacked_marks(t)
            context: StatelessSymbolicContext[..., Any] = StatelessSymbolicContext(
                dynamic_sizes=[
                    DimDynamic.UNBACKED if d in marks else DimDynamic.STATIC for d in range(t.dim())
                ],
                shape_ids=getattr(t, "_dynamo_shape_ids", None),
                unbacked_bounds=getattr(t, "_dynamo_unbacked_bounds", None),
            )
            fakes.append(
                mode.from_tensor(t, source=ConstantSource(f"input{i}"), symbolic_context=context)
            )

    return mode, fakes


def insert_runtime_asserts(gm: torch.fx.GraphModule, fake_mode: Any) -> None:
    """Put every assumption the trace made about unbacked sizes (bounds, shared shape ids,
    anything an op had to assume) into the graph as run-time asserts, so the artifact
    checks at run time what the capture took for granted."""
    from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

    if fake_mode.shape_env is not None:
        insert_deferred_runtime_asserts(gm, fake_mode.shape_env, "precompile")
        gm.recompile()


def has_symbols(values: Any) -> bool:
    return any(isinstance(v, torch.SymInt) for v in values)


# ---------------------------------------------------------------- Inductor


def functional_retrace(gm: torch.fx.GraphModule, fakes: list[Any]) -> torch.fx.GraphModule:
    """Re-trace a captured ATen graph the way Inductor wants it: functional (input
    mutations become trailing ``copy_`` into the inputs; views stay views, so an output
    that aliases an input still does) and decomposed with Inductor's table."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    fake_mode = _fake_mode_of(fakes)
    with fake_mode, torch.no_grad():
        functional = make_fx(
            torch.func.functionalize(gm, remove="mutations"),
            decomposition_table=select_decomp_table(),
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


def lower_dynamo_subgraph(gm: torch.fx.GraphModule) -> str:
    """Lower one Dynamo subgraph for inference the way a single graph is lowered: retraced
    functional on the fake values Dynamo recorded for its inputs (symbolic sizes and
    SymInt inputs included), then Inductor. Dynamo hands backends a fresh fake mode in its
    tracing context; the retrace uses the recorded values' own mode, so the context is
    set aside for it."""
    fakes = [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"]
    with torch._guards.tracing(None):
        functional = functional_retrace(gm, fakes)
        return compile_inductor(functional, fakes)


_X86_FLAG_CHECKS = {
    "avx2": "_is_avx2_supported",
    "avx512": "_is_avx512_supported",
    "avx512_vnni": "_is_vnni_supported",
    "avx512_bf16": "_is_avx512_bf16_supported",
    "amx_tile": "_is_amx_tile_supported",
    "amx_fp16": "_is_amx_fp16_supported",
}


def kernel_platform() -> dict[str, Any]:
    """What a compiled C++ kernel of this process depends on: the torch build (its kernel
    prefix header and tensor accessor), the Python extension ABI, the machine, and the
    vector ISA Inductor picked here (recorded as its feature flags)."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    isa = pick_vec_isa()
    return {
        "torch": str(torch.__version__),
        "python_abi": sysconfig.get_config_var("EXT_SUFFIX"),
        "machine": platform.machine(),
        "isa": str(isa) or "none",
        "isa_flags": str(isa).split(),
    }


def kernel_platform_problem(required: dict[str, Any]) -> str | None:
    """Why kernels built for ``required`` cannot run here, or None. Answers from cheap
    CPU-feature queries: no compiler runs and ``torch._inductor`` is not imported."""
    here = {
        "torch": str(torch.__version__),
        "python_abi": sysconfig.get_config_var("EXT_SUFFIX"),
        "machine": platform.machine(),
    }
    for key, value in here.items():
        if required.get(key) != value:
            return f"they were built for {key} {required.get(key)!r}, this process has {value!r}"
    for flag in required.get("isa_flags", []):
        check = _X86_FLAG_CHECKS.get(flag)
        if check is None or not getattr(torch.cpu, check, lambda: False)():
            return f"they use the {required.get('isa')} vector ISA, and this CPU lacks {flag!r}"
    return None


# ---------------------------------------------------------------- Dynamo (capture)

#: Guard types whose checks compare object identities: they cannot survive a process.
UNSERIALIZABLE_GUARD_TYPES = frozenset(
    {
        "ID_MATCH",
        "CLOSURE_MATCH",
        "MODULE_MATCH",
        "FUNCTION_MATCH",
        "BUILTIN_MATCH",
        "DICT_VERSION",
        "NN_MODULE",
        "CLASS_MATCH",
        "WEAKREF_ALIVE",
    }
)


def compares_identity(entry: Any) -> bool:
    """Whether a guard entry checks an object identity, directly or through what Dynamo
    derives from it (a CONSTANT_MATCH on a function's ``__code__`` is an ID_MATCH), so it
    cannot be serialized."""
    derived = getattr(entry, "derived_guard_types", None) or ()
    return entry.guard_type in UNSERIALIZABLE_GUARD_TYPES or any(
        kind in UNSERIALIZABLE_GUARD_TYPES for kind in derived
    )


#: Guard types the artifact's driver enforces itself: GLOBAL_STATE bundles grad mode
#: (the driver sets the captured one), autocast (disabled while serving), default dtype
#: and deterministic mode (checked per call) with the thread count, which an artifact
#: must not depend on.
DRIVER_ENFORCED_GUARD_TYPES = frozenset({"GLOBAL_STATE"})


def new_package(fn: Callable[..., Any]) -> Any:
    from torch._dynamo.package import CompilePackage

    return CompilePackage(fn)


def recording_traced_code(package: Any, codes: dict[types.CodeType, None]) -> None:
    """Record in ``codes`` every code object Dynamo traced into a graph of ``package``'s
    frames: the frame's own code and every function it inlined (a module's ``forward``,
    helpers, hooks) -- what Dynamo hands the package as the frame's inlined sources."""
    original = package.add_inlined_source

    def add_inlined_source(sources: list[types.CodeType]) -> None:
        for code in sources:
            codes.setdefault(code, None)
        return original(sources)

    package.add_inlined_source = add_inlined_source


def current_package_code(package: Any) -> types.CodeType | None:
    """The code object the package is compiling right now (inside a guard filter)."""
    entry = getattr(package, "_current_entry", None)
    if entry is None:
        return None
    for code, candidate in package._codes.items():
        if candidate is entry:
            return code
    return None


def current_package_module(package: Any) -> str:
    """The module whose globals the frame being compiled runs in (inside a guard filter)."""
    entry = getattr(package, "_current_entry", None)
    return str(getattr(entry, "python_module", "") or "")


def optimize(
    fn: Callable[..., Any],
    backend: Any,
    *,
    package: Any,
    guard_filter_fn: Callable[[list[Any]], list[bool]],
    guard_fail_fn: Callable[[Any], None],
    dynamic: bool | None,
    touched: dict[types.CodeType, bool],
) -> Callable[..., Any]:
    """``fn`` under Dynamo with our package. Every code object the frame evaluator hands
    this capture is recorded in ``touched`` (True when it held no compiled code before:
    what is on it then is the capture's alone), so the capture can remove what it
    compiled when it ends (``forget_compiled``)."""
    from torch._dynamo.eval_frame import OptimizeContext

    context = torch._dynamo.optimize(
        backend,
        package=package,
        guard_filter_fn=guard_filter_fn,
        guard_fail_fn=guard_fail_fn,
        dynamic=dynamic,
    )
    if not isinstance(context, OptimizeContext) or not callable(context.callback):
        # optimize() hands back a do-nothing decorator when Dynamo is switched off.
        raise RuntimeError(
            "precompile: Dynamo is disabled in this process (TORCHDYNAMO_DISABLE=1 or the "
            "enable_dynamo killswitch); a Dynamo capture needs it: unset it, or capture "
            "with tracer=precompile.MakeFxTracer()"
        )
    inner = context.callback

    def callback(frame: Any, cache_entry: Any, *args: Any, **kwargs: Any) -> Any:
        code = frame.f_code
        if code not in touched:
            touched[code] = cache_entry is None and not _precompile_entries(code)
        return inner(frame, cache_entry, *args, **kwargs)

    # Dynamo keys cache entries by the innermost backend: keep it ours.
    callback._torchdynamo_orig_backend = getattr(inner, "_torchdynamo_orig_backend", inner)  # type: ignore[attr-defined]  # Dynamo reads it off the callback function
    context.callback = callback
    return context(fn)


def _precompile_entries(code: types.CodeType) -> list[Any]:
    from torch._C._dynamo.eval_frame import _debug_get_precompile_entries

    return list(_debug_get_precompile_entries(code))


def forget_compiled(touched: dict[types.CodeType, bool]) -> None:
    """Remove what a capture compiled from the code objects it alone compiled (cache
    entries, skip marks, frame state, Dynamo's per-code context), so the process's
    Dynamo state is as the capture found it: a later capture or torch.compile of the
    same function compiles afresh. Code that held someone else's compiled code when the
    capture met it is left alone (Dynamo offers no way to remove one entry)."""
    from torch._C._dynamo.eval_frame import reset_code
    from torch._dynamo import pgo
    from torch._dynamo.code_context import code_context

    for code, alone in touched.items():
        if alone:
            reset_code(code)
            if code_context.has_context(code):
                code_context.pop_context(code)
    ours = {(c.co_filename, c.co_firstlineno, c.co_name) for c, alone in touched.items() if alone}
    # Automatic dynamic: the sizes each frame was compiled for, by CodeId. Left in place,
    # a later capture of the same function with other sizes would come out dynamic --
    # not the artifact a fresh process captures.
    states = pgo._CODE_STATE
    if states:
        for key in [k for k in states if (k.filename, k.firstlineno, k.name) in ours]:
            del states[key]


def dynamo_config(recompile_limit: int) -> Any:
    """Capture-time Dynamo settings: our recompile limit, and the default
    (non-nested) graph breaks, whose continuations the standalone driver understands."""
    return torch._dynamo.config.patch(
        recompile_limit=recompile_limit,
        accumulated_recompile_limit=max(recompile_limit * 4, 256),
        nested_graph_breaks=False,
        caching_precompile=False,
    )


def live_compiles(code: types.CodeType) -> tuple[int, int]:
    """What ``code`` holds in this process: (Dynamo cache entries, as torch.compile
    leaves them; entries an installed artifact put there)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(code)), len(_precompile_entries(code))


def graph_break_link(gb_type: str) -> tuple[str | None, str | None]:
    """Dynamo's graph-break id (e.g. ``GB0124``) and documentation link for a break type."""
    from torch._dynamo.exc import _load_gb_type_to_gb_id_map, get_gbid_documentation_link

    gb_id = _load_gb_type_to_gb_id_map().get(gb_type)
    return gb_id, get_gbid_documentation_link(gb_type)


@contextlib.contextmanager
def recording_graph_breaks() -> Iterator[list[dict[str, Any]]]:
    """Record every graph break Dynamo logs while active: its type, full message, the
    code being translated, and the user stack (FrameSummaries with 3.11 columns)."""
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase

    events: list[dict[str, Any]] = []
    original = InstructionTranslatorBase.log_graph_break

    def log_graph_break(self: Any, code_options: Any, reason: str, exc: Any) -> None:
        if not getattr(exc, "logged", False):
            events.append(
                {
                    "gb_type": getattr(exc, "gb_type", None),
                    "message": str(exc),
                    "reason": reason,
                    "code": self.f_code,
                    "stack": list(getattr(exc, "real_stack", None) or []),
                }
            )
        return original(self, code_options, reason, exc)

    with _stack_patch_lock:
        InstructionTranslatorBase.log_graph_break = log_graph_break  # type: ignore[method-assign]  # a patch for the block
        try:
            yield events
        finally:
            InstructionTranslatorBase.log_graph_break = original  # type: ignore[method-assign]  # torch's own, back


def resumed_code(code: types.CodeType) -> types.CodeType:
    """The user code a Dynamo continuation (resume function) resumes, followed through
    continuations of continuations; ``code`` itself for any other code."""
    from torch._dynamo.resume_execution import ContinueExecutionCache

    seen: set[int] = set()
    while id(code) not in seen:
        seen.add(id(code))
        meta = ContinueExecutionCache.generated_code_metadata.get(code)
        if meta is None:
            break
        code = meta.code
    return code


#: Tensor attributes whose value for a tensor the trace computed (one with no source)
#: depends on the grad mode the trace ran in: Dynamo bakes them as constants, guarded
#: by nothing.
GRAD_DEPENDENT_TENSOR_ATTRS = frozenset({"requires_grad", "grad_fn", "is_leaf"})


@contextlib.contextmanager
def recording_grad_dependent_reads(reads: list[str]) -> Iterator[None]:
    """Record (as ``.attr at file:line``) each read of a GRAD_DEPENDENT_TENSOR_ATTRS
    attribute of a tensor the trace computed. An input's are checked by its guards; an
    intermediate's were baked from the capture's grad mode."""
    from torch._dynamo.variables.tensor import TensorVariable

    original = TensorVariable.var_getattr

    def var_getattr(self: Any, tx: Any, name: str) -> Any:
        if name in GRAD_DEPENDENT_TENSOR_ATTRS and getattr(self, "source", None) is None:
            code = getattr(tx, "f_code", None)
            line = getattr(tx, "lineno", None)
            where = f"{code.co_filename.rsplit('/', 1)[-1]}:{line}" if code is not None else "?"
            reads.append(f"`.{name}` of a tensor fn computes, at {where}")
        return original(self, tx, name)

    with _stack_patch_lock:
        TensorVariable.var_getattr = var_getattr  # type: ignore[method-assign]  # a patch for the block
        try:
            yield
        finally:
            TensorVariable.var_getattr = original  # type: ignore[method-assign]  # torch's own, back


@contextlib.contextmanager
def recording_bypasses(reasons: dict[str, str]) -> Iterator[None]:
    """Record why Dynamo left a frame out of the package (frame name -> reason)."""
    from torch._dynamo.output_graph import OutputGraph

    original = OutputGraph.bypass_package

    def bypass_package(self: Any, reason: str = "", **kwargs: Any) -> None:
        code = getattr(getattr(self, "root_tx", None), "f_code", None)
        if code is not None and self.package is not None:
            reasons[code.co_name] = reason
        return original(self, reason, **kwargs)

    with _stack_patch_lock:
        OutputGraph.bypass_package = bypass_package  # type: ignore[method-assign]  # a patch for the block
        try:
            yield
        finally:
            OutputGraph.bypass_package = original  # type: ignore[method-assign]  # torch's own, back


@contextlib.contextmanager
def without_guard_latency_profiling() -> Iterator[None]:
    """While capturing: Dynamo times every new guard set once, for a log line and a
    compile metric, after flushing the CPU caches -- about 50 ms per compiled frame
    variant, a third of a warm editor re-check of a small target. Nothing a capture
    reads or emits depends on it."""
    import torch._dynamo.guards as guards

    original = guards.profile_guard_manager
    with _stack_patch_lock:
        guards.profile_guard_manager = lambda *args, **kwargs: 0.0
        try:
            yield
        finally:
            guards.profile_guard_manager = original


@contextlib.contextmanager
def recording_installed_globals(
    installed: dict[types.CodeType, dict[str, Any]],
) -> Iterator[None]:
    """Record every global Dynamo binds into a compiled frame's module while active
    (frame code -> {name: value}): besides compiled subgraphs, resume functions and
    import aliases, which the package records, Dynamo binds helpers its bytecode and
    guards read -- a module it imports under ``___module_<name>_<id>_c<n>`` (e.g. to
    build an ``OrderedDict``), the globals dict of a function it inlined that has no
    module (a namedtuple's ``__new__``) -- and the package records none of them."""
    from torch._dynamo.output_graph import OutputGraph

    original = OutputGraph.install_global_unsafe

    def install_global_unsafe(self: Any, name: str, value: Any) -> None:
        code = getattr(getattr(self, "root_tx", None), "f_code", None)
        if code is not None:
            installed.setdefault(code, {})[name] = value
        return original(self, name, value)

    with _stack_patch_lock:
        OutputGraph.install_global_unsafe = install_global_unsafe  # type: ignore[method-assign]  # a patch for the block
        try:
            yield
        finally:
            OutputGraph.install_global_unsafe = original  # type: ignore[method-assign]  # torch's own, back


def serialize_code(code: types.CodeType) -> Any:
    from torch._dynamo.package import SerializedCode

    return SerializedCode.from_code_object(code)


def builtins_key_of(guards_state: bytes) -> str | None:
    """The globals key Dynamo minted (from a counter) for the builtins dict a variant's
    guards and bytecode read through."""
    from torch._dynamo.package import load_guards_state

    return load_guards_state(guards_state).output_graph.name_of_builtins_dict_key_in_fglobals


def check_variants(
    variants: list[tuple[bytes, Any]],
    code: types.CodeType,
    scope: dict[str, Any],
    f_locals: dict[str, Any],
) -> dict[str, Any]:
    """Evaluate each variant's serialized guards against ``f_locals``: which would serve,
    and the first failing guard of each that would not."""
    from torch._dynamo.package import load_guard_manager, load_guards_state

    failures: list[dict[str, Any]] = []
    for i, (guards_state, _code) in enumerate(variants):
        manager = load_guard_manager(load_guards_state(guards_state), code, scope)
        if manager.check(f_locals) or manager.check(f_locals):
            return {"served_by": i, "failures": failures}
        parts = list(getattr(manager.check_verbose(f_locals), "verbose_code_parts", None) or [])
        shown = guard_failure_text(str(parts[0])) if parts else "a guard failed"
        failures.append({"variant": i, "guard": shown})
    return {"served_by": None, "failures": failures}


def global_state() -> dict[str, Any]:
    """The global state a Dynamo artifact depends on besides grad mode and autocast."""
    return {
        "default_dtype": str(torch.get_default_dtype()),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
    }


def autocast_enabled() -> bool:
    return bool(torch._C._is_any_autocast_enabled())


# ---------------------------------------------------------------- Dynamo (serving)
# The functions below are emitted verbatim into multi-graph artifacts (they import what
# they need themselves), so the artifact's driver reaches Dynamo only through them.


def _dynamo_serving_runtime() -> Any:
    """The few Dynamo internals a standalone artifact needs to rebuild its frames."""
    import types as _types

    import torch
    import torch._dynamo
    from torch._dynamo.aot_compile import bind_locals
    from torch._dynamo.output_graph import get_builtins_dict
    from torch._dynamo.package import SerializedCode, load_guard_manager, load_guards_state
    from torch._dynamo.utils import CleanupManager

    def disown(scope: dict[str, Any], name: str) -> None:
        # A live compile may have bound ``name`` with a hook that deletes it once that
        # compile's code object dies; point such hooks at a scratch scope instead, so
        # they cannot delete the binding this artifact is about to make.
        instance = getattr(CleanupManager, "instance", None)
        for hooks in list(getattr(instance, "values", {}).values()):
            for hook in hooks if isinstance(hooks, list) else ():
                if getattr(hook, "scope", None) is scope and getattr(hook, "name", None) == name:
                    hook.scope = {name: None}

    # What mark_dynamic / mark_unbacked / mark_static leave on a tensor. A serialized
    # guard is rebuilt without the capture's tensors, so its dimension-marking guard
    # expects none of them, and a marked tensor (the capture's own example, passed
    # again) would miss every variant though its sizes pass the shape guards.
    dim_marks = (
        "_has_dynamo_dim_marking",
        "_dynamo_dynamic_indices",
        "_dynamo_weak_dynamic_indices",
        "_dynamo_unbacked_indices",
        "_dynamo_strict_unbacked_indices",
        "_dynamo_static_indices",
        "_dynamo_shape_ids",
        "_dynamo_unbacked_bounds",
    )

    def strip_dim_marks(values: Any) -> list[tuple[Any, dict[str, Any]]]:
        """Take the dim marks off the tensors among ``values`` (and in the lists, tuples
        and dicts among them); what ``restore_dim_marks`` puts back."""
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
                if isinstance(t, torch.Tensor) and attrs and "_has_dynamo_dim_marking" in attrs:
                    stripped.append((t, {a: attrs.pop(a) for a in dim_marks if a in attrs}))
        return stripped

    def restore_dim_marks(stripped: list[tuple[Any, dict[str, Any]]]) -> None:
        for t, attrs in stripped:
            t.__dict__.update(attrs)

    return _types.SimpleNamespace(
        strip_dim_marks=strip_dim_marks,
        restore_dim_marks=restore_dim_marks,
        to_code=SerializedCode.to_code_object,
        load_guards_state=load_guards_state,
        load_guard_manager=load_guard_manager,
        builtins_dict=get_builtins_dict,
        bind_locals=bind_locals,
        disown=disown,
        disable=torch._dynamo.disable,
    )


# ---------------------------------------------------------------- Dynamo + Inductor


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

    return _compile_fx(gm, example_inputs)


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

    # Patched for this compile only (restored below): both are looked up at call time.
    runtime_wrappers._create_runtime_wrapper = recording_create
    runtime_wrappers._AOTDispatchAutogradFunctionFactory.build = recording_build  # type: ignore[method-assign]
    try:
        compiled = inductor.compile_fx(gm, example_inputs, inner_compile=inner)
    finally:
        runtime_wrappers._create_runtime_wrapper = create
        runtime_wrappers._AOTDispatchAutogradFunctionFactory.build = build  # type: ignore[method-assign]
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


def _inductor_backend_loader(bundle: dict[str, Any] | None) -> Any:
    """Emitted verbatim into Dynamo+Inductor artifacts: turn each pickled backend artifact
    back into a compiled function. With a cache bundle (every file of which the loader
    checked against the envelope's digests: Inductor loads its shared objects and
    unpickles its entries), Inductor reads from a private directory unpacked from it (so
    nothing compiles that the capture compiled, and the user's Inductor cache is never
    written); without one, kernels compile from the
    source inside the artifacts, into the user's Inductor cache."""
    import atexit
    import os
    import pickle
    import shutil
    import tempfile

    files = (bundle or {}).get("inductor_cache_files") or {}
    directory = None
    if files:
        directory = tempfile.mkdtemp(prefix="precompile-inductor-")
        atexit.register(shutil.rmtree, directory, True)
        for relative, data in files.items():
            path = os.path.join(directory, relative)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)

    # Finding a cached kernel asks Inductor which vector ISA to build for, and Inductor
    # answers by compiling and loading a test program per ISA (seconds). The bundle
    # records the ISA the kernels were built for, and the load only got this bundle
    # because this CPU has its features: answer with it while the kernels load.
    recorded = None
    if directory is not None:
        from torch._inductor import codecache, cpu_vec_isa

        isa = ((bundle or {}).get("requires") or {}).get("isa")
        matches = [v for v in cpu_vec_isa.supported_vec_isa_list if str(v) == isa]
        if matches or isa == "none":
            recorded = matches

        # Before it looks a kernel up, Inductor precompiles the kernels' common header into
        # the machine's own directory (not TORCHINDUCTOR_CACHE_DIR, so never into the bundle):
        # on a machine, or in a fresh venv, that never compiled it, that is a g++ run of
        # seconds. Every kernel is in the bundle, so no header is needed: answer with a plain
        # one (a kernel compiled despite that would still build, only without the speed-up).
        def plain_header(header: str, *args: Any, **kwargs: Any) -> str:
            path = os.path.join(directory, "headers", header.replace("/", "_"))
            if not os.path.exists(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(f"#include <{header}>\n")
            return path

    def load(blob: bytes) -> Any:
        previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        probe = precompile_header = None
        if directory is not None:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory
            precompile_header = codecache._precompile_header
            # Patched for this load only, restored below.
            codecache._precompile_header = plain_header  # type: ignore[assignment]  # a plain function for torch's lru_cache'd one
            if recorded is not None:
                probe = cpu_vec_isa.valid_vec_isa_list
                cpu_vec_isa.valid_vec_isa_list = lambda: recorded  # type: ignore[assignment]  # a plain function for torch's lru_cache'd one
        try:
            return pickle.loads(blob).after_deserialization()
        finally:
            if probe is not None:
                cpu_vec_isa.valid_vec_isa_list = probe
            if precompile_header is not None:
                codecache._precompile_header = precompile_header
            if directory is not None:
                if previous is None:
                    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
                else:
                    os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous

    return load


def _dynamo_installed_runtime() -> Any:
    """Emitted verbatim into installed artifacts: what installing a package onto the live
    code objects needs, and a compile-refusing callback bound to one callable (torch 2.13
    has none: a process-global stance would also stop other code from compiling)."""
    import types as _types

    import torch._dynamo
    from torch._C._dynamo.eval_frame import (
        _debug_get_cache_entry_list,
        _debug_get_precompile_entries,
        _reset_precompile_entries,
    )
    from torch._dynamo import convert_frame, trace_rules
    from torch._dynamo.eval_frame import OptimizeContext
    from torch._dynamo.package import CompilePackage, _lookup_code
    from torch._dynamo.types import ConvertFrameReturn

    class CompileRefused(RuntimeError):
        """A frame of an installed artifact missed every captured variant."""

    def refusing_callback(inner: Any, eager_codes: set[Any]) -> Any:
        def callback(frame: Any, *args: Any, **kwargs: Any) -> Any:
            code = frame.f_code
            if (
                code in eager_codes
                or trace_rules.check(code)
                or not convert_frame.has_tensor_in_frame(frame)
            ):
                return ConvertFrameReturn()  # run this frame eagerly, as the capture did
            failures = []
            for i, entry in enumerate(_debug_get_precompile_entries(code)):
                info = entry.guard_manager.check_verbose(frame.f_locals)
                parts = list(getattr(info, "verbose_code_parts", None) or [])
                shown = guard_failure_text(str(parts[0])) if parts else "a guard failed"
                failures.append(f"variant {i}: {shown}")
            raise CompileRefused(
                f"{frame_label(code.co_name)} ({code.co_filename}:{frame.f_lineno}) would need "
                f"a new compile; {'; '.join(failures) or 'no captured variant'}"
            )

        callback._torchdynamo_orig_backend = getattr(inner, "_torchdynamo_orig_backend", inner)  # type: ignore[attr-defined]  # Dynamo reads it off the callback function
        return callback

    class Backend:
        """What ``CompilePackage.install`` wants per backend id."""

        def __init__(self, fn: Any) -> None:
            self.fn = fn

        def after_deserialization(self) -> Any:
            return self.fn

    def target_codes(package: Any) -> list[Any]:
        return [_lookup_code(e) if e.code_source else c for c, e in package._codes.items()]

    def uninstall(package: Any, targets: list[Any]) -> None:
        # CompilePackage.uninstall pops each global once per code that installed it, and
        # fails on an import alias two frames share; remove each once, idempotently.
        for module, names in package._installed_globals.items():
            for name in set(names):
                module.__dict__.pop(name, None)
        package._installed_globals.clear()
        for code in targets:
            _reset_precompile_entries(code)

    return _types.SimpleNamespace(
        CompilePackage=CompilePackage,
        OptimizeContext=OptimizeContext,
        optimize=torch._dynamo.optimize,
        config=torch._dynamo.config,
        CompileRefused=CompileRefused,
        refusing_callback=refusing_callback,
        Backend=Backend,
        target_codes=target_codes,
        uninstall=uninstall,
        live_entries=_debug_get_cache_entry_list,
        precompile_entries=_debug_get_precompile_entries,
    )


# ---------------------------------------------------------------- single graph: what a trace read
# The make_fx side of "every call is checked": torch internals the single-graph capture
# and its artifacts use to see what a trace depended on besides its tensors.

#: Bound in single-graph artifacts: torch's global module hook dicts, in the order
#: ``precompile.state_checks.global_hooks_fingerprint`` reads them.
SINGLE_GRAPH_STATE_PRELUDE = """\
import torch.nn.modules.module as _torch_nn_module

_GLOBAL_MODULE_HOOKS = (
    _torch_nn_module._global_forward_pre_hooks,
    _torch_nn_module._global_forward_hooks,
    _torch_nn_module._global_backward_pre_hooks,
    _torch_nn_module._global_backward_hooks,
    _torch_nn_module._global_forward_hooks_with_kwargs,
    _torch_nn_module._global_forward_hooks_always_called,
)
"""


def global_module_hooks() -> tuple[dict[Any, Any], ...]:
    """The dicts behind ``torch.nn.modules.module.register_module_forward_hook`` and
    friends, as SINGLE_GRAPH_STATE_PRELUDE binds them."""
    import torch.nn.modules.module as m

    return (
        m._global_forward_pre_hooks,
        m._global_forward_hooks,
        m._global_backward_pre_hooks,
        m._global_backward_hooks,
        m._global_forward_hooks_with_kwargs,
        m._global_forward_hooks_always_called,
    )


def tracing_probes() -> dict[str, Callable[[], bool]]:
    """The functions that answer "is a trace or compile running?" by the expression a
    user writes: true in a trace where eager says false, so a branch on one bakes the
    branch eager never takes."""
    import torch.compiler
    import torch.fx._symbolic_trace as symbolic_trace
    import torch.jit

    probes: dict[str, Any] = {
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "torch.compiler.is_dynamo_compiling()": torch.compiler.is_dynamo_compiling,
        "torch.compiler.is_exporting()": torch.compiler.is_exporting,
        "torch.fx._symbolic_trace.is_fx_tracing()": symbolic_trace.is_fx_tracing,
        "torch.fx._symbolic_trace.is_fx_symbolic_tracing()": getattr(
            symbolic_trace, "is_fx_symbolic_tracing", None
        ),
        "torch.jit.is_tracing()": torch.jit.is_tracing,
        "torch._utils.is_compiling()": getattr(torch._utils, "is_compiling", None),
    }
    external = sys.modules.get("torch._dynamo.external_utils")
    if external is not None:
        probes["torch._dynamo.is_compiling()"] = getattr(external, "is_compiling", None)
    return {name: f for name, f in probes.items() if isinstance(f, types.FunctionType)}


def fake_mode(**kwargs: Any) -> Any:
    """A fake-tensor mode that refuses operators without a fake kernel. By default
    FakeTensorMode runs such an operator's real kernel on zero-filled inputs for a few
    namespaces (``aten``, ``quantized``, ...): the output shapes it takes from zeros
    would be baked into the graph, right or not."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True, allow_fallback_kernels=False, **kwargs)


@contextlib.contextmanager
def recording_grad_access(counts: Callable[[types.FrameType], bool]) -> Iterator[list[str]]:
    """Record reads and writes of ``.grad`` on fake tensors made by code for which
    ``counts(frame)`` is true, while active. A trace starts with no gradients on its fake
    parameters, so code that reads them (gradient clipping, an optimizer step, a
    ``zero_grad``) saw none: the artifact must serve only calls that have none either."""
    from torch._subclasses.fake_tensor import FakeTensor

    native = torch._C.TensorBase.__dict__["grad"]
    seen: list[str] = []

    def note(what: str) -> None:
        frame = sys._getframe(2)
        if counts(frame):
            seen.append(f"{what} at {frame.f_code.co_filename}:{frame.f_lineno}")

    def get(self: Any) -> Any:
        note("read")
        return native.__get__(self)

    def set_(self: Any, value: Any) -> None:
        note("write")
        native.__set__(self, value)

    def delete(self: Any) -> None:
        note("delete")
        native.__delete__(self)

    with _stack_patch_lock:
        # A class-level property over the C descriptor, for the block.
        FakeTensor.grad = property(get, set_, delete)  # type: ignore[assignment]  # stubs type it as the value
        try:
            yield seen
        finally:
            del FakeTensor.grad


def dim_marks(t: torch.Tensor) -> dict[str, Any]:
    """The Dynamo dim marks on ``t`` besides plain mark_unbacked: ``mark_dynamic`` dims,
    ``mark_unbacked(..., strict=True)`` dims (torch keeps them apart from the other
    unbacked dims) and ``specialize_on`` criteria."""
    return {
        "dynamic": sorted(getattr(t, "_dynamo_dynamic_indices", None) or ()),
        "strict": sorted(getattr(t, "_dynamo_strict_unbacked_indices", None) or ()),
        "specialize_on": {
            d: list(v) for d, v in (getattr(t, "_specialize_on", None) or {}).items() if v
        },
    }


def inductor_layout_config() -> Any:
    """While lowering a single graph: Inductor's size/stride asserts on, whatever
    ``TORCHINDUCTOR_SIZE_ASSERTS`` says (the artifact's layout checks must not depend on
    the capturing process's environment); and random ops (``torch.rand``, dropout) as
    calls of torch's own, which draw exactly eager's numbers from the generator --
    Inductor's own random kernels draw others, and it cannot lower a make_fx graph's
    random ops at all without torch.compile's seed-replacing pass."""
    from torch._inductor import config

    return config.patch(size_asserts=True, fallback_random=True)


# ---------------------------------------------------------------- AOTAutograd


class _Flat(torch.nn.Module):
    """A module with no state whose forward is ``fn``: what AOTAutograd's export takes.
    The user's modules stay out of it (``fn`` swaps their state for its inputs)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self._fn = fn

    def forward(self, *flat: Any) -> Any:
        return self._fn(*flat)


def _descriptor(desc: Any) -> tuple[str, int | None]:
    """An AOTAutograd input/output descriptor as plain data: ("input", i),
    ("output", i), ("saved", i), ("tangent", output i), ("grad", of input i), or
    (its class name, None) for anything else -- which the caller refuses."""
    from torch._functorch._aot_autograd import descriptors as d

    if desc is None:
        return ("none", None)
    if isinstance(desc, d.PlainAOTInput):
        return ("input", desc.idx)
    if isinstance(desc, d.PlainAOTOutput):
        return ("output", desc.idx)
    if isinstance(desc, d.SavedForBackwardsAOTOutput):
        return ("saved", desc.idx)
    if isinstance(desc, d.TangentAOTInput) and isinstance(desc.output, d.PlainAOTOutput):
        return ("tangent", desc.output.idx)
    if isinstance(desc, d.GradAOTOutput) and isinstance(desc.grad_of, d.PlainAOTInput):
        return ("grad", desc.grad_of.idx)
    return (type(desc).__name__, None)


def trace_joint(
    fn: Callable[..., Any],
    fakes: list[Any],
    decompositions: dict[Any, Callable[..., Any]] | None,
) -> dict[str, Any]:
    """Trace ``fn``'s forward and backward with AOTAutograd (its joint trace and default
    partition) on the fake ``fakes``, the way torch.compile does for a training graph.
    Returns the two graphs and AOTAutograd's view of the call as plain data."""
    from torch._functorch.aot_autograd import (
        aot_compile_joint_with_descriptors,
        aot_export_joint_with_descriptors,
    )

    graphs: dict[str, torch.fx.GraphModule] = {}

    def recording(kind: str) -> Callable[..., Any]:
        def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            graphs[kind] = gm
            return gm

        return compiler

    with contextlib.ExitStack() as stack:
        joint = aot_export_joint_with_descriptors(
            stack, _Flat(fn), tuple(fakes), decompositions=decompositions
        )
        meta = joint._aot_state.fw_metadata
        aot_compile_joint_with_descriptors(
            joint, fw_compiler=recording("forward"), bw_compiler=recording("backward")
        )
    if "backward" not in graphs:
        raise RuntimeError("AOTAutograd traced no backward graph for this call")
    forward, backward = graphs["forward"], graphs["backward"]
    forward_outputs = forward.graph.output_node()
    backward_outputs = backward.graph.output_node()
    return {
        "forward": forward,
        "backward": backward,
        "mutated_inputs": [
            i
            for i, info in enumerate(meta.input_info)
            if info.mutates_data or info.mutates_metadata or info.mutates_storage_metadata
        ],
        "output_kinds": [info.output_type.name for info in meta.output_info],
        "output_requires_grad": [bool(info.requires_grad) for info in meta.output_info],
        "intermediate_bases": meta.num_intermediate_bases,
        "effects": bool(meta.tokens) or bool(meta.num_backward_tokens),
        "forward_outputs": [_descriptor(x) for x in forward_outputs.meta.get("desc", [])],
        "forward_output_count": _output_count(forward_outputs),
        "backward_inputs": [
            _descriptor(n.meta.get("desc")) for n in backward.graph.nodes if n.op == "placeholder"
        ],
        "backward_outputs": [_descriptor(x) for x in backward_outputs.meta.get("desc", [])],
        "backward_output_count": _output_count(backward_outputs),
    }


def _output_count(output: torch.fx.Node) -> int:
    values = output.args[0]
    return len(values) if isinstance(values, (tuple, list)) else 1


def compile_inductor_backward(gm: torch.fx.GraphModule, fakes: list[Any]) -> str:
    """Lower an AOTAutograd backward graph with Inductor; return its output module."""
    from torch._inductor.compile_fx import compile_fx_inner

    with _fake_mode_of(fakes):
        compiled = compile_fx_inner(gm, fakes, is_backward=True)
    source = getattr(compiled, "source_code", None)
    if not isinstance(source, str):
        raise RuntimeError("Inductor produced no Python output module for this graph")
    return source


def inductor_decompositions() -> dict[Any, Callable[..., Any]]:
    """Inductor's decomposition table (what its lowering wants a graph traced with)."""
    from torch._inductor.decomposition import select_decomp_table

    return dict(select_decomp_table())


def inductor_autograd_config() -> Any:
    """``inductor_layout_config`` for a forward and backward lowered separately: with
    Inductor's layout optimization off, the forward hands the backward its saved tensors
    in the layout the backward graph was traced (and lowered) for. torch.compile instead
    retraces the backward with the forward's actual output strides."""
    from torch._inductor import config

    return config.patch(size_asserts=True, layout_optimization=False, fallback_random=True)
