"""The write policy, as ``precompile check --emit`` meets it: an emit writes only to a
path that is new or holds this product's own file of that kind, only inside the
workspace, and never to a path another target's pair (artifact, .cache, .sig) takes;
each refusal is a finding with its fix, the file's bytes unchanged, exit 1. A write that
fails (a full disk) is its own finding beside the target's other findings."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import precompile_cli

USER_BYTES = b"# the user's own file: not an artifact\nvalue = 1\n"

TARGETS = """import torch

import precompile


def one_vector():
    return [(torch.ones(4),)]


@precompile.target(one_vector, artifact="README.md")
def readme(x):
    return x + 1


@precompile.target(one_vector, artifact="pyproject.toml")
def pyproject(x):
    return x + 1


@precompile.target(one_vector, artifact="src/wp/helper.py")
def source_module(x):
    return x + 1


@precompile.target(one_vector, artifact="src/wp/targets.py")
def own_module(x):
    return x + 1


@precompile.target(one_vector, artifact="../outside/up.py")
def up(x):
    return x + 1


@precompile.target(one_vector, artifact="{outside}/absolute.py")
def absolute(x):
    return x + 1


@precompile.target(one_vector, artifact="linked/link.py")
def linked(x):
    return x + 1


@precompile.target(one_vector, artifact="artifacts/bar.sig")
def signature_named(x):
    return x + 1


@precompile.target(one_vector, artifact="artifacts/bar.py")
def bar(x):
    return x + 1


@precompile.target(one_vector, artifact="artifacts/dangling.py")
def dangling(x):
    return x + 1


@precompile.target(one_vector, artifact="artifacts/kept.py")
def kept(x):
    return x + 1


@precompile.target(one_vector, artifact="artifacts/cachelink.py")
def cachelink(x):
    return x + 1


@precompile.target(one_vector, artifact="artifacts/good.py")
def good(x):
    torch._dynamo.graph_break()
    return x + 1
