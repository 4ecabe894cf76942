"""Signed artifact pairs: a pair signed by a trusted key loads; a pair signed by another
key, an unsigned pair when keys are required, and a pair with one byte changed in either
file are refused before anything runs. Keys are written private (0600); ``cryptography``
is imported only to sign or verify; the CLI signs and verifies without torch."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from precompile import PrecompileError, SignatureError
from tests.harness import run_python


def double(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x) * 2


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """Two key pairs, (private, public): the producer's and somebody else's."""
    directory = tmp_path_factory.mktemp("keys")
    made = {}
    for who in ("producer", "other"):
        private, public, _ = precompile.generate_key(directory / who)
        made[who] = (private, public)
    return made


def _capture(directory: Path, signing_key: Any = None) -> tuple[Path, Path]:
    paths = directory / "double.py", directory / "double.cache"
    torch.manual_seed(0)
    with precompile.capture(
        double,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.MakeFxTracer(),
        backend="eager",
        signing_key=signing_key,
    ) as cap:
        cap(nn.Linear(3, 2), torch.ones(4, 3))
    return paths


@pytest.fixture(scope="module")
def signed(
    tmp_path_factory: pytest.TempPathFactory, keys: dict[str, tuple[str, str]]
) -> tuple[Path, Path]:
    return _capture(tmp_path_factory.mktemp("signed"), signing_key=keys["producer"][0])


@pytest.fixture
def pair(signed: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A private copy of the signed pair and its signature, free to be changed."""
    for path in (*signed, signed[0].with_suffix(".sig")):
        shutil.copy(path, tmp_path / path.name)
    return tmp_path / signed[0].name, tmp_path / signed[1].name


def _flip_middle_byte(path: Path, *, ascii_only: bool = False) -> None:
    data = bytearray(path.read_bytes())
    at = len(data) // 2
    while ascii_only and not chr(data[at]).isalnum():
        at += 1
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------- keys


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        private, public, key_id = precompile.generate_key(tmp_path / "k")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(public).st_mode) == 0o644
    assert public == private + ".pub" and len(key_id) == 16
    assert b"PRIVATE KEY" not in Path(public).read_bytes()
    before = Path(private).read_bytes()
    with pytest.raises(PrecompileError, match="never overwritten"):
        precompile.generate_key(private)
    assert Path(private).read_bytes() == before


def test_a_private_key_is_not_accepted_as_a_trusted_key(
    pair: tuple[Path, Path], keys: dict[str, tuple[str, str]]
) -> None:
    with pytest.raises(PrecompileError, match="is a private key"):
        precompile.load(*pair, trusted_keys=[keys["producer"][0]])


# ---------------------------------------------------------------- loading


