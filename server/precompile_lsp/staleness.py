"""Is a target's artifact missing, unreadable, or stale -- decided here, without torch.

Staleness is per function: an artifact records a digest of each function its capture ran
through (``FUNCTION_SOURCES``), and it is stale when one of those functions reads
differently in the workspace now, or is gone -- or when a name one of them reads from
outside itself is bound differently now (``K = 2.0`` at its module's top level, a class
attribute, a project module's attribute: ``precompile.source_bindings``).
The functions that made the example inputs (``INPUT_SOURCES``: a target's ``examples``,
what it called) are compared the same way: ``Net()`` becoming ``Net(k=3.0)`` there is a
new artifact too.
Editing another function of the same file, a comment outside the function, or lines above
it changes nothing. Artifacts that predate function records fall back to their per-file
``SOURCES`` hashes.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from precompile.artifact.metadata import inspect_artifact
from precompile.artifact.pair import file_sha256, open_regular
from precompile.errors import PrecompileError
from precompile.runtime.source_digest import changed_functions, decode_source
from precompile.source_bindings import changed_bindings
from precompile.write_policy import pair_paths, refusal
from precompile_lsp.files import shown_path


@dataclasses.dataclass(frozen=True)
class StaleSource:
    """One recorded source that no longer matches: ``function`` is None for a
    file-level record (an artifact without function records)."""

    file: Path
    function: str | None
    gone: bool = False
    #: What changed is not the function but where names it reads are bound (in
    #: ``file``, at its top level or in the class ``scope``): these names.
    reads: tuple[str, ...] = ()
    scope: str = ""
    #: The function made the example inputs (``INPUT_SOURCES``); no trace ran through it.
    inputs: bool = False

    def describe(self, shown_file: str) -> str:
        if self.function is None:
            return f"{shown_file} changed"
        if self.reads:
            where = f"{self.scope}." if self.scope else ""
            names = ", ".join(f"`{where}{name}`" for name in self.reads)
            purpose = " to make the example inputs" if self.inputs else ""
            return f"{names} ({shown_file}), which `{self.function}` reads{purpose}, changed"
        made = ", which made the example inputs," if self.inputs else ""
        if self.gone:
            return f"`{self.function}` ({shown_file}){made} is gone or renamed"
        return f"`{self.function}` ({shown_file}){made} changed"


@dataclasses.dataclass(frozen=True)
class ArtifactStatus:
    exists: bool
    unreadable: str | None = None
    stale: tuple[StaleSource, ...] = ()
    #: Why an emit may not write the pair's paths (one holds a file this product did
    #: not write: ``precompile.write_policy``), or None.
    refused: str | None = None


def _read(path: Path) -> str | None:
    """A module's text as the capture read it (``decode_source``)."""
    try:
        with open_regular(path) as f:
            return decode_source(f.read())
    except OSError:
        return None


def _strings(row: object, keys: tuple[str, ...]) -> bool:
    return isinstance(row, dict) and all(isinstance(row.get(k), str) for k in keys)


def _malformed(key: str, records: list[object]) -> str | None:
    """What is wrong with the shape of ``key``'s function records, or None: a workspace
    may hold an artifact written by hand or by another tool, and a record of the wrong
    shape is an artifact that cannot be read, not an internal error."""
    for i, record in enumerate(records):
        if not _strings(record, ("module", "function", "path", "sha256")):
            return f"{key}[{i}] is not a function record"
        assert isinstance(record, dict)
        if not isinstance(record.get("line", 0), int) or not isinstance(
            record.get("module_sha256", ""), str
        ):
            return f"{key}[{i}] is not a function record"
        reads = record.get("reads", [])
        if not isinstance(reads, list) or not all(
            _strings(r, ("module", "path", "scope", "module_sha256"))
            and isinstance(r.get("names"), dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in r["names"].items())
            for r in reads
        ):
            return f"{key}[{i}]['reads'] is not a list of read records"
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
    records = metadata.get("FUNCTION_SOURCES")
    inputs = metadata.get("INPUT_SOURCES", [])  # absent from artifacts before it
    if not isinstance(inputs, list):
        return ArtifactStatus(exists=True, unreadable="INPUT_SOURCES is not a list: it was edited")
    for key, rows in (("FUNCTION_SOURCES", records), ("INPUT_SOURCES", inputs)):
        if isinstance(rows, list) and (malformed := _malformed(key, rows)) is not None:
            return ArtifactStatus(exists=True, unreadable=f"{malformed}: it was edited")
    if isinstance(records, list) and records:
        stale = _stale_functions(records, base)
        said = {(s.file, s.function, s.reads) for s in stale}
        stale += [  # a helper both traced and run by examples() is said once
            s
            for s in _stale_functions(inputs, base, inputs=True)
            if (s.file, s.function, s.reads) not in said
        ]
        return ArtifactStatus(exists=True, stale=tuple(stale))
    stale = []
    for record in metadata.get("SOURCES", []):
        path = Path(os.path.normpath(base / record["path"]))
        if file_sha256(path) != record["sha256"]:
            stale.append(StaleSource(path, None))
    return ArtifactStatus(exists=True, stale=tuple(stale))


def _stale_functions(
    records: list[dict[str, Any]], base: Path, *, inputs: bool = False
) -> list[StaleSource]:
    """The records (``FUNCTION_SOURCES`` rows, relative to ``base``) that no longer match
    the workspace: the function itself, or else a name it reads."""

    def module_text(module: str, path: str) -> str | None:
        return _read(Path(os.path.normpath(base / path)))

    stale: list[StaleSource] = []
    for record, gone in changed_functions(records, module_text):
        path = Path(os.path.normpath(base / record["path"]))
        stale.append(StaleSource(path, record["function"], gone=gone, inputs=inputs))
    changed = {(s.file, s.function) for s in stale}
    for record, read, names in changed_bindings(records, module_text):
        path = Path(os.path.normpath(base / read["path"]))
        if (Path(os.path.normpath(base / record["path"])), record["function"]) in changed:
            continue  # the function itself changed: that says it
        stale.append(
            StaleSource(
                path, record["function"], reads=tuple(names), scope=read["scope"], inputs=inputs
            )
        )
    return stale
