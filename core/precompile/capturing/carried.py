"""What runtime code each kind of artifact carries: the one declaration the emitters read.

An artifact carries its runtime as text (``emit.runtime_source``): whole modules of
``precompile.runtime``, or a few functions of one, and the few emitted functions of
``_compat`` that name private torch. Which ones, in which order, is declared here, one
class per artifact kind and one ``Carried`` per section of the artifact; the emitters
take a ``Carried`` and nothing else (``runtime_source`` accepts no other argument), so
adding runtime code to an artifact is an edit of this module, and
tests/core/runtime/test_runtime_interfaces.py checks that every module of ``precompile.runtime``
is carried by some kind.

Order matters only where a section's top-level code runs at load (``runtime_setup``,
the drivers' ``_build_*`` calls after the last section); functions read each other's
names when called, so within a section they may come in any order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from precompile._compat import runtime as compat_runtime
from precompile.artifact import bytecode
from precompile.runtime import (
    autograd_serving,
    class_fingerprints,
    fingerprint_differences,
    guard_text,
    hook_kinds,
    hook_records,
    hook_words,
    inductor_serving,
    lowered_inputs,
    multigraph,
    multigraph_argument_checks,
    multigraph_dependencies,
    multigraph_guards,
    multigraph_installed,
    multigraph_name_checks,
    multigraph_serving,
    multigraph_variants,
    refusal,
    setting_checks,
    single_graph,
    single_graph_ambient,
    single_graph_checks,
    single_graph_inputs,
    single_graph_keyed_inputs,
    single_graph_model_state,
    source_digest,
    state_checks,
    surface_checks,
    value_fingerprints,
    version_watch,
)


@dataclass(frozen=True)
class Carried:
    """One section of runtime code an artifact kind carries: modules (emitted whole) or
    functions and classes of them, in the order the artifact defines them."""

    kind: str
    section: str
    parts: tuple[Any, ...]


#: Every artifact raises through these and reaches the user's modules through the one
#: import-or-refuse (``runtime.refusal``).
_REFUSAL = (refusal.PrecompileError, refusal.refuse, refusal.import_user_module)


class SingleGraph:
    """make_fx's artifacts: one graph, served by ``runtime.single_graph``."""

    #: After the captured graph: the driver and the checks it runs.
    DRIVER = Carried(
        "single-graph",
        "driver",
        (
            source_digest,
            state_checks,
            hook_kinds,
            hook_words,
            value_fingerprints,
            class_fingerprints,
            hook_records,
            fingerprint_differences,
            guard_text.typed_value,
            single_graph_checks,
            setting_checks,
            version_watch,
            surface_checks,
            *_REFUSAL,
            single_graph_keyed_inputs,
            single_graph_inputs,
            single_graph_model_state,
            single_graph_ambient,
            single_graph,
        ),
    )
    #: In the imports section, where the lowered graph writes an input.
    INPUT_CHECKS = Carried("single-graph", "input checks", (lowered_inputs,))
    #: In the imports section of an eager graph served with autograd.
    EAGER_AUTOGRAD = Carried("single-graph", "eager autograd", (autograd_serving.bind_autograd,))
    #: In the imports section of an Inductor graph.
    INDUCTOR = Carried(
        "single-graph",
        "inductor",
        (inductor_serving.inductor_runtime, inductor_serving.relabel_layout_error_inductor),
    )
    #: ... and of an Inductor graph served with autograd, after ``INDUCTOR``.
    INDUCTOR_AUTOGRAD = Carried(
        "single-graph",
        "inductor autograd",
        (
            bytecode.compiled_source,
            inductor_serving.bind_inductor_module,
            autograd_serving.bind_autograd,
        ),
    )


