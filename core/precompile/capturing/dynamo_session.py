"""Multi-graph capture: run ``fn`` for real under Dynamo with a CompilePackage, as many
calls as the user makes, and record what Dynamo compiled: the frame records
(``dynamo_frames``), through the backends (``dynamo_backends``) and the dependency
recorders (``dynamo_dependencies``), refusing what ``dynamo_refusals`` names. A finished
session hands one record, ``DynamoCapture`` (``finish``), to the emitter.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from precompile._compat import (
    dict_keys,
    dynamo,
    dynamo_guard_relaxing,
    dynamo_recording,
    inductor,
)
from precompile.capturing import call_context, neutral_reads, user_state
from precompile.capturing.dynamo_backends import DynamoBackends
from precompile.capturing.dynamo_capture import DynamoCapture
from precompile.capturing.dynamo_dependencies import DependencyRecorder
from precompile.capturing.dynamo_frames import (
    FrameRecord,
    GraphBreak,
    GuardDecision,
    compare_key,
    dedupe_breaks,
    describe_value,
    gave_up_reason,
    inlined_source_files,
    picklable,
    serving_mode,
)
from precompile.capturing.dynamo_refusals import (
    OPEN_CAPTURES,
    check_dynamo_fn,
    compile_only_branch_check,
    input_versions,
    names_grad_switch,
    raised_inside_torch,
    refusal_inside,
    refuse_grad_mode_left_off,
    refuse_process_hashes,
    refuse_replayed_global_hook_stores,
    refuse_tracing_probes,
)
from precompile.errors import PrecompileError, generator_input_refusal
from precompile.locations import (
    definition_location,
    innermost,
    is_project_file,
    traceback_user_stack,
)
from precompile.runtime import multigraph_variants, state_checks
from precompile.tracers import DynamoTracer


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
        self.guard_log: dict[types.CodeType, list[list[GuardDecision]]] = {}
        #: Per frame and variant, the dicts whose keys its guards name by position.
        self.dict_key_log: dict[types.CodeType, list[list[dict[str, Any]]]] = {}
        #: (dict, key position) where the trace found a traced key (``key in D``).
        self.sourced_key_reads: set[tuple[str, int | None]] = set()
        self.recompiles: list[dict[str, Any]] = []
        self.bypass_reasons: dict[str, str] = {}
        #: Settings Dynamo folded (``dynamo_recording.FOLDED_SETTINGS``) -> FILE:LINE.
        self.folded_settings: dict[tuple[str, str], str] = {}
        self._guard_failures: dict[str, list[str]] = {}
        self.break_events: list[dict[str, Any]] = []
        self.calls = 0
        self.global_state = dynamo.global_state()
        #: The torch modes active around the first captured call; every other call
        #: must run under the same ones (an artifact serves one set).
        self.ambient_modes: tuple[str, ...] | None = None
        self._touched: dict[types.CodeType, bool] = {}
        self.dependencies = DependencyRecorder(self.fn)
        # An inference artifact serves forward hooks that only mark grad (hook_snapshot).
        self.dependencies.hooks.inference = not training
        self.installed_globals: dict[types.CodeType, dict[str, Any]] = {}
        #: serialized guard state -> why its stride guards stay.
        self.layout_notes: dict[bytes, list[list[str | None]]] = {}
        #: The backend Dynamo hands each subgraph to, and what it remembers of them.
        self.backends = DynamoBackends(self.package, backend, training)
        self.compiled = dynamo.optimize(
            fn,
            self.backends.compile,
            package=self.package,
            guard_filter_fn=self._filter,
            guard_fail_fn=self._on_recompile,
            dynamic=tracer.dynamic,
            touched=self._touched,
        )
        OPEN_CAPTURES.add(fn.__code__)

    def close(self) -> None:
        """End the capture: what it compiled onto the program's code objects goes (what
        it recorded stays, for emitting). Idempotent."""
        if self.fn.__code__ in OPEN_CAPTURES:
            OPEN_CAPTURES.discard(self.fn.__code__)
            dynamo.forget_compiled(self._touched)
            self._touched.clear()

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
            elif entry.guard_type in dynamo.DRIVER_ENFORCED_GUARD_TYPES or (
                dynamo.on_global_hooks(entry)
            ):
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
                    describe_value(entry.value) if has_value else None,
                    compare_key=compare_key(entry.value) if has_value else None,
                    unpicklable=dropped_by is None and has_value and not picklable(entry.value),
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
        stores: list[dict[str, Any]] = []
        hashes: list[str] = []
        try:
            with (
                dynamo.dynamo_config(self.tracer.recompile_limit),
                dynamo_recording.recording_graph_breaks() as events,
                dynamo_recording.recording_bypasses(self.bypass_reasons),
                dynamo_recording.recording_installed_globals(self.installed_globals),
                dynamo.without_guard_latency_profiling(),
                dynamo.dict_subclasses_pickled_in_storage_order(),
                dynamo.guard_examples_pickled_as_read(),
                dict_keys.recording_sourced_key_reads(self.sourced_key_reads),
                # `HAS in CFG` with HAS absent: `HAS not in CFG`, not all of CFG's keys;
                # `CFG["k"]` that raised KeyError: `"k" not in CFG`, not no guard.
                dict_keys.guarding_absent_keys(),
                dynamo_recording.recording_grad_dependent_reads(
                    self.dependencies.grad_reads,
                    self.dependencies.library_grad_reads,
                    self.dependencies.grad_flag_reads,
                ),
                dynamo_recording.recording_compile_only_branches(branches),
                dynamo_recording.recording_replayed_stores(stores),
                dynamo_recording.guarding_what_fn_asks(hashes, self.folded_settings),
                dynamo_guard_relaxing.relaxing_unread_strides(
                    self.backends.relax_strides, self.layout_notes
                ),
                # ReLU.inplace where relu's input is not read again, padding_idx in a
                # graph with no grad: guards on values the graph proves harmless go.
                dynamo_guard_relaxing.relaxing_neutral_guards(
                    neutral_reads.NAMES,
                    neutral_reads.prove_dynamo_guard,
                    self.layout_notes,
                    # gradient_checkpointing-style flags: read only under training.
                    neutral_reads.read_only_under_training_cached,
                    neutral_reads.PURE_TRUTH_TYPES,
                    # Each flag relaxed, recorded in MODULE_HOOKS to be checked by the
                    # kind of its truth test per call.
                    self.dependencies.hooks.relaxed_flags,
                    # A property that only returns an attribute passes its truth test on.
                    neutral_reads.forwarded_truth,
                ),
                torch.set_grad_enabled(self.training),
                inductor.inductor_capture_config(self.backends.inductor_cache)
                if self.backends.inductor_cache
                else contextlib.nullcontext(),
            ):
                self.dependencies.calling(args, kwargs)
                rng = torch.random.get_rng_state()
                versions = input_versions(args, kwargs)
                entered = call_context.snapshot()
                try:
                    result = self.compiled(*args, **kwargs)
                finally:
                    self.break_events += events
                    self.calls += 1
                call_context.refuse_left_changed(entered, self.fn)
                refuse_replayed_global_hook_stores(stores)
                refuse_process_hashes(hashes, self.fn)
                self.dependencies.verify(args, kwargs)
                library = [b for b in branches if not is_project_file(b["file"])]
                switches = names_grad_switch(self.traced_codes)
                if (
                    (library or switches)
                    and not self.training
                    and input_versions(args, kwargs) == versions
                ):
                    # fn's extra eager runs store for real again (a hook's append): the
                    # user's state is put back to what the captured call left, eager's.
                    with user_state.restored(user_state.capture_roots(self.fn, (args, kwargs))):
                        if switches:
                            refuse_grad_mode_left_off(self.fn, args, kwargs, rng)
                        if library:
                            compile_only_branch_check(self.fn, args, kwargs, result, rng, library)
                return result
        except PrecompileError:
            raise
        except Exception as error:
            refused = refusal_inside(error)
            if refused is not None:
                # A backend refused the graph (Dynamo wraps what a backend raises).
                raise refused from error
            unpicklable = self._unpicklable_paths()
            pickling = dynamo.raised_pickling_guards(error)
            if unpicklable and ("package" in str(error) or pickling):
                raise self._unserializable_guards(unpicklable, error, args, kwargs) from error
            if pickling:
                raise PrecompileError(
                    "a value Dynamo's guards on fn check cannot be saved into an artifact: "
                    f"{str(error).splitlines()[0] if str(error) else type(error).__name__}",
                    location=definition_location(self.fn.__code__),
                    hint="keep values that cannot be pickled (locks, files, connections) out "
                    "of what fn's control flow reads: read them outside fn and pass the result "
                    "in, or capture with the make_fx tracer",
                ) from error
            inside = raised_inside_torch(error)
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
        return dedupe_breaks(self.break_events)

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
            eager_reason = gave_up_reason(gave_up[-1]["message"]) if gave_up else None
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
        return multigraph_variants.variant_coverage(managers, dict(bound.arguments))

    def finish(self) -> DynamoCapture:
        """What the capture recorded, as the one record its artifact and report are made
        from. Refuses, in this order: a capture with no call, a project branch on a
        tracing probe, a graph the backend cannot ship (``DynamoBackends.graphs``), the
        dependencies the recorders refuse; the emitter refuses what is left (default
        arguments, helper globals)."""
        from precompile.capturing.dynamo_name_records import module_hooks, traced_function_rows
        from precompile.capturing.fx_process_state import (
            StateRead,
            lowered_graph_reads,
            state_records,
        )
        from precompile.capturing.library_surface import record_dynamo_surface

        frames = self.frames()
        breaks = self.graph_breaks()
        codes = (*self.traced_codes, *self.dependencies.read_codes)
        refuse_tracing_probes(list(codes))
        graphs = self.backends.graphs(frames)
        files = sorted(
            {f.code.co_filename for f in frames} | set(inlined_source_files(self.package))
        )
        recorded = self.dependencies.metadata(list(codes))
        dependencies = {
            **recorded,
            "TRACED_FUNCS": traced_function_rows(
                codes,
                self.dependencies.names.read_functions,
                self.dependencies.identities.code_functions(),
                module_hooks(
                    [
                        *(
                            v
                            for v in self.dependencies.paths.arguments.values()
                            if isinstance(v, torch.nn.Module)
                        ),
                        *self.dependencies.paths.global_modules.values(),
                    ]
                ),
            ),
            # An eager graph calls each torch function per call, under the settings
            # of the call; a lowered one holds the kernel its settings chose.
            "PROCESS_STATE": state_records(
                {
                    **{
                        StateRead(module, name, True): site
                        for (module, name), site in self.folded_settings.items()
                    },
                    **lowered_graph_reads(
                        graphs.lowered,
                        f"{self.fn.__code__.co_filename}:{self.fn.__code__.co_firstlineno}",
                    ),
                }
            ),
            "LIBRARY_SURFACE": record_dynamo_surface(
                self.fn,
                graphs.graphs,
                list(codes),
                self.dependencies.classes,
                lowered=graphs.lowered,
            ),
        }
        return DynamoCapture(
            fn=self.fn,
            backend=self.backend,
            training=self.training,
            global_state=self.global_state,
            ambient_modes=self.ambient_modes or (),
            package=self.package,
            frames=frames,
            graph_breaks=breaks,
            recompiles=list(self.recompiles),
            codes=codes,
            graphs=graphs,
            serving_mode=serving_mode(frames)[0],
            source_files=[f for f in files if not f.startswith("<")],
            dependencies=dependencies,
        )
