"""Cached kernels are verified before any is written or loaded: a flipped byte or a
swapped shared object in the .cache refuses the cache's kernels (the artifact compiles
them from its inlined source, with a warning naming the kernel), and nothing from the
swapped file runs. The digests live in the cache itself, so a forger who recomputes them
gets past them; a signature does not let that through."""

from __future__ import annotations

import io
import logging
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from precompile.artifact.envelope import blob_digests
from tests.fixtures.dynamo_models import CASES, train_step_aliased
from tests.fixtures.models import plain_fn
from tests.harness import run_json

#: A shared object whose loading is visible: its constructor runs at dlopen, before any
#: Python module init, and writes the file named by PRECOMPILE_TEST_MARKER.
_MARKER_SO = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void mark(void) {
    const char *path = getenv("PRECOMPILE_TEST_MARKER");
    if (path) { FILE *f = fopen(path, "w"); if (f) { fputs("ran\n", f); fclose(f); } }
}
"""

#: Loads a pair in a fresh process and serves it, recording the cache warnings and any
#: refusal. ``serve`` sets ``error`` (the largest difference from eager).
_LOAD = """
import json, warnings, torch, precompile
warnings.simplefilter("ignore", precompile.ArtifactTrustWarning)
out = {{"warnings": [], "refused": None, "error": None}}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", precompile.CacheFallbackWarning)
    try:
        run = precompile.load({artifact!r}, {cache!r}, trusted_keys={keys!r})
    except precompile.PrecompileError as e:
        out["refused"] = type(e).__name__ + ": " + e.message
        run = None
out["warnings"] = [
    str(w.message) for w in caught if issubclass(w.category, precompile.CacheFallbackWarning)
]
if run is not None:
{serve}
    out["error"] = error
print(json.dumps(out))
"""

_SERVE_PLAIN = """
    from tests.fixtures.models import plain_fn
    torch.manual_seed(3)
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    error = (run(x, y) - plain_fn(x, y)).abs().max().item()
    out["prebuilt"] = len(run._namespace["_INDUCTOR"].prebuilt)
"""

_SERVE_TRAIN_STEP = """
    from tests.fixtures.dynamo_models import CASES, train_step_aliased
    case = CASES["train_step_break"]
    served = case.drive(run, case.build(1))
    expected = case.drive(train_step_aliased, case.build(1))
    leaves = torch.utils._pytree.tree_leaves
    pairs = list(zip(leaves(served), leaves(expected)))
    assert len(leaves(served)) == len(leaves(expected))
    assert all((a is None) == (b is None) for a, b in pairs)
    error = max((a - b).abs().max().item() for a, b in pairs if a is not None)
"""


def _load_fresh(
    artifact: Path, cache: Path, tmp_path: Path, serve: str, keys: list[str] | None = None
) -> dict[str, Any]:
    """Load and serve in a fresh process with an empty Inductor cache; the result, and
    whether anything from the marker shared object ran."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    marker = tmp_path / "marker-ran"
    code = _LOAD.format(artifact=str(artifact), cache=str(cache), keys=keys, serve=serve)
    result = run_json(
        code,
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor-cache"),
        PRECOMPILE_TEST_MARKER=str(marker),
    )  # no crash, whatever the cache holds
    result["marker_ran"] = marker.exists()
    return result


