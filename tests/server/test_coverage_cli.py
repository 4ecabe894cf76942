"""Issue 27 items 5 and 6: ``precompile coverage`` and ``precompile check`` on serving logs
that a really served artifact wrote (an eager make_fx artifact, loaded in a fresh process
with ``fallback=`` and ``serving_log=``, fed batch sizes it refuses)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from tests.fixtures.production import ARTIFACT, cli, emit, make_workspace, serve

#: Six calls the capture covers (batch 8), four it refuses (3, 3, 3 and 5).
SIZES = [8, 8, 3, 8, 3, 8, 5, 8, 3, 8]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_workspace(tmp_path_factory.mktemp("production") / "shop")
    emit(root)
    stats = serve(root, SIZES)
    assert (stats["served"], stats["fallback"]) == (6, 4)
    return root


def _copy(served: Path, tmp_path: Path) -> Path:
    root = tmp_path / "shop"
    shutil.copytree(served, root)
    return root


def test_text_report_aggregates_per_target(served: Path) -> None:
    proc = cli("coverage", "logs/*.jsonl", cwd=served)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "shop.rank.rank (src/shop/rank.py:15): served 6 of 10 calls (60.0%)" in out
    assert "refused 4 (4 answered by the fallback, 0 raised)" in out
    # Reasons, most frequent first, each with the signature that met it.
    three = out.index("3 × input 0 has shape (3, 4)")
    one = out.index("1 × input 0 has shape (5, 4)")
    assert three < one
    assert "Linear, float32[3,4] cpu contiguous" in out[three:one]
    assert "Linear, float32[5,4] cpu contiguous" in out[one:]


def test_json_and_sarif_reports(served: Path) -> None:
    proc = cli("coverage", "logs/*.jsonl", "--format", "json", cwd=served)
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    [row] = document["artifacts"]
    assert row["status"] == "current" and row["workspace_target"] == "shop.rank.rank"
    assert (row["calls"], row["served"], row["fallback"], row["refused"]) == (10, 6, 4, 0)
    assert [r["count"] for r in row["reasons"]] == [3, 1]
    assert row["reasons"][0]["signatures"] == ["Linear, float32[3,4] cpu contiguous"]
    assert [f["code"] for f in document["findings"]] == ["PC401", "PC401"]
    assert document["findings"][0]["message"].startswith(
        "production refused 3 of 10 calls of `rank`: input 0 has shape (3, 4)"
    )
    # The write policy knows this document for a report by its exact top-level keys (a
    # copy core keeps): written twice to one --output, the second replaces the first.
    for _ in range(2):
        written = cli(
            "coverage", "logs/*.jsonl", "--format", "json", "--output", "cov.json", cwd=served
        )
        assert written.returncode == 0, written.stderr
    assert json.loads((served / "cov.json").read_text()) == document
    proc = cli("coverage", "logs/*.jsonl", "--format", "sarif", cwd=served)
    assert proc.returncode == 0, proc.stderr
    [run] = json.loads(proc.stdout)["runs"]
    results = run["results"]
    assert [r["ruleId"] for r in results] == ["PC401", "PC401"]
    # Findings at one place are ordered by their text (a report's order is a function of
    # its findings alone, so merged shards equal the unsharded report): pick by reason.
    [three] = [r for r in results if "has shape (3, 4)" in r["message"]["text"]]
    assert three["message"]["text"].startswith("production refused 3 of 10 calls of `rank`")
    location = three["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "src/shop/rank.py"
    assert location["region"]["startLine"] == 15  # the decorator of rank
    related = three["relatedLocations"][0]
    assert related["message"]["text"] == "input signature: Linear, float32[3,4] cpu contiguous"
    assert related["physicalLocation"]["artifactLocation"]["uri"].startswith("logs/")


def test_max_refused_is_a_canary_gate(served: Path) -> None:
    above = cli("coverage", "logs/*.jsonl", "--max-refused", "0.3", cwd=served)
    assert above.returncode == 1
    assert "shop.rank.rank: 4 of 10 calls refused (40.00%), above --max-refused 30.00%" in (
        above.stderr
    )
    assert cli("coverage", "logs/*.jsonl", "--max-refused", "40%", cwd=served).returncode == 0
    assert cli("coverage", "logs/*.jsonl", "--max-refused", "0.5", cwd=served).returncode == 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["logs/*.jsonl", "--max-refused", "1.5"], "--max-refused takes a share"),
        (["logs/*.jsonl", "--max-refused", "many"], "--max-refused takes a share"),
        (["nowhere.jsonl"], "no such file: nowhere.jsonl"),
        (["old/*.jsonl"], "old/*.jsonl matches no file"),
        ([], "the following arguments are required"),
    ],
)
def test_usage_errors_exit_2(served: Path, args: list[str], said: str) -> None:
    proc = cli("coverage", *args, cwd=served)
    assert proc.returncode == 2
    assert said in proc.stderr


def test_malformed_lines_and_unknown_versions_are_skipped_with_one_warning(
    served: Path, tmp_path: Path
) -> None:
    root = _copy(served, tmp_path)
    [log] = sorted((root / "logs").glob("*.jsonl"))
    record = json.loads(log.read_text().splitlines()[0])
    future = dict(record, version=99)
    log.write_text(
        "not json\n"
        + json.dumps(record) + "\n"
        + '{"format": "precompile-serving-log", "version": 1, "served": "many"}\n'
        + json.dumps(future) + "\n" + json.dumps(future) + "\n"
        + "[1, 2]\n"
    )  # fmt: skip
    proc = cli("coverage", str(log), "--format", "json", cwd=root)
    assert proc.returncode == 0, proc.stderr
    shown = f"logs/{log.name}"
    assert f"{shown}:1: skipped 3 malformed lines" in proc.stderr
    assert f"{shown}:4: skipped 2 records of serving-log version 99" in proc.stderr
    assert proc.stderr.count("warning:") == 2
    [row] = json.loads(proc.stdout)["artifacts"]
    assert row["calls"] == 10  # the one good record, counted once


def test_a_log_of_an_artifact_re_emitted_since_says_so(served: Path, tmp_path: Path) -> None:
    root = _copy(served, tmp_path)
    source = root / "src" / "shop" / "rank.py"
    source.write_text(source.read_text().replace(".relu()", ".sigmoid()"))
    (root / ARTIFACT).unlink()
    (root / ARTIFACT.replace(".py", ".cache")).unlink()
    emit(root)
    proc = cli("coverage", "logs/*.jsonl", "--format", "json", cwd=root)
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    [row] = document["artifacts"]
    assert row["status"] == "re-emitted" and row["workspace_target"] == "shop.rank.rank"
    [finding] = document["findings"]
    assert finding["code"] == "PC403"
    assert "re-emitted since" in finding["message"] and "PC401" not in proc.stdout
    text = cli("coverage", "logs/*.jsonl", cwd=root).stdout
    assert "was re-emitted since: these calls say nothing of the current artifact" in text
    # The check says so too, and shows no refusal of the current artifact.
    check = cli("check", "--format", "json", cwd=root)
    codes = [f["code"] for f in json.loads(check.stdout)["findings"]]
    assert "PC403" in codes and "PC401" not in codes


def test_a_log_of_no_target_of_the_workspace_is_reported(served: Path, tmp_path: Path) -> None:
    root = _copy(served, tmp_path)
    source = root / "src" / "shop" / "rank.py"
    source.write_text(source.read_text().replace("def rank(", "def order("))
    proc = cli("coverage", "logs/*.jsonl", cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert "is no current artifact of any target" in proc.stdout


def test_check_shows_the_production_finding_at_the_target(served: Path, tmp_path: Path) -> None:
    root = _copy(served, tmp_path)
    proc = cli("check", "--format", "json", cwd=root)
    assert proc.returncode == 0, proc.stderr  # PC401 is a warning
    found = [f for f in json.loads(proc.stdout)["findings"] if f["code"] == "PC401"]
    assert [f["line"] for f in found] == [15, 15]
    [three] = [f for f in found if "has shape (3, 4)" in f["message"]]
    assert three["file"] == "src/shop/rank.py"
    assert "production refused 3 of 10 calls of `rank`" in three["message"]
    assert three["related"][0]["message"] == (
        "input signature: Linear, float32[3,4] cpu contiguous"
    )
    # Without the configured logs there is no such finding.
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('serving-logs = ["logs/*.jsonl"]\n', ""))
    again = cli("check", "--format", "json", cwd=root)
    assert "PC401" not in again.stdout


def test_serving_logs_may_not_lead_out_of_the_workspace(tmp_path: Path) -> None:
    from precompile_lsp.config import ConfigError, load_config
    from precompile_lsp.settings import parse_settings

    root = make_workspace(tmp_path / "shop")
    with pytest.raises(ConfigError, match="leads out of the workspace"):
        load_config(root, {"serving-logs": ["../other/*.jsonl"]})
    absolute = load_config(root, {"serving-logs": [str(tmp_path / "elsewhere" / "*.jsonl")]})
    assert absolute.is_serving_log(tmp_path / "elsewhere" / "a.jsonl")
    config = load_config(root)
    assert config.is_serving_log(root / "logs" / "precompile-serving-1.jsonl")
    assert not config.is_serving_log(root / "src" / "shop" / "rank.py")
    settings, errors = parse_settings({"servingLogs": ["prod/*.jsonl"]})
    assert not errors and settings.engine_overrides()["serving-logs"] == ["prod/*.jsonl"]
    _, errors = parse_settings({"servingLogs": ["prod/*.jsonl", " "]})
    assert "precompile.servingLogs must be globs of log files, not empty strings" in errors[0]


def test_an_untrusted_workspace_reads_no_logs_outside_itself(served: Path, tmp_path: Path) -> None:
    """A repository's own pyproject.toml may not point an untrusted server at files
    elsewhere on the machine: its absolute serving-log globs wait for trust (and the
    gate says so); its logs inside the workspace are read."""
    from precompile_lsp.engine import Engine

    root = _copy(served, tmp_path)
    outside = tmp_path / "elsewhere"
    shutil.move(root / "logs", outside)
    pyproject = root / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace(
            'serving-logs = ["logs/*.jsonl"]', f'serving-logs = ["{outside}/*.jsonl"]'
        )
    )

    async def production(trusted: bool) -> tuple[list[str], list[str]]:
        engine = Engine(root, trusted=trusted)
        try:
            engine.discover()
            await engine.refresh_serving_logs()
            codes = [f.code for fs in engine.findings_by_file().values() for f in fs]
            return codes, list(engine.gate.deferred)
        finally:
            await engine.close()

    codes, deferred = asyncio.run(production(trusted=False))
    assert "PC401" not in codes
    assert any(str(outside) in what for what in deferred), deferred
    codes, _ = asyncio.run(production(trusted=True))
    assert codes.count("PC401") == 2
