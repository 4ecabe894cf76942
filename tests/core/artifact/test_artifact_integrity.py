"""The artifact pair as files: code_hash binding, cache fallbacks, trust warnings, path
validation, metadata inspection, versions, reproducibility and import weight."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from precompile import ArtifactTrustWarning, CacheFallbackWarning, PrecompileError
from tests.core.artifact.pair_files import copy_pair, read_envelope, write_envelope
from tests.harness import run_json, run_python


def double(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x) * 2


def triple(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x) * 3


def _capture(fn: Any, directory: Path, name: str) -> tuple[Path, Path]:
    paths = directory / f"{name}.py", directory / f"{name}.cache"
    torch.manual_seed(0)
    with precompile.capture(
        fn,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.MakeFxTracer(),
        backend="eager",
    ) as cap:
        cap(nn.Linear(3, 2), torch.ones(4, 3))
    return paths


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _capture(double, tmp_path_factory.mktemp("pair"), "double")


@pytest.fixture(scope="module")
def other_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _capture(triple, tmp_path_factory.mktemp("other"), "triple")


def test_tampered_python_code_is_refused(pair: tuple[Path, Path], tmp_path: Path) -> None:
    artifact, cache = copy_pair(pair, tmp_path)
    # The graph's own line (its op spelled as the emitter binds it: an op handle or
    # the torch.ops path), changed in a way nothing but the hash can tell.
    text = artifact.read_text()
    tampered = re.sub(r"(mul\w*[.(](?:Tensor\()?addmm, )2\)", r"\g<1>20)", text, count=1)
    assert tampered != text, "the artifact's graph line to tamper with was not found"
    artifact.write_text(tampered)
    with pytest.raises(PrecompileError, match="code_hash") as info:
        precompile.load(artifact, cache)
    assert info.value.invariant == 7


def test_cache_from_another_capture_is_refused(
    pair: tuple[Path, Path], other_pair: tuple[Path, Path]
) -> None:
    with pytest.raises(PrecompileError, match="does not belong to this artifact"):
        precompile.load(pair[0], other_pair[1])


@pytest.mark.parametrize(("field", "value"), [("backend", "inductor"), ("tracer", "dynamo")])
def test_cache_for_another_backend_or_tracer_is_refused(
    pair: tuple[Path, Path], tmp_path: Path, field: str, value: str
) -> None:
    artifact, cache = copy_pair(pair, tmp_path)
    envelope = read_envelope(cache)
    envelope[field] = value
    write_envelope(envelope, cache)
    with pytest.raises(PrecompileError, match=f"{field} '{value}'"):
        precompile.load(artifact, cache)


@pytest.mark.parametrize(
    ("doctor", "why"),
    [
        (lambda p: p.write_bytes(b"\x00garbage" * 10), "unreadable"),
        (lambda p: write_envelope({"format": "something-else"}, p), "not a torch-precompile cache"),
        (lambda p: write_envelope({**read_envelope(p), "version": 99}, p), "format version 99"),
    ],
)
def test_unusable_cache_warns_and_serves_identically(
    pair: tuple[Path, Path], tmp_path: Path, doctor: Any, why: str
) -> None:
    artifact, cache = copy_pair(pair, tmp_path)
    doctor(cache)
    model, x = nn.Linear(3, 2), torch.randn(4, 3)
    with pytest.warns(CacheFallbackWarning, match=why):
        run = precompile.load(artifact, cache)
    assert torch.equal(run(model, x), precompile.load(artifact)(model, x))
    torch.testing.assert_close(run(model, x), double(model, x))


def test_every_load_warns_about_trust(pair: tuple[Path, Path]) -> None:
    with pytest.warns(ArtifactTrustWarning) as record:
        precompile.load(*pair)
        precompile.load(*pair)
    assert len([w for w in record if w.category is ArtifactTrustWarning]) == 2
    assert "executes its Python code" in str(record[0].message)


def test_path_validation(pair: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(PrecompileError, match="same file"):
        precompile.load(pair[0], pair[0])
    with pytest.raises(PrecompileError, match="is a directory"):
        precompile.load(tmp_path)
    with pytest.raises(PrecompileError, match="file contents where a path belongs"):
        precompile.load(pair[0].read_text())
    with pytest.raises(PrecompileError, match="bytes"):
        precompile.load(pair[0].read_bytes())
    with pytest.raises(PrecompileError, match="same file"):
        precompile.capture(double, artifact_path=tmp_path / "x.py", cache_path=tmp_path / "x.py")


def test_unreadable_files_chain_the_cause(pair: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(PrecompileError, match="cannot read the artifact") as info:
        precompile.load(tmp_path / "missing.py")
    assert isinstance(info.value.__cause__, FileNotFoundError)
    with pytest.raises(PrecompileError, match="cannot read the cache") as info:
        precompile.load(pair[0], tmp_path / "missing.cache")
    assert isinstance(info.value.__cause__, FileNotFoundError)
    with pytest.raises(PrecompileError, match="not UTF-8") as info:
        precompile.load(pair[1])  # the cache passed as the artifact
    assert isinstance(info.value.__cause__, UnicodeDecodeError)


def test_metadata_is_inspected_without_executing(pair: tuple[Path, Path], tmp_path: Path) -> None:
    artifact = tmp_path / "booby.py"
    artifact.write_text(pair[0].read_text() + "\nraise SystemExit('executed!')\n")
    metadata = precompile.inspect_artifact(artifact)
    assert metadata["BACKEND"] == "eager" and metadata["TRACER"] == "make_fx"
    assert metadata["TORCH_VERSION"] == torch.__version__
    import sys

    assert metadata["PYTHON_VERSION"] == list(sys.version_info[:2])
    assert metadata["PARAM_NAMES"] == ["weight", "bias"]
    with pytest.raises(PrecompileError, match="not a torch-precompile artifact"):
        bogus = tmp_path / "bogus.py"
        bogus.write_text("x = 1\n")
        precompile.inspect_artifact(bogus)


def test_inspect_command(pair: tuple[Path, Path], tmp_path: Path) -> None:
    proc = run_python(
        f"from precompile_lsp.cli import main; raise SystemExit(main(['inspect', '--json', {str(pair[0])!r}]))"
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["FN_NAME"] == "double"
    (tmp_path / "bogus.py").write_text("x = 1\n")
    proc = run_python(
        f"from precompile_lsp.cli import main; raise SystemExit(main(['inspect', {str(tmp_path / 'bogus.py')!r}]))"
    )
    assert proc.returncode == 2 and "not a torch-precompile artifact" in proc.stderr


def test_inspect_wraps_long_values_and_full_shows_them(pair: tuple[Path, Path]) -> None:
    """Text output fits a terminal: long values wrapped under their key and cut at
    INSPECT_LIMIT characters unless --full; encoded payloads are only sized."""
    import re

    from precompile_lsp.cli import INSPECT_LIMIT

    artifact = pair[0]
    text = artifact.read_text()
    long_value = "x" * (3 * INSPECT_LIMIT)
    doctored = artifact.with_name("long.py")
    doctored.write_text(text.replace("FN_NAME = 'double'", f"FN_NAME = {long_value!r}", 1))

    def inspect(*extra: str) -> str:
        proc = run_python(
            "from precompile_lsp.cli import main; raise SystemExit(main(['inspect', "
            f"{str(doctored)!r}, *{list(extra)!r}]))",
            COLUMNS="100",
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    short = inspect()
    assert all(len(line) <= 100 for line in short.splitlines()), short
    assert "more characters; --full" in short
    assert long_value not in short.replace("\n", "")
    full = inspect("--full")
    joined = re.sub(r"\n\s+", "", full)
    assert long_value in joined and "--full" not in full


def test_unchanged_capture_emits_identical_bytes(pair: tuple[Path, Path], tmp_path: Path) -> None:
    # Another directory at the same depth: sources are recorded relative to the
    # artifact, so the emitted pair must be byte-identical.
    again = _capture(double, tmp_path, "double")
    assert again[0].read_bytes() == pair[0].read_bytes()
    assert again[1].read_bytes() == pair[1].read_bytes()


def test_import_precompile_is_light() -> None:
    proc = run_python(
        "import sys, precompile; precompile.PrecompileError; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch._dynamo', 'torch._inductor'))))",
        cold=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


_SPY_COMPILE = """
import ast, builtins, json, warnings
import torch
from torch import nn
import precompile
warnings.simplefilter("ignore")
compiled = []
real_compile = builtins.compile
def spy(source, filename, mode, flags=0, *args, **kwargs):
    if not flags & ast.PyCF_ONLY_AST:  # reading the metadata parses, never compiles
        compiled.append(str(filename))
    return real_compile(source, filename, mode, flags, *args, **kwargs)
