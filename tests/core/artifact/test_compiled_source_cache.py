"""The code an artifact compiles from text while it loads (the plain guards' straight-line
check here; the inlined Inductor output modules in test_zero_compile_load) comes from
the verified cache, like the artifact's own bytecode: nothing compiles with a good
cache, and a cache entry of another interpreter or one that fails verification is
compiled again from the text, never run."""

from __future__ import annotations

import marshal
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from tests.core.artifact.pair_files import copy_pair, read_envelope, write_envelope
from tests.harness import run_json


def double(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x) * 2


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("sources")
    paths = directory / "double.py", directory / "double.cache"
    torch.manual_seed(0)
    with precompile.capture(
        double,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.DynamoTracer(),
        backend="eager",
    ) as cap:
        cap(nn.Linear(3, 2), torch.ones(4, 3))
    return paths


_SPY_LOAD = """
import ast, builtins, json, warnings
import torch
from torch import nn
import precompile
from tests.core.artifact.test_compiled_source_cache import double
warnings.simplefilter("ignore", precompile.ArtifactTrustWarning)
compiled = []
real_compile = builtins.compile
def spy(source, filename, mode, flags=0, *args, **kwargs):
    if not flags & ast.PyCF_ONLY_AST and str(filename).startswith(("<precompile", "<guard>")):
        compiled.append(str(filename))
    return real_compile(source, filename, mode, flags, *args, **kwargs)
builtins.compile = spy
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", precompile.CacheFallbackWarning)
    run = precompile.load({artifact!r}, {cache!r})
torch.manual_seed(1)
model, x = nn.Linear(3, 2), torch.randn(4, 3)
exact = torch.equal(run(model, x), double(model, x))
try:
    run(model, torch.randn(5, 3))  # a shape the capture never saw: its guard refuses it
    refused = False
except precompile.PrecompileError:
    refused = True
print(json.dumps({{
    "guard_compiles": compiled.count("<precompile guards>"),
    "exact": exact,
    "refused": refused,
    "warnings": [str(w.message) for w in caught if w.category is precompile.CacheFallbackWarning],
}}))
"""


def _spy_load(artifact: Path, cache: Path | None) -> dict[str, Any]:
    return run_json(
        _SPY_LOAD.format(artifact=str(artifact), cache=None if cache is None else str(cache))
    )


def _codes(envelope: dict[str, Any]) -> dict[str, bytes]:
    return envelope["bundle"]["compiled_sources"]["codes"]


def _guard_sources(cache: Path) -> int:
    """How many guard sources (each variant's straight-line check and its epilogue) the
    capture cached: what a load without a good cache compiles from text, each once."""
    codes = _codes(read_envelope(cache)).values()
    count = sum(marshal.loads(c).co_filename == "<precompile guards>" for c in codes)
    assert count, "the capture cached no guard source"
    return count


def _always_holds() -> bytes:
    """A guard check that passes everything: what must never run in the real one's place."""
    source = "def fast(f_locals, reached):\n    return True\n"
    return marshal.dumps(compile(source, "<precompile guards>", "exec", dont_inherit=True))


def test_the_guard_check_comes_from_the_cache(pair: tuple[Path, Path], tmp_path: Path) -> None:
    artifact, cache = copy_pair(pair, tmp_path)
    assert _codes(read_envelope(cache)), "the capture cached no compiled source"
    served = {"exact": True, "refused": True, "warnings": []}
    assert _spy_load(artifact, cache) == {"guard_compiles": 0, **served}
    # Without the cache the same spy sees every cached guard source compiled: the spy works.
    assert _spy_load(artifact, None) == {"guard_compiles": _guard_sources(pair[1]), **served}


def test_compiled_sources_of_another_interpreter_are_compiled_again(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    artifact, cache = copy_pair(pair, tmp_path)
    envelope = read_envelope(cache)
    envelope["bundle"]["compiled_sources"]["tag"] = "0d0d0d0a"
    write_envelope(envelope, cache)
    assert _spy_load(artifact, cache) == {
        "guard_compiles": _guard_sources(pair[1]),
        "exact": True,
        "refused": True,
        "warnings": [],
    }


def test_an_altered_cached_check_is_never_run(pair: tuple[Path, Path], tmp_path: Path) -> None:
    # A check that passes everything swapped in: its digest no longer matches the one the
    # envelope records, so the whole cache is ignored, with a warning naming the entry,
    # and the real check compiled from the artifact's text still refuses a foreign shape.
    artifact, cache = copy_pair(pair, tmp_path)
    envelope = read_envelope(cache)
    codes = _codes(envelope)
    for key in codes:
        codes[key] = _always_holds()
    write_envelope(envelope, cache)
    result = _spy_load(artifact, cache)
    assert (
        result["guard_compiles"] == _guard_sources(pair[1])
        and result["exact"]
        and result["refused"]
    ), result
    assert len(result["warnings"]) == 1, result["warnings"]
    assert "cached bytecode" in result["warnings"][0], result["warnings"]
    assert "failed verification" in result["warnings"][0], result["warnings"]


def test_an_unreadable_cached_check_is_compiled_again(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    # Bytes that are no code object, recorded consistently (digests updated): the load
    # compiles the check from the text rather than fail or run anything else.
    import hashlib

    artifact, cache = copy_pair(pair, tmp_path)
    envelope = read_envelope(cache)
    codes = _codes(envelope)
    for key in codes:
        codes[key] = b"\xff not marshal"
        name = f"compiled_sources/codes/{key}"
        envelope["digests"][name] = hashlib.sha256(codes[key]).hexdigest()
    write_envelope(envelope, cache)
    assert _spy_load(artifact, cache) == {
        "guard_compiles": _guard_sources(pair[1]),
        "exact": True,
        "refused": True,
        "warnings": [],
    }
