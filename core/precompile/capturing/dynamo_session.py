"""Multi-graph capture: run ``fn`` for real under Dynamo with a CompilePackage, as many
calls as the user makes, and turn what Dynamo compiled into frame records.

Each frame is a code object Dynamo compiled: the entry, every graph-break continuation
(reached from the frame ahead of it by a resume name), and -- for installed serving,
part 2 -- functions the entry calls. A frame's variants are (serialized guards,
transformed bytecode) pairs, one per recompile.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib
import inspect
import os
import shutil
import sys
import tempfile
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from precompile._compat import dict_keys, dynamo, inductor
from precompile.capturing import neutral_reads
from precompile.capturing.dynamo_dependencies import DependencyRecorder
from precompile.capturing.function_records import function_records
from precompile.errors import Location, PrecompileError, generator_input_refusal
from precompile.locations import (
    StackFrame,
    codepoint_column,
    definition_location,
    innermost,
    is_project_file,
    is_user_file,
    traceback_user_stack,
)
from precompile.runtime import multigraph, state_checks
from precompile.tracers import DynamoTracer


@dataclasses.dataclass
class GraphBreak:
    """One graph-break site: Dynamo logs a break once per compile that meets it; we keep
    one record per (break type, innermost user location)."""

    gb_type: str
    gb_id: str | None
    doc_link: str | None
    explanation: str
    hints: list[str]
    frame: str
    user_stack: list[StackFrame]
    count: int = 1

    @property
    def location(self) -> Location | None:
        return innermost(self.user_stack)

    def to_dict(self) -> dict[str, Any]:
        location = self.location
        return {
            "reason": self.gb_type,
            "gb_id": self.gb_id,
            "doc_link": self.doc_link,
            "explanation": self.explanation,
            "hints": self.hints,
            "frame": self.frame,
            "location": None if location is None else location.to_dict(),
            "user_stack": [f.to_dict() for f in self.user_stack],
            "count": self.count,
        }


@dataclasses.dataclass
class GuardDecision:
    """What happened to one guard of one variant when it was serialized.

    ``compare_key`` tells whether two variants guarded the same value (identity for the
    identity guards); ``unpicklable`` marks a kept guard whose value cannot be serialized.
    Neither leaves the capturing process.
    """

    name: str
    guard_type: str
    kept: bool
    dropped_by: str | None  # "default" (identity guard), "driver" (global state), "user"
    value: str | None
    compare_key: Any = None
    unpicklable: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("name", "guard_type", "kept", "dropped_by", "value")}


@dataclasses.dataclass
class FrameRecord:
    """A compiled code object and everything serving it needs (see module docstring)."""

    code: types.CodeType
    python_module: str
    is_entry: bool
    resume_names: list[str]
    import_sources: dict[str, str]
    variants: list[tuple[bytes, Any]]  # (guards_state, SerializedCode of the bytecode)
    backend_ids: list[str]
    code_source: str | None
    bypassed: bool
    bypass_reason: str | None
    eager_fallback: bool
    eager_reason: str | None
    trivial: bool
    truncated: bool
    guards: list[list[GuardDecision]]
    #: Every global Dynamo bound into the frame's module while compiling it.
    installed_globals: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Per variant, the dicts its guards name keys of by position
    #: (``_compat.dict_keys.positional_dicts``), for the load to name them by key.
    dict_keys: list[list[dict[str, Any]]] = dataclasses.field(default_factory=list)
    #: Per variant, why stride guards stay (``[path or None, why]``: a layout query its
    #: Python made, an input Inductor cannot take as a copy; ``_compat.dynamo.
    #: relaxing_unread_strides``), and why a library value's guard stays (``[path,
    #: why]``: ``_compat.dynamo.relaxing_neutral_guards``).
    layout_notes: list[list[list[str | None]]] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return self.code.co_name

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "file": self.code.co_filename,
            "line": self.code.co_firstlineno,
            "module": self.python_module,
            "entry": self.is_entry,
            "variants": len(self.variants),
            "resume_names": list(self.resume_names),
            "bypassed": self.bypassed,
            "bypass_reason": self.bypass_reason,
            "eager_fallback": self.eager_fallback,
            "eager_reason": self.eager_reason,
            "trivial": self.trivial,
            "truncated": self.truncated,
            "reached_by_call": self.code_source is not None,
        }


def _raised_inside_torch(error: BaseException) -> str | None:
    """``file:line`` of a failed internal assertion of Dynamo or Inductor, or None. Other
    errors raised inside torch (a shape mismatch met while tracing) are the user's to fix."""
    if not isinstance(error, AssertionError):
        return None
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return None
    root = os.path.dirname(torch.__file__) + os.sep
    filename = tb.tb_frame.f_code.co_filename
    if not filename.startswith((root + "_dynamo" + os.sep, root + "_inductor" + os.sep)):
        return None
    return f"torch/{filename[len(root):]}:{tb.tb_lineno}"


def _describe_value(value: Any) -> str:
    """A guarded value, described without process-specific details (no addresses)."""
    if isinstance(value, (type(None), bool, int, float, str)):
        return repr(value)[:200]
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)} {value.dtype}"
    return type(value).__qualname__


def _compare_key(value: Any) -> Any:
    """Equal for the same guarded value in two variants: literals by value, tensors by
    metadata, anything else by identity (what an identity guard compares)."""
    if isinstance(value, (type(None), bool, int, float, str)):
        return (type(value), value)
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype, value.device)
    return ("id", id(value))


