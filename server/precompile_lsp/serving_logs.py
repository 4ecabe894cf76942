"""Serving logs (docs/serving.md, "Record schema (version 1)"), read without torch.

``precompile coverage``, ``precompile check`` and the language server all read logs here,
so the three say the same thing of the same records. Records are summed per artifact (its
code hash: a reader never needs the last record, each covers its own window). An artifact
is matched to the workspace's target whose *current* artifact has that code hash (the
sha256 of the artifact's ``.py`` bytes, as the cache envelope records it); a log of an
artifact that is no longer any target's current one is reported as re-emitted since (when
its target name is still a target of the workspace), or as belonging to no target -- never
as the current artifact's coverage.

Reading a log runs nothing of the workspace: it is allowed in an untrusted workspace. A
malformed line or a record of an unknown version is skipped, with one warning per file
naming its first line and the count; nothing in a log makes the reader fail.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from precompile.artifact.pair import file_sha256, open_regular
from precompile_lsp.files import shown_path
from precompile_lsp.findings import Finding, Related, Span

FORMAT = "precompile-serving-log"
VERSIONS = frozenset({1})
#: Distinct signatures (and mismatches) kept per reason: as many as a writer keeps.
MAX_SIGNATURES = 8
#: A log larger than this is read up to it (the writer stops at 64 MiB per file).
MAX_READ_BYTES = 256 * 1024 * 1024


@dataclasses.dataclass
class Reason:
    """One refusal reason of one artifact, summed over every record that names it."""

    reason: str
    count: int = 0
    refused: int = 0
    fallback: int = 0
    partial: int = 0
    #: Each distinct signature with the log line that first recorded it.
    signatures: dict[str, tuple[Path, int]] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "count": self.count,
            "refused": self.refused,
            "fallback": self.fallback,
            "partial": self.partial,
            "signatures": list(self.signatures),
        }


@dataclasses.dataclass
class Coverage:
    """What production met of one artifact (one code hash), over every log read."""

    code_hash: str
    target: str
    served: int = 0
    refused: int = 0
    fallback: int = 0
    shadow_runs: int = 0
    shadow_mismatches: int = 0
    reasons: dict[str, Reason] = dataclasses.field(default_factory=dict)
    #: (signature, detail, log file, line), at most MAX_SIGNATURES.
    mismatches: list[tuple[str, str, Path, int]] = dataclasses.field(default_factory=list)
    #: Every log file with a record of this artifact, with its first such line.
    files: dict[Path, int] = dataclasses.field(default_factory=dict)

    @property
    def calls(self) -> int:
        return self.served + self.refused + self.fallback

    @property
    def missed(self) -> int:
        """Calls the artifact refused (answered by the fallback or raised)."""
        return self.refused + self.fallback

    @property
    def served_percent(self) -> str:
        return _percent(self.served, self.calls)

    def top_reasons(self) -> list[Reason]:
        return sorted(self.reasons.values(), key=lambda r: (-r.count, r.reason))

    def to_dict(self, root: Path | None = None) -> dict[str, Any]:
        return {
            "code_hash": self.code_hash,
            "target": self.target,
            "calls": self.calls,
            "served": self.served,
            "refused": self.refused,
            "fallback": self.fallback,
            "served_rate": round(self.served / self.calls, 6) if self.calls else None,
            "reasons": [r.to_dict() for r in self.top_reasons()],
            "shadow_runs": self.shadow_runs,
            "shadow_mismatches": self.shadow_mismatches,
            "mismatches": [{"signature": s, "detail": d} for s, d, _, _ in self.mismatches],
            "logs": [shown_path(p, root) for p in self.files],
        }


def _percent(part: int, whole: int) -> str:
    if not whole:
        return "n/a"
    value = 100 * part / whole
    return f"{value:.1f}%" if value not in (0, 100) else f"{value:.0f}%"


@dataclasses.dataclass
class LogSet:
    coverages: dict[str, Coverage] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)
    files: list[Path] = dataclasses.field(default_factory=list)
    records: int = 0


def _int(record: dict[str, Any], key: str) -> int:
    value = record.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(key)
    return value


def _add(logs: LogSet, record: dict[str, Any], path: Path, line: int) -> None:
    """Sum one well-formed record into ``logs`` (ValueError/TypeError: malformed)."""
    code_hash, target = record.get("code_hash"), record.get("target")
    if not isinstance(code_hash, str) or not isinstance(target, str):
        raise ValueError("code_hash")
    counts = {k: _int(record, k) for k in ("served", "refused", "fallback")}
    shadow = {k: _int(record, k) for k in ("shadow_runs", "shadow_mismatches")}
    reasons = record.get("reasons", [])
    mismatches = record.get("mismatches", [])
    if not isinstance(reasons, list) or not isinstance(mismatches, list):
        raise ValueError("reasons")
    parsed = []
    for entry in reasons:
        text, signatures = entry["reason"], entry.get("signatures", [])
        if not isinstance(text, str) or not isinstance(signatures, list):
            raise ValueError("reason")
        parsed.append(
            (text, {k: _int(entry, k) for k in ("count", "refused", "fallback", "partial")},
             [s for s in signatures if isinstance(s, str)])
        )  # fmt: skip
    coverage = logs.coverages.setdefault(code_hash, Coverage(code_hash, target))
    coverage.files.setdefault(path, line)
    coverage.served += counts["served"]
    coverage.refused += counts["refused"]
    coverage.fallback += counts["fallback"]
    coverage.shadow_runs += shadow["shadow_runs"]
    coverage.shadow_mismatches += shadow["shadow_mismatches"]
    for text, numbers, signatures in parsed:
        reason = coverage.reasons.setdefault(text, Reason(text))
        reason.count += numbers["count"]
        reason.refused += numbers["refused"]
        reason.fallback += numbers["fallback"]
        reason.partial += numbers["partial"]
        for signature in signatures:
            if len(reason.signatures) < MAX_SIGNATURES:
                reason.signatures.setdefault(signature, (path, line))
    for entry in mismatches:
        if isinstance(entry, dict) and len(coverage.mismatches) < MAX_SIGNATURES:
            coverage.mismatches.append(
                (str(entry.get("signature", "")), str(entry.get("detail", "")), path, line)
            )


def read_logs(paths: Iterable[Path], root: Path | None = None) -> LogSet:
    """Sum every record of ``paths``. Malformed lines and unknown versions are skipped,
    one warning per file and kind naming its first line; an unreadable file is one
    warning. Paths in warnings are shown relative to ``root``."""
    logs = LogSet()
    for path in paths:
        logs.files.append(path)
        shown = shown_path(path, root)
        try:
            # A FIFO or device named like a log is skipped, never waited on.
            with open_regular(path) as handle:
                data = handle.read(MAX_READ_BYTES)
        except OSError as error:
            logs.warnings.append(f"{shown}: cannot be read ({error.strerror or error}); skipped")
            continue
        malformed: list[int] = []
        unknown: dict[int, list[int]] = {}
        for number, raw in enumerate(data.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
                if not isinstance(record, dict) or record.get("format") != FORMAT:
                    raise ValueError("format")
                version = record.get("version")
                if version not in VERSIONS:
                    key = version if isinstance(version, int) else -1
                    unknown.setdefault(key, []).append(number)
                    continue
                if "note" in record and "code_hash" not in record:
                    continue  # a size-limit note: no counts
                _add(logs, record, path, number)
                logs.records += 1
            except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
                malformed.append(number)
        if malformed:
            logs.warnings.append(
                f"{shown}:{malformed[0]}: skipped {len(malformed)} malformed "
                f"line{'s' * (len(malformed) != 1)} (not a {FORMAT} record of the "
                f"documented schema); the other records were read"
            )
        for version, lines in sorted(unknown.items()):
            logs.warnings.append(
                f"{shown}:{lines[0]}: skipped {len(lines)} record{'s' * (len(lines) != 1)} of "
                f"serving-log version {version if version >= 0 else '(none)'}, which this "
                f"torch-precompile does not know (it reads version "
                f"{', '.join(map(str, sorted(VERSIONS)))}); upgrade torch-precompile to read them"
            )
    return logs


def expand(patterns: Iterable[str], root: Path) -> dict[str, list[Path]]:
    """Each pattern's files, sorted: a relative pattern is a glob under ``root`` (and a
    match whose real path leads out of it is dropped), an absolute one is taken as
    written. A pattern without glob characters names one file (matched if it exists)."""
    found: dict[str, list[Path]] = {}
    for pattern in patterns:
        absolute = os.path.isabs(os.path.expanduser(pattern))
        full = os.path.expanduser(pattern) if absolute else str(root / pattern)
        matches = sorted(Path(p) for p in _glob(full) if _regular(p))
        if not absolute:
            matches = [p for p in matches if inside(p.resolve(), root)]
        found[pattern] = matches
    return found


#: At most this many directory entries are looked at per pattern: a glob over a huge
#: tree (``/**/*``) ends instead of walking on.
MAX_WALKED = 200_000
_GLOB_CHARS = re.compile(r"[*?\[]")


def _regular(path: str) -> bool:
    """A regular file (by ``stat``, which never blocks: a FIFO or a device is not)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` (``/``-separated, relative) as a regex: ``**/`` any folders, ``**`` and
    ``*`` as glob.glob(recursive=True) reads them, ``?``, ``[...]``."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _glob(full: str) -> list[str]:
    """The paths ``full`` matches: walked with ``os.walk(followlinks=False)`` from its
    longest folder without glob characters, so a directory symlink loop under the logs
    (``logs/up -> ..``) is never descended into, and at most ``MAX_WALKED`` entries."""
    parts = full.split(os.sep)
    fixed = next((i for i, part in enumerate(parts) if _GLOB_CHARS.search(part)), None)
    if fixed is None:
        return [full] if os.path.lexists(full) else []
    base = os.sep.join(parts[:fixed]) or os.sep
    regex = _pattern_regex("/".join(parts[fixed:]))
    found: list[str] = []
    walked = 0
    for folder, dirs, names in os.walk(base, followlinks=False):
        dirs.sort()
        for name in names:
            walked += 1
            path = os.path.join(folder, name)
            if regex.match(os.path.relpath(path, base).replace(os.sep, "/")):
                found.append(path)
        walked += len(dirs)
        if walked > MAX_WALKED:
            break
    return found


def inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def artifact_hash(path: Path) -> str | None:
    """The code hash of the artifact at ``path`` (sha256 of its bytes), None if absent."""
    return file_sha256(path)


@dataclasses.dataclass
class Attribution:
    """Which logged artifacts belong to which workspace target."""

    #: target key -> the coverage of its current artifact.
    current: dict[str, Coverage] = dataclasses.field(default_factory=dict)
    #: target key -> coverages of artifacts of that target that are not its current one.
    stale: dict[str, list[Coverage]] = dataclasses.field(default_factory=dict)
    #: Coverages of artifacts no target of the workspace has or had.
    unknown: list[Coverage] = dataclasses.field(default_factory=list)
    #: target key -> the code hash of its current artifact (None: none emitted).
    hashes: dict[str, str | None] = dataclasses.field(default_factory=dict)


def attribute(logs: LogSet, hashes: dict[str, str | None]) -> Attribution:
    """Match each logged artifact to a target: by its current artifact's code hash,
    else (re-emitted since) by the target name the log records."""
    out = Attribution(hashes=dict(hashes))
    by_hash = {h: key for key, h in sorted(hashes.items()) if h is not None}
    for code_hash, coverage in sorted(logs.coverages.items()):
        key = by_hash.get(code_hash)
        if key is not None:
            out.current[key] = coverage
        elif coverage.target in hashes:
            out.stale.setdefault(coverage.target, []).append(coverage)
        else:
            out.unknown.append(coverage)
    return out


class LogReader:
    """Reads the serving logs a workspace's configuration names, again only when they or
    the artifacts they are matched to changed since the last read (a stamp of the
    patterns, each log file's inode, size and mtime, and the artifacts' hashes)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._stamp: object = None

    def read(
        self, artifacts: dict[str, Path], patterns: tuple[str, ...]
    ) -> tuple[Attribution | None, list[str]] | None:
        """The logs ``patterns`` name: their attribution and warnings, or None when
        nothing they depend on changed (thread-safe: changes nothing but the stamp)."""
        if not patterns:
            if self._stamp is None:
                return None
            self._stamp = None
            return None, []
        files = sorted({p for found in expand(patterns, self.root).values() for p in found})
        hashes = {key: artifact_hash(path) for key, path in sorted(artifacts.items())}

        def identity(path: Path) -> tuple[int, int, int] | None:
            try:
                info = path.stat()
            except OSError:
                return None
            return info.st_ino, info.st_size, info.st_mtime_ns

        stamp = (patterns, [(p, identity(p)) for p in files], hashes)
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        logs = read_logs(files, self.root)
        return attribute(logs, hashes), logs.warnings


def _first_line(reason: str) -> str:
    text = reason.splitlines()[0] if reason else "(no reason recorded)"
    return text.removeprefix("precompile: ")


def production_findings(
    decl: Any,
    current: Coverage | None,
    stale: list[Coverage],
    current_hash: str | None,
    root: Path | None = None,
) -> list[Finding]:
    """A target's production findings, at its decorator: PC401 per refusal reason of its
    current artifact (signatures as related locations: the log line that recorded each),
    PC402 for shadow mismatches, PC403 per log of an artifact re-emitted since."""
    anchor: Span = decl.decorator
    data = {"target": decl.key}
    findings = []
    name = decl.function
    if current is not None:
        for reason in current.top_reasons():
            how = []
            if reason.fallback:
                how.append(f"{reason.fallback:,} answered by the fallback")
            if reason.refused:
                how.append(f"{reason.refused:,} raised" + (
                    f" ({reason.partial:,} after part of the call ran)" if reason.partial else ""))  # fmt: skip
            message = (
                f"production refused {reason.count:,} of {current.calls:,} calls of `{name}`: "
                f"{_first_line(reason.reason)}" + (f" [{'; '.join(how)}]" if how else "")
            )
            related = tuple(
                Related(log, Span.at(line), f"input signature: {signature}")
                for signature, (log, line) in reason.signatures.items()
            )
            findings.append(
                Finding(
                    "PC401",
                    message,
                    decl.file,
                    anchor,
                    decl.key,
                    related=related,
                    details=reason.reason,
                    data={
                        **data,
                        "count": reason.count,
                        "calls": current.calls,
                        "signatures": list(reason.signatures),
                    },
                )
            )
        if current.shadow_mismatches:
            related = tuple(
                Related(log, Span.at(line), f"mismatch on input signature: {signature}")
                for signature, _, log, line in current.mismatches
            )
            details = "\n\n".join(f"{s}:\n{d}" for s, d, _, _ in current.mismatches) or None
            findings.append(
                Finding(
                    "PC402",
                    f"shadow checks in production found {current.shadow_mismatches:,} of "
                    f"{current.shadow_runs:,} sampled calls of `{name}` where the artifact's "
                    f"answer differs from the fallback's: the artifact served wrong answers "
                    f"no check refused; capture the mismatching signatures, verify "
                    f"(precompile verify) and emit again",
                    decl.file,
                    anchor,
                    decl.key,
                    related=related,
                    details=details,
                    data={**data, "mismatches": current.shadow_mismatches},
                )
            )
    for coverage in stale:
        now = f"the current artifact's is {current_hash[:12]}" if current_hash else (
            "no artifact is emitted now")  # fmt: skip
        logs = ", ".join(shown_path(p, root) for p in coverage.files)
        findings.append(
            Finding(
                "PC403",
                f"serving logs record {coverage.calls:,} calls of `{name}` served by an "
                f"artifact that was re-emitted since (code hash {coverage.code_hash[:12]}; "
                f"{now}), so they say nothing of the current artifact: serve it with "
                f"serving_log= to see its production coverage, or remove the old logs "
                f"({logs})",
                decl.file,
                anchor,
                decl.key,
                related=tuple(
                    Related(p, Span.at(line), f"records of artifact {coverage.code_hash[:12]}")
                    for p, line in coverage.files.items()
                ),
                data={**data, "code_hash": coverage.code_hash},
            )
        )
    return findings


def lens_text(coverage: Coverage) -> str:
    """The CodeLens's production part: served share of the calls logged."""
    return f"production: served {coverage.served_percent} of {coverage.calls:,} calls"
