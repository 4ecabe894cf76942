"""Fixture workspaces, copied to a temporary directory, and the check's JSON document."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.harness import REPO, precompile_cli

FIXTURES = REPO / "tests" / "fixtures"


def check_json(workspace: Path, *args: str) -> tuple[int, dict[str, Any]]:
    proc = precompile_cli("check", "--format", "json", *args, cwd=workspace)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="session")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shop workspace with a stale artifact: emitted, then its target's code edited
    (staleness is per function: an edit elsewhere in the file would not count)."""
    workspace = tmp_path_factory.mktemp("shop") / "shop"
    shutil.copytree(FIXTURES / "workspace", workspace)
    proc = precompile_cli("emit", "shop.serving.stale", cwd=workspace)
    assert proc.returncode == 0, proc.stderr
    serving = workspace / "src" / "shop" / "serving.py"
    source = serving.read_text()
    assert "    return model(x) * 2\n" in source
    serving.write_text(source.replace("    return model(x) * 2\n", "    return model(x) * 2.0\n"))
    return workspace
