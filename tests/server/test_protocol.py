"""The worker protocol: every message type survives encode/decode unchanged, and anything
else -- not JSON, an unknown type, a missing, unknown or mistyped field, another
protocol version -- is refused with an error naming where it differs."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from precompile_lsp import protocol
from precompile_lsp.protocol import (
    AuditFacts,
    CaptureError,
    CaptureFacts,
    CoverageFact,
    FrameFact,
    GraphBreakFact,
    GuardFailure,
    JobKind,
    JobRequest,
    JobResult,
    Outcome,
    PinnedValue,
    ProtocolError,
    RiskyDrop,
    SourceLocation,
    StackEntry,
    Stage,
    SummaryFacts,
)

JOB = JobRequest(
    kind=JobKind.CHECK,
    module="pkg.targets",
    function="score",
    root="/ws",
    source_roots=["/ws/src"],
    artifact="/ws/artifacts/pkg.targets.score.py",
    artifact_declared=False,
    backend="inductor",
    tracer="dynamo",
    timeout=120.0,
    scratch="/tmp/job/scratch",
)

FACTS = CaptureFacts(
    tracer="dynamo",
    backend="eager",
    serving_mode="standalone",
    error=CaptureError(
        "refused",
        invariant=3,
        location=SourceLocation("/ws/src/pkg/targets.py", 12, 4),
        hint="capture again",
        details="raw",
    ),
    graph_breaks=[
        GraphBreakFact(
            reason="Failed to trace builtin operator",
            gb_id="GB0059",
            doc_link="https://example.invalid/gb0059",
            explanation="print",
            hints=["avoid print"],
            frame="score",
            location=SourceLocation("/ws/src/pkg/helpers.py", 5, 4),
            user_stack=[StackEntry("/ws/src/pkg/targets.py", 12, 11, "score")],
            count=2,
        )
    ],
    frames=[
        FrameFact(
            name="torch_dynamo_resume_in_score_at_12",
            file="/ws/src/pkg/targets.py",
            line=12,
            module="pkg.targets",
            entry=False,
            variants=2,
            resume_names=["__resume_at_20_0_abc"],
            bypassed=False,
            bypass_reason=None,
            eager_fallback=True,
            eager_reason="a break in a loop",
            trivial=False,
            truncated=False,
            reached_by_call=False,
        )
    ],
    audit=AuditFacts(
        risky=[RiskyDrop("score: TENSOR_MATCH x", "its value differed")],
        pinned=[PinnedValue("f", "s", ["0.5"], "/ws/src/pkg/targets.py", 14, True)],
    ),
    summary=SummaryFacts(
        frames=2, graph_breaks=1, guarded_codes=3, complete=False, text="2 frames"
    ),
)

RESULT = JobResult(
    status=Outcome.ERROR,
    kind=JobKind.CHECK,
    message=None,
    error=None,
    report=FACTS,
    coverage=[
        CoverageFact("(Model, tensor(32, 8))", None, [GuardFailure(0, "`x` has size 32")]),
        CoverageFact("(Model, tensor(8, 8))", 1),
    ],
    verify_failures=["call (...) differs from eager"],
    artifact="/ws/artifacts/a.py",
    dependencies={"/ws/src/pkg/targets.py": "ab" * 32},
    packages={"numpy": "2.0"},
    output="printed",
    traceback=None,
)

MESSAGES = [
    protocol.Run("job-1", JOB),
    protocol.Cancel("job-1"),
    protocol.Ready(protocol.PROTOCOL_VERSION, 123, True),
    protocol.Started("job-1"),
    protocol.Progress("job-1", Stage("capturing", 1, 3)),
    protocol.Finished("job-1", RESULT),
    protocol.Finished("job-2", JobResult(status=Outcome.TIMEOUT, message="timed out after 8 s")),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message: protocol.Message) -> None:
    line = protocol.encode(message)
    assert "\n" not in line
    assert json.loads(line)["type"] == type(message).__name__.lower()
    assert protocol.decode(line) == message


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "a message is a JSON object"),
        ('{"type": "explode", "id": "x"}', "unknown message type 'explode'"),
        ('{"id": "x"}', "unknown message type None"),
        ('{"type": "cancel"}', "$.id"),
        ('{"type": "cancel", "id": "x", "extra": 1}', "extra"),
        ('{"type": "started", "id": 7}', "$.id"),
        ('{"type": "ready", "version": 1, "pid": "x", "fork": true}', "$.pid"),
        (
            '{"type": "finished", "id": "j", "result": {"status": "exploded"}}',
            "$.result.status",
        ),
        (
            '{"type": "progress", "id": "j", "progress": {"stage": "x", "done": "one"}}',
            "$.progress.done",
        ),
    ],
)
def test_a_malformed_message_names_what_is_wrong(line: str, fragment: str) -> None:
    with pytest.raises(ProtocolError) as raised:
        protocol.decode(line)
    assert fragment in str(raised.value)


def test_a_deep_field_is_named_by_its_path() -> None:
    payload = json.loads(protocol.encode(MESSAGES[5]))
    payload["result"]["report"]["frames"][0]["line"] = "twelve"
    with pytest.raises(ProtocolError, match=r"\$\.result\.report\.frames\[0\]\.line"):
        protocol.decode(json.dumps(payload))


def test_a_worker_of_another_protocol_version_is_refused(tmp_path: Path) -> None:
    """An engine whose worker speaks another version ends the job with that reason
    instead of misreading what the worker sends."""
    from precompile_lsp.workers import WorkerClient

    fake = tmp_path / "fake_worker.py"
    fake.write_text(
        "import json, sys\n"
        'print(json.dumps({"type": "ready", "version": 999, "pid": 1, "fork": True}), flush=True)\n'
        "sys.stdin.read()\n"
    )
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {fake}\n")
    python.chmod(0o755)

    async def run() -> JobResult:
        worker = WorkerClient(str(python), tmp_path)
        await worker.start()
        try:
            return await asyncio.wait_for(worker.run("job-1", JOB), 30)
        finally:
            await worker.close()

    result = asyncio.run(run())
    assert result.status is Outcome.CRASHED
    assert "speaks protocol 999" in (result.message or "")
