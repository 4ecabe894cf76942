"""What a client can send out of order: a change to a document it never opened, an
``exit`` without ``shutdown``. Run on a workspace without targets, so no capture runs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from lsprotocol import types

from tests.harness import fresh_env
from tests.lsp.conftest import Session

BROKEN = "def broken(:\n    pass\n"


def _quiet_workspace(tmp_path: Path) -> Path:
    root = tmp_path / "quiet"
    (root / "src" / "quiet").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "quiet"\nversion = "0"\n\n[tool.precompile]\nsource-roots = ["src"]\n'
    )
    (root / "src" / "quiet" / "__init__.py").write_text("")
    (root / "src" / "quiet" / "mod.py").write_text("x = 1\n")
    return root


def _change(session: Session, uri: str, version: int, *changes: object) -> None:
    session.client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(version=version, uri=uri),
            list(changes),  # type: ignore[arg-type]
        )
    )


async def test_a_change_to_a_never_opened_document_is_no_server_error(
    session: Session, tmp_path: Path
) -> None:
    root = _quiet_workspace(tmp_path)
    session.root = root
    await session.start(folders=[root])
    await session.settled()
    uri = session.uri("src/quiet/mod.py")
    # Incremental (cannot be applied to text never seen): ignored, with a log line.
    _change(
        session,
        uri,
        2,
        types.TextDocumentContentChangePartial(
            range=types.Range(types.Position(0, 0), types.Position(0, 1)), text="y"
        ),
    )
    # A whole-document change: taken as the document's text (findings are placed in it).
    _change(session, uri, 3, types.TextDocumentContentChangeWholeDocument(text=BROKEN))
    # The server still answers, and a later save still brings diagnostics.
    lenses = await session.client.text_document_code_lens_async(
        types.CodeLensParams(types.TextDocumentIdentifier(uri))
    )
    assert not lenses
    await session.save("src/quiet/mod.py", BROKEN)  # the buffer as saved
    await session.until(lambda: session.codes("src/quiet/mod.py") == ["PC002"], "PC002")
    errors = [m for m in session.client.messages if m.type == types.MessageType.Error]
    assert errors == [], [m.message for m in errors]
    logged = [m.message for m in session.client.log_messages]
    assert not any("KeyError" in m for m in logged), logged


def _framed(payload: dict[str, object]) -> bytes:
    body = json.dumps(payload).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def _run_server(root: Path, messages: list[dict[str, object]]) -> int:
    """Send ``messages`` to a fresh server over stdio; its exit status."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "precompile_lsp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=fresh_env(),
        cwd=root,
    )
    assert proc.stdin is not None
    for message in messages:
        proc.stdin.write(_framed(message))
        proc.stdin.flush()
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError("the server did not exit on 'exit'") from None
    return proc.returncode


def _initialize(root: Path) -> list[dict[str, object]]:
    return [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "processId": None,
                "rootUri": root.as_uri(),
                "capabilities": {},
                "initializationOptions": {"trusted": False},
            },
        },
        {"jsonrpc": "2.0", "method": "initialized", "params": {}},
    ]


EXIT = {"jsonrpc": "2.0", "method": "exit"}
SHUTDOWN = {"jsonrpc": "2.0", "id": 2, "method": "shutdown"}


async def test_exit_without_shutdown_exits_1_and_after_shutdown_0(tmp_path: Path) -> None:
    root = _quiet_workspace(tmp_path)
    without, after = await asyncio.gather(
        asyncio.to_thread(_run_server, root, [*_initialize(root), EXIT]),
        asyncio.to_thread(_run_server, root, [*_initialize(root), SHUTDOWN, EXIT]),
    )
    assert without == 1
    assert after == 0
