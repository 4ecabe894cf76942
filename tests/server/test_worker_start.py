"""A worker that does not start is reported with what happened to it: killed by a signal
while starting (with the end of its stderr), or its import of torch-precompile failed --
only then the hint to install it."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.harness import precompile_cli

TARGETS = """import torch

import precompile


def calls():
    return [(torch.nn.Linear(2, 2), torch.ones(1, 2))]


@precompile.target(calls)
def tiny(model, x):
    return model(x) + 1
"""


def workspace(tmp_path: Path, worker: str) -> Path:
    """A workspace whose interpreter answers the configuration's probe (``-c``) as
    Python does and starts its worker (``-m``) as ``worker`` says."""
    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "__init__.py").write_text("")
    (root / "src" / "pkg" / "targets.py").write_text(TARGETS)
    python = root / "python"
    python.write_text(
        f'#!/bin/sh\nif [ "$1" = "-c" ]; then exec {sys.executable} "$@"; fi\n{worker}\n'
    )
    python.chmod(0o755)
    (root / "pyproject.toml").write_text(
        '[tool.precompile]\nsource-roots = ["src"]\nbackend = "eager"\ntracer = "make_fx"\n'
        'python = "./python"\n'
    )
    return root


def test_a_worker_killed_while_starting_says_so(tmp_path: Path) -> None:
    # Like the OOM killer during `import torch`: a signal, after some output.
    killed = (
        f"exec {sys.executable} -c \"import os, sys; sys.stderr.write('importing torch\\\\n'); "
        'sys.stderr.flush(); os.kill(os.getpid(), 9)"'
    )
    proc = precompile_cli("check", "--no-cache", cwd=workspace(tmp_path, killed), timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "killed by signal 9 (SIGKILL) while starting" in out
    assert "importing torch" in out  # the end of its stderr
    assert "not installed" not in out and "is torch-precompile installed" not in out


def test_a_worker_that_cannot_import_torch_precompile_says_install_it(tmp_path: Path) -> None:
    # No site-packages (-S) and no PYTHONPATH (-I): precompile_lsp cannot be imported.
    missing = f'exec {sys.executable} -I -S "$@"'
    proc = precompile_cli("check", "--no-cache", cwd=workspace(tmp_path, missing), timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "exited with status 1 while starting" in out
    assert "No module named 'precompile_lsp'" in out
    assert "torch-precompile is not installed in that interpreter" in out