class MultiGraph:
    """Dynamo's artifacts: several graphs and the user's bytecode between them, served by
    ``runtime.multigraph`` (standalone) or ``runtime.multigraph_installed``."""

    #: In the imports section: the Inductor modules and guard checks compile through it.
    BYTECODE = Carried("multi-graph", "bytecode", (bytecode.compiled_source,))
    #: Subgraphs lowered by Inductor: the kernel runtime, then each output module's binder.
    INDUCTOR_RUNTIME = Carried(
        "multi-graph", "inductor runtime", (inductor_serving.inductor_runtime,)
    )
    INDUCTOR_MODULES = Carried(
        "multi-graph", "inductor modules", (inductor_serving.bind_inductor_module,)
    )
    #: Subgraphs AOTAutograd partitioned into forward and backward output modules.
    AOT_GRAPHS = Carried(
        "multi-graph",
        "aot graphs",
        (autograd_serving.bind_autograd, inductor_serving.bind_aot_graph),
    )
    #: Subgraphs shipped as Inductor's bundled artifact (pickled).
    BUNDLED_INDUCTOR = Carried(
        "multi-graph", "bundled inductor", (compat_runtime.inductor_backend_loader,)
    )
    #: What each subgraph's lowering assumed of its inputs.
    INPUT_CHECKS = Carried("multi-graph", "input checks", (lowered_inputs,))

    @staticmethod
    def driver(*, plain_guards: bool, installed: bool) -> Carried:
        """The driver section: guards checked without Dynamo (``plain_guards``) or through
        its guard managers; served standalone or installed onto the live code."""
        return Carried(
            "multi-graph",
            "driver",
            (
                state_checks.autocast_state,
                state_checks.type_name,
                state_checks.ambient_modes,
                state_checks.code_fingerprint,
                state_checks.state_getter,
                # How both tracers identify a hook (hooks_fingerprint, hook_records), and
                # which hooks change nothing (hook_kinds).
                hook_kinds,
                hook_words,
                value_fingerprints,
                hook_records,
                fingerprint_differences,
                *_REFUSAL,
                single_graph_ambient.check_ambient_modes,
                single_graph_ambient.warn_inference_grad,
                single_graph_ambient.nan_detection_on,
                single_graph_ambient.refuse_nan_detection,
                single_graph_ambient.refuse_forward_ad_inputs,
                single_graph_inputs.warn_layout_copy,
                source_digest,
                guard_text,
                compat_runtime.disown_cleanup_hooks,
                compat_runtime.guards_rebuilt_as_captured,
                *(
                    (multigraph_guards, compat_runtime.plain_serving_runtime)
                    if plain_guards
                    else (compat_runtime.dict_keys_by_name, compat_runtime.dynamo_serving_runtime)
                ),
                version_watch,
                surface_checks,
                setting_checks,
                multigraph_argument_checks,
                multigraph_name_checks,
                multigraph_dependencies,
                multigraph_variants,
                multigraph_serving,
                multigraph,
                *(
                    (compat_runtime.dynamo_installed_runtime, multigraph_installed)
                    if installed
                    else ()
                ),
            ),
        )


class CaptureTime:
    """Runtime the capture itself executes as an artifact would (not an artifact kind:
    ``inductor_backend`` runs an inlined AOT subgraph through the text a load runs)."""

    AOT_BINDER = Carried(
        "capture",
        "aot binder",
        (
            *_REFUSAL,
            single_graph_ambient.nan_detection_on,
            single_graph_ambient.refuse_nan_detection,
            bytecode.compiled_source,
            autograd_serving.bind_autograd,
            inductor_serving.bind_inductor_module,
            inductor_serving.bind_aot_graph,
        ),
    )


#: Every declared section, for the checks (tests/core/runtime/test_runtime_interfaces.py).
def every_section() -> list[Carried]:
    sections = [
        value
        for kind in (SingleGraph, MultiGraph, CaptureTime)
        for value in vars(kind).values()
        if isinstance(value, Carried)
    ]
    sections += [
        MultiGraph.driver(plain_guards=p, installed=i) for p in (True, False) for i in (True, False)
    ]
    return sections
