"""``precompile.capture``: run a function for real once, and emit it as an artifact."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from precompile.artifact_io import atomic_write_files, validate_pair
from precompile.backends import check_backend
from precompile.emit import Artifact
from precompile.errors import PrecompileError
from precompile.report import CaptureReport
from precompile.tracers import MakeFxTracer


def capture(
    fn: Callable[..., Any],
    *,
    artifact_path: str | os.PathLike[str],
    cache_path: str | os.PathLike[str],
    tracer: Any = None,
    backend: str = "inductor",
    training: bool = False,
) -> Capture:
    """Capture ``fn`` into the artifact pair (python_code at ``artifact_path``, cache at
    ``cache_path``). Use as a context manager and call the result like ``fn``."""
    return Capture(
        fn,
        artifact_path=artifact_path,
        cache_path=cache_path,
        tracer=MakeFxTracer() if tracer is None else tracer,
        backend=backend,
        training=training,
    )


class Capture:
    """A single-use capture session.

    Inside the ``with`` block, calling it runs ``fn`` on the real arguments and captures
    it; the result is served through the freshly emitted artifact, so side effects
    (batch-norm statistics, in-place updates, gradients) happen exactly once. A clean
    exit writes the pair; a block that raises writes nothing new; ``save()`` writes now.
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
    ) -> None:
        self.backend = check_backend(backend)
        if not isinstance(tracer, MakeFxTracer):
            raise TypeError(
                f"precompile: tracer must be precompile.MakeFxTracer() or "
                f"precompile.DynamoTracer(), got {type(tracer).__name__}"
            )
        if not isinstance(training, bool):
            raise TypeError(f"precompile: training must be a bool, got {type(training).__name__}")
        self.artifact_path, cache = validate_pair(artifact_path, cache_path)
        if cache is None:
            raise PrecompileError("cache_path is required", hint="e.g. cache_path='model.cache'")
        self.cache_path = cache
        self.fn = fn
        self.tracer = tracer
        self.training = training
        self._state = "new"
        self._artifact: Artifact | None = None
        self._cache = b""
        self._runnable: Any = None
        from precompile.fx_capture import describe_fn

        self._report = CaptureReport(
            target=describe_fn(fn), tracer=tracer.name, backend=self.backend
        )

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
        if exc_type is None and was_open:
            self._write()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._state != "open":
            raise PrecompileError(
                "call the Capture inside its with-block",
                hint="with precompile.capture(fn, ...) as cap: out = cap(model, x)",
            )
        if self._artifact is not None:
            raise PrecompileError(
                "the make_fx tracer captures exactly one call, and this Capture already " "has one",
                hint="use tracer=precompile.DynamoTracer() to capture several calls "
                "(shapes, graph breaks) into one artifact",
            )
        if kwargs:
            raise PrecompileError(
                f"the make_fx tracer captures positional calls only; got keyword "
                f"arguments {sorted(kwargs)}",
                hint="pass them positionally, or use tracer=precompile.DynamoTracer()",
            )
        try:
            self._capture(args)
        except PrecompileError as error:
            self._report.ok = False
            self._report.error = error.to_dict()
            raise
        started = time.perf_counter()
        result = self._runnable(*args)
        self._report.timings["first_call_s"] = time.perf_counter() - started
        return result

    def _capture(self, args: tuple[Any, ...]) -> None:
        from precompile.backends import lower_eager
        from precompile.emit import emit_single_graph
        from precompile.envelope import build_envelope
        from precompile.fx_capture import describe_fn, trace_single_graph
        from precompile.loading import exec_artifact

        timings = self._report.timings
        started = time.perf_counter()
        graph = trace_single_graph(
            self.fn, args, training=self.training, decompositions=self.tracer.decompositions
        )
        timings["trace_s"] = time.perf_counter() - started
        started = time.perf_counter()
        if self.backend == "eager":
            lowered = lower_eager(graph)
        else:
            from precompile.inductor_backend import lower_inductor

            lowered = lower_inductor(graph)
        timings["lower_s"] = time.perf_counter() - started
        started = time.perf_counter()
        artifact = emit_single_graph(
            graph,
            lowered,
            fn_info=describe_fn(self.fn),
            backend=self.backend,
            tracer=self.tracer.name,
            artifact_path=self.artifact_path,
        )
        timings["emit_s"] = time.perf_counter() - started
        started = time.perf_counter()
        # Executing the new artifact here compiles whatever the backend compiles at load;
        # what it compiled becomes the cache, so a later load compiles nothing.
        self._runnable = exec_artifact(
            artifact.python_code, artifact.metadata, None, origin=self.artifact_path
        )
        self._cache = build_envelope(
            backend=self.backend,
            tracer=self.tracer.name,
            python_code=artifact.python_code,
            bundle=lowered.collect_bundle(self._runnable._namespace),
        )
        timings["load_s"] = time.perf_counter() - started
        self._artifact = artifact
        self._report.graph = {"ops": artifact.metadata["GRAPH_OPS"]}
        self._report.sources = artifact.metadata["SOURCES"]

    def save(self) -> None:
        """Write the pair now (atomically). The block's clean exit writes it again."""
        if self._state != "open":
            raise PrecompileError("save() must be called inside the capture's with-block")
        self._write()

    def _write(self) -> None:
        if self._artifact is None:
            raise PrecompileError(
                "nothing was captured: call the Capture with example arguments inside "
                "the with-block before it ends",
                hint="with precompile.capture(fn, ...) as cap: cap(model, x)",
            )
        atomic_write_files(
            [
                (self.artifact_path, self._artifact.python_code),
                (self.cache_path, self._cache),
            ]
        )

    def report(self) -> CaptureReport:
        return self._report
