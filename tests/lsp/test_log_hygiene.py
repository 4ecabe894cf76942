"""What the server writes to stderr (the editor's output channel) on routine traffic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from tests.harness import fresh_env


def _send(stdin: IO[bytes], message: dict[str, Any]) -> None:
    body = json.dumps({"jsonrpc": "2.0", **message}).encode()
    stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    stdin.flush()


def _receive(stdout: IO[bytes]) -> dict[str, Any]:
    length = 0
    while (line := stdout.readline().strip()) != b"":
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return json.loads(stdout.read(length))


def _response(stdout: IO[bytes], request_id: int) -> dict[str, Any]:
    while (message := _receive(stdout)).get("id") != request_id or "method" in message:
        pass
    return message


def test_cancelling_an_answered_request_logs_nothing(tmp_path: Path) -> None:
    """VS Code cancels requests the server already answered all the time; pygls warned
    about each one ('Cancel notification for unknown message id') into the user's logs."""
    server = subprocess.Popen(
        [sys.executable, "-m", "precompile_lsp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=fresh_env(),
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        _send(
            server.stdin,
            {
                "id": 1,
                "method": "initialize",
                "params": {
                    "processId": None,
                    "rootUri": tmp_path.as_uri(),
                    "capabilities": {},
                    "initializationOptions": {"trusted": False},
                },
            },
        )
        _response(server.stdout, 1)
        _send(server.stdin, {"method": "initialized", "params": {}})
        hover = {
            "textDocument": {"uri": (tmp_path / "absent.py").as_uri()},
            "position": {"line": 0, "character": 0},
        }
        _send(server.stdin, {"id": 2, "method": "textDocument/hover", "params": hover})
        assert _response(server.stdout, 2)["result"] is None
        _send(server.stdin, {"method": "$/cancelRequest", "params": {"id": 2}})  # answered
        _send(server.stdin, {"method": "$/cancelRequest", "params": {"id": 99}})  # never sent
        _send(server.stdin, {"id": 3, "method": "shutdown"})
        assert "error" not in _response(server.stdout, 3)
        _send(server.stdin, {"method": "exit"})
        _, stderr = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0
    assert b"Cancel notification" not in stderr, stderr.decode(errors="replace")
