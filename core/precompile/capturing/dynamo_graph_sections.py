"""The graphs section of a multi-graph (Dynamo) artifact: each subgraph Dynamo compiled,
bound by its backend id under the names ``dynamo_emit`` normalized. The eager backend's
graphs as FX source (``eager_graph_section``); Inductor's as output modules, AOTAutograd
partitions, bundled artifacts and the input checks their lowering assumed
(``inductor_graph_section``). ``backend_order`` is the one order of backend ids, by frame,
that both sections and the report count in.
"""

from __future__ import annotations

import base64
import builtins
import math
import operator
from typing import Any

import torch

from precompile._compat.prelude import FX_GRAPH_GLOBALS, INDUCTOR_PRELUDE
from precompile.capturing import carried
from precompile.capturing.dynamo_frames import FrameRecord
from precompile.capturing.emit import runtime_source
from precompile.errors import PrecompileError

_KNOWN_GLOBALS = {"torch", "device", "inf", "nan", "NoneType", "fx_pytree", "pytree"}
#: Standard-library modules whose functions a graph may call by value (FX binds
#: ``operator.abs`` as ``_operator_abs``): bound again from the module by name.
_STDLIB_FUNCTIONS = {"operator": operator, "_operator": operator, "math": math}


def graph_source(index: int, gm: torch.fx.GraphModule) -> str:
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            raise PrecompileError(
                f"a Dynamo subgraph holds {node.op} {node.target!r} (a module or constant "
                f"baked into the graph), which the eager artifact cannot express yet",
                invariant=1,
                hint="pass that tensor or module as an argument of fn",
            )
    code = gm.graph.python_code(root_module="self")
    unknown: set[str] = set()
    bound: list[str] = []
    for name, value in sorted(code.globals.items()):
        if name in _KNOWN_GLOBALS or getattr(builtins, name, None) is value:
            # A builtin the graph calls by name (``getattr(y, 'mT')``, Dynamo's node for
            # a tensor property) is the same builtin in the artifact.
            continue
        home = _STDLIB_FUNCTIONS.get(str(getattr(value, "__module__", None)))
        attribute = str(getattr(value, "__name__", ""))
        if home is not None and getattr(home, attribute, None) is value:
            # ``abs(y)`` is ``operator.abs`` in the graph, bound by FX as ``_operator_abs``.
            bound.append(f"{name} = __import__({home.__name__!r}).{attribute}")
            continue
        unknown.add(name)
    if unknown:
        raise PrecompileError(
            f"a Dynamo subgraph references {sorted(unknown)}, which an artifact cannot import; "
            f"this is a precompile limitation, please report it"
        )
    graph = code.src.strip().replace("def forward(self", f"def _dynamo_graph_{index}(self", 1)
    return "\n".join([*bound, graph])


def eager_graph_section(
    frames: list[FrameRecord], graphs: dict[str, torch.fx.GraphModule], names: dict[str, str]
) -> str:
    """Each Dynamo subgraph as FX source, and the table binding it to its backend id."""
    order = backend_order(frames)
    missing = [b for b in order if b not in graphs]
    if missing:
        raise PrecompileError(
            f"Dynamo compiled subgraphs {missing} that the capture did not record"
        )
    sources = [graph_source(i, graphs[b]) for i, b in enumerate(order)]
    table = "\n".join(
        f"    {names[b]!r}: functools.partial(_dynamo_graph_{i}, None),"
        for i, b in enumerate(order)
    )
    return "\n".join(
        [
            "# ---- captured graphs: each Dynamo subgraph as FX source, by backend id",
            FX_GRAPH_GLOBALS,
            "\n\n\n".join(sources),
            "",
            "",
            "_BACKEND_FNS = {",
            table,
            "}",
        ]
    )


def _text_literal(text: str) -> str:
    """A string literal that reads like the text: one literal per line, concatenated."""
    return "\n".join(f"        {line!r}" for line in text.splitlines(keepends=True))