def _doctor(cache: Path, out: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    envelope = torch.load(cache, weights_only=True)
    change(envelope)
    buffer = io.BytesIO()
    torch.save(envelope, buffer)
    out.write_bytes(buffer.getvalue())
    return out


@pytest.fixture(scope="module")
def marker_so(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    directory = tmp_path_factory.mktemp("marker-so")
    (directory / "marker.c").write_text(_MARKER_SO)
    subprocess.run(
        [shutil.which("gcc") or "gcc", "-shared", "-fPIC", "-o", "marker.so", "marker.c"],
        cwd=directory,
        check=True,
    )
    return (directory / "marker.so").read_bytes()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(private key, public key) of the producer."""
    private, public, _ = precompile.generate_key(tmp_path_factory.mktemp("keys") / "producer")
    return private, public


@pytest.fixture(scope="module")
def inductor_pair(
    tmp_path_factory: pytest.TempPathFactory, keys: tuple[str, str]
) -> tuple[Path, Path]:
    """A signed single-graph Inductor pair, whose cache carries compiled kernels."""
    directory = tmp_path_factory.mktemp("inductor-pair")
    paths = directory / "plain.py", directory / "plain.cache"
    torch.manual_seed(0)
    with precompile.capture(
        plain_fn,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.MakeFxTracer(),
        backend="inductor",
        signing_key=keys[0],
    ) as cap:
        cap(torch.randn(4, 5), torch.randn(4, 5))
    return paths


def _copy(pair: tuple[Path, Path], directory: Path) -> tuple[Path, Path]:
    """The pair and its signature, copied: a doctored cache is written over the copy."""
    for path in (*pair, pair[0].with_suffix(".sig")):
        shutil.copy(path, directory / path.name)
    return directory / pair[0].name, directory / pair[1].name


def _kernel(cache: Path) -> tuple[str, bytes]:
    kernels = torch.load(cache, weights_only=True)["bundle"]["kernels"]
    assert kernels, "the Inductor capture cached no kernels: nothing to verify"
    return next(iter(kernels.items()))


def test_the_envelope_records_a_digest_of_every_kernel(inductor_pair: tuple[Path, Path]) -> None:
    envelope = torch.load(inductor_pair[1], weights_only=True)
    assert envelope["version"] == 2
    assert envelope["digests"] == blob_digests(envelope["bundle"])
    assert set(envelope["digests"]) == {
        *(f"kernels/{k}" for k in envelope["bundle"]["kernels"]),
        "python_bytecode/code",
    }


def test_a_flipped_byte_in_a_kernel_falls_back_to_source(
    inductor_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    # One byte of the raw .cache file, inside the kernel's shared object: the envelope
    # still reads, and the kernel's digest catches it before it is written or loaded.
    artifact, cache = _copy(inductor_pair, tmp_path)
    name, data = _kernel(cache)
    raw = bytearray(cache.read_bytes())
    # torch.save pickles bytes as their latin-1 text, UTF-8 encoded: an ASCII byte of
    # that text is one byte of the kernel, flipped in place.
    start = raw.find(data.decode("latin-1").encode("utf-8"))
    assert start >= 0, "the kernel's bytes are not stored verbatim in the .cache"
    at = start + len(data) // 2
    while raw[at] >= 0x80:
        at += 1
    raw[at] ^= 0x01
    cache.write_bytes(bytes(raw))
    result = _load_fresh(artifact, cache, tmp_path, _SERVE_PLAIN)
    assert result["refused"] is None
    assert len(result["warnings"]) == 1
    assert f"the compiled kernel {name!r} failed verification" in result["warnings"][0]
    assert result["prebuilt"] == 0  # compiled from the inlined source instead
    assert result["error"] < 1e-5


def test_a_swapped_shared_object_never_runs(
    inductor_pair: tuple[Path, Path], tmp_path: Path, marker_so: bytes
) -> None:
    artifact, cache = _copy(inductor_pair, tmp_path)
    name, _ = _kernel(cache)
    _doctor(cache, cache, lambda e: e["bundle"]["kernels"].update({name: marker_so}))
    result = _load_fresh(artifact, cache, tmp_path, _SERVE_PLAIN)
    assert not result["marker_ran"], "code from the swapped shared object ran"
    assert len(result["warnings"]) == 1 and "failed verification" in result["warnings"][0]
    assert result["prebuilt"] == 0
    assert result["error"] < 1e-5


def test_forged_digests_get_past_the_digests_but_not_a_signature(
    inductor_pair: tuple[Path, Path],
    tmp_path: Path,
    marker_so: bytes,
    keys: tuple[str, str],
) -> None:
    artifact, cache = _copy(inductor_pair, tmp_path)
    name, _ = _kernel(cache)

    def forge(envelope: dict[str, Any]) -> None:
        envelope["bundle"]["kernels"][name] = marker_so
        envelope["digests"] = blob_digests(envelope["bundle"])

    _doctor(cache, cache, forge)
    # The control: without keys the forged kernel is loaded (digests are checksums, not
    # authentication), which shows the marker would reveal a load.
    unsigned = _load_fresh(artifact, cache, tmp_path / "unsigned", _SERVE_PLAIN)
    assert unsigned["marker_ran"]
    # With the producer's key the pair is refused before anything is loaded.
    signed = _load_fresh(artifact, cache, tmp_path / "signed", _SERVE_PLAIN, keys=[keys[1]])
    assert not signed["marker_ran"], "code from the forged cache ran despite trusted_keys"
    assert signed["refused"] is not None
    assert signed["refused"].startswith("SignatureError")
    assert f"the cache {str(cache)!r} changed since the pair was signed" in signed["refused"]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda e: e["digests"].popitem(), "has no recorded digest"),
        (lambda e: e["digests"].update({"kernels/0": "0" * 64}), "recorded but missing"),
        (lambda e: e.pop("digests"), "records no digests"),
    ],
)
def test_an_incomplete_digest_record_refuses_the_kernels(
    inductor_pair: tuple[Path, Path], tmp_path: Path, change: Any, why: str
) -> None:
    cache = _doctor(inductor_pair[1], tmp_path / "doctored.cache", change)
    with pytest.warns(precompile.CacheFallbackWarning, match=why):
        run = precompile.load(inductor_pair[0], cache)
    assert not run._namespace["_INDUCTOR"].prebuilt
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    torch.testing.assert_close(run(x, y), plain_fn(x, y))


@pytest.fixture(scope="module")
def dynamo_training_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A Dynamo+Inductor training capture with a subgraph the artifact's runtime leaves to
    Inductor's pickled artifact (an output aliasing another): its cache carries
    Inductor's own cache files (shared objects and pickled entries), which Inductor loads
    itself."""
    torch._logging.set_logs(dynamo=logging.ERROR)
    torch._dynamo.reset()
    directory = tmp_path_factory.mktemp("dynamo-training")
    paths = directory / "train.py", directory / "train.cache"
    case = CASES["train_step_break"]
    args = case.build(0)
    with precompile.capture(
        train_step_aliased,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.DynamoTracer(),
        backend="inductor",
        training=True,
    ) as cap:
        case.drive(cap, args)
    assert "_INDUCTOR_ARTIFACTS = {" in paths[0].read_text()
    return paths


def test_a_swapped_inductor_cache_file_never_runs(
    dynamo_training_pair: tuple[Path, Path], tmp_path: Path, marker_so: bytes
) -> None:
    files = torch.load(dynamo_training_pair[1], weights_only=True)["bundle"]["inductor_cache_files"]
    shared = sorted(name for name in files if name.endswith(".so"))
    assert shared, "the capture cached no shared objects: nothing to verify"
    cache = _doctor(
        dynamo_training_pair[1],
        tmp_path / "train.cache",
        lambda e: e["bundle"]["inductor_cache_files"].update({name: marker_so for name in shared}),
    )
    result = _load_fresh(dynamo_training_pair[0], cache, tmp_path, _SERVE_TRAIN_STEP)
    assert not result["marker_ran"], "code from a swapped Inductor cache file ran"
    assert result["refused"] is None
    assert len(result["warnings"]) == 1
    assert f"the Inductor cache file {shared[0]!r} failed verification" in result["warnings"][0]
    assert result["error"] < 1e-5
