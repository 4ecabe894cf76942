"""Code actions, Emit and Verify from the editor, progress, CodeLens and hover."""

from __future__ import annotations

import asyncio
import os
import re

import pytest
from lsprotocol import types

from tests.doc_links import documented_heading
from tests.harness import REPO, run_python
from tests.lsp.conftest import Session, line_of

PROFILES = ["visual-studio-code", "neovim"]
SERVING = "src/lab/serving.py"
SHIPPED = "artifacts/lab.serving.shipped.py"

SERVE_SHIPPED = """
import torch, precompile
from lab.layers import Scorer
torch.manual_seed(1)  # other weights than at capture: they come from the call
model, x = Scorer().eval(), torch.randn(4, 8)
out = precompile.load({artifact!r})(model, x)
torch.testing.assert_close(out, model(x) * 2, rtol=0, atol=0)
print("served", tuple(out.shape))
"""


SLOW = """import time
from pathlib import Path

import torch

import precompile

FLAG = Path(__file__).resolve().parents[2] / "slow-emit.flag"


def calls():
    if FLAG.exists():
        time.sleep(120)
    return [(torch.ones(3),)]


@precompile.target(calls)
def slow(x):
    return x * 2
"""


async def code_actions(
    session: Session, relative: str, line: int, diagnostics: list[types.Diagnostic]
) -> list[types.CodeAction]:
    where = types.Range(types.Position(line, 0), types.Position(line, 0))
    actions = await session.client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=session.uri(relative)),
            range=where,
            context=types.CodeActionContext(diagnostics=diagnostics),
        )
    )
    return [a for a in actions or [] if isinstance(a, types.CodeAction)]


def progress_of(session: Session, title: str) -> list[object]:
    [reports] = [
        r
        for r in session.client.progress_reports.values()
        if r and isinstance(r[0], types.WorkDoneProgressBegin) and r[0].title == title
    ]
    return reports