def _picklable(value: Any) -> bool:
    """Whether a guarded value can go into an artifact; used to name the access path when
    Dynamo's own guard pickler refuses one."""
    import pickle

    if isinstance(value, (type(None), bool, int, float, str, torch.Tensor, torch.nn.Module)):
        return True
    if isinstance(value, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)):
        return True  # Dynamo's guard pickler saves these by reference
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


def _gave_up_reason(message: str) -> str:
    """The break that made Dynamo give up on a frame: the last one in a chained message,
    as 'type: explanation'."""
    last = message.split("another graph break occurred: ***")[-1]
    lines = [line.strip() for line in last.strip().splitlines() if line.strip()]
    explanation = next(
        (t.removeprefix("Explanation:").strip() for t in lines if t.startswith("Explanation:")), ""
    )
    return f"{lines[0]}: {explanation}" if lines and explanation else (lines[0] if lines else "")


def _explanation_and_hints(message: str) -> tuple[str, list[str]]:
    explanation, hints = "", []
    for line in message.splitlines():
        text = line.strip()
        if text.startswith("Explanation:"):
            explanation = text.removeprefix("Explanation:").strip()
        elif text.startswith("Hint:"):
            hints.append(text.removeprefix("Hint:").strip())
        elif text.startswith("*** While handling this graph break"):
            break
    return explanation, hints


def _user_stack(summaries: list[Any]) -> list[StackFrame]:
    frames = []
    for s in summaries:
        if not is_user_file(s.filename):
            continue
        column = codepoint_column(s.filename, s.lineno, getattr(s, "colno", None))
        frames.append(StackFrame(s.filename, s.lineno, column, s.name))
    return frames


def _dedupe_breaks(events: list[dict[str, Any]]) -> list[GraphBreak]:
    breaks: dict[tuple[Any, ...], GraphBreak] = {}
    for event in events:
        gb_type = event["gb_type"] or event["message"].splitlines()[0]
        stack = _user_stack(event["stack"])
        where = innermost(stack)
        key = (gb_type, None if where is None else (where.file, where.line, where.column))
        if key in breaks:
            breaks[key].count += 1
            continue
        gb_id, link = dynamo.graph_break_link(gb_type)
        explanation, hints = _explanation_and_hints(event["message"])
        breaks[key] = GraphBreak(
            gb_type=gb_type,
            gb_id=gb_id,
            doc_link=link,
            explanation=explanation,
            hints=hints,
            frame=event["code"].co_name,
            user_stack=stack,
        )
    return list(breaks.values())


def check_dynamo_fn(fn: Callable[..., Any]) -> types.FunctionType:
    """A Dynamo artifact rebuilds fn's frames inside fn's own module in another process:
    fn must be a plain module-level function of an importable module. Returns ``fn``,
    known to be one."""
    code = getattr(fn, "__code__", None)
    where = definition_location(code) if code else None
    if not isinstance(fn, types.FunctionType):
        raise PrecompileError(
            f"the Dynamo tracer captures plain functions, got {type(fn).__name__}",
            location=where,
            hint="wrap the call in a module-level function: def run(model, x): return model(x)",
        )
    code = fn.__code__
    module = fn.__module__
    if module == "__main__":
        raise PrecompileError(
            f"{fn.__qualname__} is defined in the running script (__main__), which no other "
            f"process can import, so its artifact could never be loaded",
            location=where,
            hint="move the function into an importable module and import it from the script",
        )
    if code.co_freevars and hasattr(fn, "__wrapped__"):
        context_manager = "ctx_factory" in code.co_freevars
        wrapped = getattr(fn.__wrapped__, "__code__", None)
        raise PrecompileError(
            f"{fn.__qualname__} is wrapped by a decorator"
            + (" (a context manager used as one, like @torch.no_grad())" if context_manager else "")
            + "; an artifact rebuilds the entry from its module, and the decorator's "
            "wrapper is a closure it cannot recreate",
            invariant=1,
            location=definition_location(wrapped) if wrapped else where,
            hint=(
                "remove the decorator and enter the context inside the function body "
                "(with torch.no_grad(): ...)"
                if context_manager
                else "capture the undecorated function, and apply what the decorator does "
                "inside it or around the loaded artifact"
            ),
        )
    if code.co_freevars:
        raise PrecompileError(
            f"{fn.__qualname__} closes over {list(code.co_freevars)}; an artifact rebuilds the "
            f"entry from its module and cannot recreate closure cells",
            invariant=1,
            location=where,
            hint="make it a module-level function and pass what it closes over as arguments",
        )
    try:
        imported = importlib.import_module(module)
    except ImportError as error:
        raise PrecompileError(
            f"{fn.__qualname__}'s module {module!r} is not importable ({error})",
            location=where,
            hint="capture functions from modules on sys.path",
        ) from error
    owner: Any = imported
    for part in fn.__qualname__.split("."):
        owner = getattr(owner, part, None)
    if owner is not fn:
        raise PrecompileError(
            f"{fn.__qualname__} is not reachable as {module}.{fn.__qualname__} (a nested or "
            f"decorated function); an artifact finds its entry by that name",
            location=where,
            hint="capture a module-level function",
        )
    if code in _OPEN_CAPTURES:
        raise PrecompileError(
            f"{fn.__qualname__} is being captured already: another capture of it is still "
            f"open in this process",
            location=where,
            hint="finish the first capture's with-block before starting the next",
        )
    compiled, installed = dynamo.live_compiles(code)
    if installed:
        raise PrecompileError(
            f"{fn.__qualname__} serves an installed precompile artifact in this process; "
            f"a capture would run that artifact instead of capturing",
            location=where,
            hint="unload it first (runnable.unload()), or capture in another process",
        )
    if compiled:
        raise PrecompileError(
            f"{fn.__qualname__} holds live code from a torch.compile of it in this process "
            f"({compiled} compiled entries); Dynamo would reuse that code instead of "
            f"capturing",
            location=where,
            hint="capture before compiling it, in another process, or call "
            "torch._dynamo.reset() to drop that compile first",
        )
    return fn


