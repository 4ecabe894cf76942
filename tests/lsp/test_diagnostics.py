"""Diagnostics over LSP: published in the file where the problem is, in the negotiated
position encoding, with related information; refreshed by saves and by file watching;
kept honest while a buffer has unsaved edits."""

from __future__ import annotations

import pytest
from lsprotocol import types

from tests.doc_links import documented_heading
from tests.lsp.conftest import Session, column_in, line_of

PROFILES = ["visual-studio-code", "neovim"]


@pytest.mark.parametrize("profile", PROFILES)
async def test_findings_land_in_the_files_where_they_happen(session: Session, profile: str) -> None:
    result = await session.start(profile)
    await session.settled()

    # The graph break is in the helper module, on the line after an emoji: its column
    # is counted in the encoding the client negotiated (UTF-16 for VS Code).
    helpers = session.path("src/lab/helpers.py")
    line = line_of(helpers, "print(tag")
    text = helpers.read_text(encoding="utf-8").splitlines()[line]
    [breaks] = session.diagnostics("src/lab/helpers.py")
    encoding = result.capabilities.position_encoding
    assert breaks.code == "PC101"
    assert breaks.source == "precompile"
    assert breaks.severity == types.DiagnosticSeverity.Warning
    assert breaks.range.start == types.Position(
        line, column_in(encoding, text[: text.index("print")])
    )
    assert "print" in breaks.message
    assert breaks.code_description is not None
    assert documented_heading(breaks.code_description.href) == "## pc101"

    serving = session.path("src/lab/serving.py")
    related = {
        (r.location.uri, r.location.range.start.line, r.message)
        for r in breaks.related_information or []
    }
    target = line_of(serving, "def with_break") - 1  # back to the target's decorator
    assert (serving.as_uri(), target, "target with_break") in related
    assert (
        serving.as_uri(),
        line_of(serving, "helpers.log_scores("),
        "in with_break",
    ) in related

    # The shipped target declares an artifact that was never emitted: a fixable finding
    # on its decorator.
    [missing] = session.diagnostics("src/lab/serving.py")
    assert missing.code == "PC302"
    assert missing.range.start.line == line_of(
        serving, 'artifact="artifacts/lab.serving.shipped.py"'
    )
    assert missing.data["fix"] == "emit" and missing.data["target"] == "lab.serving.shipped"

    # A capture that kills its process is a finding on that target, nothing more.
    [crashed] = session.diagnostics("src/lab/crash.py")
    assert crashed.code == "PC900" and "crashed" in crashed.message
    assert session.diagnostics("src/lab/layers.py") == []

    # The noisy target printed and wrote protocol-looking bytes to fd 1 from C while it
    # was captured; the channel survived (every notification above parsed) and so does
    # the server, which still answers.
    assert session.path("noisy-ran.txt").read_text() == "captured\n"
    assert "PC101" in session.codes("src/lab/noisy.py")
    assert session.client.error is None
    assert await session.client.text_document_hover_async(
        types.HoverParams(types.TextDocumentIdentifier(helpers.as_uri()), breaks.range.start)
    )

    # The status bar heard the run: capturing n of m, then idle with the findings count.
    assert any(s["state"] == "capturing" and s.get("total") == 5 for s in session.statuses)
    shown = sum(len(d) for d in session.client.diagnostics.values())
    assert session.statuses[-1] == {"state": "idle", "findings": shown}


async def test_saves_and_watched_files_refresh_findings(session: Session) -> None:
    await session.start()
    await session.settled()
    assert [r.method for r in session.registrations] == [types.WORKSPACE_DID_CHANGE_WATCHED_FILES]
    assert session.codes("src/lab/helpers.py") == ["PC101"]

    # An external edit (a git checkout, another editor) of a helper: the client's file
    # watcher reports it and the target that calls the helper is captured again.
    helpers = session.path("src/lab/helpers.py")
    helpers.write_text(
        "import torch\n\n\ndef log_scores(scores: torch.Tensor) -> torch.Tensor:\n"
        "    return scores.softmax(-1)\n",
        encoding="utf-8",
    )
    mark = len(session.statuses)
    session.client.workspace_did_change_watched_files(
        types.DidChangeWatchedFilesParams(
            [types.FileEvent(helpers.as_uri(), types.FileChangeType.Changed)]
        )
    )
    await session.settled(mark)
    await session.until(lambda: session.diagnostics("src/lab/helpers.py") == [], "cleared")

    # A save that introduces a break in a target's own file shows it there.
    serving = session.path("src/lab/serving.py")
    source = serving.read_text(encoding="utf-8")
    broken = source.replace(
        "    return model(x).relu()", '    print("hi")\n    return model(x).relu()'
    )
    await session.settled(await session.save("src/lab/serving.py", broken))
    assert session.codes("src/lab/serving.py") == ["PC101", "PC302"]
    [new_break] = [d for d in session.diagnostics("src/lab/serving.py") if d.code == "PC101"]
    assert new_break.range.start.line == line_of(serving, 'print("hi")')

    # ...and fixing it clears it.
    await session.settled(await session.save("src/lab/serving.py", source))
    assert session.codes("src/lab/serving.py") == ["PC302"]


async def test_unsaved_edits_move_or_drop_diagnostics(session: Session) -> None:
    await session.start()
    await session.settled()
    uri = session.uri("src/lab/helpers.py")
    [before] = session.diagnostics("src/lab/helpers.py")
    session.open("src/lab/helpers.py")

    def change(version: int, start: int, end: int, text: str) -> None:
        session.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                [
                    types.TextDocumentContentChangePartial(
                        range=types.Range(types.Position(start, 0), types.Position(end, 0)),
                        text=text,
                    )
                ],
            )
        )

    def moved_by(lines: int) -> bool:
        shown = session.diagnostics("src/lab/helpers.py")
        return len(shown) == 1 and shown[0].range.start.line == before.range.start.line + lines

    # Two lines typed above the break, not saved: the diagnostic moves with its code.
    change(2, 0, 0, "# one\n# two\n")
    await session.until(lambda: moved_by(2), "the diagnostic to move down two lines")
    # The break's own line edited: what it said may no longer hold, so it goes.
    line = before.range.start.line + 2
    change(3, line, line + 1, "    return scores.softmax(-1)\n")
    await session.until(
        lambda: session.diagnostics("src/lab/helpers.py") == [], "the diagnostic to be dropped"
    )
    # Closed without saving: the file is what it was, and so are its findings.
    session.client.text_document_did_close(
        types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri))
    )
    await session.until(lambda: moved_by(0), "the diagnostic to return")
