"""A job's result is keyed by the bytes its capture ran, whatever imported them.

Python reuses a ``.pyc`` whose recorded modification time (whole seconds) and size match
the source. An edit saved within the second of the last import that keeps the size was
captured from the old bytecode and reported -- emitted, verified -- as the new file's
result. Here the user's own Python run left the ``.pyc`` (``py_compile``) and the edit
keeps size and modification time, for every way a hashed file reaches a job: the
workspace, a folder on ``PYTHONPATH``, a file loaded by path
(``spec_from_file_location``), a workspace inside a folder whose name has
"site-packages" in it, a zip archive, and a module ``sitecustomize`` imported when the
worker started. And an edit saved while the job runs is not taken for what it ran.
"""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.harness import fresh_env, run_json, run_module

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
{load}


def examples():
{wait}    return [(torch.ones(3),)]


@precompile.target(examples)
def scale(x):
    return x * FACTOR
"""

IMPORT = "from factor import FACTOR"
BY_PATH = """\
import importlib.util, os, sys
_spec = importlib.util.spec_from_file_location(
    "factor", os.path.join(os.path.dirname(__file__), "..", "config", "factor.py")
)
sys.modules["factor"] = _module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
FACTOR = _module.FACTOR"""
#: The same without a ``sys.modules`` entry: nothing but the load itself knows the file.
BY_PATH_ALONE = BY_PATH.replace('sys.modules["factor"] = _module', "_module")

SERVE = """
import json, warnings, torch, precompile
warnings.simplefilter("ignore")
run = precompile.load({artifact!r})
print(json.dumps(run(torch.ones(3)).tolist()))
"""


def _workspace(parent: Path, load: str = IMPORT, wait: str = "") -> Path:
    workspace = parent / "ws"
    (workspace / "src").mkdir(parents=True)
    (workspace / "pyproject.toml").write_text(PYPROJECT)
    (workspace / "src" / "edits.py").write_text(TARGET.format(load=load, wait=wait))
    return workspace


def _edit_in_the_same_second(path: Path) -> None:
    """``FACTOR = 2.0`` -> ``3.0`` in ``path``, keeping the file's size and times."""
    stat = path.stat()
    path.write_text(path.read_text().replace("2.0", "3.0"))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _check(workspace: Path, outside: Path, *args: str) -> str:
    proc = run_module(
        "precompile_lsp.cli",
        "check",
        *args,
        cwd=workspace,
        pythonpath=[outside],
        PYTHONDONTWRITEBYTECODE="",  # Python may write .pyc files, as on most machines
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.stdout


def _served(workspace: Path, outside: Path, tmp_path: Path) -> list[float]:
    """What the emitted artifact serves in a process without the stale .pyc (with it,
    that process runs the old code and the artifact's checks refuse it)."""
    served: list[float] = run_json(
        SERVE.format(artifact=str(workspace / "artifacts" / "edits.scale.py")),
        cwd=workspace,
        pythonpath=[workspace / "src", outside],
        PYTHONPYCACHEPREFIX=str(tmp_path / "serving-pycache"),
    )
    return served


@pytest.mark.parametrize(
    "where", ["workspace", "pythonpath", "by path", "by path alone", "in site-packages"]
)
def test_an_edit_keeping_size_and_second_is_captured_from_disk(tmp_path: Path, where: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    parent = tmp_path / "old-site-packages-backup" if where == "in site-packages" else tmp_path
    workspace = _workspace(
        parent, load={"by path": BY_PATH, "by path alone": BY_PATH_ALONE}.get(where, IMPORT)
    )
    factor = {
        "workspace": workspace / "src",
        "pythonpath": outside,
        "by path": workspace / "config",
        "by path alone": workspace / "config",
        "in site-packages": workspace / "src",
    }[where] / "factor.py"
    factor.parent.mkdir(exist_ok=True)
    factor.write_text("FACTOR = 2.0\n")
    # The user's own run of their code left its bytecode behind, wherever Python keeps it.
    for source in (factor, workspace / "src" / "edits.py"):
        py_compile.compile(str(source), doraise=True)

    assert "1 captured, 0 from cache): 0 errors" in _check(workspace, outside, "--emit", "--verify")
    _edit_in_the_same_second(factor)
    # The edit is seen (the key hashes the file), and captured from the file.
    assert "1 captured, 0 from cache): 0 errors" in _check(workspace, outside, "--emit", "--verify")
    assert _served(workspace, outside, tmp_path) == [3.0, 3.0, 3.0]


def test_a_module_from_a_zip_archive_is_keyed_by_the_archive(tmp_path: Path) -> None:
    workspace = _workspace(tmp_path)
    archive = tmp_path / "lib.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("factor.py", "FACTOR = 2.0\n")
    assert "1 captured" in _check(workspace, archive, "--emit")
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("factor.py", "FACTOR = 3.0\n")
    assert "1 captured, 0 from cache" in _check(workspace, archive, "--emit")
    assert _served(workspace, archive, tmp_path) == [3.0, 3.0, 3.0]


def test_a_module_imported_at_the_workers_start_from_a_stale_pyc_is_refused(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "sitecustomize.py").write_text("import factor\n")  # at every interpreter's start
    factor = outside / "factor.py"
    factor.write_text("FACTOR = 2.0\n")
    py_compile.compile(str(factor), doraise=True)
    workspace = _workspace(tmp_path)
    assert "0 errors" in _check(workspace, outside)
    _edit_in_the_same_second(factor)
    out = _check(workspace, outside, "--emit")
    assert f"{factor} was imported when the worker started" in out
    assert "from a stale .pyc" in out and "delete " in out
    assert not (workspace / "artifacts" / "edits.scale.py").exists()


def test_a_module_imported_at_the_workers_start_past_its_stale_pyc_is_served(
    tmp_path: Path,
) -> None:
    """A .pyc Python did not take (its header names another size) and could not replace
    (PYTHONDONTWRITEBYTECODE) is not what the module runs: the job is not refused."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "sitecustomize.py").write_text("import factor\n")
    factor = outside / "factor.py"
    factor.write_text("FACTOR = 2.0\n")
    py_compile.compile(str(factor), doraise=True)
    factor.write_text("FACTOR = 3.00\n")  # another size: the .pyc is ignored
    workspace = _workspace(tmp_path)
    proc = run_module(
        "precompile_lsp.cli",
        "check",
        "--emit",
        cwd=workspace,
        pythonpath=[outside],
        PYTHONDONTWRITEBYTECODE="1",
    )
    assert proc.returncode == 0 and "0 errors" in proc.stdout, proc.stdout + proc.stderr
    assert _served(workspace, outside, tmp_path) == [3.0, 3.0, 3.0]


def test_an_edit_saved_while_the_job_runs_is_captured_next_time(tmp_path: Path) -> None:
    started, saved = tmp_path / "started", tmp_path / "saved"
    wait = (
        f"    open({str(started)!r}, 'w').close()\n"
        f"    while not __import__('os').path.exists({str(saved)!r}):\n"
        f"        __import__('time').sleep(0.05)\n"
    )
    workspace = _workspace(tmp_path, wait=wait)
    factor = workspace / "src" / "factor.py"
    factor.write_text("FACTOR = 2.0\n")
    check = subprocess.Popen(
        [sys.executable, "-m", "precompile_lsp.cli", "check"],
        cwd=workspace,
        env=fresh_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not started.exists():  # the job imported factor.py and runs examples()
            assert check.poll() is None and time.monotonic() < deadline, check.communicate()
            time.sleep(0.05)
        factor.write_text("FACTOR = 3.0\n")
        saved.touch()
        out, err = check.communicate(timeout=300)
    finally:
        check.kill()
    assert "1 captured" in out, out + err
    # Its result holds the bytes it ran (2.0), so the file saved since is captured again.
    assert "1 captured, 0 from cache" in _check(workspace, tmp_path)


SAVES_ITSELF = """\
import pathlib

import torch
import precompile


def examples():
    here = pathlib.Path(__file__)  # the user saves an edit while the emit's job runs
    here.write_text(here.read_text().replace("return x * 2.0", "return x * 3.0"))
    return [(torch.ones(3),)]


@precompile.target(examples)
def scale(x):
    return x * 2.0
"""


def test_an_edit_saved_while_an_emit_runs_leaves_the_artifact_stale(tmp_path: Path) -> None:
    """helper-88: the artifact held the code the job imported (``x * 2.0``), but its
    source records were read from the file as it was when the capture ended (``x *
    3.0``): the emit and every check after it called the artifact current. The records
    are of the text the job compiled."""
    workspace = _workspace(tmp_path)
    target = workspace / "src" / "edits.py"
    target.write_text(SAVES_ITSELF)
    emitted = _check(workspace, tmp_path, "--emit", "--format", "json")
    assert "return x * 3.0" in target.read_text()
    artifact = (workspace / "artifacts" / "edits.scale.py").read_text()
    assert "* 2.0" in artifact and "* 3.0" not in artifact
    later = _check(workspace, tmp_path, "--format", "json")
    for out in (emitted, later):
        findings = __import__("json").loads(out)["findings"]
        [stale] = [f for f in findings if f["code"] == "PC301"]
        assert "is stale: `scale` (src/edits.py) changed" in stale["message"]


def test_a_job_writes_no_bytecode_of_the_files_it_hashes(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "factor.py").write_text("FACTOR = 2.0\n")
    workspace = _workspace(tmp_path)
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


def test_a_jobs_traceback_quotes_the_line_it_names_past_a_form_feed(tmp_path: Path) -> None:
    """helper-89: the text a job compiled was split into lines with ``str.splitlines``,
    which also ends a line at a form feed (PEP 8's page break), so every line after one
    was quoted one line off."""
    workspace = _workspace(tmp_path)
    (workspace / "src" / "edits.py").write_text(
        "import torch\nimport precompile\n\x0c\n\ndef examples():\n    scale = 1.0\n"
        '    raise ValueError("boom in examples")\n\n\n@precompile.target(examples)\n'
        "def f(x):\n    return x * 2.0\n"
    )
    findings = __import__("json").loads(_check(workspace, tmp_path, "--format", "json"))
    [failed] = [f for f in findings["findings"] if f["code"] == "PC001"]
    assert 'line 7, in examples\n    raise ValueError("boom in examples")' in failed["details"]
