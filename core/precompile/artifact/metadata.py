"""The metadata section of python_code: literal assignments, rendered and parsed.

Parsing never executes the artifact: ``ast`` plus ``literal_eval``. This module imports
no torch, so the CLI and the language server can read artifacts cheaply.
"""

from __future__ import annotations

import ast
import os
import pprint
from collections.abc import Mapping
from typing import Any

from precompile.errors import PrecompileError

#: The line that closes the metadata section; readers parse only what precedes it.
METADATA_END = "# ---- end of metadata ----"
ARTIFACT_FORMAT = "torch-precompile-artifact"
ARTIFACT_FORMAT_VERSION = 2


def render_assignment(name: str, value: Any) -> str:
    text = pprint.pformat(value, width=96, sort_dicts=False)
    try:
        parsed = ast.literal_eval(text)
    except (ValueError, SyntaxError) as error:
        # A value with no literal form (nan, inf, an object's repr) reached the
        # metadata: refuse the capture rather than crash it.
        raise PrecompileError(
            f"the artifact's metadata {name} holds a value that has no Python literal form "
            f"({error}); the capture recorded it to check calls against, and could not "
            f"write it",
            hint="pass finite numbers, strings, None or tensors there (a non-finite float "
            "as a 0-d tensor), or capture again without that value",
        ) from error
    if parsed != value:
        raise AssertionError(f"metadata {name} does not round-trip as a literal")
    return f"{name} = {text}"


def render_metadata(items: Mapping[str, Any]) -> str:
    return "\n".join(render_assignment(k, v) for k, v in items.items()) + f"\n{METADATA_END}\n"


def parse_metadata(source: str, origin: str = "<artifact>") -> dict[str, Any]:
    """The literal assignments ahead of METADATA_END, as a dict."""
    head, found, _ = source.partition(METADATA_END)
    if not found:
        raise PrecompileError(
            f"{origin} is not a torch-precompile artifact (no metadata section)",
            hint="pass the .py file that precompile.capture wrote",
        )
    try:
        tree = ast.parse(head, filename=origin)
    except SyntaxError as error:
        raise PrecompileError(
            f"{origin} has a corrupt metadata section: {error}",
            hint="the file was edited or truncated; emit the artifact again",
        ) from error
    metadata: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                try:
                    metadata[target.id] = ast.literal_eval(node.value)
                except ValueError as error:
                    raise PrecompileError(
                        f"{origin}: metadata {target.id} is not a literal",
                        hint="the file was edited; emit the artifact again",
                    ) from error
    if metadata.get("FORMAT") != ARTIFACT_FORMAT:
        raise PrecompileError(
            f"{origin} is not a torch-precompile artifact (FORMAT is "
            f"{metadata.get('FORMAT')!r})",
            hint="pass the .py file that precompile.capture wrote",
        )
    if metadata.get("FORMAT_VERSION") != ARTIFACT_FORMAT_VERSION:
        raise PrecompileError(
            f"{origin} has artifact format version {metadata.get('FORMAT_VERSION')!r}; this "
            f"torch-precompile reads version {ARTIFACT_FORMAT_VERSION}",
            hint="emit the artifact again with this version of torch-precompile",
        )
    return metadata


def inspect_artifact(path: str | os.PathLike[str]) -> dict[str, Any]:
    """An artifact's metadata, parsed without executing it."""
    from precompile.artifact.pair import read_text

    return parse_metadata(read_text(path, "artifact"), os.fspath(path))