#: Entry code objects with a capture open in this process.
_OPEN_CAPTURES: set[types.CodeType] = set()


def _input_versions(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int]:
    """The version counters of the tensors among fn's arguments (an in-place write
    bumps one)."""
    from precompile._compat.tracing import pytree

    leaves = pytree.tree_leaves((args, kwargs))
    return [t._version for t in leaves if isinstance(t, torch.Tensor)]


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal up to the rounding of another kernel (an Inductor one, a fused fast path):
    what a compile-only branch changes (padded rows, a skipped step) is far outside."""
    if not (got.is_floating_point() or got.is_complex()):
        return bool(torch.equal(got, want))
    scale = float(want.detach().abs().nan_to_num(0.0, 0.0, 0.0).max()) if want.numel() else 0.0
    return torch.allclose(got, want, rtol=1e-3, atol=1e-3 * max(1.0, scale), equal_nan=True)


def compile_only_branch_check(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    result: Any,
    rng: torch.Tensor,
    sites: list[dict[str, Any]],
) -> None:
    """Library code branched on an "am I being traced?" probe that Dynamo answers True
    and eager False (``nn.TransformerEncoder`` skips its nested-tensor fast path under
    ``torch.compiler.is_compiling()``): the graph holds the compile-only branch. Most
    such branches skip a check or pick an equivalent kernel; to tell, fn runs once more
    eagerly on the same inputs (same RNG state), and a result that differs is refused
    at capture, naming the branch. An inference capture only: a training step run twice
    would step twice."""
    from precompile._compat.tracing import pytree

    after = torch.random.get_rng_state()
    torch.random.set_rng_state(rng)
    try:
        expected = torch.compiler.disable(fn)(*args, **kwargs)
    finally:
        torch.random.set_rng_state(after)
    got_leaves, got_spec = pytree.tree_flatten(result)
    want_leaves, want_spec = pytree.tree_flatten(expected)
    difference: str | None = None
    if got_spec != want_spec:
        difference = "another output structure"
    for got, want in zip(got_leaves, want_leaves):
        if difference is not None:
            break
        if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
            got, want = got.detach(), want.detach()
            if got.is_nested or want.is_nested:
                difference = "a nested tensor where the other has none"
            elif got.shape != want.shape or got.dtype != want.dtype:
                difference = f"shape {tuple(got.shape)} vs {tuple(want.shape)}"
            elif not _close(got, want):
                gap = (got.double() - want.double()).abs().nan_to_num(float("inf")).max()
                difference = f"values up to {float(gap):.3g} apart"
        elif type(got) is not type(want) or (not isinstance(got, torch.Tensor) and got != want):
            difference = f"{got!r} vs {want!r}"
    if difference is None:
        return
    site = sites[0]
    through = f" (through {', '.join(site['returned'])})" if site["returned"] else ""
    raise PrecompileError(
        f"{site['code']} ({site['file']}:{site['line']}) branches on {site['probe']}"
        f"{through}, which is True while Dynamo captures and False in eager: the graph "
        f"holds the library's compile-only branch, and on the capture's own inputs it "
        f"answers differently from eager ({difference}), so the artifact would serve "
        f"what eager never computes",
        invariant=3,
        location=Location(site["file"], site["line"], 0),
        hint="configure the library so that it does not reach that test (for "
        "nn.TransformerEncoder: enable_nested_tensor=False), or call that part of "
        "the model outside fn",
    )


def _refusal_inside(error: BaseException) -> PrecompileError | None:
    """A PrecompileError that a backend raised and Dynamo wrapped (its cause chain or
    ``inner_exception``)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, PrecompileError):
            return current
        seen.add(id(current))
        current = getattr(current, "inner_exception", None) or current.__cause__
    return None


