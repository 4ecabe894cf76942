"""The language server on a workspace it cannot write: it publishes the findings and
says once that the result cache could not be written (the cache is an optimisation),
instead of "capturing 0/N" forever with nothing shown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lsprotocol import types

from tests.lsp.conftest import Session
from tests.read_only import read_only_copy
from tests.server.conftest import FIXTURES


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Path]:
    with read_only_copy(FIXTURES / "workspace", tmp_path / "mnt") as root:
        yield root


async def test_a_read_only_workspace_gets_diagnostics_and_one_warning(session: Session) -> None:
    await session.start()
    await session.settled()
    assert session.codes("src/shop/serving.py") == ["PC201", "PC302"]
    assert session.codes("src/shop/helpers.py") == ["PC101"]
    assert session.codes("src/shop/broken.py") == ["PC002"]
    # Every captured target failed to cache its result; the user is told once.
    warnings = [m for m in session.client.messages if "result cache" in m.message]
    assert len(warnings) == 1, [m.message for m in session.client.messages]
    assert warnings[0].type == types.MessageType.Warning
    assert "Read-only file system" in warnings[0].message
    assert not session.path(".precompile").exists()
