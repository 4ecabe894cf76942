"""Writing the artifact pair is all or nothing: a failed or interrupted rename leaves the
previous pair exactly (or no file, on a first write), the error says what is true, and
files get the process umask like any file a tool writes."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from precompile import PrecompileError
from precompile.artifact.pair import atomic_write_files
from tests.harness import run_python


def double(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x) * 2


def triple(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x) * 3


def _capture(fn: Any, artifact: Path, cache: Path) -> None:
    with precompile.capture(
        fn,
        artifact_path=artifact,
        cache_path=cache,
        tracer=precompile.MakeFxTracer(),
        backend="eager",
    ) as cap:
        cap(nn.Linear(3, 2), torch.ones(4, 3))


@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    previous = os.umask(0o022)

    def set_umask(value: int) -> None:
        os.umask(value)

    yield set_umask
    os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _failing_replace(
    monkeypatch: pytest.MonkeyPatch, fail_on: set[int], error: BaseException
) -> list[tuple[str, str]]:
    """Make the n-th os.replace calls (1-based) raise ``error``; return the calls made."""
    real = os.replace
    calls: list[tuple[str, str]] = []

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        calls.append((os.fspath(src), os.fspath(dst)))
        if len(calls) in fail_on:
            raise error
        real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    return calls


def _pair(directory: Path) -> tuple[Path, Path]:
    return directory / "model.py", directory / "model.cache"


def _write_old(directory: Path) -> tuple[Path, Path]:
    py, cache = _pair(directory)
    py.write_bytes(b"old python_code\n")
    cache.write_bytes(b"old cache")
    return py, cache


# ---------------------------------------------------------------- permissions


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_get_the_process_umask(
    tmp_path: Path, umask: Callable[[int], None], mask: int, expected: int
) -> None:
    umask(mask)
    py, cache = _pair(tmp_path)
    atomic_write_files([(str(py), b"a"), (str(cache), b"b")])
    assert (_mode(py), _mode(cache)) == (expected, expected)
    atomic_write_files([(str(py), b"again")])  # replacing keeps to the umask too
    assert _mode(py) == expected


def test_a_capture_writes_0644_under_umask_022(
    tmp_path: Path, umask: Callable[[int], None]
) -> None:
    py, cache = _pair(tmp_path)
    _capture(double, py, cache)
    assert (_mode(py), _mode(cache)) == (0o644, 0o644)


def test_private_files_are_0600(tmp_path: Path, umask: Callable[[int], None]) -> None:
    secret, public = tmp_path / "key", tmp_path / "key.pub"
    atomic_write_files([(str(secret), b"s"), (str(public), b"p")], private={str(secret)})
    assert (_mode(secret), _mode(public)) == (0o600, 0o644)


# ---------------------------------------------------------------- all or nothing


@pytest.mark.parametrize("failing_rename", [1, 2])
def test_a_failed_rename_leaves_the_previous_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_rename: int
) -> None:
    py, cache = _write_old(tmp_path)
    _failing_replace(monkeypatch, {failing_rename}, OSError(28, "No space left on device"))
    with pytest.raises(PrecompileError, match="the previous files are unchanged") as info:
        atomic_write_files([(str(py), b"new python_code\n"), (str(cache), b"new cache")])
    assert "No space left on device" in info.value.message
    assert (py.read_bytes(), cache.read_bytes()) == (b"old python_code\n", b"old cache")
    assert sorted(os.listdir(tmp_path)) == ["model.cache", "model.py"]  # no temporaries


@pytest.mark.parametrize("failing_rename", [1, 2])
def test_an_interrupt_between_the_renames_leaves_the_previous_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_rename: int
) -> None:
    py, cache = _write_old(tmp_path)
    _failing_replace(monkeypatch, {failing_rename}, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        atomic_write_files([(str(py), b"new python_code\n"), (str(cache), b"new cache")])
    assert (py.read_bytes(), cache.read_bytes()) == (b"old python_code\n", b"old cache")
    assert sorted(os.listdir(tmp_path)) == ["model.cache", "model.py"]


@pytest.mark.parametrize("error", [OSError(5, "Input/output error"), KeyboardInterrupt()])
def test_a_failed_first_write_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    py, cache = _pair(tmp_path)
    _failing_replace(monkeypatch, {2}, error)
    with pytest.raises((PrecompileError, KeyboardInterrupt)) as info:
        atomic_write_files([(str(py), b"new python_code\n"), (str(cache), b"new cache")])
    if isinstance(error, OSError):
        assert "no file was created" in str(info.value)
    assert os.listdir(tmp_path) == []


def test_a_failed_restore_says_what_is_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cache's rename fails, and so does putting the previous .py back (the third
    # rename): the error must not claim the files are unchanged, and must say where the
    # previous .py now is.
    py, cache = _write_old(tmp_path)
    _failing_replace(monkeypatch, {2, 3}, OSError(30, "Read-only file system"))
    with pytest.raises(PrecompileError) as info:
        atomic_write_files([(str(py), b"new python_code\n"), (str(cache), b"new cache")])
    message = info.value.message
    assert "unchanged" not in message
    assert f"{py} could not be restored" in message and "holds the new version" in message
    backup = Path(message.split("its previous version is at ")[1].split(";")[0].strip())
    assert backup.read_bytes() == b"old python_code\n"
    assert py.read_bytes() == b"new python_code\n" and cache.read_bytes() == b"old cache"


def test_without_hard_links_the_backup_is_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(*args: Any, **kwargs: Any) -> None:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    py, cache = _write_old(tmp_path)
    _failing_replace(monkeypatch, {2}, OSError(28, "No space left on device"))
    with pytest.raises(PrecompileError, match="unchanged"):
        atomic_write_files([(str(py), b"new python_code\n"), (str(cache), b"new cache")])
    assert (py.read_bytes(), cache.read_bytes()) == (b"old python_code\n", b"old cache")
    assert sorted(os.listdir(tmp_path)) == ["model.cache", "model.py"]


def test_a_real_sigint_between_the_renames_leaves_the_previous_pair(tmp_path: Path) -> None:
    # A real signal, delivered by the kernel right after the .py's rename: Python raises
    # KeyboardInterrupt at the next bytecode, wherever that is.
    py, cache = _write_old(tmp_path)
    code = f"""
