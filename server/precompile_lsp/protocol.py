"""The worker protocol: the only thing both sides of the pipe between the engine and its
torch worker import, and the shape of cached results.

One JSON object per line, each tagged with its ``type``. Every message is a frozen attrs
class here, encoded and decoded by one strict converter: a message with an unknown type,
a missing or unknown field or a value of the wrong type is a ``ProtocolError`` that names
the field (``$.result.report.frames[0].line``), never a ``KeyError`` somewhere later.
``PROTOCOL_VERSION`` travels in the worker's ``Ready``; an engine that meets another
version refuses the worker instead of misreading it.

This module imports neither torch nor anything of precompile's capture side.
"""

from __future__ import annotations

import enum
import json
from typing import Any

import attrs
import cattrs

PROTOCOL_VERSION = 1


class ProtocolError(ValueError):
    """A message that is not what the protocol says, naming where it differs."""


class JobKind(enum.Enum):
    CHECK = "check"
    EMIT = "emit"
    VERIFY = "verify"


class Outcome(enum.Enum):
    """How a job ended. ``ERROR`` is a capture the target refused (a finding, not a
    failure of the machinery); ``UNSTARTED`` a job whose worker died before forking it,
    which the pool runs again elsewhere."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    CANCELLED = "cancelled"
    UNSTARTED = "unstarted"

    @property
    def failed(self) -> bool:
        """The machinery failed: no result to show but the failure itself."""
        return self in (Outcome.TIMEOUT, Outcome.CRASHED)


# ---------------------------------------------------------------- what a job is asked


@attrs.frozen
class JobRequest:
    kind: JobKind
    module: str
    function: str
    root: str
    source_roots: list[str]
    artifact: str
    artifact_declared: bool
    backend: str
    tracer: str
    timeout: float
    #: A folder the worker owns and removes after the job, whatever happened to it.
    scratch: str | None = None
    #: For a verification: the public keys (PEM paths or base64) the pair must be signed
    #: by; the load itself refuses any other pair, so what is verified is what was checked.
    trusted_keys: list[str] = attrs.field(factory=list)
    #: What the target asks of the machine that runs it (``@precompile.target(...,
    #: resources={"num_gpus": 1})``): a cluster executor schedules the job's task on a
    #: node that has them; local workers run every job where they are.
    resources: dict[str, float] = attrs.field(factory=dict)
    #: For an emit on a cluster node: a folder the job writes the pair's bytes into
    #: (``artifact``, ``cache``) instead of the workspace, for the engine to write under
    #: its write policy. None: the job writes the pair itself (a local worker).
    deliver: str | None = None


# ---------------------------------------------------------------- what a capture found


@attrs.frozen
class SourceLocation:
    """1-based line, 0-based column in Unicode code points."""

    file: str
    line: int
    column: int = 0


@attrs.frozen
class StackEntry:
    file: str
    line: int
    column: int
    function: str


@attrs.frozen
class CaptureError:
    """A refusal (``PrecompileError``) or a failure of the job's own code."""

    message: str
    type: str = "PrecompileError"
    invariant: int | None = None
    location: SourceLocation | None = None
    hint: str | None = None
    details: str | None = None
    #: For an exception raised by user code (an import, ``examples()``): the workspace
    #: frames it passed through, outermost first; ``location`` is the innermost.
    stack: list[StackEntry] = attrs.field(factory=list)


@attrs.frozen
class GraphBreakFact:
    reason: str
    gb_id: str | None
    doc_link: str | None
    explanation: str
    hints: list[str]
    frame: str
    location: SourceLocation | None
    user_stack: list[StackEntry]
    count: int = 1


@attrs.frozen
class FrameFact:
    name: str
    file: str
    line: int
    module: str
    entry: bool
    variants: int
    resume_names: list[str]
    bypassed: bool
    bypass_reason: str | None
    eager_fallback: bool
    eager_reason: str | None
    trivial: bool
    truncated: bool
    reached_by_call: bool


@attrs.frozen
class RiskyDrop:
    guard: str
    why: str


@attrs.frozen
class PinnedValue:
    """A value guard every variant of a frame keeps: the frame serves only that value."""

    frame: str
    path: str
    values: list[str]
    file: str
    line: int
    continuation: bool


@attrs.frozen
class AuditFacts:
    risky: list[RiskyDrop] = attrs.field(factory=list)
    pinned: list[PinnedValue] = attrs.field(factory=list)


@attrs.frozen
class SummaryFacts:
    frames: int = 0
    graph_breaks: int = 0
    guarded_codes: int = 0
    complete: bool = True
    text: str = ""