def inductor_graph_section(
    frames: list[FrameRecord],
    modules: dict[str, str],
    aot_graphs: dict[str, tuple[dict[str, Any], str, str | None]],
    artifacts: dict[str, bytes],
    names: dict[str, str],
    input_checks: dict[str, dict[str, Any]] | None = None,
) -> str:
    """Each Dynamo subgraph through Inductor: an inference subgraph as its output module;
    a training subgraph, or one that switches grad mode, as the forward and backward
    output modules AOTAutograd partitioned it into, with the spec of what AOTAutograd's
    runtime does around them (``_INDUCTOR_AOT_GRAPHS``). Both are executed at load with
    their kernels bound from the cache (or compiled from the modules' kernel source
    without one). A subgraph that runtime cannot reproduce ships as Inductor's bundled
    artifact (pickled), rebuilt at load from the cache's files or by compiling the kernel
    source it carries."""
    order = backend_order(frames)
    parts = []
    if modules or aot_graphs:
        parts += [
            "# ---- captured graphs: each subgraph as Inductor output modules",
            INDUCTOR_PRELUDE,
            runtime_source(carried.MultiGraph.INDUCTOR_RUNTIME),
            "",
            "",
            runtime_source(carried.MultiGraph.INDUCTOR_MODULES),
            "",
            "",
            '_INDUCTOR = inductor_runtime(globals().get("_PRECOMPILE_BUNDLE"))',
            "_BACKEND_FNS = {}",
        ]
    else:
        parts.append("_BACKEND_FNS = {}")
    if modules:
        rows = "\n".join(
            f"    {names[b]!r}: (\n{_text_literal(modules[b])}\n    ),"
            for b in order
            if b in modules
        )
        parts += [
            "",
            "# inference subgraphs: one output module each",
            "_INDUCTOR_MODULES = {",
            rows,
            "}",
            "_BACKEND_FNS.update(",
            "    (backend_id, bind_inductor_module(backend_id, source, _INDUCTOR.resolve))",
            "    for backend_id, source in _INDUCTOR_MODULES.items()",
            ")",
        ]
    if aot_graphs:
        rows = "\n".join(
            f"    {names[b]!r}: (\n        {aot_graphs[b][0]!r},\n"
            f"{_text_literal(aot_graphs[b][1])},\n"
            + (f"{_text_literal(backward)}," if (backward := aot_graphs[b][2]) else "        None,")
            + "\n    ),"
            for b in order
            if b in aot_graphs
        )
        parts += [
            "",
            "# subgraphs AOTAutograd partitioned: (runtime spec, forward module, backward module)",
            runtime_source(carried.MultiGraph.AOT_GRAPHS),
            "",
            "",
            "_INDUCTOR_AOT_GRAPHS = {",
            rows,
            "}",
            "_BACKEND_FNS.update(",
            "    (backend_id, bind_aot_graph(backend_id, *graph, _INDUCTOR.resolve))",
            "    for backend_id, graph in _INDUCTOR_AOT_GRAPHS.items()",
            ")",
        ]
    if artifacts:
        rows = "\n".join(
            f"    {names[b]!r}: {base64.b64encode(artifacts[b]).decode('ascii')!r},"
            for b in order
            if b in artifacts
        )
        parts += [
            "",
            "# ---- captured graphs: other subgraphs as Inductor's bundled artifact (pickled)",
            runtime_source(carried.MultiGraph.BUNDLED_INDUCTOR),
            "",
            "",
            "_INDUCTOR_ARTIFACTS = {",
            rows,
            "}",
            '_load_backend = inductor_backend_loader(globals().get("_PRECOMPILE_BUNDLE"))',
            "_BACKEND_FNS.update(",
            "    (backend_id, _load_backend(base64.b64decode(blob)))",
            "    for backend_id, blob in _INDUCTOR_ARTIFACTS.items()",
            ")",
        ]
    checked = {b: input_checks[b] for b in order if input_checks and b in input_checks}
    if checked:
        rows = "\n".join(f"    {names[b]!r}: {spec!r}," for b, spec in checked.items())
        parts += [
            "",
            "# what each subgraph's lowering assumed of its inputs, checked per call: the",
            "# inputs it writes share memory with no other input, dynamic integers fit int64",
            runtime_source(carried.MultiGraph.INPUT_CHECKS),
            "",
            "",
            "_INPUT_CHECKS = {",
            rows,
            "}",
            "_BACKEND_FNS.update(",
            "    (backend_id, check_inputs(_BACKEND_FNS[backend_id], **spec))",
            "    for backend_id, spec in _INPUT_CHECKS.items()",
            ")",
        ]
    return "\n".join(parts)


def backend_order(frames: list[FrameRecord]) -> list[str]:
    order: list[str] = []
    for frame in frames:
        for backend_id in frame.backend_ids:
            if backend_id not in order:
                order.append(backend_id)
    return order
