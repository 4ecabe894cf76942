"""Shards: ``precompile check --shard K/N`` and ``precompile merge``.

The partition rule (docs/ci.md#shards). Every shard discovers the whole workspace, so
each knows every target key. Each target gets a weight: with ``--shard-balance time``
(the default) the seconds its last capture took, as the result cache remembers them, in
whole milliseconds (a target the cache knows nothing of weighs the median of those it
knows, or 1 when it knows none: count balance); with ``count``, 1. Targets are taken
heaviest first, ties by key (code-point order of the string), and each goes to the
shard with the least weight so far, ties to the lowest shard number. With equal
weights that is round-robin over the sorted keys. Nothing in it depends on dict or set
iteration order or on ``PYTHONHASHSEED``, so every run and machine that sees the same
keys and weights makes the same partition.

Weights come from the cache, so shards that restored different caches could partition
differently. Each shard's report therefore records a fingerprint of the whole
assignment (every key with its shard), and ``merge`` refuses reports whose fingerprints
differ, or that do not cover shards 1..N exactly once, instead of silently dropping or
doubling targets.

Which shard reports what: a target's findings are in its shard's report; findings of
no target (a file that does not parse, an unreadable file) are in shard 1's only. So
the shard reports together hold each finding of the unsharded check exactly once.

This module imports neither torch nor the engine: ``merge`` works on report files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Where a shard's own record lives: the JSON document's top-level key, and the key in
#: the SARIF run's property bag.
SHARD_KEY = "shard"
SARIF_PROPERTY = "precompile-shard"
_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


class ShardError(ValueError):
    """A bad --shard value, or shard reports that do not make one whole check."""


@dataclasses.dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """``K/N`` with 1 <= K <= N, or a ShardError saying what to write instead."""
    match = _SHARD.match(text)
    if match is None:
        raise ShardError(
            f"--shard {text!r} is not K/N; write e.g. --shard 2/4 for the second of four "
            f"shards (K from 1 to N)"
        )
    index, count = int(match[1]), int(match[2])
    if count < 1 or not 1 <= index <= count:
        raise ShardError(
            f"--shard {text}: K must be between 1 and N and N at least 1; the shards of "
            f"a {max(count, 1)}-way split are 1/{max(count, 1)} .. {max(count, 1)}/{max(count, 1)}"
        )
    return Shard(index, count)


def weights(keys: Sequence[str], seconds: Mapping[str, float | None]) -> dict[str, int]:
    """Each key's weight in whole milliseconds (at least 1): its remembered capture time,
    else the median of the known ones, else 1."""
    known = sorted(max(1, round(s * 1000)) for k in keys if (s := seconds.get(k)) is not None)
    fallback = known[len(known) // 2] if known else 1
    out = {}
    for key in keys:
        value = seconds.get(key)
        out[key] = fallback if value is None else max(1, round(value * 1000))
    return out


def partition(keys: Sequence[str], count: int, weight: Mapping[str, int]) -> dict[str, int]:
    """Each key -> its shard (1-based): heaviest first, ties by key, each onto the
    lightest shard so far, ties to the lowest number (the rule in the module docstring)."""
    loads = [0] * count
    assignment: dict[str, int] = {}
    for key in sorted(set(keys), key=lambda k: (-weight.get(k, 1), k)):
        shard = min(range(count), key=lambda i: (loads[i], i))
        loads[shard] += weight.get(key, 1)
        assignment[key] = shard + 1
    return assignment


def fingerprint(assignment: Mapping[str, int]) -> str:
    """A digest of the whole assignment: shards that agree on it split the same targets."""
    text = json.dumps(sorted(assignment.items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def record(shard: Shard, assignment: Mapping[str, int], extra: Mapping[str, Any]) -> dict[str, Any]:
    """What a shard's report says of itself (and what ``merge`` needs to write the whole
    report as the unsharded check would have)."""
    return {
        "index": shard.index,
        "count": shard.count,
        "assignment": fingerprint(assignment),
        "targets": sorted(k for k, s in assignment.items() if s == shard.index),
        "workspace_targets": len(assignment),
        **extra,
    }


# ---------------------------------------------------------------- merge


@dataclasses.dataclass
class Loaded:
    path: str
    kind: str  # "json" or "sarif"
    document: dict[str, Any]
    shard: dict[str, Any]


def load(path: str) -> Loaded:
    """One shard report (JSON or SARIF), with its shard record; ShardError otherwise."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ShardError(f"{path}: no such file; pass the reports the shards wrote") from None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ShardError(
            f"{path} is not a JSON or SARIF report ({error}); merge reads the reports of "
            f"precompile check --shard K/N --format json|sarif"
        ) from None
    kind, shard = None, None
    if isinstance(document, dict) and {"version", "findings", "root"} <= document.keys():
        kind, shard = "json", document.get(SHARD_KEY)
    elif isinstance(document, dict) and isinstance(document.get("runs"), list):
        runs = document["runs"]
        if len(runs) == 1 and isinstance(runs[0], dict):
            kind = "sarif"
            shard = (runs[0].get("properties") or {}).get(SARIF_PROPERTY)
    if kind is None:
        raise ShardError(
            f"{path} is neither a precompile JSON report nor a one-run SARIF report; merge "
            f"reads the reports of precompile check --shard K/N --format json|sarif"
        )
    if not isinstance(shard, dict) or not {"index", "count", "assignment"} <= shard.keys():
        raise ShardError(
            f"{path} is a report of an unsharded check (it has no shard record); merge "
            f"reads the reports of precompile check --shard K/N"
        )
    return Loaded(path, kind, document, shard)


