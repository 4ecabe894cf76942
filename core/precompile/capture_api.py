"""``precompile.capture``: run a function for real, and emit what ran as an artifact."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from precompile.artifact.bytecode import (
    BUNDLE_KEY,
    SOURCES_KEY,
    artifact_code,
    bytecode_entry,
    sources_entry,
)
from precompile.artifact.pair import remove_own, validate_pair, write_files
from precompile.capturing.backends import check_backend
from precompile.capturing.emit import Artifact
from precompile.capturing.function_records import input_records
from precompile.errors import PrecompileError, RiskyGuardWarning
from precompile.report import CaptureReport, PrecompileSummary
from precompile.tracers import DynamoTracer, MakeFxTracer
from precompile.write_policy import check_writes, pair_collision, pair_paths


def capture(
    fn: Callable[..., Any],
    *,
    artifact_path: str | os.PathLike[str],
    cache_path: str | os.PathLike[str],
    tracer: Any = None,
    backend: str = "inductor",
    training: bool = False,
    signing_key: Any = None,
    inputs_from: Callable[..., Any] | Iterable[Any] | None = None,
) -> Capture:
    """Capture ``fn`` into the artifact pair (python_code at ``artifact_path``, cache at
    ``cache_path``). Use as a context manager and call the result like ``fn``. The default
    tracer is ``DynamoTracer()``. With ``signing_key`` (an Ed25519 private key: a PEM
    file's path, its bytes or a key object) every write also signs the pair, writing
    ``NAME.sig`` beside the artifact together with the two files. ``inputs_from`` names
    what made the example arguments: a function (a target's ``examples``), or the code
    objects ``precompile.capturing.function_records.codes_run`` saw run while they were
    made. The artifact records their source (``INPUT_SOURCES``), so ``precompile check``
    calls the artifact stale when it changes; a load never reads it."""
    return Capture(
        fn,
        artifact_path=artifact_path,
        cache_path=cache_path,
        tracer=DynamoTracer() if tracer is None else tracer,
        backend=backend,
        training=training,
        signing_key=signing_key,
        inputs_from=inputs_from,
    )


class Capture:
    """A single-use capture session.

    Inside the ``with`` block, calling it runs ``fn`` on the real arguments and captures
    it. Under ``MakeFxTracer`` (one call) the result is served through the freshly emitted
    artifact, so side effects happen exactly once; under ``DynamoTracer`` each call runs
    for real under Dynamo and adds what it compiled. A clean exit writes the pair; a block
    that raises writes nothing new; ``save()`` writes (checkpoints) now.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        artifact_path: str | os.PathLike[str],
        cache_path: str | os.PathLike[str],
        tracer: Any,
        backend: str,
        training: bool,
        signing_key: Any = None,
        inputs_from: Callable[..., Any] | Iterable[Any] | None = None,
    ) -> None:
        self.backend = check_backend(backend)
        if not isinstance(tracer, (MakeFxTracer, DynamoTracer)):
            raise TypeError(
                f"precompile: tracer must be precompile.DynamoTracer() or "
                f"precompile.MakeFxTracer(), got {type(tracer).__name__}"
            )
        if not isinstance(training, bool):
            raise TypeError(f"precompile: training must be a bool, got {type(training).__name__}")
        self.artifact_path, cache = validate_pair(artifact_path, cache_path)
        if cache is None:
            raise PrecompileError("cache_path is required", hint="e.g. cache_path='model.cache'")
        self.cache_path = cache
        collision = pair_collision(self.artifact_path, cache)
        if collision is not None:
            raise PrecompileError(
                f"the artifact pair cannot be written: {collision}",
                hint="give the artifact a .py name, e.g. artifact_path='model.py', "
                "cache_path='model.cache'",
            )
        # Checked again at each write; now too, so a capture is not run for nothing.
        check_writes(pair_paths(self.artifact_path, cache))
        # Read now, so a bad key fails before anything runs rather than at the write.
        self._signing_key: Any = None
        if signing_key is not None:
            from precompile.artifact import signing

            self._signing_key = signing.load_private_key(signing_key)
        # Recorded now, from the source the examples were made with.
        self._input_sources = input_records(inputs_from, self.artifact_path)
        self.fn = fn
        self.tracer = tracer
        self.training = training
        self._state = "new"
        self._artifact: Artifact | None = None
        self._cache = b""
        self._runnable: Any = None
        self._session: Any = None
        self._warned_risky = False
        self._warned_main = False
        from precompile.capturing.fx_inputs import describe_fn

        self._fn_info = describe_fn(fn)
        self._report = CaptureReport(target=self._fn_info, tracer=tracer.name, backend=self.backend)

    # ------------------------------------------------------------ the session

    def __enter__(self) -> Capture:
        if self._state != "new":
            raise PrecompileError(
                "this Capture was already used; a Capture is single-use",
                hint="call precompile.capture(...) again for a new capture",
            )
        self._state = "open"
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        was_open = self._state == "open"
        self._state = "closed"
        try:
            if exc_type is None and was_open:
                self._write()
        finally:
            if self._session is not None and self._runnable is not None:
                # The in-process build (for covers() and the checkpoint) bound names into
                # the user's modules; a capture leaves them as it found them.
                self._runnable.unload()
            if self._session is not None:
                self._session.close()  # and its compiled code objects, likewise

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._state != "open":
            raise PrecompileError(
                "call the Capture inside its with-block",
                hint="with precompile.capture(fn, ...) as cap: out = cap(model, x)",
            )
        self._refuse_ambient_modes()
        if not self._warned_main:
            self._warn_main_classes([*args, *kwargs.values()])
        try:
            if isinstance(self.tracer, DynamoTracer):
                return self._call_dynamo(self.tracer, args, kwargs)
            return self._call_make_fx(self.tracer, args, kwargs)
        except PrecompileError as error:
            self._report.ok = False
            self._report.error = error.to_dict()
            self._report.summary.capture_errors.append(error.message)
            raise

    def _refuse_ambient_modes(self) -> None:
        """Refuse a capture made under a torch-function or dispatch mode (all but the
        one ``torch.set_default_device`` pushes, which the artifact records and checks
        per call). The graph would hold what the mode made of each call, and a served
        call under the same mode would run it again through the mode: neither tracer
        can promise eager's answer, so the mode must stay outside the capture."""
        import torch

        from precompile._compat import tracing
        from precompile.runtime.state_checks import ambient_modes

        traces = tracing.tracing_dispatch_modes()
        if traces or torch.compiler.is_compiling():
            raise PrecompileError(
                f"capture was called inside another trace "
                f"({', '.join(traces) or 'torch.compile / Dynamo'}); what it would record "
                f"are that trace's values, not real tensors",
                hint="call precompile.capture at top level, outside torch.compile, make_fx "
                "and fake-tensor modes",
            )
        modes = [m for m in ambient_modes() if not m.startswith("torch.set_default_device(")]
        if modes:
            raise PrecompileError(
                f"capture was called under {', '.join(modes)}; a mode sees every torch "
                f"call and may change its result, and an artifact cannot replay what it "
                f"does, under it or without it",
                invariant=6,
                hint="capture outside the mode (a call of the artifact under it is then "
                "refused, naming it), or run fn eagerly under the mode",
            )

    def _warn_main_classes(self, values: list[Any]) -> None:
        """Warn, once per capture, of an argument (a module or any of its submodules, or
        an item of a list, tuple or dict argument) whose class is defined in the running
        script (``__main__``). The artifact checks each submodule's class by the name
        another process imports it by, and no other process can import this one's
        ``__main__``: loading it anywhere else would refuse every call (``is a
        models.Net but was captured as a __main__.Net``). Said here, where it can be
        fixed, rather than first in production."""
        import torch

        found: dict[str, None] = {}
        for value in values:
            items = (
                list(value.values())
                if isinstance(value, dict)
                else list(value)
                if isinstance(value, (list, tuple))
                else [value]
            )
            for item in items:
                classes = (
                    [type(m) for m in item.modules()]
                    if isinstance(item, torch.nn.Module)
                    else [type(item)]
                )
                for cls in classes:
                    if cls.__module__ == "__main__":
                        found.setdefault(cls.__qualname__)
        if found:
            self._warned_main = True
            names = ", ".join(f"__main__.{name}" for name in found)
            warnings.warn(
                f"precompile: {names} is defined in the running script (__main__), and the "
                f"artifact checks the class of what it is passed by its importable name: "
                f"loaded in any other process (a server), it will refuse every call with "
                f"this class. Define the class in an importable module (models.py) and "
                f"import it from the script, then capture again",
                UserWarning,
                stacklevel=3,
            )

    def _call_make_fx(
        self, tracer: MakeFxTracer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if self._artifact is not None:
            raise PrecompileError(
                "the make_fx tracer captures exactly one call, and this Capture already has one",
                hint="use tracer=precompile.DynamoTracer() to capture several calls "
                "(shapes, graph breaks) into one artifact",
            )
        if kwargs:
            raise PrecompileError(
                f"the make_fx tracer captures positional calls only; got keyword arguments "
                f"{sorted(kwargs)}",
                hint="pass them positionally, or use tracer=precompile.DynamoTracer()",
            )
        self._capture_single_graph(tracer, args)
        started = time.perf_counter()
        result = self._runnable(*args)
        self._report.timings["first_call_s"] = time.perf_counter() - started
        return result

    def _call_dynamo(
        self, tracer: DynamoTracer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        from precompile.capturing.dynamo_session import DynamoSession

        started = time.perf_counter()
        if self._session is None:
            self._session = DynamoSession(self.fn, tracer, self.backend, self.training)
        self._artifact = None  # what was emitted before this call is out of date
        try:
            return self._session.call(args, kwargs)
        finally:
            self._report.timings["capture_s"] = self._report.timings.get("capture_s", 0.0) + (
                time.perf_counter() - started
            )

    # ------------------------------------------------------------ emitting

    def _capture_single_graph(self, tracer: MakeFxTracer, args: tuple[Any, ...]) -> None:
        from precompile.capturing.backends import lower_eager
        from precompile.capturing.emit import emit_single_graph
        from precompile.capturing.fx_trace import trace_single_graph

        timings = self._report.timings
        started = time.perf_counter()
        graph = trace_single_graph(
            self.fn, args, training=self.training, decompositions=tracer.decompositions
        )
        timings["trace_s"] = time.perf_counter() - started
        started = time.perf_counter()
        if self.backend == "eager":
            lowered = lower_eager(graph)
        else:
            from precompile.capturing.inductor_backend import lower_inductor

            lowered = lower_inductor(graph)
        timings["lower_s"] = time.perf_counter() - started
        started = time.perf_counter()
        artifact = emit_single_graph(
            graph,
            lowered,
            fn_info=self._fn_info,
            backend=self.backend,
            tracer=self.tracer.name,
            artifact_path=self.artifact_path,
            input_sources=self._input_sources,
        )
        timings["emit_s"] = time.perf_counter() - started
        self._load_and_cache(artifact, lowered.collect_bundle)
        self._report.graph = {"ops": artifact.metadata["GRAPH_OPS"]}
        self._report.sources = artifact.metadata["SOURCES"]
        self._report.serving_mode = "single_graph"
        self._report.summary = PrecompileSummary(frames=1, guarded_codes=1, backend_graphs=1)

    def _emit_dynamo(self) -> None:
        from precompile.capturing.dynamo_artifact import build_dynamo_artifact

        started = time.perf_counter()
        artifact, report, collect_bundle = build_dynamo_artifact(
            self._session.finish(),
            fn_info=self._fn_info,
            artifact_path=self.artifact_path,
            input_sources=self._input_sources,
        )
        self._report.timings["emit_s"] = time.perf_counter() - started
        for field in (
            "serving_mode",
            "frames",
            "graph_breaks",
            "recompiles",
            "guards",
            "function_sources",
            "sources",
            "summary",
            "audit",
        ):
            setattr(self._report, field, getattr(report, field))
        self._report.graph = report.graph
        if report.serving_mode == "installed":
            # This process holds the live compiles the artifact installs onto (its load
            # refuses exactly that), so it is not executed here; covers() reads the
            # entry frame's serialized guards instead.
            self._cache = self._envelope(
                artifact, collect_bundle({}), bytecode_entry(artifact.python_code)
            )
            self._artifact = artifact
            self._runnable = None
        else:
            self._load_and_cache(artifact, collect_bundle)

    def _load_and_cache(
        self, artifact: Artifact, collect_bundle: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> None:
        """Execute the new artifact here (it compiles whatever its backend compiles at
        load; that becomes the cache, so a later load compiles nothing)."""
        from precompile.loading import exec_artifact

        started = time.perf_counter()
        bytecode = bytecode_entry(artifact.python_code)  # compiled once: run here, and cached
        self._runnable = exec_artifact(
            artifact.python_code,
            dict(artifact.metadata),
            None,
            origin=self.artifact_path,
            code=artifact_code(artifact.python_code, self.artifact_path, {BUNDLE_KEY: bytecode}),
        )
        namespace = self._runnable._namespace
        bundle = {**collect_bundle(namespace), SOURCES_KEY: sources_entry(namespace)}
        self._cache = self._envelope(artifact, bundle, bytecode)
        self._report.timings["load_s"] = time.perf_counter() - started
        self._artifact = artifact

    def _envelope(
        self, artifact: Artifact, bundle: dict[str, Any], bytecode: dict[str, Any]
    ) -> bytes:
        from precompile.artifact.envelope import build_envelope

        return build_envelope(
            backend=self.backend,
            tracer=self.tracer.name,
            python_code=artifact.python_code,
            bundle={**bundle, BUNDLE_KEY: bytecode},
        )

    def _ensure_artifact(self) -> None:
        if self._artifact is not None:
            return
        if self._session is None:
            raise PrecompileError(
                "nothing was captured: call the Capture with example arguments inside the "
                "with-block before it ends",
                hint="with precompile.capture(fn, ...) as cap: cap(model, x)",
            )
        if self._runnable is not None:
            self._runnable.unload()  # a checkpoint's bindings, about to be replaced
        self._emit_dynamo()

    # ------------------------------------------------------------ public

    def save(self) -> None:
        """Write the pair now (atomically): everything captured so far. The block's clean
        exit writes it again, with whatever was captured after this."""
        if self._state != "open":
            raise PrecompileError("save() must be called inside the capture's with-block")
        self._write()

    def _write(self) -> None:
        write_files(self.pair_files())
        if self._signing_key is None:
            self._drop_stale_signature()

    def pair_files(self) -> list[tuple[str, bytes, str]]:
        """What a write of the pair now writes, as ``(path, data, kind)``: the artifact,
        its cache and (with a signing key) its signature. A job on a cluster node returns
        these bytes and the engine writes them under its own write policy; the paths
        inside the bytes (sources relative to the artifact) are those of ``artifact_path``
        whoever writes them."""
        self._ensure_artifact()
        self._check_gates()
        assert self._artifact is not None
        files = [
            (self.artifact_path, self._artifact.python_code, "artifact"),
            (self.cache_path, self._cache, "cache"),
        ]
        if self._signing_key is not None:
            from precompile.artifact import signing

            signature = signing.signature_bytes(
                self._artifact.python_code, self._cache, self._signing_key
            )
            files.append(
                (signing.default_signature_path(self.artifact_path), signature, "signature")
            )
        return files

    def _drop_stale_signature(self) -> None:
        """An unsigned write makes a signature beside the pair stale: it signs bytes that
        are gone. Left there, a load with trusted keys would blame tampering; removed, it
        says plainly that the pair is unsigned. Only a signature is removed: a file of
        another kind under that name is not ours to delete."""
        from precompile.artifact.signing import default_signature_path

        remove_own(default_signature_path(self.artifact_path), "signature")

    def _check_gates(self) -> None:
        """The DynamoTracer's require_* gates, checked before anything is written."""
        if not isinstance(self.tracer, DynamoTracer):
            return
        summary, audit = self._report.summary, self._report.audit
        if self.tracer.require_complete and not summary.complete:
            raise PrecompileError(
                f"the capture is incomplete: {'; '.join(summary.problems())}",
                hint="fix the graph breaks the report lists, or pass "
                "DynamoTracer(require_complete=False) to serve those frames as captured "
                "(eager where Dynamo gave up)",
            )
        if audit is None:
            return
        dropped = [s for s in audit.dropped]
        if self.tracer.require_no_dropped_guards and dropped:
            raise PrecompileError(
                f"{len(dropped)} guards could not be kept in the artifact "
                f"({'; '.join(f'{s.guard_type} {s.path} (dropped by {s.dropped_by})' for s in dropped[:8])})",
                hint="DynamoTracer(require_no_dropped_guards=False) accepts them (the default)",
            )
        if audit.risky:
            listing = "; ".join(f"{slot.describe()}: {why}" for slot, why in audit.risky)
            if self.tracer.require_no_risky_drops:
                raise PrecompileError(
                    f"guards that decide which captured variant runs were dropped, so the "
                    f"artifact could serve a call with the wrong variant: {listing}",
                    hint="keep those guards (adjust guard_filter_fn), or pass "
                    "DynamoTracer(require_no_risky_drops=False) to accept them",
                )
            if not self._warned_risky:
                self._warned_risky = True
                warnings.warn(
                    f"precompile: the artifact dropped guards that decide dispatch: {listing}",
                    RiskyGuardWarning,
                    stacklevel=4,
                )

    def covers(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Which captured variant of the entry frame would serve this call, or which guard
        fails per variant, decided as serving decides. No graph runs."""
        if not isinstance(self.tracer, DynamoTracer):
            if self._runnable is None:
                raise PrecompileError("covers() needs a captured call first")
            return self._runnable.covers(*args, **kwargs)
        self._ensure_artifact()
        if self._runnable is None:
            return self._session.entry_coverage(args, kwargs)
        return self._runnable.covers(*args, **kwargs)

    def report(self) -> CaptureReport:
        if self._session is not None and self._artifact is None and self._report.ok:
            try:
                self._ensure_artifact()
            except PrecompileError as error:
                self._report.ok, self._report.error = False, error.to_dict()
        return self._report

    def summary(self) -> PrecompileSummary:
        return self.report().summary
