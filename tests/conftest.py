"""pytest's hooks and shared fixtures. The helpers tests import live in modules of their
own: tests/harness.py (the fresh-process harness), tests/attack_runner.py (the attack
files' runner), tests/doc_links.py, tests/read_only.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import REPO


@pytest.fixture
def artifact(tmp_path: Path) -> tuple[str, str]:
    return str(tmp_path / "artifact.py"), str(tmp_path / "artifact.cache")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--e2e",
        action="store_true",
        help="also collect tests/e2e: the extension in a real VS Code (run by `make e2e`)",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """tests/e2e needs code-server, Chromium and Playwright (`make e2e` installs them) and
    takes minutes, so `make test` leaves it out."""
    if collection_path == REPO / "tests" / "e2e" and not config.getoption("--e2e"):
        return True
    return None