class DynamoSession:
    """The running capture: Dynamo, its package, and what we record around it.

    A capture is hermetic: ``close()`` removes what it compiled onto the program's code
    objects, so the process's Dynamo state is left as the capture found it.
    """

    def __init__(self, fn: Callable[..., Any], tracer: DynamoTracer, backend: str, training: bool):
        self.fn = check_dynamo_fn(fn)
        self.tracer = tracer
        self.backend = backend
        self.training = training
        self.package = dynamo.new_package(fn)
        #: Every code object traced into a graph (frames and what they inlined).
        self.traced_codes: dict[types.CodeType, None] = {}
        dynamo.recording_traced_code(self.package, self.traced_codes)
        self.inductor_graphs: list[torch.fx.GraphModule] = []
        #: (what the Inductor backend returned, what its calls check of their inputs)
        self.input_checks: list[tuple[Any, dict[str, Any]]] = []
        self.kernel_runtime: Any = None  # compiles and remembers inlined modules' kernels
        self.guard_log: dict[types.CodeType, list[list[GuardDecision]]] = {}
        #: Per frame and variant, the dicts whose keys its guards name by position.
        self.dict_key_log: dict[types.CodeType, list[list[dict[str, Any]]]] = {}
        #: (dict, key position) where the trace found a traced key (``key in D``).
        self.sourced_key_reads: set[tuple[str, int | None]] = set()
        self.recompiles: list[dict[str, Any]] = []
        self.bypass_reasons: dict[str, str] = {}
        self._guard_failures: dict[str, list[str]] = {}
        self.break_events: list[dict[str, Any]] = []
        self.calls = 0
        self.global_state = dynamo.global_state()
        #: The torch modes active around the first captured call; every other call
        #: must run under the same ones (an artifact serves one set).
        self.ambient_modes: tuple[str, ...] | None = None
        self._touched: dict[types.CodeType, bool] = {}
        self.dependencies = DependencyRecorder(self.fn)
        self.installed_globals: dict[types.CodeType, dict[str, Any]] = {}
        #: serialized guard state -> why its stride guards stay.
        self.layout_notes: dict[bytes, list[list[str | None]]] = {}
        #: Whether a subgraph compiled since the last guards were built needs every
        #: input as captured (it bakes a view of the strides, or nothing copies for it).
        self._layout_bound_graph = False
        #: Sources whose strides a subgraph compiled since then needs as captured, and why.
        self._layout_kept: dict[Any, str] = {}
        # Inductor compiles into a private cache; its files become the kernel cache.
        self.inductor_cache = (
            tempfile.mkdtemp(prefix="precompile-capture-") if backend == "inductor" else None
        )
        if self.inductor_cache:
            # Removed when the process ends, not with the capture: Inductor keeps loaded
            # kernels in memory by source, and a later capture in this process that
            # compiles the same kernel is handed the module loaded from this directory.
            atexit.register(shutil.rmtree, self.inductor_cache, True)
        self.compiled = dynamo.optimize(
            fn,
            self._eager_backend if backend == "eager" else self._inductor_backend,
            package=self.package,
            guard_filter_fn=self._filter,
            guard_fail_fn=self._on_recompile,
            dynamic=tracer.dynamic,
            touched=self._touched,
        )
        _OPEN_CAPTURES.add(fn.__code__)

    def close(self) -> None:
        """End the capture: what it compiled onto the program's code objects goes (what
        it recorded stays, for emitting). Idempotent."""
        if self.fn.__code__ in _OPEN_CAPTURES:
            _OPEN_CAPTURES.discard(self.fn.__code__)
            dynamo.forget_compiled(self._touched)
            self._touched.clear()

    def _eager_backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from precompile.capturing import graph_layouts

        # A Dynamo subgraph holds torch calls as the code made them (``reshape`` stays
        # ``reshape``), so it runs on any layout as eager does; one holding an ATen view
        # that depends on strides (``graph_layouts``) keeps its frame's stride guards.
        if graph_layouts.kept_views(gm):
            self._layout_bound_graph = True
        return gm.forward

    def _relax_strides(self, reads: list[str]) -> dict[Any, str] | None:
        """Which stride guards of the frame whose guards are being built stay (None:
        all). All stay where the frame's Python queried a layout (Dynamo folded the
        answer: a branch eager could take otherwise) or a subgraph of it bakes a view of
        the capture's strides. Else none under the eager backend (FX code runs on any
        layout); under Inductor, whose kernels index by the captured strides, those of
        the inputs a copy in the captured layout would not serve (``_layout_copies``),
        the others being copied per call."""
        bound, self._layout_bound_graph = self._layout_bound_graph, False
        kept, self._layout_kept = self._layout_kept, {}
        return None if reads or bound else kept

    def _layout_copies(self, gm: torch.fx.GraphModule) -> list[list[int] | None]:
        """Per input of a subgraph Inductor lowers, the strides its kernels are compiled
        for, where a call's tensor in another layout is served through a copy in that
        layout (``lowered_inputs.check_inputs``); None where it is not a tensor or a copy
        would not serve it exactly, whose stride guard then stays, with why: the graph
        writes it in place or an output views it (``graph_layouts.copy_blockers``), a
        parameter or buffer (taken as captured, as make_fx artifacts do), symbolic
        strides."""
        from precompile.capturing import graph_layouts

        sources = dynamo.placeholder_source_objects(gm)
        fakes = [n.meta.get("example_value") for n in gm.graph.find_nodes(op="placeholder")]
        try:
            blockers = graph_layouts.copy_blockers(dynamo.aliasing_graph(gm), 0)
        except Exception:  # not traceable as ATen here: every stride guard stays
            self._layout_bound_graph = True
            return [None] * len(fakes)
        layouts: list[list[int] | None] = []
        for source, fake, blocker in zip(sources, fakes, blockers):
            if not isinstance(fake, torch.Tensor):
                layouts.append(None)
                continue
            path = dynamo.source_path(source) or ""
            strides = list(fake.stride())
            why = (
                f"a copy in the captured layout would not serve it: {blocker}"
                if blocker
                else "Inductor's kernels take parameters and buffers in the captured layout"
                if "._parameters[" in str(getattr(source, "name", ""))
                or "._buffers[" in str(getattr(source, "name", ""))
                or not path
                else "its strides are symbolic"
                if not all(isinstance(s, int) for s in strides)
                else None
            )
            if why is not None:
                if source is not None:
                    self._layout_kept[source] = why
                layouts.append(None)
            else:
                layouts.append([int(s) for s in strides])
        return layouts

    def _inductor_backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        """Every subgraph becomes inlined Inductor output modules, which a cached load
        serves by binding their kernels directly (no compiler import, no AOTAutograd):
        an inference subgraph as one module; a training subgraph, or one that switches
        grad mode, as AOTAutograd partitioned it (forward and backward modules) with
        what AOTAutograd's runtime does around them. The capture's own calls run them
        through that runtime too. A subgraph needing what that runtime does not
        reproduce (aliased outputs, tensor subclasses, ...) is compiled the way
        torch.compile compiles it and shipped as Inductor's bundled artifact."""
        from precompile.capturing import inductor_backend
        from precompile.runtime import inductor_serving

        self.inductor_graphs.append(gm)
        layouts = self._layout_copies(gm)
        if self.kernel_runtime is None:
            self.kernel_runtime = inductor_serving.inductor_runtime(None)
        if not self.training:
            inlined = inductor_backend.inline_dynamo_subgraph(gm, self.kernel_runtime)
            if inlined is not None:
                return self._checking_inputs(gm, inlined, inlined.mutated, layouts)
        try:
            compiled, record = inductor.compile_fx_recorded(gm, example_inputs)
        except Exception:  # compiled again below the way torch.compile does, or refused there
            compiled = inductor.compile_fx(gm, example_inputs)
            mutated = inductor.recorded_mutated_inputs(None, len(example_inputs))
            return self._checking_inputs(gm, compiled, mutated, layouts)
        inlined_aot = inductor_backend.inline_aot_subgraph(
            record, len(example_inputs), self.kernel_runtime
        )
        outputs = inductor.outputs_need_no_grad(record)
        if inlined_aot is None and outputs is not None:
            inlined_aot = inductor_backend.inline_no_grad_subgraph(gm, outputs, self.kernel_runtime)
        if inlined_aot is not None:
            return self._checking_inputs(gm, inlined_aot, inlined_aot.mutated, layouts)
        mutated = inductor.recorded_mutated_inputs(record, len(example_inputs))
        return self._checking_inputs(gm, compiled, mutated, layouts)

    def _checking_inputs(
        self,
        gm: torch.fx.GraphModule,
        compiled: Any,
        mutated: Any,
        layouts: list[list[int] | None] | None = None,
    ) -> Any:
        """Remember what a lowered subgraph assumes of its inputs (which inputs it writes,
        which are dynamic integers, which it takes in the captured layout), for the
        artifact to refuse a call where another input shares the memory of one it writes
        or an integer does not fit in 64 bits, and to copy a tensor passed in another
        layout into the captured one (``precompile.runtime.lowered_inputs``). The capture's own calls of an inlined module
        are checked likewise; Inductor's bundled artifact was compiled for the capture's
        own inputs, aliasing included."""
        from precompile._compat import symbolic
        from precompile.capturing.inductor_backend import InlinedAotSubgraph, InlinedSubgraph
        from precompile.runtime import lowered_inputs

        ints = dynamo.int_placeholders(gm)
        copied = layouts if layouts and any(s is not None for s in layouts) else None
        if copied and not isinstance(compiled, InlinedSubgraph | InlinedAotSubgraph):
            # Inductor's bundled artifact: the capture's own calls run it unwrapped, so
            # nothing would copy for them; its frame keeps every stride guard.
            self._layout_bound_graph = True
            copied = None
        if mutated or ints or copied:
            labels = dynamo.placeholder_sources(gm)
            spec: dict[str, Any] = {"mutated": list(mutated), "ints": ints, "labels": labels}
            if copied:
                spec["layouts"] = copied
            if ints:
                exprs, bounded = symbolic.int_expressions(gm, labels)
                if exprs:
                    spec["int_exprs"] = exprs
                if bounded:
                    spec["int_bounded"] = bounded
            self.input_checks.append((compiled, spec))
            if isinstance(compiled, InlinedSubgraph | InlinedAotSubgraph):
                compiled.run = lowered_inputs.check_inputs(compiled.run, **spec)
        return compiled

    def input_checks_by_backend(self) -> dict[str, dict[str, Any]]:
        """Backend id -> what its lowered subgraph's calls check of their inputs
        (``precompile.runtime.lowered_inputs.check_inputs``'s arguments)."""
        found = {}
        for backend_id, compiled in self.package.cached_backends.items():
            for candidate, spec in self.input_checks:
                if candidate is compiled:
                    found[backend_id] = spec
        return found

    def inlined_subgraphs(self) -> dict[str, Any]:
        """Backend id -> the subgraph's inlined Inductor output module(s)."""
        from precompile.capturing.inductor_backend import InlinedAotSubgraph, InlinedSubgraph

        return {
            backend_id: compiled
            for backend_id, compiled in self.package.cached_backends.items()
            if isinstance(compiled, InlinedSubgraph | InlinedAotSubgraph)
        }

    def _filter(self, entries: list[Any]) -> list[bool]:
        user = self.tracer.guard_filter_fn
        user_keep = list(user(entries)) if user is not None else [True] * len(entries)
        if len(user_keep) != len(entries):
            raise PrecompileError(
                f"guard_filter_fn returned {len(user_keep)} decisions for {len(entries)} guards",
                hint="return one bool per guard entry",
            )
        decisions, keep = [], []
        for entry, user_says in zip(entries, user_keep):
            dropped_by = None
            if dynamo.compares_identity(entry):
                dropped_by = "default"
            elif entry.guard_type in dynamo.DRIVER_ENFORCED_GUARD_TYPES:
                dropped_by = "driver"
            elif not user_says:
                dropped_by = "user"
            keep.append(dropped_by is None)
            has_value = getattr(entry, "has_value", False)
            decisions.append(
                GuardDecision(
                    entry.name,
                    entry.guard_type,
                    dropped_by is None,
                    dropped_by,
                    _describe_value(entry.value) if has_value else None,
                    compare_key=_compare_key(entry.value) if has_value else None,
                    unpicklable=dropped_by is None and has_value and not _picklable(entry.value),
                )
            )
        code = dynamo.current_package_code(self.package)
        self.dependencies.observe(code, dynamo.current_package_module(self.package), entries)
        if code is not None:
            variants = self.guard_log.setdefault(code, [])
            variants.append(decisions)
            self.dict_key_log.setdefault(code, []).append(
                dict_keys.positional_dicts(entries, self.sourced_key_reads)
            )
            failures = self._guard_failures.pop(code.co_name, None)
            if failures:
                self.recompiles.append(
                    {"frame": code.co_name, "variant": len(variants) - 1, "reasons": failures}
                )
        return keep

    def _on_recompile(self, failure: Any) -> None:
        """Dynamo reports each existing variant that failed; they are grouped into one
        recompile event when the frame's next variant is compiled (in ``_filter``)."""
        code = getattr(failure, "orig_code", None)
        reason = str(getattr(failure, "reason", failure))
        self._guard_failures.setdefault(getattr(code, "co_name", "?"), []).append(reason)

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        named = [
            *((f"argument {i}", a) for i, a in enumerate(args)),
            *((f"argument {k!r}", a) for k, a in kwargs.items()),
        ]
        for name, value in named:
            items = (
                value.values()
                if isinstance(value, dict)
                else value
                if isinstance(value, (list, tuple))
                else (value,)
            )
            if any(isinstance(item, torch.Generator) for item in items):
                raise generator_input_refusal(name, definition_location(self.fn.__code__))
        if dynamo.autocast_enabled():
            raise PrecompileError(
                "capture was called under torch.autocast; an artifact serves with autocast "
                "disabled, so casts must be part of the captured program",
                invariant=6,
                location=definition_location(self.fn.__code__),
                hint="enter torch.autocast inside fn instead of around the capture",
            )
        modes = state_checks.ambient_modes()
        if self.ambient_modes is None:
            self.ambient_modes = modes
        elif modes != self.ambient_modes:
            raise PrecompileError(
                f"the torch modes around the captured calls changed ({self.ambient_modes} "
                f"-> {modes}); an artifact serves one set of modes",
                invariant=6,
                hint="make every captured call under the same torch modes",
            )
        if dynamo.global_state() != self.global_state:
            raise PrecompileError(
                f"the default dtype or deterministic mode changed between captured calls "
                f"({self.global_state} -> {dynamo.global_state()}); an artifact serves one",
                invariant=6,
            )
        branches: list[dict[str, Any]] = []
        try:
            with (
                dynamo.dynamo_config(self.tracer.recompile_limit),
                dynamo.recording_graph_breaks() as events,
                dynamo.recording_bypasses(self.bypass_reasons),
                dynamo.recording_installed_globals(self.installed_globals),
                dynamo.without_guard_latency_profiling(),
                dynamo.dict_subclasses_pickled_in_storage_order(),
                dict_keys.recording_sourced_key_reads(self.sourced_key_reads),
                dynamo.recording_grad_dependent_reads(
                    self.dependencies.grad_reads,
                    self.dependencies.library_grad_reads,
                    self.dependencies.grad_flag_reads,
                ),
                dynamo.recording_compile_only_branches(branches),
                dynamo.relaxing_unread_strides(self._relax_strides, self.layout_notes),
                # ReLU.inplace where relu's input is not read again, padding_idx in a
                # graph with no grad: guards on values the graph proves harmless go.
                dynamo.relaxing_neutral_guards(
                    neutral_reads.NAMES, neutral_reads.prove_dynamo_guard, self.layout_notes
                ),
                torch.set_grad_enabled(self.training),
                inductor.inductor_capture_config(self.inductor_cache)
                if self.inductor_cache
                else contextlib.nullcontext(),
            ):
                self.dependencies.calling(args, kwargs)
                rng = torch.random.get_rng_state()
                versions = _input_versions(args, kwargs)
                try:
                    result = self.compiled(*args, **kwargs)
                finally:
                    self.break_events += events
                    self.calls += 1
                self.dependencies.verify(args, kwargs)
                library = [b for b in branches if not is_project_file(b["file"])]
                if library and not self.training and _input_versions(args, kwargs) == versions:
                    compile_only_branch_check(self.fn, args, kwargs, result, rng, library)
                return result
        except PrecompileError:
            raise
        except Exception as error:
            refused = _refusal_inside(error)
            if refused is not None:
                # A backend refused the graph (Dynamo wraps what a backend raises).
                raise refused from error
            unpicklable = self._unpicklable_paths()
            if unpicklable and "package" in str(error):
                raise self._unserializable_guards(unpicklable, error, args, kwargs) from error
            inside = _raised_inside_torch(error)
            if inside is not None:
                raise PrecompileError(
                    f"Dynamo failed while capturing {self.fn.__qualname__}: "
                    f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''} "
                    f"(raised at {inside})",
                    location=innermost(traceback_user_stack(error.__traceback__)),
                    hint="this is a limitation of torch or precompile, not an error in your "
                    "code: report it with the chained traceback",
                ) from error
            where = innermost(traceback_user_stack(error.__traceback__))
            raise PrecompileError(
                f"fn raised {type(error).__name__} while being captured under Dynamo: "
                f"{str(error).splitlines()[0] if str(error) else ''}",
                location=where,
                hint="fix the error at the location shown (fn runs for real during capture)",
            ) from error

    def _unserializable_guards(
        self, paths: list[str], error: BaseException, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> PrecompileError:
        """Guards whose values cannot be saved: named by the library objects they come
        from when a library is the cause (a model's generate(), a loss behind labels=),
        with the raw access paths and torch's words kept in ``details``."""
        libraries = sorted(
            {
                f"{type(a).__name__} (from {type(a).__module__.split('.')[0]})"
                for a in (*args, *kwargs.values())
                if isinstance(a, torch.nn.Module)
                and not is_project_file(
                    getattr(sys.modules.get(type(a).__module__), "__file__", "") or ""
                )
            }
        )
        where = definition_location(self.fn.__code__)
        details = (
            "Guards whose values cannot be serialized:\n  "
            + "\n  ".join(paths)
            + f"\n\nDynamo: {str(error).strip()[-2000:]}"
        )
        if libraries:
            return PrecompileError(
                f"Dynamo's guards on {', '.join(libraries)} read library state that cannot be "
                f"saved into an artifact",
                location=where,
                hint="capture a function that calls the model's forward only: library control "
                "flow around it (generate(), a loss computed from labels=) keeps state an "
                "artifact cannot check; loop or compute the loss around the loaded artifact",
                details=details,
            )
        shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        return PrecompileError(
            f"guards on {shown} check values that cannot be serialized into an artifact",
            location=where,
            hint="define their classes at module level, or keep them out of what fn's "
            "control flow reads",
            details=details,
        )

    def _unpicklable_paths(self) -> list[str]:
        from precompile.runtime.guard_text import user_path

        return sorted(
            {
                user_path(d.name)
                for variants in self.guard_log.values()
                for ds in variants
                for d in ds
                if d.unpicklable
            }
        )

    # ------------------------------------------------------------ after the calls

    def graph_breaks(self) -> list[GraphBreak]:
        return _dedupe_breaks(self.break_events)

    def frames(self) -> list[FrameRecord]:
        if self.calls == 0:
            raise PrecompileError(
                "nothing was captured: call the Capture with example arguments inside the "
                "with-block before it ends",
                hint="with precompile.capture(fn, ...) as cap: cap(model, x)",
            )
        from precompile.runtime.guard_text import user_path

        breaks_by_code: dict[str, list[dict[str, Any]]] = {}
        for event in self.break_events:
            breaks_by_code.setdefault(event["code"].co_name, []).append(event)
        records = []
        entry = self.package.cache_entry()
        codes = list(self.package._codes)
        for index, (code, c) in enumerate(zip(codes, entry.codes)):
            variants = [(g.guards_state, g.dynamo_code) for g in c.guarded_codes]
            positional = self.dict_key_log.get(code, [])
            if len(positional) != len(variants):
                # A record per guard filter call, a variant per guarded code: where they
                # do not pair up, no record is trusted to describe its variant's guards
                # (the positional guards stay, as Dynamo wrote them).
                positional = [[] for _ in variants]
            for (_state, dynamo_code), found in zip(variants, positional):
                if dict_keys.reads_keys_positionally(dynamo_code):
                    for r in found:
                        if not r["order"]:
                            r["order"] = True
                            r["why"] = "the compiled code reads its keys by position"
            gave_up = [e for e in breaks_by_code.get(code.co_name, []) if not variants]
            eager_reason = _gave_up_reason(gave_up[-1]["message"]) if gave_up else None
            records.append(
                FrameRecord(
                    code=code,
                    python_module=c.python_module,
                    is_entry=index == 0,
                    resume_names=list(c.function_names) if c.install_to_global else [],
                    import_sources=dict(c.import_sources),
                    variants=variants,
                    backend_ids=list(c.backend_ids),
                    code_source=c.code_source,
                    bypassed=c.bypassed,
                    bypass_reason=self.bypass_reasons.get(code.co_name) if c.bypassed else None,
                    eager_fallback=bool(gave_up) and not c.bypassed,
                    eager_reason=eager_reason,
                    trivial=not variants and not gave_up and not c.bypassed and c.has_compile_id,
                    truncated=len(variants) >= self.tracer.recompile_limit,
                    guards=self.guard_log.get(code, []),
                    installed_globals=dict(self.installed_globals.get(code, {})),
                    dict_keys=[
                        [dict(r, shown=user_path(r["dict"])) for r in found] for found in positional
                    ],
                    layout_notes=[
                        self.layout_notes.get(g.guards_state, []) for g in c.guarded_codes
                    ],
                )
            )
        return records

    def entry_coverage(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Which captured variant of the entry would serve a call, from its serialized
        guards (what the artifact checks), in this process."""
        entry = self.frames()[0]
        bound = inspect.signature(self.fn).bind(*args, **kwargs)
        bound.apply_defaults()
        managers = dynamo.variant_guard_managers(
            entry.variants, self.fn.__code__, vars(sys.modules[self.fn.__module__])
        )
        return multigraph.variant_coverage(managers, dict(bound.arguments))

    def inductor_artifacts(self, backend_ids: list[str]) -> dict[str, bytes]:
        artifacts = {}
        for backend_id in backend_ids:
            blob = inductor.inductor_backend_artifact(backend_id)
            if blob is None:
                raise PrecompileError(
                    f"Inductor recorded no serializable artifact for subgraph {backend_id}",
                    hint="capture with backend='eager', or report the model",
                )
            artifacts[backend_id] = blob
        return artifacts

    def inductor_cache_files(self, artifacts: dict[str, bytes]) -> dict[str, bytes]:
        """The private Inductor cache, as the artifacts' loader will need it."""
        inductor.complete_inductor_cache(list(artifacts.values()), self.inductor_cache or "")
        files = {}
        for directory, _, names in os.walk(self.inductor_cache or ""):
            for name in names:
                if name.endswith(".lock"):
                    continue
                path = os.path.join(directory, name)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, self.inductor_cache)] = f.read()
        return dict(sorted(files.items()))

    def backend_graphs(self) -> dict[str, torch.fx.GraphModule]:
        """Backend id -> the FX graph Dynamo handed the eager backend."""
        graphs = {}
        for backend_id, compiled in self.package.cached_backends.items():
            gm = getattr(compiled, "__self__", None)
            if isinstance(gm, torch.fx.GraphModule):
                graphs[backend_id] = gm
        return graphs