builtins.compile = spy
torch.manual_seed(1)
model, x = nn.Linear(3, 2), torch.randn(4, 3)
run = precompile.load({artifact!r}, {cache!r})
out = run(model, x)
print(json.dumps({{
    "artifact_compiles": compiled.count({artifact!r}),
    "code_file": run._forward.__code__.co_filename,
    "exact": torch.equal(out, model(x) * 2),
}}))
"""


def _spy_load(artifact: Path, cache: Path | None) -> dict[str, Any]:
    return dict(
        run_json(
            _SPY_COMPILE.format(artifact=str(artifact), cache=None if cache is None else str(cache))
        )
    )


def test_load_executes_the_cached_bytecode_instead_of_compiling(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    # Moved elsewhere: the bytecode runs under the name of the file that was loaded.
    artifact, cache = copy_pair(pair, tmp_path)
    with_cache = _spy_load(artifact, cache)
    assert with_cache == {"artifact_compiles": 0, "code_file": str(artifact), "exact": True}
    # Without the cache the same spy sees the source compiled: the spy works.
    assert _spy_load(artifact, None) == {**with_cache, "artifact_compiles": 1}


def test_bytecode_of_another_interpreter_is_not_executed(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    artifact, cache = copy_pair(pair, tmp_path)
    envelope = read_envelope(cache)
    envelope["bundle"]["python_bytecode"]["tag"] = "0d0d0d0a"
    write_envelope(envelope, cache)
    assert _spy_load(artifact, cache) == {
        "artifact_compiles": 1,
        "code_file": str(artifact),
        "exact": True,
    }


def test_altered_bytecode_is_never_executed(
    pair: tuple[Path, Path], other_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    # The other capture's bytecode (it multiplies by 3) swapped in: the digest the
    # envelope records no longer matches, so the cache is ignored with a warning.
    artifact, cache = copy_pair(pair, tmp_path)
    envelope = read_envelope(cache)
    envelope["bundle"]["python_bytecode"] = read_envelope(other_pair[1])["bundle"][
        "python_bytecode"
    ]
    write_envelope(envelope, cache)
    model, x = nn.Linear(3, 2), torch.randn(4, 3)
    with pytest.warns(CacheFallbackWarning, match="the artifact's cached bytecode failed"):
        run = precompile.load(artifact, cache)
    torch.testing.assert_close(run(model, x), double(model, x))
    assert _spy_load(artifact, cache)["artifact_compiles"] == 1
