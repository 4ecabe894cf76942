"""The backends a Dynamo capture hands each subgraph to, and what they remember for the
artifact: the eager backend (FX code as Dynamo made it), the Inductor backend (inlined
output modules, AOTAutograd partitions, or Inductor's bundled artifact, with what their
calls check of their inputs), and which stride guards of a frame the subgraphs it
compiled let go (``relax_strides``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Any, cast

import torch

from precompile._compat import dynamo, inductor
from precompile.capturing.dynamo_capture import DynamoGraphs
from precompile.capturing.dynamo_frames import FrameRecord
from precompile.errors import PrecompileError


class DynamoBackends:
    """One capture's backend (``backend``: "eager" or "inductor") and its records.

    ``compile`` is what Dynamo calls with each subgraph; ``inductor_graphs``,
    ``input_checks``, ``kernel_runtime`` and the package's cached backends are what the
    artifact's graphs section is built from.
    """

    def __init__(self, package: Any, backend: str, training: bool):
        self.package = package
        self.backend = backend
        self.training = training
        self.inductor_graphs: list[torch.fx.GraphModule] = []
        #: (what the Inductor backend returned, what its calls check of their inputs)
        self.input_checks: list[tuple[Any, dict[str, Any]]] = []
        self.kernel_runtime: Any = None  # compiles and remembers inlined modules' kernels
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
        self.compile = self.eager_backend if backend == "eager" else self.inductor_backend

    def eager_backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from precompile.capturing import graph_layouts

        # A Dynamo subgraph holds torch calls as the code made them (``reshape`` stays
        # ``reshape``), so it runs on any layout as eager does; one holding an ATen view
        # that depends on strides (``graph_layouts``) keeps its frame's stride guards.
        if graph_layouts.kept_views(gm):
            self._layout_bound_graph = True
        return gm.forward

    def relax_strides(self, reads: list[str]) -> dict[Any, str] | None:
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

    def inductor_backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
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

    def graphs(self, frames: list[FrameRecord]) -> DynamoGraphs:
        """The graphs as the artifact ships them; refuses an eager graph the artifact
        cannot express (``graph_source``) and a subgraph Inductor left no artifact for."""
        # Imported here, as the artifact is built: importing the session stays light.
        from precompile._compat.kernel_platform import kernel_platform
        from precompile.capturing.dynamo_graph_sections import (
            backend_order,
            eager_graph_section,
            graph_source,
            inductor_graph_section,
        )
        from precompile.capturing.inductor_backend import (
            InlinedAotSubgraph,
            InlinedSubgraph,
            collect_kernels,
        )

        order = backend_order(frames)
        if self.backend == "eager":
            graphs = self.backend_graphs()
            graph_sources = [graph_source(i, graphs[b]) for i, b in enumerate(order) if b in graphs]
            ops = sum(
                1
                for b in order
                if b in graphs
                for n in graphs[b].graph.nodes
                if n.op == "call_function"
            )

            def graph_section(
                names: dict[str, str], tensor_guards: dict[str, Any] | None = None
            ) -> str:
                return eager_graph_section(frames, graphs, names)

            collect_bundle: Any = lambda namespace: {}  # noqa: E731
        else:
            inlined = self.inlined_subgraphs()
            artifacts = self.inductor_artifacts([b for b in order if b not in inlined])
            modules = {
                b: sub.source for b, sub in inlined.items() if isinstance(sub, InlinedSubgraph)
            }
            aot_graphs = {
                b: (sub.spec, sub.forward, sub.backward)
                for b, sub in inlined.items()
                if isinstance(sub, InlinedAotSubgraph)
            }
            graph_sources = [gm.code for gm in self.inductor_graphs]
            ops = sum(
                1 for gm in self.inductor_graphs for n in gm.graph.nodes if n.op == "call_function"
            )

            input_checks = self.input_checks_by_backend()

            def graph_section(
                names: dict[str, str], tensor_guards: dict[str, Any] | None = None
            ) -> str:
                # Where the frames' guards prove an input's sizes and strides per call,
                # its Inductor assert goes (InlinedSubgraph.proven_source).
                shipped = {
                    b: cast("InlinedSubgraph", inlined[b]).proven_source(
                        tensor_guards[b], input_checks.get(b, {}).get("layouts")
                    )
                    if tensor_guards and b in tensor_guards
                    else source
                    for b, source in modules.items()
                }
                return inductor_graph_section(
                    frames, shipped, aot_graphs, artifacts, names, input_checks
                )

            files = self.inductor_cache_files(artifacts) if artifacts else {}

            def collect_bundle(namespace: dict[str, Any]) -> dict[str, Any]:
                bundle: dict[str, Any] = {"requires": kernel_platform()}
                if files:
                    bundle["inductor_cache_files"] = files
                if inlined:
                    slim = all(sub.slim for sub in inlined.values())
                    bundle.update(collect_kernels(self.kernel_runtime, slim))
                return bundle

        return DynamoGraphs(
            order=order,
            sources=graph_sources,
            ops=ops,
            graphs=[*self.backend_graphs().values(), *self.inductor_graphs],
            lowered=self.inductor_graphs,
            section=graph_section,
            bundle=collect_bundle,
        )
