"""The subcommands about one artifact pair: ``emit`` and ``verify`` (through the engine,
in a worker), ``keygen`` and ``sign`` (Ed25519), and ``inspect`` (its metadata, read
without running it)."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

from precompile_lsp.cli_workspace import (
    EXIT_ERROR,
    EXIT_FINDINGS,
    EXIT_OK,
    Progress,
    workspace_root,
)

#: ``precompile inspect`` shows this much of a value unless asked for --full.
INSPECT_LIMIT = 400


def _resolve_target(engine: Any, spec: str) -> Any:
    engine.discover()
    if "::" in spec:
        file, function = spec.split("::", 1)
        path = Path(file).resolve()
        matches = [
            s.decl
            for s in engine.targets.values()
            if s.decl.file == path and s.decl.function == function
        ]
    else:
        matches = [s.decl for k, s in engine.targets.items() if k == spec or k.endswith("." + spec)]
    if len(matches) != 1:
        known = ", ".join(sorted(engine.targets)) or "none found"
        raise LookupError(
            f"{'no' if not matches else 'more than one'} target matches {spec!r} (targets: {known})"
        )
    return matches[0]


def emit_or_verify(args: argparse.Namespace, kind: str) -> int:
    from precompile_lsp.config import ConfigError
    from precompile_lsp.engine import Engine
    from precompile_lsp.files import shown_path
    from precompile_lsp.protocol import JobResult

    root = workspace_root([])
    progress = Progress(args.quiet)
    try:
        # Key files as absolute paths: the worker that loads the pair runs elsewhere.
        keys = [str(Path(k).resolve()) for k in getattr(args, "trusted_key", None) or ()]
        engine = Engine(root, trusted=True, use_cache=False, on_event=progress, trusted_keys=keys)
        if kind == "verify":
            from precompile.artifact.metadata import inspect_artifact

            metadata = inspect_artifact(args.artifact)
            decl = _resolve_target(engine, f"{metadata['FN_MODULE']}.{metadata['FN_NAME']}")
            own = engine.emit_paths.artifact_of(decl)[0]
            if own != Path(args.artifact).resolve():
                # The worker verifies the target's own artifact: verifying (or checking the
                # signature of) any other file would report on one file and load another.
                raise LookupError(
                    f"{args.artifact} is a copy of {decl.key}'s artifact, which lives at "
                    f"{shown_path(own, root)}; verify that path (or point the target's "
                    f"artifact= option at this file)"
                )
        else:
            decl = _resolve_target(engine, args.target)
    except (ConfigError, LookupError) as error:
        print(f"precompile {kind}: {error}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as error:
        print(f"precompile {kind}: {error}", file=sys.stderr)
        return EXIT_ERROR

    async def run() -> JobResult:
        try:
            return await (engine.verify(decl) if kind == "verify" else engine.emit(decl))
        finally:
            await engine.close()

    result = asyncio.run(run())
    progress.done()
    if result.status.failed:
        print(f"precompile {kind}: {result.message}", file=sys.stderr)
        return EXIT_FINDINGS
    if result.failure is not None:
        print(f"precompile {kind}: {decl.key}: {result.failure.message}", file=sys.stderr)
        return EXIT_FINDINGS
    if kind == "emit":
        summary = result.report.summary.text if result.report is not None else ""
        print(f"emitted {result.artifact}: {summary}")
        return EXIT_OK
    failures = result.verify_failures
    for failure in failures:
        print(f"{args.artifact}: {failure}")
    status = engine.targets[decl.key].artifact
    stale = status.stale if status is not None else ()
    for source in stale:
        print(f"{args.artifact}: stale: {source.describe(str(source.file))} since it was emitted")
    if not failures and not stale:
        print(f"{args.artifact}: verified against eager")
    return EXIT_FINDINGS if failures or stale else EXIT_OK


def verify_pair(args: argparse.Namespace) -> int:
    """With ``--trusted-key``, the pair's signature is checked first (in this process,
    without torch); a refused signature is a finding, and nothing is loaded."""
    if args.trusted_key:
        from precompile.artifact.pair import default_cache_path
        from precompile.artifact.signing import verify_signature
        from precompile.errors import PrecompileError, SignatureError

        cache = default_cache_path(args.artifact)
        try:
            signer = verify_signature(
                args.artifact,
                cache if Path(cache).exists() else None,
                trusted_keys=args.trusted_key,
            )
        except SignatureError as error:
            print(f"{args.artifact}: {error}", file=sys.stderr)
            return EXIT_FINDINGS
        except PrecompileError as error:
            print(f"precompile verify: {error}", file=sys.stderr)
            return EXIT_ERROR
        print(f"{args.artifact}: signed by trusted key {signer}")
    elif args.signature_only:
        print("precompile verify: --signature-only needs --trusted-key", file=sys.stderr)
        return EXIT_ERROR
    if args.signature_only:
        return EXIT_OK
    return emit_or_verify(args, "verify")


def keygen(args: argparse.Namespace) -> int:
    from precompile.artifact.signing import generate_key
    from precompile.errors import PrecompileError

    try:
        private, public, key = generate_key(args.key, args.public)
    except PrecompileError as error:
        print(f"precompile keygen: {error}", file=sys.stderr)
        return EXIT_ERROR
    print(f"wrote private key {private} (mode 0600: keep it secret) and public key {public}")
    print(f"key id {key}; load with trusted_keys=[{public!r}] or verify --trusted-key {public}")
    return EXIT_OK


def sign_pair(args: argparse.Namespace) -> int:
    from precompile.artifact.pair import default_cache_path
    from precompile.artifact.signing import sign
    from precompile.errors import PrecompileError

    cache = args.cache or default_cache_path(args.artifact)
    try:
        signature = sign(args.artifact, cache, args.key, signature_path=args.signature)
    except PrecompileError as error:
        print(f"precompile sign: {error}", file=sys.stderr)
        return EXIT_ERROR
    print(f"signed {args.artifact} and {cache}: {signature}")
    return EXIT_OK


def inspect_pair(args: argparse.Namespace) -> int:
    from precompile.artifact.metadata import inspect_artifact
    from precompile.errors import PrecompileError

    try:
        metadata = inspect_artifact(args.artifact)
    except PrecompileError as error:
        print(f"precompile inspect: {error}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps(metadata, indent=2, default=list))
        return EXIT_OK
    width = max(map(len, metadata), default=0)
    columns = max(shutil.get_terminal_size((100, 24)).columns - width - 2, 40)
    for key, value in metadata.items():
        if key.startswith("_"):
            # Encoded payloads (_FRAMES, _PACKAGE...) are sized, never printed.
            print(f"{key.ljust(width)}  <{len(str(value))} characters>")
            continue
        text = repr(value)
        if not args.full and len(text) > INSPECT_LIMIT:
            text = (
                f"{text[:INSPECT_LIMIT]}... ({len(text) - INSPECT_LIMIT} more characters; --full)"
            )
        lines = textwrap.wrap(text, columns, break_long_words=True) or [""]
        print(f"{key.ljust(width)}  {lines[0]}")
        for line in lines[1:]:
            print(f"{'':{width}}  {line}")
    return EXIT_OK
