"""The harness's forked children (tests/zygote.py) end as spawned ones do: the same exit
status, output and shutdown, a new process with no test code in it -- checked against
``own_interpreter`` (a spawned ``python -c``) on the same probes."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.harness import run_module, run_python, together

PROBES = {
    "ends": "import atexit\natexit.register(lambda: print('atexit ran'))\nprint('out')",
    "raises": (
        "import threading, time\n"
        "def late():\n"
        "    time.sleep(0.2)\n"
        "    print('thread joined', flush=True)\n"
        "threading.Thread(target=late).start()\n"
        "raise ValueError('boom')"
    ),
    "exits": "import sys\nprint('before', flush=True)\nsys.exit(3)",
    "exits with words": "raise SystemExit('words')",
    "is fresh": (
        "import json, os, sys\n"
        "print(json.dumps([__name__, sys.argv, os.getcwd(), sys.path[0],\n"
        "    sorted(m for m in sys.modules if m.split('.')[0] in ('precompile', 'tests'))]))"
    ),
}


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_a_forked_child_ends_as_a_spawned_one(probe: str) -> None:
    forked, spawned = together(
        lambda: run_python(PROBES[probe]),
        lambda: run_python(PROBES[probe], own_interpreter=True),
    )
    assert forked.returncode == spawned.returncode
    assert forked.stdout == spawned.stdout
    # The traceback of a forked child has one more frame (the zygote's own <string>).
    assert forked.stderr.splitlines()[-1:] == spawned.stderr.splitlines()[-1:]


def test_forked_children_are_new_processes_of_their_own_group() -> None:
    script = "import json, os; print(json.dumps([os.getpid(), os.getpgrp(), os.getppid()]))"
    first, second = together(*(lambda: run_python(script) for _ in range(2)))
    pids = [tuple(map(int, p.stdout.strip()[1:-1].split(","))) for p in (first, second)]
    assert len({pid for pid, _group, _parent in pids}) == 2
    # A forked child leads a session of its own (the zygote's ``setsid``: its timeout
    # kills its group); a spawned one stays in pytest's.
    forked = os.environ.get("PRECOMPILE_TESTS_SPAWN") != "1"
    assert all(pid == group for pid, group, _parent in pids) == forked
    assert all(pid != os.getpid() for pid, _group, _parent in pids)


def test_a_forked_child_past_its_timeout_is_killed() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_python("import time\ntime.sleep(60)", timeout=2)


def test_a_fixture_module_runs_as_main_with_its_arguments() -> None:
    forked = run_module("tests.fixtures.print_argv", "a", "b")
    assert forked.returncode == 0, forked.stderr
    assert forked.stdout.split() == ["__main__", "a", "b"]