@pytest.mark.parametrize("profile", PROFILES)
async def test_emit_quick_fix_writes_an_artifact_that_serves(
    session: Session, profile: str
) -> None:
    await session.start(profile)
    await session.settled()
    uri = session.uri(SERVING)
    serving = session.path(SERVING)

    # Actions on the diagnostic of a missing artifact: the quick fix, and Emit / Verify.
    [missing] = session.diagnostics(SERVING)
    actions = await code_actions(session, SERVING, missing.range.start.line, [missing])
    [fix] = [a for a in actions if a.kind == types.CodeActionKind.QuickFix]
    assert fix.title == "Re-emit precompile artifact" and fix.is_preferred
    assert fix.command is not None and fix.command.command == "precompile.emit"
    assert list(fix.command.arguments or []) == [uri, "lab.serving.shipped"]
    assert [
        (a.title, a.command.command if a.command else None) for a in actions if a is not fix
    ] == [
        ("Emit precompile artifact", "precompile.emit"),
        ("Verify artifact", "precompile.verify"),
    ]

    # On a target's def (no diagnostic there), Emit and Verify for that target; on a
    # line of no target, nothing.
    clean = await code_actions(session, SERVING, line_of(serving, "def clean"), [])
    assert [(a.title, list(a.command.arguments or []) if a.command else None) for a in clean] == [
        ("Emit precompile artifact", [uri, "lab.serving.clean"]),
        ("Verify artifact", [uri, "lab.serving.clean"]),
    ]
    assert await code_actions(session, SERVING, 0, []) == []

    message = await session.command(fix.command.command, *fix.command.arguments)
    assert message == f"Precompile: emitted {SHIPPED}"
    assert message in [m.message for m in session.client.messages]
    artifact = session.path(SHIPPED)
    assert artifact.is_file()
    await session.until(lambda: session.codes(SERVING) == [], "the PC302 to clear")
    assert not list(artifact.parent.glob("*.tmp*")), "a temp file was left beside the artifact"

    # The editor heard about the long work: begin, report, end with the same message.
    begin, *reports, end = progress_of(session, "Precompile: emit shipped")
    assert begin.cancellable is True
    assert reports and all(isinstance(r, types.WorkDoneProgressReport) for r in reports)
    assert isinstance(end, types.WorkDoneProgressEnd) and end.message == message
    # The stages the capture went through, in order, as they happened.
    stages = [r.message for r in reports]
    assert stages[:3] == ["importing", "capturing 1 of 1 calls", "writing"], stages
    percentages = [r.percentage for r in reports if r.percentage is not None]
    assert percentages == sorted(percentages)

    # The emitted file serves in a fresh process: no capture, numerically the target.
    proc = run_python(
        SERVE_SHIPPED.format(artifact=str(artifact)),
        cwd=session.root,
        PYTHONPATH=os.pathsep.join([str(session.path("src")), str(REPO)]),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "served (4, 4)"


async def test_verify_reports_a_stale_artifact_after_an_edit(session: Session) -> None:
    await session.start()
    await session.settled()
    uri = session.uri(SERVING)
    assert await session.command("precompile.emit", uri, "lab.serving.shipped") == (
        f"Precompile: emitted {SHIPPED}"
    )
    verified = await session.command("precompile.verify", uri, "lab.serving.shipped")
    assert verified == "Precompile: shipped's artifact verified against eager"

    # The target changes after the artifact was emitted: the artifact is now stale, and
    # Verify says it no longer matches eager.
    source = session.path(SERVING).read_text(encoding="utf-8")
    edited = source.replace("return model(x) * 2", "return model(x) * 3")
    await session.settled(await session.save(SERVING, edited))
    [stale] = session.diagnostics(SERVING)
    assert stale.code == "PC301" and "stale" in stale.message
    assert stale.range.start.line == line_of(session.path(SERVING), f'artifact="{SHIPPED}"')
    message = await session.command("precompile.verify", uri, "lab.serving.shipped")
    assert message == (
        "Precompile: shipped's artifact failed verification "
        "(1 failure; stale: its sources changed since it was emitted)"
    )
    # ...and shows it on the target until its next check.
    await session.until(lambda: session.codes(SERVING) == ["PC301", "PC303"], "PC303 shown")
    [failed] = [d for d in session.diagnostics(SERVING) if d.code == "PC303"]
    assert failed.range.start.line == stale.range.start.line

    # The stale diagnostic's quick fix re-emits, after which it verifies again.
    actions = await code_actions(session, SERVING, stale.range.start.line, [stale])
    [fix] = [a for a in actions if a.kind == types.CodeActionKind.QuickFix]
    assert fix.command is not None
    await session.command(fix.command.command, *fix.command.arguments)
    await session.until(lambda: session.codes(SERVING) == [], "the PC301 to clear")
    assert await session.command("precompile.verify", uri, "lab.serving.shipped") == verified


async def test_code_lens_and_hover(session: Session) -> None:
    await session.start()
    await session.settled()
    serving = session.path(SERVING)
    lenses = await session.client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=serving.as_uri()))
    )
    by_line: dict[int, list[str]] = {}
    for lens in lenses or []:
        assert lens.command is not None
        by_line.setdefault(lens.range.start.line, []).append(lens.command.title)
    decorator = line_of(serving, "def clean") - 1
    assert by_line[decorator] == ["1 frame · 0 graph breaks · 1 variant", "Emit", "Verify"]
    breaks = line_of(serving, "def with_break") - 1
    assert by_line[breaks][0] == "3 frames · 1 graph break · 3 variants"
    assert len(by_line) == 3
    assert session.lens_refreshes > 0, "lenses were never refreshed after results arrived"

    # The server knows where each target is: from anywhere in its function (decorator
    # to last line) it offers that target's Emit and Verify; between functions, nothing.
    body = line_of(serving, "return model(x).relu()")
    actions = await code_actions(session, SERVING, body, [])
    assert [(a.title, a.command.arguments[1]) for a in actions if a.command] == [
        ("Emit precompile artifact", "lab.serving.clean"),
        ("Verify artifact", "lab.serving.clean"),
    ]
    assert await code_actions(session, SERVING, body + 1, []) == []

    # Hover on the graph break: the explanation, the hint, the user stack as links.
    [diagnostic] = session.diagnostics("src/lab/helpers.py")
    hover = await session.client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=session.uri("src/lab/helpers.py")),
            position=diagnostic.range.start,
        )
    )
    assert hover is not None and isinstance(hover.contents, types.MarkupContent)
    text = hover.contents.value
    assert hover.contents.kind == types.MarkupKind.Markdown
    assert text.startswith("**PC101")
    assert "*Hint:*" in text
    call_line = line_of(serving, "helpers.log_scores(") + 1
    assert f"({serving.as_uri()}#L{call_line})" in text
    # Our page on the code (shipped with the package), and PyTorch's on the graph break.
    [ours] = re.findall(r"\[PC101 documentation\]\(([^)]+)\)", text)
    assert documented_heading(ours) == "## pc101"
    assert re.search(r"\[PyTorch on GB\d+\]\(https?://", text)
    # Nothing to say away from a finding.
    assert (
        await session.client.text_document_hover_async(
            types.HoverParams(
                text_document=types.TextDocumentIdentifier(uri=serving.as_uri()),
                position=types.Position(0, 0),
            )
        )
        is None
    )


async def test_cancelling_an_emit_stops_its_capture_and_writes_nothing(session: Session) -> None:
    session.path("src/lab/slow.py").write_text(SLOW, encoding="utf-8")
    await session.start()
    await session.settled()
    uri = session.uri("src/lab/slow.py")

    # From now on the target's examples() sleeps for two minutes: the emit hangs in it.
    session.path("slow-emit.flag").write_text("")
    emit = asyncio.ensure_future(session.command("precompile.emit", uri, "lab.slow.slow"))
    token = await session.until(
        lambda: next(
            (
                t
                for t, reports in session.client.progress_reports.items()
                if reports and getattr(reports[0], "title", "") == "Precompile: emit slow"
            ),
            None,
        ),
        "the emit's progress to begin",
    )
    await asyncio.sleep(1)
    session.client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=token))
    message = await asyncio.wait_for(emit, 30)
    assert message == "Precompile: emit of slow cancelled"
    end = session.client.progress_reports[token][-1]
    assert isinstance(end, types.WorkDoneProgressEnd) and end.message == message
    assert not session.path("artifacts/lab.slow.slow.py").exists()

    # The cancelled capture is gone, not still sleeping in the only worker: the next
    # emit runs at once.
    session.path("slow-emit.flag").unlink()
    emitted = await asyncio.wait_for(session.command("precompile.emit", uri, "lab.slow.slow"), 60)
    assert emitted == "Precompile: emitted artifacts/lab.slow.slow.py"
