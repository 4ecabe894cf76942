"""The Inductor backend: lower a captured graph, inline Inductor's output module, and
cache its compiled kernels.

The generated module stays in python_code as real code, so python_code alone runs (its
kernels compile from the inlined source when it is executed). Only its
``from torch._inductor... import`` lines are rewritten into ``_inductor_import(...)``
calls, which the artifact's runtime resolves: to the real names, or -- with a cache whose
kernels suit this machine -- to light stand-ins and prebuilt kernels, so that serving
imports no compiler and compiles nothing.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import re
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from precompile._compat import inductor
from precompile._compat.kernel_platform import kernel_platform
from precompile._compat.prelude import ARTIFACT_PRELUDE, INDUCTOR_PRELUDE
from precompile.capturing import carried
from precompile.capturing.emit import LoweredGraph, runtime_source
from precompile.capturing.fx_trace import SingleGraph
from precompile.errors import PrecompileError
from precompile.runtime import autograd_serving, inductor_serving

_IMPORT = re.compile(r"^from (torch\._inductor[\w.]*) import (.+)$")
_TRAILER = ("def get_args():", "def benchmark_compiled_module(", 'if __name__ == "__main__":')


def rewrite_inductor_module(source: str) -> tuple[str, bool]:
    """Route the module's Inductor imports through ``_inductor_import`` and drop its
    benchmarking trailer. Also say whether the light (slim) resolution can serve it:
    only when nothing else in it names ``torch._inductor``."""
    out: list[str] = []
    slim = True
    for line in source.splitlines():
        if line.startswith(_TRAILER):
            break
        match = _IMPORT.match(line)
        if match and "(" not in line:
            module = match.group(1)
            for item in match.group(2).split(","):
                name, _, alias = item.strip().partition(" as ")
                out.append(f"{alias or name} = _inductor_import({module!r}, {name!r})")
            continue
        if "torch._inductor" in line:
            slim = False
        out.append(line)
    return "\n".join(out).rstrip() + "\n", slim


def _graph_fakes(graph: SingleGraph) -> list[Any]:
    return [n.meta["val"] for n in graph.graph_module.graph.nodes if n.op == "placeholder"]


def lower_inductor(graph: SingleGraph) -> LoweredGraph:
    if graph.grad_inputs:
        return _lower_autograd(graph)
    fakes = _graph_fakes(graph)
    try:
        functional = inductor.functional_retrace(graph.graph_module, fakes)
        # Read before compiling: Inductor's passes rewrite the graph in place, and its
        # reinplacing folds a write through a view (``x[0] = 5.0``: ``copy_(x,
        # select_scatter(...))``) into the kernel, leaving no ``copy_`` to find.
        mutated = inductor.mutated_placeholders(functional)
        with inductor.inductor_layout_config():
            source = inductor.compile_inductor(functional, fakes)
    except PrecompileError:
        raise
    except Exception as error:
        raise _lowering_refusal(error) from error
    section, slim = rewrite_inductor_module(source)
    if len(fakes) == len(graph.lifted.tensors) + len(graph.user_tensors):
        section = drop_proven_size_asserts(section, fakes)
    return dataclasses.replace(_lowered(section, slim), mutated_inputs=mutated)


#: Where a graph input's size/stride assert stood in ``call``, the statement as a comment
#: (the graph's code stays readable), and the data a benchmark replays as Inductor's call.
PROVEN_ASSERT = "# proven by the driver per call: "
PROVEN_ASSERTS_NAME = "_PROVEN_SIZE_ASSERTS"


def drop_proven_size_asserts(
    section: str, fakes: list[Any], proven: Sequence[bool] | None = None
) -> str:
    """Turn into comments the size/stride asserts of ``call`` on its graph inputs that the
    driver proves on every call before the graph runs; keep every other. ``proven`` is
    the caller's proof, per graph input (None: the single-graph driver's, below); with
    it, an input that is not a static tensor or not proven keeps its assert and the
    others may still go (``dynamo_proven_inputs``: the Dynamo driver's frame guards).

    Each ``assert_size_stride`` costs about 0.4 us (the MLP's five: 2 us, most of the
    driver's own cost again). The driver compares every graph input's shape and strides
    with the capture's before ``call`` runs, on every path, where the graph is static:
    the parameters and buffers (``single_graph_model_state``: a C-level guard built from
    tensors that matched the captured shapes and ``GRAPH_INPUT_STRIDES``, else that
    comparison) and the user's tensors (``single_graph_inputs``: likewise, and an input
    in another layout is copied into the captured one or refused). So only where every
    graph input's shape and strides are plain ints (no ``mark_unbacked`` dim: then the
    driver leaves some strides to these asserts), and only an assert that is a top-level
    statement of ``call`` naming one graph input with exactly that input's traced sizes
    and strides. The asserts on intermediate buffers, ``assert_alignment`` and everything
    else stay. The dropped ones are listed in ``_PROVEN_SIZE_ASSERTS`` (graph input
    index, sizes, strides): nothing at run time reads it; it says what the driver
    proves, and lets a benchmark time Inductor's own call."""
    traced: list[tuple[tuple[int, ...], tuple[int, ...]] | None] = []
    for k, fake in enumerate(fakes):
        static = _static_layout(fake)
        if static is None and proven is None:
            return section
        traced.append(static if proven is None or proven[k] else None)
    if not any(traced):
        return section
    call = next(
        (
            node
            for node in ast.parse(section).body
            for node in [node, *getattr(node, "body", [])]
            if isinstance(node, ast.FunctionDef) and node.name == "call"
        ),
        None,
    )
    if call is None:
        return section
    positions: dict[str, int] = {}
    for stmt in call.body:
        if (
            isinstance(stmt, ast.Assign)
            and isinstance(stmt.value, ast.Name)
            and stmt.value.id == "args"
            and isinstance(stmt.targets[0], ast.Tuple)
        ):
            names = [e.id for e in stmt.targets[0].elts if isinstance(e, ast.Name)]
            if len(names) == len(stmt.targets[0].elts) == len(traced):
                positions = {name: k for k, name in enumerate(names)}
            break
    lines = section.splitlines(keepends=True)
    dropped: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []
    for stmt in call.body:
        fact = _input_size_assert(stmt, positions)
        if fact is None or stmt.lineno != stmt.end_lineno:
            continue
        k, sizes, strides = fact
        if traced[k] is None or (sizes, strides) != traced[k]:
            continue
        line = lines[stmt.lineno - 1]
        indent = line[: len(line) - len(line.lstrip())]
        lines[stmt.lineno - 1] = f"{indent}{PROVEN_ASSERT}{line.strip()}\n"
        dropped.append(fact)
    if not dropped:
        return section
    return "".join(lines).rstrip() + f"\n\n{PROVEN_ASSERTS_NAME} = {dropped!r}\n"


