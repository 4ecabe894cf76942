"""Is a target's artifact missing, unreadable, or stale -- decided here, without torch.

Staleness is per function: an artifact records a digest of each function its capture ran
through (``FUNCTION_SOURCES``), and it is stale when one of those functions reads
differently in the workspace now, or is gone. Editing another function of the same file,
a comment outside the function, or lines above it changes nothing. Artifacts that predate
function records fall back to their per-file ``SOURCES`` hashes.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from precompile.artifact.metadata import inspect_artifact
from precompile.artifact.pair import file_sha256, open_regular
from precompile.errors import PrecompileError
from precompile.runtime.source_digest import changed_functions
from precompile.write_policy import pair_paths, refusal
from precompile_lsp.files import shown_path


@dataclasses.dataclass(frozen=True)
class StaleSource:
    """One recorded source that no longer matches: ``function`` is None for a
    file-level record (an artifact without function records)."""

    file: Path
    function: str | None
    gone: bool = False

    def describe(self, shown_file: str) -> str:
        if self.function is None:
            return f"{shown_file} changed"
        if self.gone:
            return f"`{self.function}` ({shown_file}) is gone or renamed"
        return f"`{self.function}` ({shown_file}) changed"


@dataclasses.dataclass(frozen=True)
class ArtifactStatus:
    exists: bool
    unreadable: str | None = None
    stale: tuple[StaleSource, ...] = ()
    #: Why an emit may not write the pair's paths (one holds a file this product did
    #: not write: ``precompile.write_policy``), or None.
    refused: str | None = None


def _read(path: Path) -> str | None:
    try:
        with open_regular(path) as f:
            return f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def artifact_status(artifact: Path, root: Path | None = None) -> ArtifactStatus:
    """What the workspace says of ``artifact`` now (reads files: call off the event loop;
    paths in messages are shown relative to ``root``)."""
    refused = [
        r
        for path, kind in pair_paths(str(artifact))
        if (r := refusal(path, kind, shown_path(path, root))) is not None
    ]
    if refused:
        return ArtifactStatus(exists=artifact.is_file(), refused="; ".join(refused))
    if not artifact.is_file():
        return ArtifactStatus(exists=False)
    try:
        metadata = inspect_artifact(artifact)
    except PrecompileError as error:
        return ArtifactStatus(exists=True, unreadable=error.message)
    base = artifact.parent
    stale: list[StaleSource] = []
    records = metadata.get("FUNCTION_SOURCES")
    if isinstance(records, list) and records:

        def module_text(module: str, path: str) -> str | None:
            return _read(Path(os.path.normpath(base / path)))

        for record, gone in changed_functions(records, module_text):
            path = Path(os.path.normpath(base / record["path"]))
            stale.append(StaleSource(path, record["function"], gone=gone))
        return ArtifactStatus(exists=True, stale=tuple(stale))
    for record in metadata.get("SOURCES", []):
        path = Path(os.path.normpath(base / record["path"]))
        if file_sha256(path) != record["sha256"]:
            stale.append(StaleSource(path, None))
    return ArtifactStatus(exists=True, stale=tuple(stale))
