"""The fresh-process harness (tests/harness.py): a child forked from its fork server
(tests/fork_server.py) must be what a fresh interpreter after ``import torch`` is, for
every kind of command line a test starts, and a child that must not have torch imported
(``cold``, the CLI) must be a real fresh interpreter."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.harness import run_json, run_module, run_python, run_script

_STATE = """
import json, os, random, sys
import torch
print(json.dumps({
    "pid": os.getpid(),
    "argv": sys.argv,
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "main": sorted(k for k in vars(sys.modules["__main__"]) if k.startswith("__")),
    "main_file": getattr(sys.modules["__main__"], "__file__", None),
    "name": __name__,
    "ours": sorted(m for m in sys.modules if m.split(".")[0] in ("precompile", "precompile_lsp", "tests")),
    "dynamo": "torch._dynamo" in sys.modules,
    "random": random.random(),
    "torch_random": torch.rand(1).item(),
    "marker": os.environ.get("HARNESS_MARKER"),
    "stdin": sys.stdin.read(),
}))
"""


def test_a_forked_child_is_a_fresh_interpreter_after_import_torch(tmp_path: Path) -> None:
    first, second = run_json(_STATE, cwd=tmp_path), run_json(_STATE, cwd=tmp_path)
    cold = run_json(_STATE, cwd=tmp_path, cold=True)
    assert first["pid"] != second["pid"]
    # Seeded afresh, as an interpreter seeds Python's and torch's generators.
    assert first["random"] != second["random"]
    assert first["torch_random"] != second["torch_random"]
    for child in (first, second):
        for key in ("argv", "path0", "cwd", "main", "name", "ours", "dynamo", "stdin"):
            assert child[key] == cold[key], key
    assert first["argv"] == ["-c"] and first["path0"] == "" and first["ours"] == []
    assert first["cwd"] == str(tmp_path) and first["dynamo"] is False


def test_scripts_and_modules_run_as_main_with_their_arguments(tmp_path: Path) -> None:
    script = tmp_path / "user_script.py"
    script.write_text(_STATE)
    forked = json.loads(run_script(script, "a", "b").stdout.splitlines()[-1])
    cold = json.loads(run_script(script, "a", "b", cold=True).stdout.splitlines()[-1])
    assert forked["argv"] == cold["argv"] == [str(script), "a", "b"]
    assert forked["path0"] == cold["path0"] == str(tmp_path)
    assert forked["main_file"] == cold["main_file"] == str(script)
    package = tmp_path / "pkg_harness"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "job.py").write_text(_STATE)
    forked = json.loads(run_module("pkg_harness.job", "x", cwd=tmp_path).stdout.splitlines()[-1])
    cold = json.loads(
        run_module("pkg_harness.job", "x", cwd=tmp_path, cold=True).stdout.splitlines()[-1]
    )
    for key in ("argv", "path0", "main", "name", "main_file"):
        assert forked[key] == cold[key], key
    assert forked["argv"] == [str(package / "job.py"), "x"] and forked["name"] == "__main__"


@pytest.mark.parametrize("cold", [False, True])
def test_exit_codes_streams_and_errors_are_the_interpreters(cold: bool) -> None:
    proc = run_python(
        "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)", cold=cold
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "out\n", "err\n")
    proc = run_python("import sys\nsys.exit('a message')", cold=cold)
    assert (proc.returncode, proc.stderr) == (1, "a message\n")
    proc = run_python("x = 1\nraise ValueError('boom')", cold=cold)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "Traceback (most recent call last):",
        '  File "<string>", line 2, in <module>',
        "ValueError: boom",
    ]
    proc = run_python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", cold=cold)
    assert proc.returncode == -9
    proc = run_python("import atexit; atexit.register(print, 'at exit')", cold=cold)
    assert (proc.returncode, proc.stdout) == (0, "at exit\n")
    proc = run_python("print('a\\r\\nb', end='')", cold=cold)
    assert proc.stdout == "a\nb"  # text=True's universal newlines


def test_a_child_past_its_timeout_is_killed() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_python("import time; time.sleep(60)", timeout=2)
    # The server goes on serving.
    assert run_python("print(6 * 7)").stdout == "42\n"


def test_a_child_in_another_environment_or_cold_is_a_real_interpreter() -> None:
    code = "import sys, json; print(json.dumps(sorted(m for m in sys.modules if m == 'torch')))"
    assert run_json(code) == ["torch"]  # forked: torch was imported before it started
    assert run_json(code, cold=True) == []
    assert run_json(code, HARNESS_MARKER="1") == []  # its own environment: not forked
    assert run_json(code, PYTHONHASHSEED="3") == []  # read as the interpreter starts
    proc = run_module("precompile_lsp.cli", "--help")
    assert proc.returncode == 0, proc.stderr  # the CLI: never forked from a torch process
    assert run_json(_STATE, HARNESS_MARKER="m")["marker"] == "m"


def test_a_forked_child_runs_in_its_own_temporary_and_inductor_folders(tmp_path: Path) -> None:
    code = (
        "import json, os, sys, tempfile\n"
        "print(json.dumps([tempfile.gettempdir(), os.environ['TORCHINDUCTOR_CACHE_DIR'],"
        " 'torch' in sys.modules]))"
    )
    temp, cache = tmp_path / "tmp", tmp_path / "inductor"
    temp.mkdir()
    got = run_json(code, TMPDIR=str(temp), TORCHINDUCTOR_CACHE_DIR=str(cache))
    assert got == [str(temp), str(cache), True]  # forked, in the environment it was given


def test_what_fixtures_set_in_the_worker_leaves_its_children_forked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fixture module's ``os.environ.setdefault("HF_HUB_OFFLINE", "1")`` at import, or
    the Ray executor's setting, changes the worker's environment for the rest of the run:
    variables torch's import does not read leave every later child forked, in that
    environment."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    code = "import json, os, sys; print(json.dumps([os.environ['HF_HUB_OFFLINE'], 'torch' in sys.modules]))"
    assert run_json(code) == ["1", True]


def test_a_process_that_used_its_fork_server_leaves_no_folder_behind() -> None:
    # The pytest worker's own server lives until the worker exits: a child process that
    # starts one, forks a child from it and exits stands for a worker.
    code = (
        "import json, os\n"
        "from tests.harness import _fork_server, run_json\n"
        "assert run_json('print(1)') == 1\n"
        "print(json.dumps(os.path.dirname(_fork_server().socket)))\n"
    )
    folder = Path(run_json(code, cold=True))
    assert folder.name.startswith("fork-server-")
    assert not folder.exists()
