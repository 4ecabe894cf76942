"""Review 24's safe edges, as ``precompile check`` meets them: a path that is not a
regular file (FIFO, device node) is never opened or replaced by a writer; the result
cache never writes through a symbolic link; serving-log globs neither loop on directory
symlinks nor block on a FIFO; ``--output`` naming a pair path is a usage error before
anything runs; a module imported from outside the source roots is part of the cache key."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from tests.harness import fresh_env, precompile_cli

TARGETS = """import torch

import precompile


def one_vector():
    return [(torch.ones(4),)]


@precompile.target(one_vector, artifact="artifacts/a.py")
def a(x):
    return x + 1


@precompile.target(one_vector, artifact="artifacts/b.py")
def b(x):
    return x * 2


@precompile.target(one_vector, artifact="artifacts/c.py")
def c(x):
    return x - 1
"""


def _workspace(root: Path, extra_config: str = "") -> Path:
    (root / "src" / "wp").mkdir(parents=True)
    (root / "src" / "wp" / "__init__.py").write_text("")
    (root / "src" / "wp" / "targets.py").write_text(TARGETS)
    (root / "pyproject.toml").write_text(
        f'[tool.precompile]\nsource-roots = ["src"]\nbackend = "eager"\n{extra_config}'
    )
    return root


def _kind(path: Path) -> int:
    return stat.S_IFMT(os.lstat(path).st_mode)


def test_a_fifo_or_device_at_a_pair_path_is_refused_without_blocking(tmp_path: Path) -> None:
    root = _workspace(tmp_path / "ws")
    artifacts = root / "artifacts"
    artifacts.mkdir()
    os.mkfifo(artifacts / "a.py")
    os.mknod(artifacts / "b.cache", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null
    os.mkfifo(artifacts / "c.sig")
    kinds = {p: _kind(p) for p in artifacts.iterdir()}
    proc = precompile_cli(
        "check", "--format", "json", "--emit", "--no-cache", cwd=root, timeout=300
    )
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    messages = {
        f["target"].rsplit(".", 1)[-1]: f["message"]
        for f in doc["findings"]
        if f["code"] == "PC305"
    }
    assert "is a named pipe (FIFO), never written" in messages["a"]
    assert "is a character device, never written" in messages["b"]
    assert "is a named pipe (FIFO), never written" in messages["c"]
    assert {p: _kind(p) for p in artifacts.iterdir()} == kinds


def test_output_that_is_a_fifo_or_device_is_refused(tmp_path: Path) -> None:
    root = _workspace(tmp_path / "ws")
    os.mkfifo(root / "rep.json")
    os.mknod(root / "mynull", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    (root / "mystdout").symlink_to("/proc/self/fd/1")
    for name, what in (
        ("rep.json", "a named pipe (FIFO)"),
        ("mynull", "a character device"),
        ("mystdout", "a symbolic link"),
    ):
        kind = _kind(root / name)
        proc = precompile_cli("check", "--output", name, "--no-cache", cwd=root, timeout=120)
        assert proc.returncode == 2, (name, proc.stderr)
        assert f"--output {name} is {what}, never written" in proc.stderr
        assert _kind(root / name) == kind


def test_the_result_cache_never_writes_through_a_symbolic_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    # .precompile itself a link; .precompile/cache a link; .precompile/.gitignore dangling.
    linked = _workspace(tmp_path / "linked")
    (linked / ".precompile").symlink_to(outside, target_is_directory=True)
    inner = _workspace(tmp_path / "inner")
    (inner / ".precompile").mkdir()
    (inner / ".precompile" / "cache").symlink_to(outside, target_is_directory=True)
    dangling = _workspace(tmp_path / "dangling")
    (dangling / ".precompile").mkdir()
    (dangling / ".precompile" / ".gitignore").symlink_to(outside / "created-by-precompile")
    for root in (linked, inner, dangling):
        proc = precompile_cli("check", cwd=root, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.count("cannot write the result cache") == 1, proc.stderr
        assert "never written through" in proc.stderr
        assert list(outside.iterdir()) == []
        # The next run is not answered from a cache: there is none.
        proc = precompile_cli("check", cwd=root, timeout=300)
        assert "0 from cache" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert (dangling / ".precompile" / ".gitignore").is_symlink()
    assert (linked / ".precompile").is_symlink()


def test_output_naming_a_targets_pair_path_is_a_usage_error(tmp_path: Path) -> None:
    root = _workspace(tmp_path / "ws")
    for output in ("artifacts/a.py", "artifacts/b.cache", "artifacts/c.sig"):
        proc = precompile_cli(
            "check", "--emit", "--no-cache", "--output", output, cwd=root, timeout=300
        )
        assert proc.returncode == 2, proc.stderr
        assert f"--output {output} is the" in proc.stderr
        assert "wp.targets." + output.split("/")[1][0] in proc.stderr
        assert not (root / "artifacts").exists()  # refused before anything ran


def _shadowing(root: Path, marker: Path) -> None:
    """Packages named like ours at the workspace root that leave ``marker`` when run."""
    for package in ("precompile_lsp", "precompile"):
        (root / package).mkdir()
        for module in ("__init__.py", "__main__.py"):
            (root / package / module).write_text(
                f"open({str(marker)!r}, 'a').write({package + '/' + module!r} + '\\n')\n"
            )


def test_the_documented_launches_never_run_a_workspace_precompile_lsp(tmp_path: Path) -> None:
    root = _workspace(tmp_path / "ws")
    marker = tmp_path / "PWNED"
    _shadowing(root, marker)
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert '{ "precompile", "lsp" }' in readme and '("precompile" "lsp"' in readme
    assert '"python", "-m", "precompile_lsp"' not in readme
    console = Path(sys.executable).parent / "precompile"
    for command in ([str(console), "lsp"], [sys.executable, "-P", "-m", "precompile_lsp"]):
        started = time.monotonic()
        subprocess.run(
            command, cwd=root, env=fresh_env(), stdin=subprocess.DEVNULL,
            capture_output=True, timeout=60,
        )  # fmt: skip
        assert time.monotonic() - started < 60
        assert not marker.exists(), (command, marker.read_text())
    # Workers run in the workspace folder too: they import ours, not the workspace's.
    proc = subprocess.run(
        [str(console), "check", "--no-cache"], cwd=root, env=fresh_env(),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "3 targets checked" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert not marker.exists(), marker.read_text()


def test_a_module_from_outside_the_source_roots_is_part_of_the_cache_key(tmp_path: Path) -> None:
    """A sibling library on PYTHONPATH (as an editable install or a .pth folder puts it)
    has no version that changes with its code: its file is hashed, so a change to it is
    checked again, not answered from the cache."""
    library = tmp_path / "lib"
    library.mkdir()
    (library / "extmod.py").write_text("def f(x):\n    return x + 1\n")
    root = tmp_path / "ws"
    (root / "src" / "wp").mkdir(parents=True)
    (root / "src" / "wp" / "__init__.py").write_text("")
    (root / "src" / "wp" / "targets.py").write_text(
        TARGETS.replace("import precompile\n", "import precompile\nimport extmod\n").replace(
            "return x + 1", "return extmod.f(x)"
        )
    )
    (root / "pyproject.toml").write_text(
        '[tool.precompile]\nsource-roots = ["src"]\nbackend = "eager"\n'
    )
    env = {"PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(library)])}
    first = precompile_cli("check", cwd=root, timeout=300, **env)
    assert first.returncode == 0, first.stdout + first.stderr
    (library / "extmod.py").write_text("def f(x):\n    raise RuntimeError('extmod changed')\n")
    second = precompile_cli("check", cwd=root, timeout=300, **env)
    assert second.returncode == 1, second.stdout + second.stderr
    assert "extmod changed" in second.stdout
    # Unchanged since: answered from the cache, the failure included (the key is stable).
    third = precompile_cli("check", cwd=root, timeout=300, **env)
    assert "(0 captured, 3 from cache)" in third.stdout, third.stdout + third.stderr
    assert "extmod changed" in third.stdout


def test_serving_log_globs_neither_loop_on_symlinks_nor_block_on_a_fifo(tmp_path: Path) -> None:
    root = _workspace(tmp_path / "ws", 'serving-logs = ["logs/**/*.jsonl"]\n')
    for name in ("a", "b", "c"):
        (root / name).symlink_to(".", target_is_directory=True)
    logs = root / "logs"
    logs.mkdir()
    (logs / "up").symlink_to("..", target_is_directory=True)
    (logs / "up2").symlink_to("..", target_is_directory=True)
    os.mkfifo(logs / "x.jsonl")
    started = time.monotonic()
    proc = precompile_cli("check", "--no-cache", cwd=root, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert time.monotonic() - started < 60
    assert stat.S_ISFIFO(os.lstat(logs / "x.jsonl").st_mode)


def test_a_fifo_named_like_a_source_or_artifact_is_never_waited_on(tmp_path: Path) -> None:
    # A named pipe has no writer here: opening it to read would block for ever.
    root = _workspace(tmp_path / "ws")
    os.mkfifo(root / "src" / "wp" / "notes.py")
    proc = precompile_cli("check", "--format", "json", "--no-cache", cwd=root, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert len(doc["targets"]) == 3, doc
    assert all(t["summary"].endswith("complete") for t in doc["targets"]), doc["targets"]
    assert {f["code"] for f in doc["findings"]} == {"PC302"}, doc["findings"]  # not emitted
    assert _kind(root / "src" / "wp" / "notes.py") == stat.S_IFIFO
    # The artifact side: reading a pair whose artifact is a FIFO is an error that says
    # so, in `precompile inspect` and in `precompile.load`.
    artifacts = root / "artifacts"
    artifacts.mkdir()
    os.mkfifo(artifacts / "a.py")
    proc = precompile_cli("inspect", "artifacts/a.py", cwd=root, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "not a regular file" in proc.stderr
    load = (
        "import precompile\n"
        "try:\n"
        "    precompile.load('artifacts/a.py')\n"
        "except precompile.PrecompileError as error:\n"
        "    print(error)\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", load],
        cwd=root,
        env=fresh_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "not a regular file" in loaded.stdout, loaded.stderr
