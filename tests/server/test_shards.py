"""``precompile check --shard K/N`` and ``precompile merge``: the merged report of N shards
is the unsharded report, finding for finding, with the same exit code.

Fields excluded from equality: ``stats.seconds`` (wall time), ``stats.captures`` and
``stats.cache_hits`` (they say what the result cache held at each run, not what was
found). Everything else -- every finding, its order, the target rows, the target
count, the SARIF document -- is compared whole."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from precompile_lsp.shards import ShardError, fingerprint, parse_shard, partition, weights
from tests.harness import precompile_cli, run_python
from tests.server.conftest import FIXTURES

EXTRA = """\
import precompile
from shop.layers import make_calls


@precompile.target(make_calls)
def raises(model, x):
    raise ValueError("boom in the forward")


@precompile.target(make_calls, artifact="artifacts/shared.py")
def conflict_a(model, x):
    return model(x) + 1


@precompile.target(make_calls, artifact="artifacts/shared.py")
def conflict_b(model, x):
    return model(x) - 1
"""
SHARDS = 3
#: Timing and cache-state fields: see the module docstring.
VOLATILE_STATS = ("seconds", "captures", "cache_hits")


def shop_workspace(where: Path) -> Path:
    """The shop fixture (a file that does not parse, a method target, a graph break, a
    coverage gap, a missing declared artifact) plus a target whose capture fails and two
    targets that write one artifact path."""
    workspace = where / "shop"
    shutil.copytree(FIXTURES / "workspace", workspace)
    (workspace / "src" / "shop" / "extra.py").write_text(EXTRA)
    return workspace


def run(workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = precompile_cli(*args, cwd=workspace)
    assert proc.returncode in (0, 1), proc.stderr
    return proc


def shard_reports(workspace: Path, fmt: str, *extra: str) -> tuple[list[str], list[int]]:
    paths, codes = [], []
    for k in range(1, SHARDS + 1):
        out = workspace.parent / f"shard{k}.{fmt}"
        out.unlink(missing_ok=True)
        proc = run(
            workspace,
            "check",
            "--format",
            fmt,
            "--shard",
            f"{k}/{SHARDS}",
            "--output",
            str(out),
            *extra,
        )
        paths.append(str(out))
        codes.append(proc.returncode)
    return paths, codes


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """JSON shards run cold (each captures its own targets; count balance, so where each
    target lands is known), then the unsharded check; then SARIF, unsharded and sharded,
    balanced by the capture times the cache now remembers."""
    workspace = shop_workspace(tmp_path_factory.mktemp("shards"))
    json_shards, json_codes = shard_reports(workspace, "json", "--shard-balance", "count")
    full_json = run(workspace, "check", "--format", "json")
    full_sarif = run(workspace, "check", "--format", "sarif")
    sarif_shards, sarif_codes = shard_reports(workspace, "sarif")
    return {
        "workspace": workspace,
        "json_shards": json_shards,
        "json_codes": json_codes,
        "full_json": full_json,
        "full_sarif": full_sarif,
        "sarif_shards": sarif_shards,
        "sarif_codes": sarif_codes,
    }


def _stable(document: dict[str, Any]) -> dict[str, Any]:
    stats = {k: v for k, v in document["stats"].items() if k not in VOLATILE_STATS}
    return document | {"stats": stats}


def test_merged_json_shards_equal_the_unsharded_report(sharded: dict[str, Any]) -> None:
    workspace = sharded["workspace"]
    records = [json.loads(Path(p).read_text())["shard"] for p in sharded["json_shards"]]
    where = {key: r["index"] for r in records for key in r["targets"]}
    # The conflict pair is split across shards, and still reported as a conflict.
    assert where["shop.extra.conflict_a"] != where["shop.extra.conflict_b"]
    assert sorted(where) == sorted(
        records[0]["targets"] + records[1]["targets"] + records[2]["targets"]
    )
    assert len(where) == records[0]["workspace_targets"] == 7
    merged = precompile_cli("merge", *sharded["json_shards"], cwd=workspace)
    full = sharded["full_json"]
    assert merged.returncode == full.returncode == 1, merged.stderr
    unsharded, together = json.loads(full.stdout), json.loads(merged.stdout)
    codes = [f["code"] for f in unsharded["findings"]]
    assert codes.count("PC304") == 2 and "PC001" in codes and "PC002" in codes, codes
    assert _stable(together) == _stable(unsharded)
    assert together["findings"] == unsharded["findings"]  # same findings, same order
    # The cold shards captured every target once between them.
    assert together["stats"]["captures"] == 7
    # Every output format of the merge is the unsharded check's (bar the timing line).
    for fmt in ("text", "github", "sarif"):
        one = run(workspace, "check", "--format", fmt)
        many = precompile_cli("merge", *sharded["json_shards"], "--format", fmt, cwd=workspace)
        assert many.returncode == one.returncode == 1, many.stderr
        if fmt == "text":
            assert many.stdout.splitlines()[:-1] == one.stdout.splitlines()[:-1]
            assert many.stdout.splitlines()[-1].startswith("7 targets checked in ")
        elif fmt == "sarif":
            assert json.loads(many.stdout) == json.loads(one.stdout)
        else:
            assert many.stdout == one.stdout
    # The exit code follows --fail-on as check's does.
    never = precompile_cli("merge", *sharded["json_shards"], "--fail-on", "never", cwd=workspace)
    assert never.returncode == 0, never.stderr


def test_merged_sarif_shards_equal_the_unsharded_report(sharded: dict[str, Any]) -> None:
    workspace = sharded["workspace"]
    out = workspace.parent / "merged.sarif"
    merged = precompile_cli("merge", *sharded["sarif_shards"], "--output", str(out), cwd=workspace)
    full = sharded["full_sarif"]
    assert merged.returncode == full.returncode == 1, merged.stderr
    unsharded, together = json.loads(full.stdout), json.loads(out.read_text())
    (run_,) = together["runs"]
    assert len({r["id"] for r in run_["tool"]["driver"]["rules"]}) == len(
        run_["tool"]["driver"]["rules"]
    )
    assert together == unsharded
    assert len(run_["results"]) == 8
    from sarif_pydantic import Sarif

    Sarif.model_validate(together)  # the SARIF 2.1.0 object model
    for shard in sharded["sarif_shards"]:  # each shard's report is valid SARIF too
        Sarif.model_validate(json.loads(Path(shard).read_text()))
    for result in run_["results"]:
        assert run_["tool"]["driver"]["rules"][result["ruleIndex"]]["id"] == result["ruleId"]
    # The merged file is a report of ours: merging again may replace it, nothing else.
    again = precompile_cli("merge", *sharded["sarif_shards"], "--output", str(out), cwd=workspace)
    assert again.returncode == 1, again.stderr
    foreign = workspace / "README.md"
    foreign.write_text("not a report\n")
    refused = precompile_cli(
        "merge", *sharded["sarif_shards"], "--output", str(foreign), cwd=workspace
    )
    assert refused.returncode == 2 and "--output" in refused.stderr
    assert foreign.read_text() == "not a report\n"


def test_merge_refuses_reports_that_are_not_one_whole_check(sharded: dict[str, Any]) -> None:
    workspace = sharded["workspace"]
    one, two, three = sharded["json_shards"]

    def refused(*args: str) -> str:
        proc = precompile_cli("merge", *args, cwd=workspace)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        return proc.stderr

    assert "shard 3 of 3 is missing" in refused(one, two)
    assert "are both shard 1/3" in refused(one, one, two, three)
    assert "mix JSON and SARIF" in refused(one, two, sharded["sarif_shards"][2])
    unsharded = workspace.parent / "full.json"
    unsharded.write_text(sharded["full_json"].stdout)
    assert "unsharded check" in refused(str(unsharded))
    # Shards that split the targets differently (here: one edited to say so) are refused,
    # rather than merged into a report that checks some target twice or not at all.
    other = json.loads(Path(three).read_text())
    other["shard"]["assignment"] = "0" * 16
    odd = workspace.parent / "odd.json"
    odd.write_text(json.dumps(other))
    assert "partitioned the targets differently" in refused(one, two, str(odd))
    assert "SARIF only" in refused(*sharded["sarif_shards"], "--format", "text")


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("0/3", "K must be between 1 and N"),
        ("4/3", "1/3 .. 3/3"),
        ("2", "is not K/N"),
        ("1/0", "K must"),
    ],
)
def test_a_bad_shard_is_exit_2_with_the_fix(tmp_path: Path, value: str, said: str) -> None:
    proc = precompile_cli("check", "--shard", value, cwd=tmp_path)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    with pytest.raises(ShardError):
        parse_shard(value)


def test_the_partition_rule() -> None:
    keys = [f"pkg.mod{i % 5}.t{i}" for i in range(23)]
    equal = partition(keys, 4, weights(keys, {}))
    # Count balance: round-robin over the sorted keys.
    assert [equal[k] for k in sorted(keys)] == [i % 4 + 1 for i in range(23)]
    # Not the order the keys come in.
    assert partition(list(reversed(keys)), 4, weights(keys, {})) == equal
    # Balanced by remembered times: one slow target gets a shard of its own.
    seconds: dict[str, float | None] = {k: 0.1 for k in keys}
    seconds["pkg.mod0.t0"] = 60.0
    timed = partition(keys, 4, weights(keys, seconds))
    alone = timed["pkg.mod0.t0"]
    assert [k for k, s in timed.items() if s == alone] == ["pkg.mod0.t0"]
    # A target the cache does not know weighs the median of those it knows.
    assert weights(["a", "b", "c"], {"a": 1.0, "b": 3.0}) == {"a": 1000, "b": 3000, "c": 3000}
    assert sorted(set(equal.values())) == [1, 2, 3, 4]
    assert fingerprint(equal) != fingerprint(timed)


def test_the_partition_does_not_depend_on_the_hash_seed() -> None:
    code = (
        "from precompile_lsp.shards import partition, weights, fingerprint\n"
        "keys = {f'm{i}.t{i * 7 % 13}' for i in range(40)}\n"
        "secs = {k: (len(k) % 3) * 0.5 for k in keys}\n"
        "print(fingerprint(partition(list(keys), 4, weights(list(keys), secs))))\n"
    )

    def printed(seed: str) -> str:
        proc = run_python(code, PYTHONHASHSEED=seed)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    prints = {printed(seed) for seed in ("0", "1", "12345")}
    assert len(prints) == 1, prints