def test_a_signed_pair_loads_with_the_right_key_in_a_fresh_process(
    pair: tuple[Path, Path], keys: dict[str, tuple[str, str]]
) -> None:
    code = f"""
import warnings, torch, precompile
from torch import nn
warnings.simplefilter("error")  # a verified load does not warn about trust
run = precompile.load({str(pair[0])!r}, {str(pair[1])!r}, trusted_keys=[{keys["producer"][1]!r}])
model, x = nn.Linear(3, 2), torch.randn(4, 3)
with torch.no_grad():  # an inference artifact under grad mode warns InferenceGradWarning
    torch.testing.assert_close(run(model, x), model(x) * 2)
print("served")
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "served"


def test_python_code_alone_is_authenticated(
    pair: tuple[Path, Path], keys: dict[str, tuple[str, str]]
) -> None:
    run = precompile.load(pair[0], trusted_keys=keys["producer"][1])
    model, x = nn.Linear(3, 2), torch.randn(4, 3)
    torch.testing.assert_close(run(model, x), model(x) * 2)


def test_a_pair_signed_by_another_key_is_refused(
    pair: tuple[Path, Path], keys: dict[str, tuple[str, str]]
) -> None:
    with pytest.raises(SignatureError, match="which is not a trusted key"):
        precompile.load(*pair, trusted_keys=[keys["other"][1]])
    # Trusting both is fine: one of them signed it.
    precompile.load(*pair, trusted_keys=[keys["other"][1], keys["producer"][1]])


def test_an_unsigned_pair_is_refused_when_keys_are_required(
    tmp_path: Path, keys: dict[str, tuple[str, str]]
) -> None:
    artifact, cache = _capture(tmp_path)
    assert not artifact.with_suffix(".sig").exists()
    with pytest.raises(SignatureError, match="is not signed"):
        precompile.load(artifact, cache, trusted_keys=[keys["producer"][1]])
    with pytest.raises(SignatureError, match="is not signed"):
        precompile.load(artifact, trusted_keys=[keys["producer"][1]])


@pytest.mark.parametrize(
    ("which", "why"),
    [
        ("py", "the artifact '{py}' changed since the pair was signed"),
        ("cache", "the cache '{cache}' changed since the pair was signed"),
    ],
)
def test_one_changed_byte_in_either_file_is_refused(
    pair: tuple[Path, Path], keys: dict[str, tuple[str, str]], which: str, why: str
) -> None:
    _flip_middle_byte(pair[0] if which == "py" else pair[1], ascii_only=which == "py")
    with pytest.raises(SignatureError) as info:
        precompile.load(*pair, trusted_keys=[keys["producer"][1]])
    assert why.format(py=pair[0], cache=pair[1]) in info.value.message


def test_a_changed_signature_is_refused(
    pair: tuple[Path, Path], keys: dict[str, tuple[str, str]]
) -> None:
    signature = pair[0].with_suffix(".sig")
    record = json.loads(signature.read_text())
    value = bytearray(record["signature"].encode())
    value[10] = ord("A") if value[10] != ord("A") else ord("B")
    record["signature"] = value.decode()
    signature.write_text(json.dumps(record))
    with pytest.raises(SignatureError, match="signature file .* was altered"):
        precompile.load(*pair, trusted_keys=[keys["producer"][1]])
    signature.write_text("not json")
    with pytest.raises(SignatureError, match="not a valid torch-precompile signature"):
        precompile.load(*pair, trusted_keys=[keys["producer"][1]])


def test_a_refused_pair_runs_nothing(
    pair: tuple[Path, Path], keys: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    # python_code changed to announce itself when executed: with keys it never is; the
    # same file without keys shows the marker would reveal an execution.
    marker = tmp_path / "executed"
    text = pair[0].read_text()
    pair[0].write_text(text + f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(SignatureError, match="the artifact .* changed since"):
        precompile.load(pair[0], trusted_keys=[keys["producer"][1]])
    assert not marker.exists()
    precompile.load(pair[0])
    assert marker.exists()


def test_sign_after_capture_and_a_stale_signature(
    tmp_path: Path, keys: dict[str, tuple[str, str]], signed: tuple[Path, Path]
) -> None:
    artifact, cache = _capture(tmp_path)
    signature = precompile.sign(artifact, cache, keys["other"][0])
    assert signature == str(artifact.with_suffix(".sig"))
    assert (
        precompile.verify_signature(artifact, cache, trusted_keys=[keys["other"][1]])
        == json.loads(Path(signature).read_text())["key_id"]
    )
    # Signing, after or at capture, changes neither file (``signed`` was captured with a
    # key, in a directory at the same depth: sources are recorded relative to it).
    assert artifact.read_bytes() == signed[0].read_bytes()
    assert cache.read_bytes() == signed[1].read_bytes()
    # A file changed after signing (not by a capture) leaves the signature behind: it no
    # longer matches, and says so.
    cache.write_bytes(cache.read_bytes() + b"\0")
    with pytest.raises(SignatureError, match="the cache .* changed since the pair was signed"):
        precompile.verify_signature(artifact, cache, trusted_keys=[keys["other"][1]])


def test_an_unsigned_capture_removes_the_signature_it_made_stale(
    tmp_path: Path, keys: dict[str, tuple[str, str]]
) -> None:
    artifact, cache = _capture(tmp_path, signing_key=keys["producer"][0])
    assert artifact.with_suffix(".sig").exists()
    _capture(tmp_path)  # the same target again, without a key
    assert not artifact.with_suffix(".sig").exists()
    with pytest.raises(SignatureError, match="is not signed"):
        precompile.load(artifact, cache, trusted_keys=[keys["producer"][1]])
    assert precompile.load(artifact, cache)(nn.Linear(3, 2), torch.ones(4, 3)).shape == (4, 2)


def test_a_signing_capture_writes_the_three_files_all_or_nothing(
    tmp_path: Path, keys: dict[str, tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    artifact, cache = _capture(tmp_path, signing_key=keys["producer"][0])
    signature = artifact.with_suffix(".sig")
    before = [p.read_bytes() for p in (artifact, cache, signature)]
    real, calls = os.replace, []

    def replace(src: Any, dst: Any) -> None:
        calls.append(dst)
        if len(calls) == 3:  # the signature's rename, after both files of the pair
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(PrecompileError, match="unchanged"):
        _capture(tmp_path, signing_key=keys["other"][0])
    monkeypatch.undo()
    assert [p.read_bytes() for p in (artifact, cache, signature)] == before
    precompile.load(artifact, cache, trusted_keys=[keys["producer"][1]])


def test_trusted_keys_must_not_be_empty(pair: tuple[Path, Path]) -> None:
    with pytest.raises(PrecompileError, match="trusted_keys is empty"):
        precompile.load(*pair, trusted_keys=[])


# ---------------------------------------------------------------- imports and the CLI


def test_cryptography_is_imported_only_to_sign_or_verify(pair: tuple[Path, Path]) -> None:
    code = f"""