"""

REFUSED = {
    "readme": "README.md",
    "pyproject": "pyproject.toml",
    "source_module": "src/wp/helper.py",
    "own_module": "src/wp/targets.py",
}
OUTSIDE = {"up": "up.py", "absolute": "absolute.py", "linked": "link.py"}
#: Targets whose artifact path (or its .cache) is a symbolic link: the link's path is
#: refused, whatever it points at.
LINKS = {
    # Dangling, into the sources: the emit created a new module there.
    "dangling": ("artifacts/dangling.py", "src/wp/evil.py"),
    # An older pair the user kept, this product's own kind: the emit replaced it.
    "kept": ("artifacts/kept.py", "backup/kept_v1.py"),
    # The refusal named the README, not the link.
    "cachelink": ("artifacts/cachelink.cache", "README.md"),
}


def _workspace(base: Path) -> tuple[Path, Path]:
    root, outside = base / "ws", base / "outside"
    (root / "src" / "wp").mkdir(parents=True)
    outside.mkdir()
    (root / "src" / "wp" / "__init__.py").write_text("")
    (root / "src" / "wp" / "helper.py").write_bytes(USER_BYTES)
    (root / "src" / "wp" / "targets.py").write_text(TARGETS.replace("{outside}", str(outside)))
    (root / "README.md").write_bytes(b"# Read me\n")
    (root / "pyproject.toml").write_text(
        '[tool.precompile]\nsource-roots = ["src"]\nbackend = "eager"\n'
    )
    for name in OUTSIDE.values():
        (outside / name).write_bytes(USER_BYTES)
    (root / "linked").symlink_to(outside, target_is_directory=True)
    import torch

    from precompile.write_policy import ARTIFACT_MARKER, CACHE_FORMAT

    (root / "backup").mkdir()
    (root / "backup" / "kept_v1.py").write_bytes(ARTIFACT_MARKER + b" the user's kept v1\n")
    torch.save({"format": CACHE_FORMAT, "kept": "v1"}, root / "backup" / "kept_v1.cache")
    (root / "artifacts").mkdir()
    for link, points_at in LINKS.values():
        (root / link).symlink_to(os.path.relpath(root / points_at, (root / link).parent))
    (root / "artifacts" / "kept.cache").symlink_to("../backup/kept_v1.cache")
    return root, outside


def _snapshot(*dirs: Path) -> dict[str, bytes]:
    files = {}
    for directory in dirs:
        for path in sorted(directory.rglob("*")):
            if path.is_file() and not path.is_symlink() and ".precompile" not in path.parts:
                files[str(path)] = path.read_bytes()
    return files


def _of(doc: dict[str, Any], target: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["target"] == f"wp.targets.{target}"]


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root, outside = _workspace(tmp_path_factory.mktemp("writes"))
    before = _snapshot(root, outside)
    proc = precompile_cli("check", "--format", "json", "--emit", "--verify", cwd=root)
    return {
        "root": root,
        "outside": outside,
        "before": before,
        "after": _snapshot(root, outside),
        "proc": proc,
        "doc": json.loads(proc.stdout),
    }


def test_emit_refuses_to_overwrite_a_file_it_did_not_write(emitted: dict[str, Any]) -> None:
    assert emitted["proc"].returncode == 1, emitted["proc"].stderr
    for target, path in REFUSED.items():
        [finding] = [f for f in _of(emitted["doc"], target) if f["code"] == "PC305"]
        assert finding["severity"] == "error"
        assert f"{path} already exists and is not a torch-precompile artifact" in finding["message"]
        assert "Point artifact= at a new path" in finding["message"]
        assert finding["file"] == "src/wp/targets.py"
    # Every byte of every file there was is as it was; nothing new beside them either.
    after = emitted["after"]
    for name, data in emitted["before"].items():
        assert after[name] == data, name
    root: Path = emitted["root"]
    for stray in ("README.cache", "README.sig", "pyproject.cache", "src/wp/helper.cache"):
        assert not (root / stray).exists(), stray


def test_emit_never_writes_outside_the_workspace(emitted: dict[str, Any]) -> None:
    outside: Path = emitted["outside"]
    for target, name in OUTSIDE.items():
        [finding] = [f for f in _of(emitted["doc"], target) if f["code"] == "PC305"]
        assert "is outside the workspace" in finding["message"], finding["message"]
        assert (outside / name).read_bytes() == USER_BYTES
    assert sorted(p.name for p in outside.iterdir()) == sorted(OUTSIDE.values())


def test_emit_never_writes_through_a_symbolic_link(emitted: dict[str, Any]) -> None:
    """helper-88: the engine resolved the artifact path before it asked the write policy,
    so the policy saw the link's destination, not the link: a dangling link made the
    emit create a module inside the sources, and a link to an older pair the user kept
    replaced it. The refusal of a linked .cache named the README it points at."""
    root: Path = emitted["root"]
    for target, (link, points_at) in LINKS.items():
        [finding] = [f for f in _of(emitted["doc"], target) if f["code"] == "PC305"]
        assert f"{link} is a symbolic link, never written" in finding["message"], finding
        assert points_at not in finding["message"], finding
        # The new path it suggests is not the refused one.
        assert f"e.g. artifacts/{target}.py)" not in finding["message"], finding
        assert (root / link).is_symlink()
    assert not (root / "src" / "wp" / "evil.py").exists()
    assert not (root / "src" / "wp" / "evil.cache").exists()
    assert sorted(p.name for p in (root / "backup").iterdir()) == ["kept_v1.cache", "kept_v1.py"]
    # Their bytes are unchanged: test_emit_refuses_to_overwrite_a_file_it_did_not_write.


def test_a_signature_path_beside_another_targets_artifact_is_a_conflict(
    emitted: dict[str, Any],
) -> None:
    doc, root = emitted["doc"], emitted["root"]
    for target, other in (("signature_named", "bar"), ("bar", "signature_named")):
        codes = [f["code"] for f in _of(doc, target)]
        # One finding says it all: no verification of a pair that is not its own.
        assert codes == ["PC304"], codes
        [conflict] = _of(doc, target)
        message = conflict["message"]
        assert f"wp.targets.{target} and wp.targets.{other}" in message, message
        assert "artifacts/bar.sig" in message
        assert " all write" not in message
    [mine] = _of(doc, "signature_named")
    assert (
        "both write artifacts/bar.sig (its artifact, the other's signature) and "
        "artifacts/bar.cache (the cache of each)"
    ) in mine["message"]
    assert not any((root / "artifacts" / f"bar.{ext}").exists() for ext in ("py", "sig", "cache"))


def test_re_emitting_over_its_own_artifact_works(emitted: dict[str, Any]) -> None:
    root: Path = emitted["root"]
    # The target writable beside all those refusals was emitted, verified, and its
    # other finding (the graph break) is shown.
    assert [f["code"] for f in _of(emitted["doc"], "good")] == ["PC101"]
    artifact = root / "artifacts" / "good.py"
    first = artifact.read_bytes()
    targets = root / "src" / "wp" / "targets.py"
    source = targets.read_text()
    targets.write_text(
        source.replace(
            "    torch._dynamo.graph_break()\n    return x + 1",
            "    torch._dynamo.graph_break()\n    return x + 2",
        )
    )
    proc = precompile_cli("emit", "wp.targets.good", cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert artifact.read_bytes() != first
    assert (root / "artifacts" / "good.cache").is_file()
    proc = precompile_cli("emit", "wp.targets.readme", cwd=root)
    assert proc.returncode == 1
    assert "README.md already exists and is not a torch-precompile artifact" in proc.stderr
    assert (root / "README.md").read_bytes() == b"# Read me\n"


BREAKING = """import torch

