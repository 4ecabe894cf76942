"""Trust gates everything that runs user code; settings apply without a restart."""

from __future__ import annotations

import asyncio

from lsprotocol import types

from tests.lsp.conftest import Session, descendants, line_of

SERVING = "src/lab/serving.py"
HELPERS = "src/lab/helpers.py"


def pc101_severities(session: Session) -> list[types.DiagnosticSeverity | None]:
    return [d.severity for d in session.diagnostics(HELPERS) if d.code == "PC101"]


async def lens_titles(session: Session, relative: str) -> list[str]:
    lenses = await session.client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=session.uri(relative)))
    )
    return [lens.command.title for lens in lenses or [] if lens.command]


def warnings(session: Session) -> list[str]:
    return [m.message for m in session.client.messages if m.type == types.MessageType.Warning]


async def test_an_untrusted_workspace_runs_nothing(session: Session) -> None:
    await session.start(trusted=False)
    await session.settled()
    uri = session.uri(SERVING)

    # One message says why, once; nothing was captured, so nothing is shown.
    [told] = warnings(session)
    assert "not trusted" in told and "Trust the workspace" in told
    assert not any(session.client.diagnostics.values())
    assert not session.path("noisy-ran.txt").exists()
    assert descendants(session.server_pid) == set(), "a worker started in an untrusted workspace"

    # Nothing that executes code is offered or done.
    line = line_of(session.path(SERVING), "def shipped")
    actions = await session.client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(types.Position(line, 0), types.Position(line, 0)),
            context=types.CodeActionContext(diagnostics=[]),
        )
    )
    assert list(actions or []) == []
    assert (
        await lens_titles(session, SERVING) == ["precompile: not run (workspace not trusted)"] * 3
    )
    refused = await session.command("precompile.emit", uri, "lab.serving.shipped")
    assert refused == "Precompile: not trusted; nothing was run"
    assert not session.path("artifacts").exists()
    mark = len(session.statuses)
    await session.save(SERVING, session.path(SERVING).read_text() + "\n# saved\n")
    await asyncio.sleep(2)
    assert not any(s["state"] == "capturing" for s in session.statuses[mark:])
    assert not session.path("noisy-ran.txt").exists()
    assert descendants(session.server_pid) == set()
    assert len(warnings(session)) == 1


async def test_settings_apply_without_a_restart(session: Session) -> None:
    await session.start(options={"settings": {"severity": {"PC101": "error"}}})
    await session.settled()
    assert pc101_severities(session) == [types.DiagnosticSeverity.Error]
    assert (await lens_titles(session, SERVING))[1:3] == ["Emit", "Verify"]

    # Pushed settings (didChangeConfiguration with the section): graph breaks off, and
    # lenses off; no capture needed to apply either.
    mark = len(session.statuses)
    session.client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(
            settings={"precompile": {"severity": {"PC101": "off"}, "codeLens": False}}
        )
    )
    # Each file's diagnostics are published on their own: wait for both files.
    await session.until(
        lambda: session.diagnostics(HELPERS) == []
        and "PC101" not in session.codes("src/lab/noisy.py"),
        "PC101 to be turned off in every file",
    )
    assert await lens_titles(session, SERVING) == []
    assert not any(s["state"] == "capturing" for s in session.statuses[mark:])

    # Pulled settings (workspace/configuration, as VS Code does): a bad timeout is
    # reported and ignored, the rest applies.
    session.client.set_configuration(
        {"severity": {}, "codeLens": True, "timeout": -1}, section="precompile"
    )
    session.client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings=None)
    )
    await session.until(
        lambda: pc101_severities(session) == [types.DiagnosticSeverity.Warning], "PC101 back"
    )
    assert any(
        "the editor setting precompile.timeout must be a finite positive number" in w
        for w in warnings(session)
    )
    assert (await lens_titles(session, SERVING))[1:3] == ["Emit", "Verify"]

    # Disabled: everything is cleared and saves capture nothing; enabled again: rechecked.
    session.client.set_configuration({"enable": False}, section="precompile")
    session.client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings=None)
    )
    await session.until(lambda: not any(session.client.diagnostics.values()), "all cleared")
    mark = len(session.statuses)
    await session.save(HELPERS, session.path(HELPERS).read_text() + "\n# saved\n")
    await asyncio.sleep(2)
    assert not any(s["state"] == "capturing" for s in session.statuses[mark:])
    session.client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"precompile": {"enable": True}})
    )
    await session.settled(mark)
    assert session.codes(HELPERS) == ["PC101"]


async def test_run_on_save_and_timeout_reach_where_they_act(session: Session) -> None:
    """runOnSave off: a save re-checks nothing (no job runs); the timeout setting is the
    per-capture limit the workers enforce."""
    await session.start(options={"settings": {"runOnSave": False}})
    await session.settled()
    before = await session.stats()
    helpers = session.path(HELPERS)
    await session.save(HELPERS, "# a line added above\n" + helpers.read_text())
    await asyncio.sleep(3)
    assert (await session.stats())["jobs"] == before["jobs"]
    assert session.codes(HELPERS) == ["PC101"]  # not re-checked: still shown, moved down

    # runOnSave back on, with a timeout far below what a capture takes: the next save
    # re-checks the helper's dependent, and its capture is stopped.
    session.client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(
            settings={"precompile": {"runOnSave": True, "timeout": 0.01}}
        )
    )
    await session.settled(await session.save(HELPERS, helpers.read_text()))
    timed_out = [
        d for d in session.diagnostics(SERVING) if d.code == "PC900" and "timed out" in d.message
    ]
    assert timed_out and "0.01 s" in timed_out[0].message