@attrs.frozen
class CaptureFacts:
    """What the engine reads of a capture report (precompile.CaptureReport): only this
    crosses the pipe, so the report can grow without breaking the protocol."""

    tracer: str
    backend: str
    serving_mode: str | None = None
    error: CaptureError | None = None
    graph_breaks: list[GraphBreakFact] = attrs.field(factory=list)
    frames: list[FrameFact] = attrs.field(factory=list)
    audit: AuditFacts = attrs.field(factory=AuditFacts)
    summary: SummaryFacts = attrs.field(factory=SummaryFacts)


@attrs.frozen
class GuardFailure:
    variant: int
    guard: str


@attrs.frozen
class CoverageFact:
    """One ``covers`` call: the variant that serves it, or why none does."""

    call: str
    served_by: int | None
    failures: list[GuardFailure] = attrs.field(factory=list)
    error: str | None = None


@attrs.frozen
class JobResult:
    status: Outcome
    kind: JobKind | None = None
    message: str | None = None
    error: CaptureError | None = None
    report: CaptureFacts | None = None
    coverage: list[CoverageFact] = attrs.field(factory=list)
    verify_failures: list[str] = attrs.field(factory=list)
    artifact: str | None = None
    #: Workspace files the job imported, with the sha256 it read: what it depends on.
    dependencies: dict[str, str] = attrs.field(factory=dict)
    #: Third-party distributions it imported, with their versions.
    packages: dict[str, str] = attrs.field(factory=dict)
    output: str | None = None
    traceback: str | None = None

    @property
    def failure(self) -> CaptureError | None:
        """The capture's refusal, wherever it was recorded."""
        return self.error or (self.report.error if self.report is not None else None)


# ---------------------------------------------------------------- the messages


@attrs.frozen
class Run:
    """engine -> worker: run this job."""

    id: str
    job: JobRequest


@attrs.frozen
class Cancel:
    """engine -> worker: stop this job (its whole process group is killed)."""

    id: str


@attrs.frozen
class Ready:
    """worker -> engine, once: imports are done, jobs can come."""

    version: int
    pid: int
    fork: bool


@attrs.frozen
class Started:
    """worker -> engine: the job's child is forked (a worker that dies before this never
    ran the job)."""

    id: str


@attrs.frozen
class Stage:
    """What a job is doing now: importing, capturing ``done`` of ``total`` calls..."""

    stage: str
    done: int | None = None
    total: int | None = None


@attrs.frozen
class Progress:
    """worker -> engine: a stage of a running job."""

    id: str
    progress: Stage


@attrs.frozen
class Finished:
    """worker -> engine: the job's result."""

    id: str
    result: JobResult


Message = Run | Cancel | Ready | Started | Progress | Finished
_TYPES: dict[str, type[Any]] = {
    "run": Run,
    "cancel": Cancel,
    "ready": Ready,
    "started": Started,
    "progress": Progress,
    "finished": Finished,
}
_TAGS = {cls: tag for tag, cls in _TYPES.items()}

_converter = cattrs.Converter(forbid_extra_keys=True)


def _exactly(kind: type[Any]) -> Any:
    """cattrs would turn 7 into "7" for a str field; the protocol takes values as sent
    (an int is a float, nothing else converts)."""

    def structure(value: Any, _: Any) -> Any:
        if type(value) is kind or (kind is float and type(value) is int):
            return kind(value)
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__} {value!r}")

    return structure


for _kind in (str, int, float, bool):
    _converter.register_structure_hook(_kind, _exactly(_kind))


def to_json_value(value: Any) -> Any:
    """A protocol object as plain JSON values (for the result cache)."""
    return _converter.unstructure(value)


def from_json_value(value: Any, cls: type[Any]) -> Any:
    """A protocol object from plain JSON values; ProtocolError naming the field."""
    try:
        return _converter.structure(value, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as error:
        raise ProtocolError(_describe(error, cls)) from error


def _describe(error: Exception, cls: type[Any]) -> str:
    if isinstance(error, cattrs.BaseValidationError):
        problems = "; ".join(cattrs.transform_error(error, path="$"))
    else:
        problems = str(error)
    return f"not a valid {cls.__name__}: {problems}"


def encode(message: Message) -> str:
    """One protocol message as one JSON line (no trailing newline)."""
    payload = _converter.unstructure(message)
    return json.dumps({"type": _TAGS[type(message)], **payload})


def decode(line: str | bytes) -> Message:
    """One JSON line as the message it is; ProtocolError for anything else."""
    try:
        raw = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ProtocolError(f"not JSON: {error}") from error
    if not isinstance(raw, dict):
        raise ProtocolError(f"a message is a JSON object, got {type(raw).__name__}")
    tag = raw.pop("type", None)
    cls = _TYPES.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message type {tag!r} (known: {', '.join(_TYPES)})")
    message: Message = from_json_value(raw, cls)
    return message
