"""The layering contracts (pyproject.toml, run by `make lint`) hold, and they bite: a copy
of the sources with one forbidden import added fails them, naming the contract."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import REPO

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root / "core"), str(root / "server")])
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root)
    for package in ("core/precompile", "server/precompile_lsp"):
        shutil.copytree(
            REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return root


def test_the_contracts_hold(sources: Path) -> None:
    proc = lint_imports(sources)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 kept, 0 broken" in proc.stdout


@pytest.mark.parametrize(
    "module, line, contract",
    [
        (
            "server/precompile_lsp/engine.py",
            "import torch",
            "the engine, language server and CLI never import torch",
        ),
        (
            "server/precompile_lsp/findings.py",
            "from precompile_lsp.worker import jobs",
            "only the worker package imports the worker package",
        ),
        (
            "core/precompile/artifact/metadata.py",
            "import precompile_lsp",
            "core never imports the server",
        ),
        (
            "core/precompile/runtime/single_graph.py",
            "from precompile import capturing",
            "the artifact runtime never imports the capture side",
        ),
        (
            "core/precompile/artifact/envelope.py",
            "from precompile._compat import prelude",
            "the pair on disk and the base (errors, version) import no",
        ),
        (
            "core/precompile/runtime/multigraph.py",
            "from precompile.artifact import pair",
            "the artifact runtime never imports the capture side, the pair on disk",
        ),
        (
            "core/precompile/_compat/runtime.py",
            "from precompile.capturing import emit",
            "torch-compatibility code never imports the capture side",
        ),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    sources: Path, module: str, line: str, contract: str
) -> None:
    path = sources / module
    path.write_text(path.read_text() + f"\n{line}  # deliberately forbidden\n")
    proc = lint_imports(sources)
    assert proc.returncode != 0
    broken = proc.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken.replace("\n", " "), proc.stdout


PRIVATE_NAMES = REPO / "tools" / "private_names.py"


def private_names(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PRIVATE_NAMES), str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_only_the_compat_module_names_private_torch_and_no_module_another_s_private_names(
    sources: Path,
) -> None:
    proc = private_names(sources)
    assert proc.returncode == 0, proc.stderr


_TORCH = "a private torch name outside core/precompile/_compat/"
_OURS = "another module's private name"


@pytest.mark.parametrize(
    "module, line, shown, why",
    [
        (
            "core/precompile/runtime/single_graph.py",
            "import torch as _torch\n_x = _torch._C._set_grad_enabled",
            "_torch._C._set_grad_enabled",
            _TORCH,
        ),
        ("core/precompile/capturing/fx_trace.py", "import torch._dynamo", "torch._dynamo", _TORCH),
        (
            "core/precompile/runtime/state_checks.py",
            "from torch.utils._pytree import tree_flatten",
            "from torch.utils._pytree import tree_flatten",
            _TORCH,
        ),
        ("server/precompile_lsp/engine.py", "from torch import _C", "from torch import _C", _TORCH),
        # Another product module's private name: an attribute read through an imported
        # module (the case the check was made for), a relative import of a sibling's,
        # and a whole module imported under an alias.
        (
            "server/precompile_lsp/worker/ray_task.py",
            "from precompile_lsp.worker import jobs\n_x = jobs._dependencies",
            "jobs._dependencies",
            _OURS,
        ),
        (
            "core/precompile/runtime/multigraph.py",
            "from .multigraph_guards import _fast_check",
            "from .multigraph_guards import _fast_check",
            _OURS,
        ),
        (
            "server/precompile_lsp/engine.py",
            "import precompile_lsp.worker.sources as s\n_y = s._pyc_used",
            "s._pyc_used",
            _OURS,
        ),
    ],
)
def test_a_private_name_used_outside_its_owner_fails_the_check(
    sources: Path, module: str, line: str, shown: str, why: str
) -> None:
    path = sources / module
    path.write_text(path.read_text() + f"\n\n{line}\n")
    proc = private_names(sources)
    assert proc.returncode == 1
    assert f"{module}:" in proc.stderr and shown in proc.stderr, proc.stderr
    assert why in proc.stderr, proc.stderr


def test_a_package_s_private_module_is_its_own_to_use(sources: Path) -> None:
    # ``precompile._compat`` is private to ``precompile``: every module of the package may
    # import it, a module of the server may not.
    inside = sources / "core/precompile/capturing/emit.py"
    inside.write_text(inside.read_text() + "\n\nfrom precompile._compat import tracing as _t\n")
    assert private_names(sources).returncode == 0
    outside = sources / "server/precompile_lsp/engine.py"
    outside.write_text(outside.read_text() + "\n\nfrom precompile._compat import tracing\n")
    proc = private_names(sources)
    assert proc.returncode == 1 and "server/precompile_lsp/engine.py:" in proc.stderr
