"""The language server's stdio transport: LSP base-protocol framing that survives a bad
client.

pygls's own loop skips header lines it cannot read without a word, and after a bad
``Content-Length`` it reads the stream out of step, so one broken message can swallow the
next ones and leave a client waiting forever. Here every problem is logged (stderr, which
editors show in the server's log) and the stream is brought back into step:

- a malformed header line, or a ``Content-Length`` that is not a sane number, is skipped
  up to the next ``Content-Length:`` header, wherever it starts (a body written without
  its trailing newline glues the next header onto its last line);
- a body that is not JSON gets the protocol's Parse error (-32700); a JSON value that is
  not a request, response or notification gets Invalid Request (-32600), with its id
  when it has one;
- an unknown method is pygls's: MethodNotFound for a request, a log line for a
  notification.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Awaitable
from typing import Any, Protocol

log = logging.getLogger("precompile_lsp")

#: A body larger than this is not an LSP message but a broken stream.
MAX_BODY_BYTES = 256 * 1024 * 1024
_HEADER = re.compile(rb"^([A-Za-z][A-Za-z0-9-]*):[ \t]*([^\r\n]*)\r?\n$")
_CONTENT_LENGTH = re.compile(rb"Content-Length:[ \t]*(\d+)\r?\n$")
PARSE_ERROR, INVALID_REQUEST = -32700, -32600


class AsyncReader(Protocol):
    def readline(self) -> Awaitable[bytes]: ...

    def readexactly(self, n: int) -> Awaitable[bytes]: ...


class Writer(Protocol):
    def write(self, data: bytes) -> Any: ...


def frame(payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload).encode("utf-8")
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def _content_length(value: bytes) -> int | None:
    if not value.strip().isdigit():
        return None
    length = int(value)
    return length if 0 < length <= MAX_BODY_BYTES else None


async def _read_headers(reader: AsyncReader) -> int | None:
    """The next message's Content-Length, skipping (and logging) anything malformed on
    the way; None at the end of the stream."""
    length: int | None = None
    skipped: list[bytes] = []
    while True:
        line = await reader.readline()
        if not line:
            return None
        if line.strip() == b"":
            if length is not None:
                if skipped:
                    _log_skipped(skipped)
                return length
            if skipped:
                skipped.append(line)
            continue
        match = _HEADER.match(line)
        if match is not None and match.group(1).lower() != b"content-length":
            continue  # Content-Type and other headers: nothing to act on
        value = match.group(2) if match is not None else None
        parsed = _content_length(value) if value is not None else None
        if parsed is not None and length is None:
            length = parsed
            continue
        # Malformed: skip it; a Content-Length glued onto its end starts a new message.
        skipped.append(line)
        glued = _CONTENT_LENGTH.search(line)
        if glued is not None:
            length = _content_length(glued.group(1))


def _log_skipped(lines: list[bytes]) -> None:
    text = b"".join(lines)
    log.warning(
        "precompile: skipped %d bytes of malformed input from the client (a bad header or "
        "Content-Length): %r",
        len(text),
        text[:200],
    )


def _reply_error(writer: Writer, code: int, message: str, message_id: Any = None) -> None:
    payload = {"jsonrpc": "2.0", "id": message_id, "error": {"code": code, "message": message}}
    writer.write(frame(payload))


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and (
        isinstance(value.get("method"), str) or "result" in value or "error" in value
    )


async def serve(stop: threading.Event, reader: AsyncReader, protocol: Any, writer: Writer) -> None:
    """Read framed messages until the stream ends or ``stop`` is set, handing each to
    ``protocol`` (pygls's JSON-RPC protocol)."""
    while not stop.is_set():
        length = await _read_headers(reader)
        if length is None:
            return
        try:
            body = await reader.readexactly(length)
        except Exception:  # the stream ended inside a body
            log.warning("precompile: the client's stream ended inside a message")
            return
        try:
            raw = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            log.warning(
                "precompile: a message from the client is not JSON (%s): %r", error, body[:200]
            )
            _reply_error(writer, PARSE_ERROR, f"Parse error: {error}")
            continue
        if not _is_message(raw):
            log.warning("precompile: not a JSON-RPC message: %r", body[:200])
            message_id = raw.get("id") if isinstance(raw, dict) else None
            _reply_error(
                writer, INVALID_REQUEST, "Invalid Request: not a JSON-RPC message", message_id
            )
            continue
        try:
            message = json.loads(body, object_hook=protocol.structure_message)
        except Exception as error:
            log.warning("precompile: cannot read %r: %s", body[:200], error)
            if raw.get("id") is not None and "method" in raw:
                _reply_error(writer, INVALID_REQUEST, f"Invalid Request: {error}", raw["id"])
            continue
        try:
            protocol.handle_message(message)
        except Exception:
            log.exception("precompile: failed to handle %r", body[:200])
