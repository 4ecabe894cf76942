"""The write policy in the core API: ``precompile.capture`` (and ``sign``) write only to
a path that is new or holds this product's own file of that kind -- recognised by its
content, whatever its name -- and refuse anything else with a PrecompileError, leaving
the file as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import precompile
from precompile.write_policy import OverwriteRefusedError, is_artifact, is_cache, is_signature
from tests.harness import run_python

README = b"# My project\n\nNotes I would hate to lose.\n"


def plus(x: torch.Tensor, k: float = 1.0) -> torch.Tensor:
    return x + k


def _capture(artifact: Path, cache: Path, fn=plus) -> None:  # type: ignore[no-untyped-def]
    with precompile.capture(
        fn,
        artifact_path=artifact,
        cache_path=cache,
        tracer=precompile.MakeFxTracer(),
        backend="eager",
    ) as cap:
        cap(torch.ones(3))


def test_capture_refuses_to_overwrite_a_file_it_did_not_write(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_bytes(README)
    with pytest.raises(OverwriteRefusedError, match="README.md already exists and is not a "):
        _capture(readme, tmp_path / "README.cache")
    assert readme.read_bytes() == README
    assert not (tmp_path / "README.cache").exists()
    # A user's file where the cache goes is refused the same way, before anything runs.
    (tmp_path / "model.cache").write_bytes(b"PK\x03\x04 not ours")
    with pytest.raises(precompile.PrecompileError, match="not a torch-precompile cache"):
        _capture(tmp_path / "model.py", tmp_path / "model.cache")
    assert not (tmp_path / "model.py").exists()


def test_capture_replaces_its_own_artifact(tmp_path: Path) -> None:
    artifact, cache = tmp_path / "model.py", tmp_path / "model.cache"
    _capture(artifact, cache)
    assert is_artifact(str(artifact)) and is_cache(str(cache))
    assert not is_cache(str(artifact)) and not is_artifact(str(cache))

    def plus_two(x: torch.Tensor) -> torch.Tensor:
        return x + 2

    _capture(artifact, cache, plus_two)
    proc = run_python(
        f"import precompile, torch\n"
        f"print(precompile.load({str(artifact)!r}, {str(cache)!r})(torch.ones(3)).tolist())"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("[3.0, 3.0, 3.0]")


def test_a_users_file_where_the_signature_goes_is_kept(tmp_path: Path) -> None:
    # NAME.sig is removed by an unsigned write (it would sign bytes that are gone), so a
    # user's file of that name refuses the write: it is neither replaced nor removed.
    notes = tmp_path / "model.sig"
    notes.write_bytes(README)
    with pytest.raises(OverwriteRefusedError):
        _capture(tmp_path / "model.py", tmp_path / "model.cache")
    assert notes.read_bytes() == README
    assert not is_signature(str(notes))


def test_an_artifact_named_like_its_own_signature_is_refused(tmp_path: Path) -> None:
    with pytest.raises(precompile.PrecompileError, match="artifact and its signature"):
        _capture(tmp_path / "bar.sig", tmp_path / "bar.cache")
    assert list(tmp_path.iterdir()) == []