def _static_layout(fake: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """A traced graph input's sizes and strides, where it is a tensor and all are ints."""
    if not isinstance(fake, torch.Tensor):
        return None
    sizes, strides = tuple(fake.shape), tuple(fake.stride())
    if not all(type(n) is int for n in (*sizes, *strides)):
        return None
    return sizes, strides


def dynamo_proven_inputs(
    inputs: Sequence[tuple[str | None, Any]],
    variants: Sequence[Sequence[dict[str, Any]]],
    layouts: Sequence[Sequence[int] | None] = (),
) -> list[bool]:
    """Per input of a Dynamo subgraph (its source's name, its traced value), whether the
    Dynamo-free driver proves its sizes and strides right before the graph runs, so
    that Inductor's assert on it can go (``drop_proven_size_asserts``).

    ``variants``: the TENSOR_MATCH specs (``guard_translation``: name, sizes, strides)
    of every variant of every frame whose code calls the subgraph. A frame's guards run
    at its entry, and its bytecode calls its graph before any other user code (a graph
    break's eager section runs after it, and the graph after the break is a resume
    frame's, guarded at that frame's entry). Proven: a static tensor that every such
    variant guards by a TENSOR_MATCH on its source with exactly its sizes and strides
    (a dynamic dim or relaxed stride is None there: not proven), or with exactly its
    sizes where the call's input check copies it into its traced strides (``layouts``,
    ``lowered_inputs.in_captured_layouts``, the stride guard relaxed for that). Only
    for the plain guard program: Dynamo's own guard manager (installed serving, or
    guards outside the plain whitelist) skips the tensor guards under a dict whose
    version tag did not change (``skip_tensor_guards_with_matching_dict_tags``), which
    ``p.data = ...`` does not change: the caller passes no proof there."""
    proven: list[bool] = []
    for k, (name, fake) in enumerate(inputs):
        static = _static_layout(fake)
        copied = layouts[k] if k < len(layouts) else None
        ok = static is not None and name is not None and bool(variants)
        for specs in variants if ok else ():
            matches = [spec for spec in specs if spec.get("name") == name]
            if not any(
                list(spec["sizes"]) == list(static[0])  # type: ignore[index]
                and (
                    list(spec["strides"]) == list(static[1])  # type: ignore[index]
                    or (copied is not None and list(copied) == list(static[1]))  # type: ignore[index]
                )
                for spec in matches
            ):
                ok = False
                break
        proven.append(ok)
    return proven


def tensor_match_specs(program: Any) -> list[dict[str, Any]]:
    """Every TENSOR_MATCH leaf's spec in a plain guard program (``guard_translation``:
    a leaf is ``["tensor", spec, verbose]``), wherever it sits in the tree."""
    found: list[dict[str, Any]] = []
    stack = [program]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            if len(item) == 3 and item[0] == "tensor" and isinstance(item[1], dict):
                found.append(item[1])
            else:
                stack.extend(item)
    return found


def _input_size_assert(
    stmt: ast.stmt, positions: dict[str, int]
) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
    """``assert_size_stride(<graph input>, (ints), (ints), ...)`` as (the input's
    position, sizes, strides); None for any other statement."""
    if not (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Name)
        and stmt.value.func.id == "assert_size_stride"
        and not stmt.value.keywords
        and len(stmt.value.args) >= 3
    ):
        return None
    target, *literals = stmt.value.args[:3]
    if not isinstance(target, ast.Name) or target.id not in positions:
        return None
    values: list[tuple[int, ...]] = []
    for literal in literals:
        if not isinstance(literal, ast.Tuple):
            return None
        ints = [
            e.value for e in literal.elts if isinstance(e, ast.Constant) and type(e.value) is int
        ]
        if len(ints) != len(literal.elts):
            return None
        values.append(tuple(ints))
    return positions[target.id], values[0], values[1]


