"""Issue 27 item 6 in the editor: a serving log written by a really served artifact shows
as a finding at the target, its CodeLens shows the served share, and an edited log (the
service served more calls) updates both -- in an untrusted workspace, since reading a log
runs nothing of it, and without a single job (a log never triggers a capture)."""

from __future__ import annotations

import pytest
from lsprotocol import types

from tests.fixtures.production import emit, make_workspace, serve
from tests.lsp.conftest import Session, line_of


@pytest.mark.asyncio
async def test_a_served_artifacts_log_is_a_finding_at_the_target_and_updates(
    session: Session,
) -> None:
    root = make_workspace(session.root.parent / "shop")
    emit(root)
    serve(root, [8, 8, 3, 8])
    session.root = root
    await session.start(trusted=False)
    rank = "src/shop/rank.py"
    decorator = line_of(root / rank, "@precompile.target")

    def production() -> list[types.Diagnostic]:
        return [d for d in session.diagnostics(rank) if d.code == "PC401"]

    [first] = await session.until(production, "a PC401 at rank")
    assert first.range.start.line == decorator
    assert first.message.startswith(
        "production refused 1 of 4 calls of `rank`: input 0 has shape (3, 4)"
    )
    assert first.severity == types.DiagnosticSeverity.Warning
    assert first.related_information is not None
    [related] = first.related_information
    assert related.message == "input signature: Linear, float32[3,4] cpu contiguous"
    assert "/logs/precompile-serving-" in related.location.uri

    lenses = await session.client.text_document_code_lens_async(
        types.CodeLensParams(types.TextDocumentIdentifier(session.uri(rank)))
    )
    titles = [lens.command.title for lens in lenses if lens.command]
    assert any("production: served 75.0% of 4 calls" in t for t in titles), titles

    # The service runs on: a second process appends to the logs (a new refused size).
    serve(root, [8, 5, 5, 8])
    session.client.workspace_did_change_watched_files(
        types.DidChangeWatchedFilesParams(
            [
                types.FileEvent(log.as_uri(), types.FileChangeType.Changed)
                for log in sorted((root / "logs").glob("*.jsonl"))
            ]
        )
    )

    def updated() -> list[str]:
        messages = sorted(d.message for d in production())
        return messages if len(messages) == 2 else []

    messages = await session.until(updated, "two PC401s after the log changed")
    assert messages[0].startswith("production refused 1 of 8 calls of `rank`: input 0 has shape (3")
    assert messages[1].startswith("production refused 2 of 8 calls of `rank`: input 0 has shape (5")
    lenses = await session.client.text_document_code_lens_async(
        types.CodeLensParams(types.TextDocumentIdentifier(session.uri(rank)))
    )
    assert any("production: served 62.5% of 8 calls" in (lens.command.title if lens.command else "")
               for lens in lenses)  # fmt: skip
    assert (await session.stats())["jobs"] == 0  # reading logs ran nothing
