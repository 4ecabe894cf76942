"""A target whose module fails to import is checked again when any file of the
workspace changes: the fix (here a module that did not exist yet) may be anywhere, and
the target's own file is not touched; after a restart, nothing is answered from a
cache that recorded the failure."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from lsprotocol import types

from tests.lsp.conftest import Session

TARGET = """\
import torch

import precompile
from lab.later import helper


@precompile.target(lambda: [(torch.nn.Linear(4, 4), torch.randn(2, 4))], backend="eager")
def target(model, x):
    return helper(model(x))
"""


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "lab"
    (root / "src" / "lab").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [project]
            name = "lab"
            version = "0"

            [tool.precompile]
            source-roots = ["src"]
            backend = "eager"
            tracer = "make_fx"
            """
        )
    )
    (root / "src" / "lab" / "__init__.py").write_text("")
    (root / "src" / "lab" / "t.py").write_text(TARGET)
    return root


async def test_a_module_created_later_fixes_the_import(session: Session) -> None:
    await session.start()
    await session.settled()
    (error,) = session.diagnostics("src/lab/t.py")
    assert error.code == "PC001" and "lab.later" in error.message, error.message

    later = session.path("src/lab/later.py")
    later.write_text("def helper(y):\n    return y.relu()\n", encoding="utf-8")
    mark = len(session.statuses)
    session.client.workspace_did_change_watched_files(
        types.DidChangeWatchedFilesParams(
            [types.FileEvent(later.as_uri(), types.FileChangeType.Created)]
        )
    )
    await session.settled(mark)
    await session.until(lambda: session.diagnostics("src/lab/t.py") == [], "the error cleared")
