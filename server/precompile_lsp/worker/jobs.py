"""The jobs a worker child runs (this module imports torch: it runs only in workers).

*check* captures a target with the eager backend (graph breaks, frames and guards do not
depend on the backend, and eager captures are fast), evaluates each ``covers`` call,
and records which workspace files the capture imported (the target's dependencies).
*emit* captures with the target's backend and writes the artifact pair. *verify* loads
the artifact and compares it with eager on every example and covers call. Whether an
artifact is stale or missing is the engine's call (it needs no torch).

The tracer and backend come from the decorator when it names them, else from the job
(the workspace's ``[tool.precompile]``). Long jobs report their stage as they go
(``report_stage``), which the engine shows as progress.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import importlib.metadata
import linecache
import os
import sys
import tempfile
import traceback
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import torch

import precompile
import precompile.targets
from precompile.artifact.pair import default_cache_path, file_sha256
from precompile.capturing.function_records import codes_run
from precompile.errors import Location, PrecompileError
from precompile.targets import as_example
from precompile_lsp import protocol
from precompile_lsp.files import path_state
from precompile_lsp.protocol import (
    CaptureError,
    CaptureFacts,
    CoverageFact,
    GuardFailure,
    JobKind,
    JobRequest,
    JobResult,
    Outcome,
    Stage,
)
from precompile_lsp.worker import sources

#: Where a forked job child reports its stages (a pipe the worker reads), if anywhere.
STAGE_FD: int | None = None


def report_stage(stage: str, done: int | None = None, total: int | None = None) -> None:
    """Tell whoever runs this job what it is doing now (one JSON line on STAGE_FD)."""
    if STAGE_FD is None:
        return
    import json

    line = json.dumps(protocol.to_json_value(Stage(stage, done, total))) + "\n"
    try:
        os.write(STAGE_FD, line.encode())
    except OSError:
        pass


def _tracer(option: Any, workspace: str) -> Any:
    """The decorator's tracer (a name or a tracer object), else the workspace's."""
    name = workspace if option is None else option
    if name == "make_fx":
        return precompile.MakeFxTracer()
    if name == "dynamo":
        return precompile.DynamoTracer(require_complete=False, require_no_risky_drops=False)
    return name


class UserCodeError(PrecompileError):
    """An exception raised by the workspace's own code (importing the target's module,
    its ``examples()`` or ``covers()``), located at the innermost workspace line it passed
    through, with the workspace frames on the way there (``stack``)."""

    def __init__(self, message: str, error: BaseException, root: str, hint: str) -> None:
        frames = _workspace_frames(error, root)
        location = None
        if frames:
            file, line, column, _ = frames[-1]
            location = Location(file, line, column)
        shown = traceback.format_list(
            [traceback.FrameSummary(f, n, name) for f, n, _, name in frames[-_SHOWN_FRAMES:]]
        )
        details = "Traceback (workspace frames, innermost last):\n" + "".join(shown)
        details += "".join(traceback.format_exception_only(type(error), error))
        super().__init__(message, location=location, hint=hint, details=details)
        self.stack = [
            protocol.StackEntry(f, n, c, name) for f, n, c, name in frames[-_SHOWN_FRAMES:]
        ]


#: How many workspace frames of a user exception a finding shows.
_SHOWN_FRAMES = 5


def _indent(file: str, line: int) -> int:
    text = linecache.getline(file, line)
    return len(text) - len(text.lstrip()) if text.strip() else 0


def _workspace_frames(error: BaseException, root: str) -> list[tuple[str, int, int, str]]:
    """(file, line, column, function) of each frame of ``error``'s traceback in a file of
    the workspace (not an installed package, not this package), outermost first; for a
    SyntaxError, the line that does not parse comes last."""
    prefix = os.path.realpath(root) + os.sep
    mine = os.path.dirname(os.path.realpath(__file__)) + os.sep

    def inside(file: str | None) -> bool:
        # Frozen modules name no file ("<frozen importlib._bootstrap>").
        real = sources.realpath(file) if file and os.path.isabs(file) else ""
        return (
            real.startswith(prefix)
            and not sources.installed(real, root)
            and not real.startswith(mine)
        )

    frames = [
        (sources.realpath(f.filename), f.lineno or 1, _indent(f.filename, f.lineno or 1), f.name)
        for f in traceback.extract_tb(error.__traceback__)
        if inside(f.filename)
    ]
    if isinstance(error, SyntaxError) and inside(error.filename) and error.filename:
        column = max((error.offset or 1) - 1, 0)
        frames.append((sources.realpath(error.filename), error.lineno or 1, column, "<module>"))
    return frames


@contextlib.contextmanager
def _option_errors_stay_on_their_target() -> Iterator[None]:
    """While a target's module is imported: a ``@precompile.target(...)`` whose own
    arguments are invalid marks its function with the error instead of raising, so the
    module imports and its other targets are checked as usual; the job of the marked
    target reports the error at its decorator. (Outside workers the decorator raises, as
    documented.)"""
    original = precompile.targets.target

    @functools.wraps(original)
    def target(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except (TypeError, ValueError) as error:
            caller = sys._getframe(1)
            marked = (error, Location(caller.f_code.co_filename, caller.f_lineno, 0))

            def mark(fn: Any) -> Any:
                fn.__precompile_target_error__ = marked
                return fn

            return mark

    precompile.target = precompile.targets.target = target
    try:
        yield
    finally:
        precompile.target = precompile.targets.target = original


def _import_target(job: JobRequest) -> Any:
    sources.import_from_disk(job.root)  # the bytes the result's key hashes, not a .pyc
    sources.refuse_stale_preloaded(job.root)
    for root in reversed(job.source_roots):
        if root not in sys.path:
            sys.path.insert(0, root)
    try:
        with _option_errors_stay_on_their_target():
            module = importlib.import_module(job.module)
    except Exception as error:
        raise UserCodeError(
            f"importing {job.module} failed: {type(error).__name__}: {error}",
            error,
            job.root,
            hint="fix the failing line (shown here, innermost workspace frame); every target "
            "of the module is checked again once it imports",
        ) from error
    fn = getattr(module, job.function, None)
    marked = getattr(fn, "__precompile_target_error__", None)
    if marked is not None:
        invalid, where = marked
        raise PrecompileError(
            f"this @precompile.target's arguments are invalid: {invalid}",
            location=Location(
                sources.realpath(where.file), where.line, _indent(where.file, where.line)
            ),
            hint="fix this decorator's arguments; other targets of the module are not "
            "affected (but importing the module outside precompile check raises this)",
        )
    options = getattr(fn, "__precompile_target__", None)
    if options is None:
        raise PrecompileError(
            f"{job.module}.{job.function} is not decorated with @precompile.target at run "
            f"time (the decorator was found in its source)",
            hint="make sure the decorator is applied, and not shadowed by another import",
        )
    return fn, options


def _calls(factory: Any, what: str, root: str) -> list[Any]:
    if factory is None:
        return []
    try:
        return [as_example(c) for c in factory()]
    except PrecompileError:
        raise
    except Exception as error:
        raise UserCodeError(
            f"the target's {what}() failed: {type(error).__name__}: {error}",
            error,
            root,
            hint=f"fix {what}() where it raised (the traceback is in the details)",
        ) from error


def _describe_call(example: Any) -> str:
    def show(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            return f"tensor{tuple(v.shape)}"
        if isinstance(v, torch.nn.Module):
            return type(v).__name__
        return repr(v)[:40]

    parts = [show(a) for a in example.args] + [f"{k}={show(v)}" for k, v in example.kwargs.items()]
    return f"({', '.join(parts)})"


def _dependencies(root: str, imported: bool = False) -> tuple[dict[str, str], dict[str, str]]:
    """What a result depends on, as paths with what each held (``files.path_state``):
    the source files the child imported that no version stands for -- the workspace's,
    and any outside it that is not in an installed distribution's site-packages, the
    standard library or this product (an editable sibling library, a PYTHONPATH folder)
    --, the places its imports looked (``sources.looked``), and for each third-party
    distribution it imported the file that records its installed files (``RECORD``,
    else its metadata): an upgrade, a reinstall or an uninstall changes or removes it,
    in whichever interpreter ran the job. Second, by version, the distributions without
    such a file. A file's hash is that of the bytes the job compiled
    (``sources.compiled``), else of the file now; an archive's stands for the modules
    imported from it. Where the target's module ``imported``, files compiled without a
    ``sys.modules`` entry (loaded by path) and the lookups count too; where it did not,
    its own file is not recorded (it left ``sys.modules``), which is how the engine
    tells a failed import (``job_requests.import_failed``)."""
    files: dict[str, str] = {}
    packages: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not path:
            continue
        real = sources.realpath(path)
        if sources.recorded(real, root):
            held = real if real in sources.compiled else sources.holder(real)
            digest = sources.compiled.get(held) or file_sha256(held)
            if digest:
                files[held] = digest
        elif sources.installed(real, root) and "." not in name:
            for dist in _DISTRIBUTIONS.of(name):
                record = _installed_record(dist)
                if record is not None:
                    files[record[0]] = record[1]
                    continue
                try:
                    packages[dist] = importlib.metadata.version(dist)
                except importlib.metadata.PackageNotFoundError:
                    pass
    if not imported:
        return files, packages
    return {**sources.looked, **sources.compiled, **files}, packages


@functools.cache
def _installed_record(dist: str) -> tuple[str, str] | None:
    """The file that records what distribution ``dist`` installed (its ``RECORD``, else
    its ``METADATA`` or ``PKG-INFO``), with its ``path_state``; None where it lists
    none. Read once per process: the warm worker reads those it imported before forking
    (listing torch's files takes a tenth of a second)."""
    try:
        found = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    listed = found.files or []
    for wanted in ("RECORD", "METADATA", "PKG-INFO"):
        for file in listed:
            if file.name == wanted and file.parent.name.endswith((".dist-info", ".egg-info")):
                path = str(file.locate())
                return path, path_state(path)
    # A RECORD that does not list the metadata folder's own files (some installers
    # leave them out): the folder beside the distribution's files whose METADATA is
    # the one read here, and its RECORD where it has one.
    site = str(found.locate_file(""))
    for wanted in ("METADATA", "PKG-INFO"):
        text = found.read_text(wanted)
        if text is None:
            continue
        try:
            folders = os.listdir(site)
        except OSError:
            return None
        for folder in folders:
            path = os.path.join(site, folder, wanted)
            if folder.endswith((".dist-info", ".egg-info")) and os.path.isfile(path):
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    with open(path, encoding="utf-8") as f:
                        if f.read() == text:
                            record = os.path.join(site, folder, "RECORD")
                            path = record if os.path.isfile(record) else path
                            return path, path_state(path)
    return None


class _Distributions:
    """Top-level module name -> the distributions that provide it, read again when a
    job imports a module it does not know (a package installed since)."""

    def __init__(self) -> None:
        self._by_module: Mapping[str, list[str]] = {}
        self._unprovided: set[str] = set()

    def of(self, name: str) -> list[str]:
        if name not in self._by_module and name not in self._unprovided:
            self._by_module = importlib.metadata.packages_distributions()
            if name not in self._by_module:
                self._unprovided.add(name)
        return self._by_module.get(name, [])


_DISTRIBUTIONS = _Distributions()


def warm_up() -> None:
    """In the warm worker, before it forks: what every job would otherwise work out
    again about the modules already imported."""
    _dependencies(os.sep)


@functools.cache
def _delivering_capture() -> Any:
    """A capture whose writes go to ``deliver`` (``artifact``, ``cache``) instead of the
    pair's paths: a job on a cluster node hands the bytes back and the engine writes them
    under its write policy. The capture still names the pair's real paths, so what the
    bytes record relative to the artifact (its sources) is what a local emit records.
    (Made on first use: ``precompile.Capture`` is the capture side, imported lazily.)"""

    class DeliveringCapture(precompile.Capture):
        def __init__(self, *args: Any, deliver: str, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.deliver = deliver

        def _write(self) -> None:
            for _path, data, kind in self.pair_files():
                with open(os.path.join(self.deliver, kind), "wb") as f:
                    f.write(data)

    return DeliveringCapture


def _capture(
    fn: Any,
    tracer: Any,
    training: bool,
    examples: list[Any],
    backend: str,
    paths: tuple[str, str],
    covers: list[Any] | None = None,
    deliver: str | None = None,
    inputs_from: Any = None,
) -> tuple[Any, list[CoverageFact]]:
    """Capture ``examples``; evaluate ``covers`` against the artifact while the capture
    still holds it (its frames bound as a served artifact binds them). With ``deliver``
    the pair's bytes go into that folder, not to ``paths``."""
    calls = examples[:1] if isinstance(tracer, precompile.MakeFxTracer) else examples
    coverage: list[CoverageFact] = []
    settings: dict[str, Any] = {
        "artifact_path": paths[0],
        "cache_path": paths[1],
        "tracer": tracer,
        "backend": backend,
        "training": training,
        # So that ``precompile check`` sees an edit to examples() as a stale artifact.
        "inputs_from": inputs_from,
    }
    session = (
        precompile.capture(fn, **settings)
        if deliver is None
        else _delivering_capture()(fn, deliver=deliver, **settings)
    )
    with session as cap:
        for number, example in enumerate(calls, 1):
            report_stage("capturing", number, len(calls))
            cap(*copy.deepcopy(example.args), **copy.deepcopy(example.kwargs))
        if covers:
            coverage = _coverage(cap, covers)
        report_stage("compiling kernels and writing" if backend == "inductor" else "writing")
    return cap, coverage


def _coverage(cap: Any, covers: list[Any]) -> list[CoverageFact]:
    results = []
    for number, example in enumerate(covers, 1):
        report_stage("checking covers", number, len(covers))
        call = _describe_call(example)
        try:
            coverage = cap.covers(*copy.deepcopy(example.args), **copy.deepcopy(example.kwargs))
            fact = CoverageFact(
                call,
                coverage["served_by"],
                [GuardFailure(f["variant"], f["guard"]) for f in coverage["failures"]],
            )
            runnable = cap._runnable
            dynamo = isinstance(cap.tracer, precompile.DynamoTracer)
            if fact.served_by is not None and runnable is not None and dynamo:
                # Beyond the entry, only a real (served) call reaches the continuations.
                runnable(*copy.deepcopy(example.args), **copy.deepcopy(example.kwargs))
        except PrecompileError as error:
            fact = CoverageFact(call, None, [], error.message)
        results.append(fact)
    return results


def capture_error(error: PrecompileError) -> CaptureError:
    captured = protocol.from_json_value(error.to_dict(), CaptureError)
    stack = getattr(error, "stack", None)
    return attrs.evolve(captured, stack=stack) if isinstance(stack, list) else captured


def facts_of(report: Any) -> CaptureFacts:
    """What the engine reads of a capture report, as protocol facts: the report can grow
    fields without the pipe noticing."""
    data = report.to_dict()
    audit = data.get("audit") or {}
    summary = data["summary"]
    return protocol.from_json_value(
        {
            "tracer": data["tracer"],
            "backend": data["backend"],
            "serving_mode": data.get("serving_mode"),
            "error": data.get("error"),
            "graph_breaks": data.get("graph_breaks", []),
            "frames": data.get("frames", []),
            "audit": {"risky": audit.get("risky", []), "pinned": audit.get("pinned", [])},
            "summary": {
                key: summary[key]
                for key in ("frames", "graph_breaks", "guarded_codes", "complete", "text")
            },
        },
        CaptureFacts,
    )


def run_job(job: JobRequest) -> JobResult:
    warnings.simplefilter("ignore")
    result = JobResult(status=Outcome.OK, kind=job.kind)
    try:
        report_stage("importing")
        fn, options = _import_target(job)
        artifact = job.artifact
        cache = default_cache_path(artifact)
        if job.kind is JobKind.VERIFY:
            failures = verify(fn, options, artifact, cache, job.trusted_keys, job.root)
            result = attrs.evolve(result, verify_failures=failures)
        else:
            # What made the example inputs, recorded so an edit to it is a stale artifact.
            with codes_run() as made_by:
                examples = _calls(options.examples, "examples", job.root)
            if not examples:
                raise PrecompileError(
                    "the target's examples() returned no calls", hint="return at least one Example"
                )
            tracer = _tracer(options.tracer, job.tracer)
            if job.kind is JobKind.EMIT:
                backend = options.backend or job.backend
                cap, _ = _capture(
                    fn,
                    tracer,
                    options.training,
                    examples,
                    backend,
                    (artifact, cache),
                    deliver=job.deliver,
                    inputs_from=made_by,
                )
                result = attrs.evolve(result, artifact=artifact)
            else:
                # In the worker's folder for this job, which it removes even if it kills us.
                with tempfile.TemporaryDirectory(
                    prefix="precompile-check-", dir=job.scratch
                ) as tmp:
                    scratch = (f"{tmp}/a.py", f"{tmp}/a.cache")
                    covers = _calls(options.covers, "covers", job.root)
                    cap, coverage = _capture(
                        fn, tracer, options.training, examples, "eager", scratch, covers
                    )
                result = attrs.evolve(result, coverage=coverage)
            facts = facts_of(cap.report())
            status = Outcome.ERROR if facts.error is not None else Outcome.OK
            result = attrs.evolve(result, report=facts, status=status)
    except PrecompileError as error:
        result = attrs.evolve(result, status=Outcome.ERROR, error=capture_error(error))
    finally:
        files, packages = _dependencies(job.root, imported=job.module in sys.modules)
        result = attrs.evolve(result, dependencies=files, packages=packages)
    return result


def verify(
    fn: Any, options: Any, artifact: str, cache: str, trusted_keys: list[str], root: str
) -> list[str]:
    """Load the artifact in this (fresh) child and compare it with eager on every example
    and covers call; each mismatch or refusal is one failure. With ``trusted_keys`` the
    load itself checks the signature of the bytes it loads."""
    if not os.path.exists(artifact):
        return [f"{artifact} does not exist; emit it first"]
    failures = []
    try:
        runnable = precompile.load(
            artifact,
            cache if os.path.exists(cache) else None,
            trusted_keys=trusted_keys or None,
        )
    except PrecompileError as error:
        return [f"it does not load: {error.message}"]
    calls = _calls(options.examples, "examples", root) + _calls(options.covers, "covers", root)
    for number, example in enumerate(calls, 1):
        report_stage("verifying", number, len(calls))
        served_args = copy.deepcopy((example.args, example.kwargs))
        eager_args = copy.deepcopy((example.args, example.kwargs))
        try:
            served = runnable(*served_args[0], **served_args[1])
        except PrecompileError as error:
            failures.append(f"call {_describe_call(example)} is refused: {error.message}")
            continue
        expected = fn(*eager_args[0], **eager_args[1])
        try:
            torch.testing.assert_close(served, expected)
        except AssertionError as error:
            failures.append(
                f"call {_describe_call(example)} differs from eager: {str(error).splitlines()[0]}"
            )
    return failures
