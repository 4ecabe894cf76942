"""The server outlives its workers, and keeps one engine per workspace folder."""

from __future__ import annotations

import os
import signal
from pathlib import Path

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