def validate(reports: Sequence[Loaded]) -> list[Loaded]:
    """The reports in shard order, if they are the N shards of one partition, each once."""
    if not reports:
        raise ShardError("no reports to merge; name the N shard reports")
    kinds = {r.kind for r in reports}
    if len(kinds) != 1:
        raise ShardError("the reports mix JSON and SARIF; merge the shards' reports of one format")
    counts = {r.shard["count"] for r in reports}
    if len(counts) != 1:
        raise ShardError(
            f"the reports are of different splits (N = {', '.join(map(str, sorted(counts)))}); "
            f"merge the reports of one run of --shard K/N, K = 1..N"
        )
    (count,) = counts
    prints = {r.shard["assignment"] for r in reports}
    if len(prints) != 1:
        raise ShardError(
            "the shards partitioned the targets differently (each saw other target keys or "
            "other capture times in its result cache), so some targets may be checked twice "
            "or not at all; run every shard on the same commit with the same restored "
            "cache-dir, or pass --shard-balance count to all of them"
        )
    seen: dict[int, str] = {}
    for report in reports:
        index = report.shard["index"]
        if index in seen:
            raise ShardError(
                f"{seen[index]} and {report.path} are both shard {index}/{count}; pass each "
                f"shard's report once"
            )
        seen[index] = report.path
    missing = [str(i) for i in range(1, count + 1) if i not in seen]
    if missing:
        raise ShardError(
            f"shard{'s' * (len(missing) > 1)} {', '.join(missing)} of {count} "
            f"{'are' if len(missing) > 1 else 'is'} missing; pass all {count} shard reports"
        )
    return sorted(reports, key=lambda r: int(r.shard["index"]))


def sarif_order(result: dict[str, Any], root: str) -> tuple[Any, ...]:
    """The order ``formats._ordered`` gives findings, read off a SARIF result."""
    location = result["locations"][0]["physicalLocation"]
    uri = location["artifactLocation"]["uri"]
    region = location["region"]
    file = uri if Path(uri).is_absolute() else str(Path(root) / uri)
    target = (result.get("properties") or {}).get("target") or ""
    return (
        file,
        region["startLine"],
        region["startColumn"] - 1,
        result["ruleId"],
        target,
        result["message"]["text"],
    )


def merge_sarif(reports: Sequence[Loaded]) -> str:
    """One SARIF document from the shards': one run, its rules the union of theirs by id
    (first seen first), its results in the unsharded order, each ``ruleIndex`` re-pointed."""
    first = reports[0].document
    run = {k: v for k, v in first["runs"][0].items() if k != "properties"}
    rules: list[dict[str, Any]] = []
    by_id: dict[str, int] = {}
    results = []
    base = run.get("originalUriBaseIds", {}).get("%SRCROOT%", {}).get("uri", "file:///")
    root = _path_of_uri(base)
    for report in reports:
        shard_run = report.document["runs"][0]
        for rule in shard_run["tool"]["driver"].get("rules", []):
            if rule["id"] not in by_id:
                by_id[rule["id"]] = len(rules)
                rules.append(rule)
        results.extend(shard_run.get("results", []))
    results.sort(key=lambda r: sarif_order(r, root))
    for result in results:
        result["ruleIndex"] = by_id[result["ruleId"]]
    run["tool"] = {"driver": {**run["tool"]["driver"], "rules": rules}}
    run["results"] = results
    document = {k: v for k, v in first.items() if k != "runs"} | {"runs": [run]}
    return json.dumps(document, indent=2) + "\n"


def _path_of_uri(uri: str) -> str:
    from urllib.parse import unquote, urlparse

    return str(Path(unquote(urlparse(uri).path)))


def findings_of(document: Mapping[str, Any], docs_url: str | None) -> list[Any]:
    """The findings of a JSON report, as the engine had them (paths made absolute again
    under the report's root), so a merged report is written by the same code as an
    unsharded one."""
    from precompile_lsp.findings import Finding, Related, Span

    root = Path(document["root"])

    def absolute(path: str) -> Path:
        return Path(path) if Path(path).is_absolute() else root / path

    def span(d: Mapping[str, Any]) -> Span:
        return Span(d["line"], d["column"], d["end_line"], d["end_column"])

    found = []
    for f in document["findings"]:
        data = dict(f.get("data") or {})
        if isinstance(data.get("artifact"), str):
            data["artifact"] = str(absolute(data["artifact"]))
        found.append(
            Finding(
                code=f["code"],
                message=f["message"],
                file=absolute(f["file"]),
                span=span(f),
                target=f.get("target"),
                related=tuple(
                    Related(absolute(r["file"]), span(r), r["message"]) for r in f["related"]
                ),
                details=f.get("details"),
                data=data,
                severity=f["severity"],
                docs_url=docs_url,
            )
        )
    return found


def merged_stats(reports: Sequence[Loaded]) -> dict[str, Any]:
    """The shards' stats together: counts summed; ``seconds`` the longest shard's (they
    run side by side, so that is the wall time of the whole)."""
    stats: dict[str, Any] = {}
    for report in reports:
        for name, value in report.document.get("stats", {}).items():
            if name == "seconds":
                stats[name] = max(stats.get(name, 0), value)
            else:
                stats[name] = stats.get(name, 0) + value
    return stats