import sys, warnings
warnings.simplefilter("ignore")
import precompile
precompile.load({str(pair[0])!r}, {str(pair[1])!r})
print(sorted(m for m in sys.modules if m.startswith("cryptography")))
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_without_cryptography_keys_are_refused_with_the_fix(
    pair: tuple[Path, Path], keys: dict[str, tuple[str, str]]
) -> None:
    code = f"""
import sys, warnings
sys.modules["cryptography"] = None
warnings.simplefilter("ignore")
import precompile
precompile.load({str(pair[0])!r}, {str(pair[1])!r})  # no keys: no cryptography needed
try:
    precompile.load({str(pair[0])!r}, {str(pair[1])!r}, trusted_keys=[{keys["producer"][1]!r}])
except precompile.PrecompileError as error:
    print(error)
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert "needs the 'cryptography' package" in proc.stdout
    assert "torch-precompile[sign]" in proc.stdout


def _cli(*argv: str) -> tuple[int, str, str, list[str]]:
    """Run the CLI in a fresh process: exit code, stdout, stderr, and whether it loaded
    torch (the last stdout line)."""
    code = f"""
import json, sys
from precompile_lsp.cli import main
code = main({list(argv)!r})
print(json.dumps(sorted(m for m in sys.modules if m == "torch")))
raise SystemExit(code)
"""
    proc = run_python(code, cold=True)
    lines = proc.stdout.strip().splitlines()
    return proc.returncode, "\n".join(lines[:-1]), proc.stderr, json.loads(lines[-1])


def test_cli_keygen_sign_verify(tmp_path: Path, keys: dict[str, tuple[str, str]]) -> None:
    artifact, cache = _capture(tmp_path)
    key = str(tmp_path / "cli-key")
    code, out, err, torch_loaded = _cli("keygen", key)
    assert code == 0, err
    assert f"{key}.pub" in out and torch_loaded == []
    code, out, err, torch_loaded = _cli("sign", str(artifact), "--key", key)
    assert code == 0, err
    assert artifact.with_suffix(".sig").exists() and torch_loaded == []
    code, out, err, torch_loaded = _cli(
        "verify", str(artifact), "--trusted-key", f"{key}.pub", "--signature-only"
    )
    assert code == 0, err
    assert "signed by trusted key" in out and torch_loaded == []
    # Another key's signature is a finding (exit 1), before any eager comparison runs.
    code, out, err, _ = _cli("verify", str(artifact), "--trusted-key", keys["other"][1])
    assert code == 1 and "not a trusted key" in err
    _flip_middle_byte(cache)
    code, out, err, _ = _cli(
        "verify", str(artifact), "--trusted-key", f"{key}.pub", "--signature-only"
    )
    assert code == 1 and "changed since the pair was signed" in err
    # Usage errors are exit 2: a missing key, an existing key file, no key to check with.
    assert _cli("sign", str(artifact), "--key", str(tmp_path / "missing"))[0] == 2
    assert _cli("keygen", key)[0] == 2
    assert _cli("verify", str(artifact), "--signature-only")[0] == 2
