"""Ed25519 signatures over an artifact pair: who produced it, not only whether it is intact.

``code_hash`` and the kernel digests are plain sha256 values stored beside what they
cover: anyone able to change a file can recompute them, so they catch accidents, not
tampering. A signature binds both files to the holder of a private key, so a pair moved
between machines can be authenticated before any of it runs.

The signature is a detached file beside the pair (``NAME.sig``, JSON), so signing changes
neither file: python_code alone still runs, and "unsigned" is simply "no signature file".
It signs a canonical message naming the format and the sha256 of both files' exact bytes.

``cryptography`` is imported here only, and only when a key is read, made or used: ``import
precompile`` and every load without ``trusted_keys`` work without it. Nothing here imports
torch, so the CLI signs and verifies without it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterable
from typing import Any

from precompile.artifact.pair import as_path, read_bytes, validate_pair, write_files
from precompile.errors import PrecompileError, SignatureError
from precompile.write_policy import SIGNATURE_FORMAT

SIGNATURE_VERSION = 1

#: A private key, public key or trusted key: a path to a PEM file (or a raw 32-byte key
#: file, or an OpenSSH ``ssh-ed25519`` public key), the bytes of one, or a key object of
#: ``cryptography``.
KeyLike = Any

_INSTALL_HINT = "install the signing extra: pip install 'torch-precompile[sign]'"


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as error:
        raise PrecompileError(
            "signing and verifying artifacts needs the 'cryptography' package, which is "
            "not installed",
            hint=_INSTALL_HINT,
        ) from error
    return serialization, ed25519


def default_signature_path(artifact_path: str) -> str:
    root, _ = os.path.splitext(artifact_path)
    return root + ".sig"


def signed_message(python_code: bytes, cache_sha256: str) -> bytes:
    """What is signed: the format, and the sha256 of both files. Hashing each file on its
    own lets a load without the cache still authenticate python_code."""
    return (
        f"{SIGNATURE_FORMAT} {SIGNATURE_VERSION}\n"
        f"artifact sha256 {hashlib.sha256(python_code).hexdigest()}\n"
        f"cache sha256 {cache_sha256}\n"
    ).encode("ascii")


# ---------------------------------------------------------------- keys


def _key_bytes(key: KeyLike, what: str) -> tuple[bytes, str]:
    if isinstance(key, (bytes, bytearray)):
        return bytes(key), f"the {what} given as bytes"
    if isinstance(key, (str, os.PathLike)):
        path = os.fspath(key)
        return read_bytes(path, what), f"the {what} {path!r}"
    raise PrecompileError(
        f"the {what} must be a key file's path, its bytes or an Ed25519 key object, got "
        f"{type(key).__name__}"
    )


def load_private_key(key: KeyLike) -> Any:
    """An Ed25519 private key from a PEM (PKCS#8, unencrypted) or raw 32-byte key file."""
    serialization, ed25519 = _crypto()
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key
    data, where = _key_bytes(key, "private key")
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            loaded = serialization.load_pem_private_key(data, password=None)
        elif len(data) == 32:
            loaded = ed25519.Ed25519PrivateKey.from_private_bytes(data)
        else:
            loaded = None
    except (TypeError, ValueError) as error:
        raise PrecompileError(
            f"{where} cannot be read as a private key: {error}",
            hint="pass the unencrypted PEM key that 'precompile keygen' wrote",
        ) from error
    if not isinstance(loaded, ed25519.Ed25519PrivateKey):
        raise PrecompileError(
            f"{where} is not an Ed25519 private key",
            hint="make one with: precompile keygen KEYFILE",
        )
    return loaded


def load_public_key(key: KeyLike) -> Any:
    """An Ed25519 public key from a PEM, OpenSSH (``ssh-ed25519 ...``) or raw 32-byte file."""
    serialization, ed25519 = _crypto()
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.public_key()
    data, where = _key_bytes(key, "trusted key")
    if b"PRIVATE KEY" in data:
        raise PrecompileError(
            f"{where} is a private key; a trusted key is the public half",
            hint="pass the .pub file 'precompile keygen' wrote beside it (the private key "
            "stays with whoever signs)",
        )
    try:
        stripped = data.strip()
        if stripped.startswith(b"-----BEGIN"):
            loaded = serialization.load_pem_public_key(stripped)
        elif stripped.startswith(b"ssh-ed25519 "):
            loaded = serialization.load_ssh_public_key(stripped)
        elif len(data) == 32:
            loaded = ed25519.Ed25519PublicKey.from_public_bytes(data)
        else:
            loaded = None
    except (TypeError, ValueError) as error:
        raise PrecompileError(
            f"{where} cannot be read as a public key: {error}",
            hint="pass the .pub file 'precompile keygen' wrote",
        ) from error
    if not isinstance(loaded, ed25519.Ed25519PublicKey):
        raise PrecompileError(f"{where} is not an Ed25519 public key")
    return loaded


def key_id(public_key: Any) -> str:
    """A short, stable name for a public key: the start of the sha256 of its raw bytes."""
    serialization, _ = _crypto()
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_key(
    private_path: str | os.PathLike[str], public_path: str | os.PathLike[str] | None = None
) -> tuple[str, str, str]:
    """Make a new Ed25519 key pair: the private key as unencrypted PEM, mode 0600, and the
    public key (default: the private key's path + ``.pub``) as PEM. Returns both paths
    and the key id. An existing private key file is never overwritten."""
    serialization, ed25519 = _crypto()
    private = as_path(private_path, "the private key path")
    public = as_path(
        private + ".pub" if public_path is None else public_path, "the public key path"
    )
    if os.path.realpath(public) == os.path.realpath(private):
        raise PrecompileError("the public and private key paths are the same file")
    if os.path.lexists(private):
        raise PrecompileError(
            f"{private!r} already exists; a key file is never overwritten (that would "
            f"lose the key)",
            hint="pass another path, or delete the old key first if you mean to replace it",
        )
    key = ed25519.Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    write_files([(private, private_pem, "key"), (public, public_pem, "key")], private={private})
    return private, public, key_id(key.public_key())


# ---------------------------------------------------------------- signing


def signature_bytes(python_code: bytes, cache: bytes, private_key: Any) -> bytes:
    """The signature file's contents for this pair, signed with ``private_key`` (a key
    object from ``load_private_key``)."""
    cache_sha256 = hashlib.sha256(cache).hexdigest()
    record = {
        "format": SIGNATURE_FORMAT,
        "version": SIGNATURE_VERSION,
        "key_id": key_id(private_key.public_key()),
        "artifact_sha256": hashlib.sha256(python_code).hexdigest(),
        "cache_sha256": cache_sha256,
        "signature": base64.b64encode(
            private_key.sign(signed_message(python_code, cache_sha256))
        ).decode("ascii"),
    }
    return (json.dumps(record, indent=2) + "\n").encode("ascii")


def sign(
    artifact_path: str | os.PathLike[str],
    cache_path: str | os.PathLike[str],
    private_key: KeyLike,
    *,
    signature_path: str | os.PathLike[str] | None = None,
) -> str:
    """Sign an artifact pair with an Ed25519 private key; write the signature (default:
    beside the artifact, ``NAME.sig``) atomically and return its path. Neither file of
    the pair changes."""
    artifact, cache = validate_pair(artifact_path, cache_path)
    assert cache is not None
    key = load_private_key(private_key)
    python_code = read_bytes(artifact, "artifact")
    cache_data = read_bytes(cache, "cache")
    target = _signature_path(artifact, cache, signature_path)
    write_files([(target, signature_bytes(python_code, cache_data, key), "signature")])
    return target


# ---------------------------------------------------------------- verifying


def trusted_public_keys(trusted_keys: KeyLike | Iterable[KeyLike]) -> dict[str, Any]:
    """Key id -> public key, for one key or a list of them; an empty list is refused
    (it would refuse every pair: pass None to load without verifying)."""
    _, ed25519 = _crypto()
    single = (str, bytes, bytearray, os.PathLike, ed25519.Ed25519PublicKey)
    keys = [trusted_keys] if isinstance(trusted_keys, single) else list(trusted_keys)
    if not keys:
        raise PrecompileError(
            "trusted_keys is empty, so no pair could ever verify",
            hint="pass the public key(s) whose signatures you accept, or trusted_keys=None "
            "to load without checking a signature",
        )
    loaded = [load_public_key(k) for k in keys]
    return {key_id(k): k for k in loaded}


def _parse_signature(data: bytes, where: str) -> dict[str, Any]:
    try:
        record = json.loads(data.decode("utf-8"))
        if record.get("format") != SIGNATURE_FORMAT:
            raise ValueError("another format")
        if record.get("version") != SIGNATURE_VERSION:
            raise ValueError(f"version {record.get('version')!r}, expected {SIGNATURE_VERSION}")
        for field in ("key_id", "artifact_sha256", "cache_sha256", "signature"):
            if not isinstance(record.get(field), str):
                raise ValueError(f"no {field!r}")
        record["signature"] = base64.b64decode(record["signature"], validate=True)
    except (UnicodeDecodeError, ValueError, AttributeError) as error:
        raise SignatureError(
            f"the signature file {where!r} is not a valid torch-precompile signature " f"({error})",
            hint="sign the pair again: precompile sign ARTIFACT --key KEY",
        ) from error
    return record


def _check_signature(
    python_code: bytes,
    cache: bytes | None,
    signature: bytes | None,
    trusted: dict[str, Any],
    *,
    artifact_path: str,
    cache_path: str | None,
    signature_path: str,
) -> str:
    """Raise SignatureError unless ``signature`` is a valid signature, by one of the
    ``trusted`` keys, over exactly these bytes; return the signing key's id. Without the
    cache (``cache is None``) python_code alone is authenticated, against the cache
    digest the signature names."""
    from cryptography.exceptions import InvalidSignature

    if signature is None:
        raise SignatureError(
            f"the artifact {artifact_path!r} is not signed (there is no signature file "
            f"{signature_path!r}), and trusted keys were given",
            hint="sign it where it was produced: precompile sign ARTIFACT --key KEY, or "
            "capture(..., signing_key=KEY)",
        )
    record = _parse_signature(signature, signature_path)
    key = trusted.get(record["key_id"])
    if key is None:
        raise SignatureError(
            f"the artifact {artifact_path!r} is signed by key {record['key_id']}, which "
            f"is not a trusted key (trusted: {', '.join(sorted(trusted))})",
            hint="pass that key's public key in trusted_keys if you trust whoever holds "
            "it, or have the pair signed with a key you trust",
        )
    cache_sha256 = record["cache_sha256"] if cache is None else hashlib.sha256(cache).hexdigest()
    try:
        key.verify(record["signature"], signed_message(python_code, cache_sha256))
    except InvalidSignature:
        changed = []
        if hashlib.sha256(python_code).hexdigest() != record["artifact_sha256"]:
            changed.append(f"the artifact {artifact_path!r}")
        if cache is not None and cache_sha256 != record["cache_sha256"]:
            changed.append(f"the cache {cache_path!r}")
        what = (
            " and ".join(changed) + " changed since the pair was signed"
            if changed
            else f"the signature file {signature_path!r} was altered"
        )
        raise SignatureError(
            f"the signature of {artifact_path!r} does not match: {what}",
            hint="do not load it; produce and sign the pair again from a source you trust",
        ) from None
    return str(record["key_id"])


def verify_pair_bytes(
    python_code: bytes,
    cache: bytes | None,
    *,
    trusted_keys: KeyLike | Iterable[KeyLike],
    artifact_path: str,
    cache_path: str | None,
    signature_path: str | os.PathLike[str] | None = None,
) -> str:
    """``_check_signature`` for bytes already read (so what is verified is exactly what
    is then loaded), with the keys and the signature file resolved as ``load`` takes them."""
    trusted = trusted_public_keys(trusted_keys)
    where = _signature_path(artifact_path, cache_path, signature_path)
    return _check_signature(
        python_code,
        cache,
        read_signature(where),
        trusted,
        artifact_path=artifact_path,
        cache_path=cache_path,
        signature_path=where,
    )


def verify_signature(
    artifact_path: str | os.PathLike[str],
    cache_path: str | os.PathLike[str] | None,
    *,
    trusted_keys: KeyLike | Iterable[KeyLike],
    signature_path: str | os.PathLike[str] | None = None,
) -> str:
    """Check the pair's signature against ``trusted_keys`` without loading anything;
    return the signing key's id, or raise SignatureError naming why it is refused."""
    artifact, cache = validate_pair(artifact_path, cache_path)
    return verify_pair_bytes(
        read_bytes(artifact, "artifact"),
        None if cache is None else read_bytes(cache, "cache"),
        trusted_keys=trusted_keys,
        artifact_path=artifact,
        cache_path=cache,
        signature_path=signature_path,
    )


def _signature_path(artifact: str, cache: str | None, signature_path: object) -> str:
    if signature_path is None:
        return default_signature_path(artifact)
    path = as_path(signature_path, "signature_path")
    if any(
        other and os.path.realpath(path) == os.path.realpath(other) for other in (artifact, cache)
    ):
        raise PrecompileError(
            f"signature_path {path!r} is one of the pair's own files",
            hint="use e.g. model.sig beside model.py and model.cache",
        )
    return path


def read_signature(path: str) -> bytes | None:
    """The signature file's bytes, or None where there is none."""
    if not os.path.lexists(path):
        return None
    return read_bytes(path, "signature file")
