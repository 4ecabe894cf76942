"""The server outlives its workers, and keeps one engine per workspace folder."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from lsprotocol import types

from tests.lsp.conftest import Session, alive, descendants

HELPERS = "src/lab/helpers.py"

OTHER_PYPROJECT = """[project]
name = "other"
version = "0"

[tool.precompile]
source-roots = ["src"]
backend = "eager"
"""

OTHER_MODULE = """import torch

import precompile


def calls():
    return [(torch.ones(3),)]


@precompile.target(calls)
def chatty(x):
    print("one")
    return x + 1
"""


def workers_in(session: Session, root: Path) -> set[int]:
    """The server's worker processes running in ``root`` (workers run in their folder)."""
    found = set()
    for pid in descendants(session.server_pid):
        try:
            if Path(f"/proc/{pid}/cwd").resolve() == root.resolve():
                found.add(pid)
        except OSError:
            continue
    return found


async def test_killed_workers_leave_the_server_serving(session: Session) -> None:
    await session.start()
    await session.settled()
    assert session.codes("src/lab/crash.py") == ["PC900"]
    workers = descendants(session.server_pid)
    assert workers, "the checks ran in no worker process"

    # Something outside kills every worker (the OOM killer, a user's pkill).
    for pid in workers:
        os.kill(pid, signal.SIGKILL)

    # The next save is checked by fresh workers, and the server answers throughout.
    helpers = session.path(HELPERS)
    await session.settled(await session.save(HELPERS, helpers.read_text() + "\n# edited\n"))
    [finding] = session.diagnostics(HELPERS)
    assert finding.code == "PC101"
    hover = await session.client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=helpers.as_uri()),
            position=finding.range.start,
        )
    )
    assert hover is not None
    assert descendants(session.server_pid) - workers, "no fresh worker took over"
    assert session.client.error is None


async def test_one_engine_per_folder(session: Session, tmp_path: Path) -> None:
    other = tmp_path / "other"
    (other / "src" / "other").mkdir(parents=True)
    (other / "pyproject.toml").write_text(OTHER_PYPROJECT)
    (other / "src" / "other" / "__init__.py").write_text("")
    module = other / "src" / "other" / "mod.py"
    module.write_text(OTHER_MODULE)

    await session.start(folders=[session.root, other])
    await session.settled()
    await session.until(lambda: session.diagnostics(module), "other's findings")
    assert session.codes(module) == ["PC101"]
    assert session.codes(HELPERS) == ["PC101"]
    others = workers_in(session, other)
    assert others, "the other folder's targets ran in no worker of its own"

    # Removing the folder drops its engine, its workers' work and its diagnostics; the
    # other folder is untouched.
    session.client.workspace_did_change_workspace_folders(
        types.DidChangeWorkspaceFoldersParams(
            event=types.WorkspaceFoldersChangeEvent(
                added=[], removed=[types.WorkspaceFolder(uri=other.as_uri(), name="other")]
            )
        )
    )
    await session.until(lambda: session.diagnostics(module) == [], "other's findings cleared")
    assert session.codes(HELPERS) == ["PC101"]
    assert not alive(others), "the removed folder's workers outlived its engine"

    # Added back, it is checked again.
    mark = len(session.statuses)
    session.client.workspace_did_change_workspace_folders(
        types.DidChangeWorkspaceFoldersParams(
            event=types.WorkspaceFoldersChangeEvent(
                added=[types.WorkspaceFolder(uri=other.as_uri(), name="other")], removed=[]
            )
        )
    )
    await session.settled(mark)
    assert session.codes(module) == ["PC101"]


async def test_malformed_messages_are_answered_and_the_server_keeps_serving(
    session: Session,
) -> None:
    """A client that sends a broken header, a bad Content-Length, a body that is not JSON,
    a JSON value that is not a message and an unknown method: each is logged (and
    answered where the protocol has an answer), and diagnostics keep coming."""
    await session.start("neovim")
    await session.settled()
    writer = session.client.protocol.writer
    assert writer is not None
    for raw in (
        b"Not-A-Header\r\n\r\n",
        b"Content-Length: twelve\r\n\r\n{}",
        b"Content-Length: 10\r\n\r\n{not json}",
        b"Content-Length: 9\r\n\r\n[1, 2, 3]",
    ):
        writer.write(raw)
    with pytest.raises(Exception, match="Method Not Found"):
        await asyncio.wait_for(
            session.client.protocol.send_request_async("precompile/no-such-method", None), 30
        )
    # The server still serves: a save re-checks and publishes.
    helpers = session.path(HELPERS)
    source = helpers.read_text()
    await session.settled(await session.save(HELPERS, source.replace("print(tag", "# print(tag")))
    await session.until(lambda: session.diagnostics(HELPERS) == [], "the break to clear")
    await session.settled(await session.save(HELPERS, source))
    assert session.codes(HELPERS) == ["PC101"]
    assert session.client.error is None


async def test_a_huge_source_file_neither_blocks_nor_is_parsed(session: Session) -> None:
    """Tens of megabytes of generated Python: reading and hashing it happen off the event
    loop (requests are answered meanwhile), it is never parsed, and one log line says so."""
    huge = session.path("src/lab/generated_tables.py")
    row = "TABLE_%d = [" + ", ".join(["1.0"] * 60) + "]\n"
    with huge.open("w", encoding="utf-8") as f:
        for i in range(90_000):
            f.write(row % i)
    assert huge.stat().st_size > 25 * 1024 * 1024
    await session.start("neovim")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(session.stats(), 30)
    assert loop.time() - started < 2.0, "a request waited on the huge file"
    await session.settled()
    assert session.codes(HELPERS) == ["PC101"]
    skipped = [m.message for m in session.client.log_messages if "generated_tables.py" in m.message]
    assert len(skipped) == 1 and "not searched for targets" in skipped[0]
    # Saving it again does not log again, nor parse it.
    await session.save("src/lab/generated_tables.py", huge.read_text() + "X = 1\n")
    await asyncio.sleep(2)
    skipped = [m.message for m in session.client.log_messages if "generated_tables.py" in m.message]
    assert len(skipped) == 1


SLOW_MODULE = """import time

import torch

import precompile


def calls():
    time.sleep(600)
    return [(torch.ones(3),)]


@precompile.target(calls)
def slow(x):
    return x * 2
"""


async def test_shutting_down_mid_capture_leaves_nothing_running(session: Session) -> None:
    """A capture runs in a job child with a session of its own (so a timeout can kill all
    it started), which a signal to its worker's process group does not reach; shutting
    the server down while it runs takes it along too (the job is cancelled, and a worker
    that is stopped ends its job's group itself)."""
    session.path("src/lab/slow.py").write_text(SLOW_MODULE)
    await session.start()

    # The worker, and below it the capture it forked (sleeping in calls()).
    def running() -> set[int] | None:
        found = descendants(session.server_pid)
        return found if len(found) >= 2 else None

    below = await session.until(running, "a capture to be running")
    await session.shutdown()
    deadline = asyncio.get_running_loop().time() + 10
    while alive(below) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)
    assert not alive(below), "a worker or its capture outlived the server's shutdown"
