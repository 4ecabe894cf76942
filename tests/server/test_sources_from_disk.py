"""A job captures the bytes its result is keyed by, never a stale ``.pyc``.

Python reuses a ``.pyc`` whose recorded modification time (whole seconds) and size match
the source. An edit saved within the second of the last import that keeps the size was
captured from the old bytecode and reported -- emitted, verified -- as the new file's
result. Here the user's own Python run left the ``.pyc`` (``py_compile``), the edit keeps
size and modification time, and the file lives in the workspace or in a folder on
``PYTHONPATH`` (both are hashed into the result's key: the same rule must read both).
"""

from __future__ import annotations

import os
import py_compile
from pathlib import Path

import pytest

from tests.harness import run_json, run_module

PYPROJECT = """\
[project]
name = "edits"
version = "0"

[tool.precompile]
source-roots = ["src"]
artifact-dir = "artifacts"
backend = "eager"
"""

TARGET = """\
import torch
import precompile
from factor import FACTOR


def examples():
    return [(torch.ones(3),)]


@precompile.target(examples)
def scale(x):
    return x * FACTOR
"""

SERVE = """
import json, warnings, torch, precompile
warnings.simplefilter("ignore")
run = precompile.load({artifact!r})
print(json.dumps(run(torch.ones(3)).tolist()))
"""


def _workspace(tmp_path: Path, factor_in: str) -> tuple[Path, Path, Path]:
    """A workspace whose target imports ``factor`` from its source root (``factor_in`` is
    ``"workspace"``) or from a folder outside it on PYTHONPATH; returns the workspace,
    that folder and factor.py."""
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    (workspace / "src").mkdir(parents=True)
    outside.mkdir()
    (workspace / "pyproject.toml").write_text(PYPROJECT)
    (workspace / "src" / "edits.py").write_text(TARGET)
    factor = (workspace / "src" if factor_in == "workspace" else outside) / "factor.py"
    factor.write_text("FACTOR = 2.0\n")
    return workspace, outside, factor


def _edit_in_the_same_second(path: Path, old: str, new: str) -> None:
    """Replace ``old`` with ``new`` (same length), keeping the file's times."""
    assert len(old) == len(new)
    stat = path.stat()
    path.write_text(path.read_text().replace(old, new))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.mark.parametrize("where", ["workspace", "pythonpath"])
def test_an_edit_keeping_size_and_second_is_captured_from_disk(tmp_path: Path, where: str) -> None:
    workspace, outside, factor = _workspace(tmp_path, where)
    # The user's own run of their code left its bytecode behind, wherever Python keeps it.
    for source in (factor, workspace / "src" / "edits.py"):
        py_compile.compile(str(source), doraise=True)

    def emit_and_verify() -> str:
        proc = run_module(
            "precompile_lsp.cli",
            "check",
            "--emit",
            "--verify",
            cwd=workspace,
            pythonpath=[outside],
            PYTHONDONTWRITEBYTECODE="",  # Python may write .pyc files, as on most machines
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    assert "1 captured" in emit_and_verify()
    _edit_in_the_same_second(factor, "2.0", "3.0")
    assert "1 captured" in emit_and_verify()  # the edit is seen: the key hashes the file

    # The artifact serves the code on disk (in a serving process without the stale .pyc:
    # with it, that process runs the old code and the artifact's checks refuse it).
    served = run_json(
        SERVE.format(artifact=str(workspace / "artifacts" / "edits.scale.py")),
        cwd=workspace,
        pythonpath=[workspace / "src", outside],
        PYTHONPYCACHEPREFIX=str(tmp_path / "serving-pycache"),
    )
    assert served == [3.0, 3.0, 3.0]


def test_a_job_writes_no_bytecode_of_the_files_it_hashes(tmp_path: Path) -> None:
    workspace, outside, _ = _workspace(tmp_path, "pythonpath")
    proc = run_module(
        "precompile_lsp.cli",
        "check",
        cwd=workspace,
        pythonpath=[outside],
        PYTHONDONTWRITEBYTECODE="",
        PYTHONPYCACHEPREFIX=str(tmp_path / "pycache"),  # Python writes every .pyc there
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 captured" in proc.stdout
    written = sorted(p.name for p in tmp_path.rglob("*.pyc"))
    assert written and [n for n in written if n.startswith(("edits.", "factor."))] == []
