"""``precompile.load``: run an artifact pair in this process, with no tracing or compiling."""

from __future__ import annotations

import builtins
import os
import types
import warnings
from collections.abc import Callable
from typing import Any

from precompile.artifact.bytecode import COMPILED_SOURCES, artifact_code
from precompile.artifact.envelope import code_hash, read_envelope, warn_cache_fallback
from precompile.artifact.metadata import parse_metadata
from precompile.artifact.pair import read_bytes, validate_pair
from precompile.errors import ArtifactTrustWarning, PrecompileError
from precompile.serving import Serving, validate


class PrecompiledRunnable:
    """A loaded artifact: call it with the arguments the captured function took.

    The model is passed again on every call (no weights live in the artifact); every
    call is checked against what was captured and a mismatch raises PrecompileError --
    or, loaded with ``fallback=``, runs the fallback (precompile.serving). Every call is
    counted (``stats()``).
    """

    def __init__(
        self,
        forward: Callable[..., Any],
        metadata: dict[str, Any],
        namespace: dict[str, Any],
        artifact_path: str,
        cache_path: str | None,
        serving: Serving | None = None,
    ) -> None:
        self._forward = forward
        self.metadata = metadata
        self._namespace = namespace
        self.artifact_path = artifact_path
        self.cache_path = cache_path
        if serving is None:
            serving = Serving(
                forward,
                code_hash=namespace.get("_PRECOMPILE_CODE_HASH", ""),
                target=_target(metadata),
            )
        self._serving = serving
        # Bound once: a served call is Serving.serve (one next() on a counter beside the
        # artifact's own call), or Serving.call when shadow checks sample calls. Where
        # the artifact takes the arguments as held (``forward.packed``: single-graph
        # artifacts) and no shadow check samples, ``__call__`` runs Serving.serve's body
        # itself with that form: one frame and one packing of the arguments fewer.
        self._serve = serving.call if serving.shadow_rate else serving.serve
        self._packed = None if serving.shadow_rate else serving.packed_forward
        self._served = serving.served_counter

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        packed = self._packed
        if packed is None:
            return self._serve(args, kwargs)
        # Serving.serve, inline (refusals counted and fallen back alike).
        try:
            result = packed(args, kwargs)
        except PrecompileError as error:
            return self._serving.refused(error, args, kwargs)
        next(self._served)
        return result

    def stats(self) -> dict[str, Any]:
        """Calls served, refused and fallen back since load, per refusal reason (its first
        line) with up to 8 distinct input signatures each, and the shadow checks' counts:
        see docs/serving.md."""
        return self._serving.stats()

    def flush_serving_log(self) -> None:
        """Write the serving log's record now (it is also written periodically and at
        exit); nothing without a serving log."""
        self._serving.flush()

    @property
    def installed(self) -> bool:
        """True when loading installed the artifact onto live code objects."""
        return bool(getattr(self._forward, "installed", False))

    def covers(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Which captured variant of the entry frame would serve this call, or, per
        variant, the first guard that fails: decided by the checks a call runs, but no
        graph runs."""
        covers = self._namespace.get("covers")
        if covers is None:
            raise PrecompileError(
                "this artifact predates covers() for single-graph artifacts; emit it again"
            )
        return covers(*args, **kwargs)

    def unload(self) -> None:
        """Remove what loading installed into this process; idempotent."""
        unload = self._namespace.get("_unload")
        if unload is not None:
            unload()

    def __enter__(self) -> PrecompiledRunnable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unload()

    def __repr__(self) -> str:
        m = self.metadata
        return (
            f"<PrecompiledRunnable {m.get('FN_MODULE')}.{m.get('FN_NAME')} "
            f"backend={m.get('BACKEND')} tracer={m.get('TRACER')} from {self.artifact_path!r}>"
        )


def exec_artifact(
    python_code: bytes,
    metadata: dict[str, Any],
    bundle: dict[str, Any] | None,
    *,
    origin: str,
    cache_path: str | None = None,
    allow_serve_time_compiles: bool = False,
    code: types.CodeType | None = None,
    serving: dict[str, Any] | None = None,
) -> PrecompiledRunnable:
    """Execute python_code (or ``code``, compiled from it) in a fresh namespace. What load decided (the cache bundle,
    the serve-time-compile flag) reaches the driver through namespace entries, never by
    changing the hashed bytes."""
    digest = code_hash(python_code)
    namespace: dict[str, Any] = {
        "__name__": f"precompile_artifact_{digest[:12]}",
        "__file__": origin,
        "__builtins__": builtins,
        "_PRECOMPILE_BUNDLE": bundle,
        "_PRECOMPILE_ALLOW_SERVE_TIME_COMPILES": allow_serve_time_compiles,
        COMPILED_SOURCES: {},
    }
    try:
        exec(code or artifact_code(python_code, origin, bundle), namespace)
    except PrecompileError:
        raise
    except Exception as error:
        raise PrecompileError(
            f"the artifact {origin!r} failed to load: {type(error).__name__}: {error}",
            hint="emit it again with this torch and Python; if it persists, report it",
        ) from error
    forward = namespace.get("forward")
    if not callable(forward):
        raise PrecompileError(f"the artifact {origin!r} defines no forward()")
    policy = Serving(forward, code_hash=digest, target=_target(metadata), **(serving or {}))
    return PrecompiledRunnable(forward, metadata, namespace, origin, cache_path, policy)


def _target(metadata: dict[str, Any]) -> str:
    """The captured function, as the serving log names it: FN_MODULE.FN_NAME."""
    return f"{metadata.get('FN_MODULE')}.{metadata.get('FN_NAME')}"


def load(
    artifact_path: str | os.PathLike[str],
    cache_path: str | os.PathLike[str] | None = None,
    *,
    allow_serve_time_compiles: bool = False,
    trusted_keys: Any = None,
    signature_path: str | os.PathLike[str] | None = None,
    fallback: Callable[..., Any] | None = None,
    serving_log: str | os.PathLike[str] | None = None,
    shadow: float = 0.0,
    shadow_strict: bool = False,
    shadow_seed: int | None = None,
) -> PrecompiledRunnable:
    """Load an artifact pair. ``cache_path=None`` runs from python_code alone.

    Both files are code: loading executes python_code, and the cache's compiled kernels
    are loaded as native code (after each has been checked against its recorded digest).
    Without ``trusted_keys`` the pair is trusted input, like a pickle, and every load says
    so with an ArtifactTrustWarning. With ``trusted_keys`` (Ed25519 public keys: paths,
    bytes or key objects) the pair must carry a signature by one of them over exactly
    these bytes (``NAME.sig`` beside the artifact, or ``signature_path``), checked before
    anything is unpickled, loaded or executed; otherwise SignatureError says why.

    Production serving (docs/serving.md): ``fallback`` runs for a call the artifact
    refuses (warned once per reason, always counted; never for a refusal of the pair
    itself, which still raises here, nor for a call refused after part of it ran);
    ``serving_log`` (or the environment variable PRECOMPILE_SERVING_LOG) appends the
    counters as JSON lines; ``shadow`` is the fraction of served calls also run through
    ``fallback`` and compared (``shadow_strict`` raises on a mismatch; ``shadow_seed``
    makes the sampling reproducible).
    """
    rate, log_path = validate(fallback, shadow, shadow_strict, serving_log)
    artifact, cache = validate_pair(artifact_path, cache_path)
    python_code = read_bytes(artifact, "artifact")
    cache_data = None if cache is None else read_bytes(cache, "cache")
    signer = None
    if trusted_keys is not None:
        from precompile.artifact import signing

        signer = signing.verify_pair_bytes(
            python_code,
            cache_data,
            trusted_keys=trusted_keys,
            artifact_path=artifact,
            cache_path=cache,
            signature_path=signature_path,
        )
    try:
        text = python_code.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PrecompileError(
            f"the artifact {artifact!r} is not UTF-8 text",
            hint="pass the .py artifact as artifact_path and the .cache as cache_path",
        ) from error
    metadata = parse_metadata(text, artifact)
    bundle = None
    if cache is not None and cache_data is not None:
        bundle = read_envelope(
            cache_data,
            cache,
            backend=metadata.get("BACKEND", ""),
            tracer=metadata.get("TRACER", ""),
            python_code_hash=code_hash(python_code),
        )
        bundle = _usable_kernels(bundle, cache)
    if signer is None:
        warnings.warn(
            f"precompile: loading {artifact!r} executes its Python code, and its cache's "
            f"compiled kernels run as native code: both files are code. Load only pairs "
            f"you produced or reviewed, from a directory only you can write, or sign them "
            f"(precompile sign) and load with trusted_keys=[...]",
            ArtifactTrustWarning,
            stacklevel=2,
        )
    return exec_artifact(
        python_code,
        metadata,
        bundle,
        origin=artifact,
        cache_path=cache,
        allow_serve_time_compiles=allow_serve_time_compiles,
        serving={
            "fallback": fallback,
            "serving_log": log_path,
            "shadow": rate,
            "shadow_strict": shadow_strict,
            "shadow_seed": shadow_seed,
        },
    )


def _usable_kernels(bundle: dict[str, Any] | None, cache_path: str) -> dict[str, Any] | None:
    """The bundle, if its compiled kernels can run in this process; else None, with one
    warning: the artifact then compiles its kernels from the inlined source. A kernel
    built for a CPU feature this machine lacks would die of an illegal instruction, so
    this is checked from CPU-feature queries before anything is loaded."""
    if not bundle or not bundle.get("requires"):
        return bundle
    from precompile._compat.kernel_platform import kernel_platform_problem

    problem = kernel_platform_problem(bundle.get("requires", {}))
    if problem is None:
        return bundle
    warn_cache_fallback(
        cache_path,
        f"its compiled kernels cannot run here: {problem}; compiling them from the inlined source instead, which makes this load slow",
    )
    return None
