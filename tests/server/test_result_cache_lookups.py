"""A cached result stays current only while every import its job made would find what
it found: helper-78's attack found four changes to what a target imports that left
every imported file's bytes alone -- a symbolic link to a module re-pointed, one to a
package folder re-pointed, an optional import (``try: from .fast import f``) now finding
its module, and a module shadowed by a new file in an earlier source root -- and a
distribution reinstalled with other files under the same version. (A source root that
did not exist at the job, created since with the module in it, is the same shadowing; so
is a folder added to PYTHONPATH, which the cache key holds.)
Each was answered from the cache ("0 errors") while the emitted artifact no longer matched the source.
The job now records every place its imports looked (``worker/sources.py``) and each
distribution's ``RECORD``; the cache compares what each held
(``files.path_state``)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

from tests.harness import precompile_cli

EXAMPLES = """import torch
import precompile


def examples():
    torch.manual_seed(0)
    return [precompile.Example(torch.nn.Linear(4, 4).eval(), torch.randn(2, 4))]
"""

#: Target name -> (its module's source); each calls ``scale`` from where its route says.
TARGETS = {
    "linked": "from pkg import linked_impl as impl\n",
    "linked_package": "from pkg import linked_dir as impl\n",
    "optional": (
        "try:\n    from pkg import fast as impl\nexcept ImportError:\n"
        "    from pkg import slow as impl\n"
    ),
    "shadowed": "import shadowed_mod as impl\n",
    # Shadowed from a source root created since (no folder, so no finder, at the job).
    "late_root": "import late_mod as impl\n",
    # Found in a folder added to PYTHONPATH since (not on the job's sys.path at all).
    "on_pythonpath": (
        "try:\n    import pyp_mod as impl\nexcept ImportError:\n"
        "    from pkg import slow as impl\n"
    ),
    "installed": "import fakedist_mod as impl\n",
    # A RECORD that leaves the dist-info's own files out (some installers do).
    "installed_unlisted": "import unlisted_mod as impl\n",
}

TARGET = """import precompile
from pkg.common import examples
{imports}

@precompile.target(examples, artifact="artifacts/{name}.py")
def {name}(model, x):
    return impl.scale(model(x))
"""


def _scale(factor: float) -> str:
    return f"def scale(x):\n    return x * {factor}\n"


def _install(site: Path, factor: float, name: str = "fakedist", own_files: bool = True) -> None:
    """A distribution ``name`` 1.0 in ``site`` (a folder named site-packages), as an
    installer leaves one: its module and a dist-info whose RECORD lists the module's hash
    (and, where ``own_files``, the dist-info's own files, as pip's does)."""
    module = site / f"{name}_mod.py"
    module.write_text(_scale(factor))
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "top_level.txt").write_text(f"{name}_mod\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(module.read_bytes()).digest())
    size = module.stat().st_size
    own = f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n" if own_files else ""
    (info / "RECORD").write_text(
        f"{module.name},sha256={digest.decode().rstrip('=')},{size}\n{own}"
    )


def _workspace(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    root = tmp_path / "ws"
    package = root / "src" / "pkg"
    package.mkdir(parents=True)
    (root / "lib").mkdir()
    shared = tmp_path / "shared"
    for folder in ("one", "two"):
        (shared / folder).mkdir(parents=True)
    (shared / "one.py").write_text(_scale(2.0))
    (shared / "two.py").write_text(_scale(3.0))
    (shared / "one" / "__init__.py").write_text(_scale(2.0))
    (shared / "two" / "__init__.py").write_text(_scale(3.0))
    (package / "__init__.py").write_text("")
    (package / "common.py").write_text(EXAMPLES)
    (package / "linked_impl.py").symlink_to(shared / "one.py")
    (package / "linked_dir").symlink_to(shared / "one")
    (package / "slow.py").write_text(_scale(2.0))
    (root / "lib" / "shadowed_mod.py").write_text(_scale(2.0))
    (root / "lib" / "late_mod.py").write_text(_scale(2.0))
    for name, imports in TARGETS.items():
        (package / f"t_{name}.py").write_text(TARGET.format(name=name, imports=imports))
    (root / "pyproject.toml").write_text(
        '[tool.precompile]\nsource-roots = ["src", "gen", "lib"]\nbackend = "eager"\n'
    )
    site = tmp_path / "venv" / "site-packages"
    site.mkdir(parents=True)
    _install(site, 2.0)
    _install(site, 2.0, "unlisted", own_files=False)
    env = {"PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(site)])}
    return root, env


def _change_what_each_import_finds(root: Path, tmp_path: Path) -> None:
    """Each target computes ``x * 3.0`` now, and no file any job imported changed."""
    package = root / "src" / "pkg"
    (package / "linked_impl.py").unlink()
    (package / "linked_impl.py").symlink_to(tmp_path / "shared" / "two.py")
    (package / "linked_dir").unlink()
    (package / "linked_dir").symlink_to(tmp_path / "shared" / "two")
    (package / "fast.py").write_text(_scale(3.0))
    (root / "src" / "shadowed_mod.py").write_text(_scale(3.0))
    (root / "gen").mkdir()
    (root / "gen" / "late_mod.py").write_text(_scale(3.0))
    _install(tmp_path / "venv" / "site-packages", 3.0)  # reinstalled, same version
    _install(tmp_path / "venv" / "site-packages", 3.0, "unlisted", own_files=False)


def _failed_verifications(stdout: str) -> set[str]:
    doc = json.loads(stdout)
    return {f["target"].rsplit(".", 1)[-1] for f in doc["findings"] if f["code"] == "PC303"}


def test_a_change_to_what_an_import_finds_is_never_answered_from_the_cache(
    tmp_path: Path,
) -> None:
    root, env = _workspace(tmp_path)
    first = precompile_cli("check", "--emit", "--verify", cwd=root, timeout=600, **env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"({len(TARGETS)} captured, 0 from cache)" in first.stdout, first.stdout
    # Unchanged: every result from the cache (what the lookups record is stable).
    again = precompile_cli("check", "--verify", cwd=root, timeout=600, **env)
    cached = f"(0 captured, {2 * len(TARGETS)} from cache)"
    assert cached in again.stdout, again.stdout + again.stderr

    _change_what_each_import_finds(root, tmp_path)
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "pyp_mod.py").write_text(_scale(3.0))
    env = {"PYTHONPATH": os.pathsep.join([str(extra), env["PYTHONPATH"]])}
    after = precompile_cli("check", "--verify", "--format", "json", cwd=root, timeout=600, **env)
    uncached = precompile_cli(
        "check", "--verify", "--format", "json", "--no-cache", cwd=root, timeout=600, **env
    )
    # The artifacts emitted before the change serve x * 2.0 where the source now says
    # x * 3.0: each verification fails, with the cache as without it.
    assert _failed_verifications(uncached.stdout) == set(TARGETS), uncached.stdout
    assert _failed_verifications(after.stdout) == set(TARGETS), after.stdout
    assert json.loads(after.stdout)["stats"]["cache_hits"] == 0, after.stdout