import json, os, signal
from precompile.artifact.pair import atomic_write_files
# Python's own SIGINT handler, even where the parent ignores SIGINT (a job started in the
# background by a non-interactive shell does, and a child inherits that).
signal.signal(signal.SIGINT, signal.default_int_handler)
real, calls = os.replace, []
def replace(src, dst):
    real(src, dst)
    calls.append(dst)
    if len(calls) == 1:
        os.kill(os.getpid(), signal.SIGINT)
os.replace = replace
try:
    atomic_write_files([({str(py)!r}, b"new python_code\\n"), ({str(cache)!r}, b"new cache")])
    outcome = "completed"
except KeyboardInterrupt:
    outcome = "interrupted"
print(json.dumps({{"outcome": outcome, "renames": len(calls)}}))
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["outcome"] == "interrupted"
    assert (py.read_bytes(), cache.read_bytes()) == (b"old python_code\n", b"old cache")
    assert sorted(os.listdir(tmp_path)) == ["model.cache", "model.py"]


def test_a_capture_whose_cache_rename_fails_leaves_a_loadable_previous_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    py, cache = _pair(tmp_path)
    _capture(double, py, cache)
    before = py.read_bytes(), cache.read_bytes()
    _failing_replace(monkeypatch, {2}, OSError(28, "No space left on device"))
    with pytest.raises(PrecompileError, match=r"cannot write .*model\.cache.*unchanged"):
        _capture(triple, py, cache)
    monkeypatch.undo()
    assert (py.read_bytes(), cache.read_bytes()) == before
    code = f"""
import warnings, torch, precompile
from torch import nn
warnings.simplefilter("error", precompile.CacheFallbackWarning)
warnings.simplefilter("ignore", precompile.ArtifactTrustWarning)
run = precompile.load({str(py)!r}, {str(cache)!r})
model, x = nn.Linear(3, 2), torch.randn(4, 3)
torch.testing.assert_close(run(model, x), model(x) * 2)
print("served the previous pair")
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert "served the previous pair" in proc.stdout


def test_the_pair_records_paths_and_file_hashes_one_way(tmp_path: Path) -> None:
    """Where an artifact records a source (relative to the artifact's folder, with ``/``)
    and how a file is hashed have one definition each (``artifact.pair``): the capture's
    records, the engine's staleness and the serving-log code hash all use them."""
    import hashlib

    from precompile.artifact.pair import artifact_relative, file_sha256

    source = tmp_path / "src" / "pkg" / "mod.py"
    source.parent.mkdir(parents=True)
    source.write_bytes(b"x = 1\n")
    artifact = tmp_path / "artifacts" / "a.py"
    assert artifact_relative(str(source), str(artifact)) == "../src/pkg/mod.py"
    assert artifact_relative(None, str(artifact)) is None
    assert file_sha256(source) == hashlib.sha256(b"x = 1\n").hexdigest()
    assert file_sha256(tmp_path / "missing.py") is None

    from precompile.capturing import emit, function_records
    from precompile_lsp import serving_logs, staleness
    from precompile_lsp.worker import jobs

    assert emit.artifact_relative is function_records.artifact_relative is artifact_relative
    assert emit.file_sha256 is staleness.file_sha256 is jobs.file_sha256 is file_sha256
    assert serving_logs.artifact_hash(source) == file_sha256(source)