def _lowering_refusal(error: Exception) -> PrecompileError:
    return PrecompileError(
        f"Inductor could not lower this graph: {type(error).__name__}: {str(error)[:500]}",
        invariant=4,
        hint="capture with backend='eager', or report the failing op",
    )


def _lowered(section: str, slim: bool, autograd: dict[str, Any] | None = None) -> LoweredGraph:
    runtime: tuple[carried.Carried, ...] = (carried.SingleGraph.INDUCTOR,)
    if autograd is not None:
        runtime += (carried.SingleGraph.INDUCTOR_AUTOGRAD,)
    return LoweredGraph(
        source=section,
        relabel=inductor_serving.relabel_layout_error_inductor,
        runtime=runtime,
        prelude=INDUCTOR_PRELUDE,
        runtime_setup=(
            '_INDUCTOR = inductor_runtime(globals().get("_PRECOMPILE_BUNDLE"))\n'
            "_inductor_import = _INDUCTOR.resolve\n"
        ),
        collect_bundle=lambda namespace: collect_kernels(namespace["_INDUCTOR"], slim),
        identity_outputs=identity_outputs(section),
        autograd=autograd,
    )


def _lower_autograd(graph: SingleGraph) -> LoweredGraph:
    """An inference capture whose inputs require grad: AOTAutograd's forward and
    backward graphs (traced with Inductor's decompositions), each lowered to an output
    module. The forward is inlined as the graph section (its ``call``); the backward is
    carried as text and executed in a namespace of its own (``call_backward``)."""
    from precompile.capturing.fx_autograd import capture_joint

    assert graph.joint_inputs is not None
    decompositions = {**inductor.inductor_decompositions(), **(graph.joint_inputs[2] or {})}
    joint = capture_joint(graph, decompositions)
    try:
        with inductor.inductor_autograd_config():
            forward = inductor.compile_inductor(joint.forward, joint.placeholder_values("forward"))
            backward = inductor.compile_inductor_backward(
                joint.backward, joint.placeholder_values("backward")
            )
    except PrecompileError:
        raise
    except Exception as error:
        raise _lowering_refusal(error) from error
    forward_section, forward_slim = rewrite_inductor_module(forward)
    backward_section, backward_slim = rewrite_inductor_module(backward)
    identity_outputs(backward_section)  # a backward shaped otherwise is refused
    literal = "\n".join(f"    {line!r}" for line in backward_section.splitlines(keepends=True))
    section = "\n".join(
        [
            forward_section,
            "",
            "# The captured backward graph's Inductor output module, executed in a namespace",
            "# of its own: the forward's saved values, then the outputs' gradients.",
            "_BACKWARD_MODULE = (",
            literal,
            ")",
            '_backward_graph = bind_inductor_module("backward", _BACKWARD_MODULE, '
            "_inductor_import)",
            "",
            "",
            "def call_backward(flat_inputs):",
            "    inputs = tuple(flat_inputs)",
            "    flat_inputs.clear()",
            "    return _backward_graph(*inputs)",
            "",
        ]
    )
    return _lowered(section, forward_slim and backward_slim, autograd=joint.runtime)