def serving_mode(frames: list[FrameRecord]) -> tuple[str, str | None]:
    """Standalone when every compiled frame is the entry or a continuation reached by a
    resume name; installed otherwise (a frame reached by an ordinary call)."""
    called = [f for f in frames if not f.is_entry and f.code_source is not None and f.variants]
    if called:
        names = ", ".join(f"{f.name} ({f.python_module})" for f in called)
        return "installed", f"frames reached by an ordinary call, not a resume name: {names}"
    return "standalone", None


def function_sources(
    fn: types.FunctionType,
    frames: list[FrameRecord],
    artifact_path: str,
    traced: Sequence[types.CodeType] = (),
) -> list[dict[str, Any]]:
    """Function-level digests of the traced source: the entry, every frame's code and
    every function Dynamo inlined into a graph (``traced``: a model's ``forward``,
    helpers, hooks), so a load can refuse a changed function by name and an editor can
    tell a stale artifact from an edit elsewhere in the same file
    (``precompile.runtime.source_digest``)."""
    codes = [fn.__code__, *(frame.code for frame in frames), *traced]
    return function_records(
        [c for c in codes if not c.co_name.startswith("torch_dynamo_resume_in")], artifact_path
    )


def inlined_source_files(package: Any) -> list[str]:
    files = set()
    for source in package.cache_entry().source_info.inlined_sources:
        module = sys.modules.get(source.module)
        path = getattr(module, "__file__", None)
        if path and is_user_file(path):
            files.add(path)
    return sorted(files)


