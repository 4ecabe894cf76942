"""Which code is an installed library's and which the project's (``precompile.locations``):
a library from any install folder on the path is a library.

Only this environment's own site-packages used to count: a library installed for the
user (``pip install --user``), in the base interpreter's site-packages (a venv made with
``--system-site-packages``), in Debian's ``dist-packages`` or in a folder a ``.pth`` file
adds was taken for the project's code -- its module globals walked and held against
every make_fx trace (transformers' lazy mapping then raised out of the capture).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.harness import run_json

CHILD = """
import json, sys
import installed_elsewhere, project_module
from precompile.locations import is_project_module
print(json.dumps([is_project_module(installed_elsewhere), is_project_module(project_module)]))
"""


@pytest.mark.parametrize("folder", ["site-packages", "dist-packages"])
def test_a_module_from_another_install_folder_is_a_library(tmp_path: Path, folder: str) -> None:
    installed = tmp_path / "base" / "lib" / "python3.11" / folder
    project = tmp_path / "project"
    installed.mkdir(parents=True)
    project.mkdir()
    (installed / "installed_elsewhere.py").write_text("CALLS = []\n")
    (project / "project_module.py").write_text("CALLS = []\n")
    result = run_json(textwrap.dedent(CHILD), pythonpath=[installed, project])
    assert result == [False, True]
