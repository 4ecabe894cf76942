"""The cache half of the artifact pair: a ``torch.save``d dict that only accelerates.

python_code alone always runs; the envelope carries what makes loading cheap (compiled
kernels, for Inductor) plus ``code_hash``, which binds it to the exact python_code bytes
it was made with, and ``digests``, the sha256 of every binary blob in the bundle (each
compiled kernel, each Inductor cache file). Read with ``weights_only=True``, so the
envelope itself is never a pickle gadget; but the kernels it carries are native code that
the load executes, so a blob that does not match its digest refuses the whole bundle
before any of it is written or loaded. The digests live in the same file: they catch a
corrupted cache, not a forged one; authenticity is what signatures add (signing.py).
"""

from __future__ import annotations

import hashlib
import io
import warnings
from collections.abc import Iterator
from typing import Any

from precompile.errors import CacheFallbackWarning, PrecompileError
from precompile.write_policy import CACHE_FORMAT

#: 2: the envelope records ``digests``; a version-1 cache (no digests) is not used.
CACHE_VERSION = 2


def code_hash(python_code: bytes) -> str:
    return hashlib.sha256(python_code).hexdigest()


def _blobs(value: Any, name: str = "") -> Iterator[tuple[str, bytes]]:
    """Every bytes value in the bundle, named by its path (``kernels/<source digest>``,
    ``inductor_cache_files/<relative path>``)."""
    if isinstance(value, (bytes, bytearray)):
        yield name, bytes(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _blobs(item, f"{name}/{key}" if name else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _blobs(item, f"{name}[{i}]")


def blob_digests(bundle: dict[str, Any]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in _blobs(bundle)}


def _describe(name: str) -> str:
    kind, _, rest = name.partition("/")
    if kind == "kernels":
        return f"the compiled kernel {rest!r}"
    if kind == "inductor_cache_files":
        return f"the Inductor cache file {rest!r}"
    if kind == "python_bytecode":
        return "the artifact's cached bytecode"
    if kind == "compiled_sources":
        return f"the cached bytecode {rest.rpartition('/')[2][:16]!r} of code the artifact compiles"
    return f"the blob {name!r}"


def blob_problem(bundle: dict[str, Any], digests: object) -> str | None:
    """Why the bundle's blobs cannot be trusted to be what the capture wrote, or None.
    Every blob must match its recorded sha256, and the recorded set must be complete."""
    if not isinstance(digests, dict):
        return "it records no digests of its compiled kernels"
    seen = set()
    for name, data in _blobs(bundle):
        expected = digests.get(name)
        if expected is None:
            return f"{_describe(name)} has no recorded digest"
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            return (
                f"{_describe(name)} failed verification: its sha256 is {actual[:16]}..., "
                f"the cache records {str(expected)[:16]}...; the cache is corrupted or was "
                f"altered, so none of its kernels is loaded"
            )
        seen.add(name)
    missing = sorted(set(digests) - seen)
    if missing:
        return f"{_describe(missing[0])} is recorded but missing from the cache"
    return None


def build_envelope(
    *, backend: str, tracer: str, python_code: bytes, bundle: dict[str, Any]
) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(
        {
            "format": CACHE_FORMAT,
            "version": CACHE_VERSION,
            "backend": backend,
            "tracer": tracer,
            "code_hash": code_hash(python_code),
            "digests": blob_digests(bundle),
            "bundle": bundle,
        },
        buffer,
    )
    return buffer.getvalue()


def warn_cache_fallback(cache_path: str, why: str) -> None:
    warnings.warn(
        f"precompile: ignoring the cache {cache_path!r} ({why}); the artifact runs from its "
        f"python_code alone, with identical results (only loading is slower)",
        CacheFallbackWarning,
        stacklevel=4,
    )


def read_envelope(
    data: bytes, cache_path: str, *, backend: str, tracer: str, python_code_hash: str
) -> dict[str, Any] | None:
    """The envelope's bundle, or None (with one warning) when it cannot be used.

    An unreadable or foreign-format cache only slows loading down, so it warns; so does
    a bundle with a blob that does not match its digest, which is then never written or
    loaded. A cache that reads fine but belongs to another capture means the pair was
    mixed up, which the user must hear about, so it raises.
    """
    import torch

    try:
        envelope = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:  # any unpickling failure means "not a usable cache"
        warn_cache_fallback(cache_path, f"unreadable: {type(error).__name__}: {str(error)[:200]}")
        return None
    if not isinstance(envelope, dict) or envelope.get("format") != CACHE_FORMAT:
        warn_cache_fallback(cache_path, "not a torch-precompile cache")
        return None
    if envelope.get("version") != CACHE_VERSION:
        warn_cache_fallback(
            cache_path,
            f"cache format version {envelope.get('version')!r}, expected {CACHE_VERSION}",
        )
        return None
    for field, expected in (("backend", backend), ("tracer", tracer)):
        if envelope.get(field) != expected:
            raise PrecompileError(
                f"the cache {cache_path!r} was made for {field} {envelope.get(field)!r} but "
                f"the artifact uses {expected!r}: the two files come from different captures",
                invariant=7,
                hint="pass the .cache written together with this .py, or omit cache_path",
            )
    if envelope.get("code_hash") != python_code_hash:
        raise PrecompileError(
            f"the cache {cache_path!r} does not belong to this artifact (its code_hash "
            f"differs): the .py was edited or the two files come from different captures",
            invariant=7,
            hint="emit the artifact again, or pass the .cache written with this .py",
        )
    bundle = envelope.get("bundle")
    if not isinstance(bundle, dict):
        return {}
    problem = blob_problem(bundle, envelope.get("digests"))
    if problem is not None:
        warn_cache_fallback(
            cache_path,
            f"{problem}; compiling them from the inlined source instead, which makes this "
            f"load slow",
        )
        return None
    return bundle