import precompile


def one_vector():
    return [(torch.ones(4),)]


@precompile.target(one_vector)
def broken(x):
    torch._dynamo.graph_break()
    return x + 1
"""


@pytest.fixture
def full_artifacts(tmp_path: Path) -> Iterator[Path]:
    """A workspace whose artifacts folder is a 64 KiB tmpfs: too small for an artifact."""
    root = tmp_path / "ws"
    (root / "src" / "full").mkdir(parents=True)
    (root / "src" / "full" / "__init__.py").write_text("")
    (root / "src" / "full" / "targets.py").write_text(BREAKING)
    (root / "pyproject.toml").write_text(
        '[tool.precompile]\nsource-roots = ["src"]\nbackend = "eager"\n'
    )
    artifacts = root / "artifacts"
    artifacts.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(artifacts)], check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", str(artifacts)], check=True)


def test_a_full_disk_on_emit_is_a_finding_beside_the_others(full_artifacts: Path) -> None:
    proc = precompile_cli("check", "--format", "json", "--emit", cwd=full_artifacts)
    assert proc.returncode == 1, proc.stderr
    findings = json.loads(proc.stdout)["findings"]
    codes = sorted(f["code"] for f in findings)
    assert codes == ["PC101", "PC306"], findings
    [failed] = [f for f in findings if f["code"] == "PC306"]
    assert os.strerror(28) in failed["message"]  # ENOSPC: "No space left on device"
    assert "no file was created" in failed["message"]
    assert list((full_artifacts / "artifacts").iterdir()) == []


def test_a_report_replaces_only_a_report(emitted: dict[str, Any]) -> None:
    root: Path = emitted["root"]
    proc = precompile_cli("check", "--format", "sarif", "--output", "README.md", cwd=root)
    assert proc.returncode == 2
    assert (
        "README.md already exists and is not a report of precompile check, merge or coverage"
        in proc.stderr
    )
    assert (root / "README.md").read_bytes() == b"# Read me\n"
    # A new file, then the same report again in each format: a report replaces a report.
    for fmt in ("sarif", "json", "text", "github", "sarif"):
        proc = precompile_cli("check", "--format", fmt, "--output", "report.out", cwd=root)
        assert proc.returncode == 1, (fmt, proc.stderr)
    assert json.loads((root / "report.out").read_text())["version"] == "2.1.0"


def test_a_file_that_only_looks_like_a_report_is_never_replaced(
    emitted: dict[str, Any],
) -> None:
    # helper-78's attack: each of these was replaced by `check --output`, because one
    # line, a key set or emptiness was all that recognised a report.
    root: Path = emitted["root"]
    lookalikes = {
        # An empty module: its existence is its content (an empty __init__.py makes
        # a package).
        "empty_mod.py": "",
        # A changelog whose last line is a pasted summary.
        "CHANGELOG.md": "# Changelog\n\n- CI runs precompile check; it printed:\n\n"
        "2 targets checked in 3.1 s (2 captured, 0 from cache): 0 errors, 0 warnings\n",
        # Another tool's GitHub annotations.
        "eslint.txt": "::warning file=src/app.js,line=3::Unexpected console statement\n",
        # A JSON document with the report's keys and one of its own.
        "audit.json": '{"version": 1, "root": "/srv", "findings": [], "targets": [], '
        '"stats": {}, "owner": "me"}\n',
        # helper-80: a SARIF log merged from several tools' runs (sarif-multitool), one
        # of them ours: replacing it would lose CodeQL's findings.
        "combined.sarif": json.dumps(
            {
                "version": "2.1.0",
                "runs": [
                    {"tool": {"driver": {"name": "CodeQL"}}, "results": [{"ruleId": "py/x"}]},
                    {"tool": {"driver": {"name": "torch-precompile"}}, "results": []},
                ],
            }
        ),
    }
    for name, content in lookalikes.items():
        (root / name).write_text(content)
        for fmt in ("text", "json", "sarif"):
            proc = precompile_cli("check", "--format", fmt, "--output", name, cwd=root)
            assert proc.returncode == 2, (name, fmt, proc.stderr)
            assert (
                f"{name} already exists and is not a report of precompile check, merge or coverage"
                in proc.stderr
            )
            assert (root / name).read_text() == content
    # An empty file of another name is a new report's place (``mktemp``).
    (root / "empty.out").write_text("")
    proc = precompile_cli("check", "--format", "text", "--output", "empty.out", cwd=root)
    assert proc.returncode == 1, proc.stderr
    assert "targets checked in" in (root / "empty.out").read_text()