def identity_outputs(source: str) -> tuple[int, ...]:
    """The positions of ``call``'s results that are its input objects themselves: the
    names its first statement unpacks from ``args`` and its return tuple hands back
    unchanged. Inductor does that for an output it needs no kernel for (``x.detach()``,
    ``w.detach()``). A ``call`` shaped otherwise is refused: the driver could not tell."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == "call":
            inputs: set[str] = set()
            for stmt in node.body:
                if (
                    isinstance(stmt, ast.Assign)
                    and isinstance(stmt.value, ast.Name)
                    and stmt.value.id == "args"
                ):
                    target = stmt.targets[0]
                    elts = target.elts if isinstance(target, ast.Tuple) else [target]
                    inputs |= {e.id for e in elts if isinstance(e, ast.Name)}
            returns = [s for s in node.body if isinstance(s, ast.Return)]
            if returns and isinstance(returns[-1].value, ast.Tuple):
                return tuple(
                    i
                    for i, e in enumerate(returns[-1].value.elts)
                    if isinstance(e, ast.Name) and e.id in inputs
                )
    raise PrecompileError(
        "Inductor's output module has no recognizable call(args) returning a tuple; "
        "this is a precompile limitation with this torch version, please report it",
        hint="capture with backend='eager'",
    )


@dataclasses.dataclass
class InlinedSubgraph:
    """A Dynamo subgraph lowered to an Inductor output module that the artifact inlines;
    calling it runs that module, bound as the artifact binds it."""

    source: str
    slim: bool
    run: Callable[..., Any]
    #: The inputs the lowered graph writes (``lowered_inputs``).
    mutated: tuple[int, ...] = ()
    #: Per graph input, its Dynamo source's name (the key of its tensor guard, None
    #: without one) and traced value: what ``dynamo_proven_inputs`` proves against.
    inputs: tuple[tuple[str | None, Any], ...] = ()

    def __call__(self, *args: Any) -> Any:
        return self.run(*args)

    def proven_source(self, variants: Sequence[Sequence[dict[str, Any]]], layouts: Any) -> str:
        """The module's text with the asserts ``variants``' tensor guards (and the
        layout copies) prove turned into comments (``drop_proven_size_asserts``)."""
        proven = dynamo_proven_inputs(self.inputs, variants, layouts or ())
        if len(proven) != len(self.inputs) or not any(proven):
            return self.source
        return drop_proven_size_asserts(self.source, [v for _n, v in self.inputs], proven)


def inline_dynamo_subgraph(gm: torch.fx.GraphModule, runtime: Any) -> InlinedSubgraph | None:
    """Lower an inference subgraph to an inlined output module whose kernels ``runtime``
    compiles (and remembers for the cache), or None when it needs AOTAutograd's runtime:
    a graph that switches grad mode, or one the functional retrace cannot lower. The
    caller then compiles it the way torch.compile does."""
    if inductor.sets_grad_mode(gm):
        return None
    try:
        source, mutated = inductor.lower_dynamo_subgraph(gm)
    except Exception:  # the full Inductor path compiles it, or says why it cannot
        return None
    section, slim = rewrite_inductor_module(source)
    name = f"subgraph_{hashlib.sha256(section.encode()).hexdigest()[:12]}"
    from precompile._compat import dynamo

    sources = dynamo.placeholder_source_objects(gm)
    inputs = tuple(
        (dynamo.source_name(source), n.meta.get("example_value"))
        for source, n in zip(sources, gm.graph.find_nodes(op="placeholder"))
    )
    return InlinedSubgraph(
        section,
        slim,
        inductor_serving.bind_inductor_module(name, section, runtime.resolve),
        mutated,
        inputs,
    )


@dataclasses.dataclass
class InlinedAotSubgraph:
    """A Dynamo subgraph AOTAutograd partitioned (training, or switching grad mode): its
    forward (and backward) Inductor output modules, inlined, and the spec of what
    AOTAutograd's runtime does around them; calling it runs the artifact's own runtime
    for them (``inductor_serving.bind_aot_graph``), exactly as a load will."""

    spec: dict[str, Any]
    forward: str
    backward: str | None
    slim: bool
    run: Callable[..., Any]
    #: The inputs the lowered graphs write (``lowered_inputs``).
    mutated: tuple[int, ...] = ()

    def __call__(self, *args: Any) -> Any:
        return self.run(*args)


def inline_aot_subgraph(
    record: dict[str, Any], num_inputs: int, runtime: Any
) -> InlinedAotSubgraph | None:
    """The subgraph ``_compat.inductor.compile_fx_recorded`` compiled, as inlined output modules
    run by the artifact's runtime, or None where that runtime cannot reproduce what
    AOTAutograd does around it (the caller then ships Inductor's pickled artifact)."""
    try:
        spec = inductor.aot_runtime_spec(record, num_inputs)
    except ValueError:
        return None
    sources = dict(record["graphs"])
    forward, slim = rewrite_inductor_module(sources["forward"])
    backward = None
    if "backward" in sources:
        backward, backward_slim = rewrite_inductor_module(sources["backward"])
        slim = slim and backward_slim
    name = f"subgraph_{hashlib.sha256((forward + (backward or '')).encode()).hexdigest()[:12]}"
    run = _emitted_aot_binder()(name, spec, forward, backward, runtime.resolve)
    mutated = inductor.recorded_mutated_inputs(record, num_inputs)
    return InlinedAotSubgraph(spec, forward, backward, slim, run, mutated)


def inline_no_grad_subgraph(
    gm: torch.fx.GraphModule, num_outputs: int, runtime: Any
) -> InlinedAotSubgraph | None:
    """A subgraph of a training capture whose outputs need no gradient (the graph after
    ``loss.backward()`` returning ``loss.detach()``, say), lowered as an inference
    subgraph and run under no_grad; an output that is an input object itself is
    detached, as the traced ``detach()`` made it. None where the inference path cannot
    lower it."""
    inlined = inline_dynamo_subgraph(gm, runtime)
    if inlined is None:
        return None
    spec = {**autograd_serving.base_spec(num_outputs), "detach_outputs": True}
    name = f"subgraph_{hashlib.sha256(inlined.source.encode()).hexdigest()[:12]}"
    run = _emitted_aot_binder()(name, spec, inlined.source, None, runtime.resolve)
    return InlinedAotSubgraph(spec, inlined.source, None, inlined.slim, run, inlined.mutated)


@functools.cache
def _emitted_aot_binder() -> Callable[..., Any]:
    """``inductor_serving.bind_aot_graph`` as an artifact defines it: the text an artifact
    carries (``emit.runtime_source``), executed after the artifact's import preludes, so
    the capture runs the runtime the load will."""
    namespace: dict[str, Any] = {"__name__": "precompile_aot_runtime"}
    text = "\n\n".join(
        [
            "from __future__ import annotations",
            ARTIFACT_PRELUDE,
            INDUCTOR_PRELUDE,
            runtime_source(carried.CaptureTime.AOT_BINDER),
        ]
    )
    exec(compile(text, "<precompile aot runtime>", "exec"), namespace)
    return cast("Callable[..., Any]", namespace["bind_aot_graph"])


def collect_kernels(runtime: Any, slim: bool) -> dict[str, Any]:
    """The cache bundle: every kernel ``runtime`` compiled while the capture executed the
    inlined modules, with what those kernels need of the machine that loads them."""
    kernels = {}
    for digest, kernel in sorted(runtime.compiled.items()):
        path = getattr(getattr(kernel, "__self__", None), "__file__", None)
        if path is None:
            return {}  # a kernel we cannot locate: ship no cache rather than a partial one
        with open(path, "rb") as f:
            kernels[digest] = f.read()
    return {"kernels": kernels, "slim": slim, "requires": kernel_platform()}