def global_recipe(name: str, value: Any, frame: str) -> list[str]:
    """How a serving process rebuilds a global Dynamo bound for a frame's bytecode or
    guards (``[kind, data]``): a module by name, a module's globals dict, a function or
    class by module and qualified name, or a small container of such values by pickled
    value. Anything else is refused: an artifact must not depend on a global it cannot
    recreate."""
    import base64
    import pickle

    if isinstance(value, types.ModuleType):
        return ["module", value.__name__]
    if isinstance(value, dict):
        module = sys.modules.get(str(value.get("__name__", "")))
        if module is not None and vars(module) is value:
            return ["module_dict", module.__name__]
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        module_name = getattr(value, "__module__", None)
        qualname = getattr(value, "__qualname__", "")
        owner: Any = sys.modules.get(module_name or "")
        for part in qualname.split("."):
            owner = getattr(owner, part, None)
        if owner is value:
            return ["object", f"{module_name}:{qualname}"]
    elif isinstance(value, (dict, list, tuple)):
        try:
            blob = pickle.dumps(value, protocol=4)
            same = pickle.loads(blob) == value
        except Exception:
            same = False
        if same:
            return ["value", base64.b64encode(blob).decode("ascii")]
    from precompile.runtime.guard_text import frame_label

    raise PrecompileError(
        f"Dynamo bound a helper global ({type(value).__qualname__}) into the module of "
        f"{frame_label(frame)} that its compiled code reads, and an artifact cannot "
        f"recreate it in another process",
        hint="report the model; as a workaround, move the construct that needs it "
        "(see the capture report's graph breaks) out of the captured function",
        details=f"global {name!r} = {value!r}"[:2000],
    )
