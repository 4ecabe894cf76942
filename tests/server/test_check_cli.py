"""``precompile check`` on the shop workspace: every finding kind with its code,
severity, location and related locations; the JSON, SARIF and GitHub formats; exit codes;
the result cache; rescheduling only the targets that depend on an edited file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from precompile_lsp.findings import Finding, Span
from precompile_lsp.formats import github
from tests.doc_links import documented_heading
from tests.harness import precompile_cli
from tests.server.conftest import check_json


@pytest.fixture(scope="module")
def checked(shop: Path) -> dict[str, Any]:
    code, document = check_json(shop)
    return {"code": code, "doc": document}


def _by_code(document: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for f in document["findings"]:
        found.setdefault(f["code"], []).append(f)
    return found


def _at(finding: dict[str, Any]) -> tuple[str, int, int, str]:
    return finding["file"], finding["line"], finding["column"], finding["severity"]


def test_every_finding_kind_exactly(checked: dict[str, Any]) -> None:
    found = _by_code(checked["doc"])
    assert sorted(found) == ["PC002", "PC003", "PC101", "PC201", "PC301"]
    assert [_at(f) for f in found["PC002"]] == [("src/shop/broken.py", 4, 14, "error")]
    assert [_at(f) for f in found["PC003"]] == [("src/shop/methods.py", 6, 4, "warning")]
    (gb,) = found["PC101"]
    # Reported where it happens (the helper module), not at the target.
    assert _at(gb) == ("src/shop/helpers.py", 5, 4, "warning")
    assert gb["data"]["gb_id"] == "GB0059" and gb["target"] == "shop.pipeline.with_helper_break"
    assert [(r["file"], r["line"], r["message"]) for r in gb["related"]] == [
        ("src/shop/pipeline.py", 6, "target with_helper_break"),  # at its decorator
        ("src/shop/pipeline.py", 8, "in with_helper_break"),
    ]
    (gap,) = found["PC201"]
    assert _at(gap) == ("src/shop/serving.py", 18, 0, "error")  # at the target's decorator
    assert "tensor(7, 8)" in gap["message"]
    assert "`x` has size 7 at dim 0; the capture saw 4" in gap["message"]
    (stale,) = found["PC301"]
    assert _at(stale) == ("src/shop/serving.py", 23, 0, "warning")
    assert stale["message"].startswith(
        "the artifact artifacts/shop.serving.stale.py is stale: `stale` (src/shop/serving.py) "
        "changed since it was emitted"
    )
    assert stale["data"]["fix"] == "emit"
    for f in checked["doc"]["findings"]:  # each opens its code's section of the shipped docs
        assert documented_heading(f["doc"]) == "## " + f["code"].lower()


def test_json_document_schema(checked: dict[str, Any]) -> None:
    doc = checked["doc"]
    assert doc["version"] == 1 and set(doc) == {"version", "root", "findings", "targets", "stats"}
    keys = {
        "code",
        "name",
        "severity",
        "message",
        "file",
        "line",
        "column",
        "end_line",
        "end_column",
        "target",
        "related",
        "details",
        "doc",
        "data",
    }
    assert all(set(f) == keys for f in doc["findings"])
    targets = {t["target"]: t for t in doc["targets"]}
    assert set(targets) == {
        "shop.serving.clean",
        "shop.pipeline.with_helper_break",
        "shop.serving.with_gap",
        "shop.serving.stale",
    }
    assert any(
        d.endswith("shop/helpers.py")
        for d in targets["shop.pipeline.with_helper_break"]["dependencies"]
    )
    assert not any(
        d.endswith("shop/helpers.py") for d in targets["shop.serving.clean"]["dependencies"]
    )
    assert targets["shop.serving.clean"]["summary"].endswith("complete")


def test_exit_codes(shop: Path, checked: dict[str, Any], tmp_path: Path) -> None:
    assert checked["code"] == 1  # errors present
    assert precompile_cli("check", "--fail-on", "never", cwd=shop).returncode == 0
    broken = tmp_path / "broken"
    shutil.copytree(shop, broken)
    (broken / "pyproject.toml").write_text('[tool.precompile]\nbackend = "tvm"\n')
    proc = precompile_cli("check", cwd=broken)
    assert proc.returncode == 2 and "backend must be one of inductor, eager" in proc.stderr
    proc = precompile_cli("check", "no/such/dir", cwd=shop)
    assert proc.returncode == 2 and "no such file" in proc.stderr
    assert precompile_cli("check", "--format", "yaml", cwd=shop).returncode == 2


def test_an_unchanged_check_captures_nothing(shop: Path, checked: dict[str, Any]) -> None:
    _, again = check_json(shop)
    assert again["stats"]["captures"] == 0 and again["stats"]["cache_hits"] == 4
    assert again["findings"] == checked["doc"]["findings"]
    assert (shop / ".precompile" / ".gitignore").read_text().strip().endswith("*")


def test_editing_a_helper_reschedules_only_its_dependents(
    shop: Path, checked: dict[str, Any], tmp_path: Path
) -> None:
    workspace = tmp_path / "shop"
    shutil.copytree(shop, workspace)  # with its cache: paths in it are workspace-relative
    _, copied = check_json(workspace)
    assert copied["stats"]["captures"] == 0, "a copied workspace did not reuse its cache"
    assert copied["findings"] == checked["doc"]["findings"]  # relative paths, same findings
    assert not any(str(shop) in json.dumps(f) for f in copied["findings"])
    helpers = workspace / "src" / "shop" / "helpers.py"
    helpers.write_text(helpers.read_text() + "\n# edited\n")
    _, after = check_json(workspace)
    assert after["stats"]["captures"] == 1 and after["stats"]["cache_hits"] == 3


def test_staleness_is_per_function(shop: Path, tmp_path: Path) -> None:
    """An edit elsewhere in the target's file -- another function, a comment, lines added
    above -- does not make its artifact stale; an edit of the target itself does."""
    workspace = tmp_path / "shop"
    shutil.copytree(shop, workspace)
    serving = workspace / "src" / "shop" / "serving.py"
    serving.write_text(
        serving.read_text().replace("    return model(x) * 2.0\n", "    return model(x) * 2\n")
    )
    _, fresh = check_json(workspace)
    assert "PC301" not in {f["code"] for f in fresh["findings"]}
    source = serving.read_text()
    edited = "# a comment above everything\n\n" + source.replace(
        "def with_gap(model, x):\n    return model(x).tanh()",
        "def with_gap(model, x):\n    return model(x).tanh() * 1",
    )
    serving.write_text(edited + "\n\ndef unrelated():\n    return 1\n")
    _, elsewhere = check_json(workspace)
    assert "PC301" not in {f["code"] for f in elsewhere["findings"]}
    serving.write_text(
        serving.read_text().replace("return model(x) * 2\n", "return model(x) * 4\n")
    )
    _, edited_target = check_json(workspace)
    [stale] = [f for f in edited_target["findings"] if f["code"] == "PC301"]
    assert "`stale` (src/shop/serving.py) changed" in stale["message"]


def test_sarif_is_valid_2_1_0(shop: Path, checked: dict[str, Any]) -> None:
    from sarif_pydantic import Sarif

    proc = precompile_cli("check", "--format", "sarif", cwd=shop)
    document = json.loads(proc.stdout)
    Sarif.model_validate(document)  # the SARIF 2.1.0 object model
    run = document["runs"][0]
    assert document["version"] == "2.1.0" and run["columnKind"] == "unicodeCodePoints"
    rules = {r["id"] for r in run["tool"]["driver"]["rules"]}
    assert {r["ruleId"] for r in run["results"]} <= rules and "PC101" in rules
    for result in run["results"]:
        assert run["tool"]["driver"]["rules"][result["ruleIndex"]]["id"] == result["ruleId"]
        region = result["locations"][0]["physicalLocation"]["region"]
        assert (
            region["startLine"] >= 1
            and region["startColumn"] >= 1
            and region["endColumn"] > region["startColumn"]
        )
    gb = next(r for r in run["results"] if r["ruleId"] == "PC101")
    assert gb["locations"][0]["physicalLocation"]["region"]["startColumn"] == 5  # 0-based 4
    assert (
        gb["relatedLocations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        == "src/shop/pipeline.py"
    )


def test_github_annotations_are_escaped() -> None:
    finding = Finding(
        code="PC101",
        message="100% broken\nline two",
        file=Path("/ws/a,b:c.py"),
        span=Span(3, 4, 3, 9),
        severity="warning",
    )
    line = github({Path("/ws/a,b:c.py"): [finding]}, Path("/ws"))
    assert (
        line
        == "::warning file=a%2Cb%3Ac.py,line=3,col=5,endLine=3,title=PC101 graph-break::100%25 broken%0Aline two\n"
    )


def test_text_output(shop: Path, checked: dict[str, Any]) -> None:
    proc = precompile_cli("check", cwd=shop)
    lines = proc.stdout.splitlines()
    assert "src/shop/helpers.py:5:5: warning PC101 graph break [GB0059]" in proc.stdout
    assert lines[-1].startswith("4 targets checked") and "2 errors, 3 warnings" in lines[-1]


def test_emit_shows_its_stages_on_a_terminal_only(shop: Path, tmp_path: Path) -> None:
    """On a terminal, emit keeps one progress line (importing, capturing k of N calls,
    writing); piped, or with --quiet, it prints nothing but its result."""
    import os
    import pty
    import subprocess
    import sys

    from tests.harness import fresh_env

    workspace = tmp_path / "shop"
    shutil.copytree(shop, workspace)

    def emit(*extra: str, tty: bool) -> tuple[int, str]:
        master, slave = pty.openpty() if tty else (None, None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "precompile_lsp.cli", "emit", "shop.serving.clean", *extra],
            cwd=workspace,
            env=fresh_env(),
            stdout=subprocess.PIPE,
            stderr=slave if tty else subprocess.PIPE,
        )
        err = b""
        if tty:
            assert master is not None and slave is not None
            os.close(slave)
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                err += chunk
            os.close(master)
        out, piped = proc.communicate(timeout=600)
        return proc.wait(), (err or piped or b"").decode(errors="replace") + "\n" + out.decode()

    code, text = emit(tty=True)
    assert code == 0, text
    for stage in ("importing", "capturing 1 of 1 calls", "writing"):
        assert f"emit shop.serving.clean: {stage}" in text, text
    code, text = emit(tty=False)
    assert code == 0 and "capturing" not in text, text
    code, text = emit("--quiet", tty=True)
    assert code == 0 and "capturing" not in text, text


def test_the_engine_and_the_server_never_import_torch(shop: Path, checked: dict[str, Any]) -> None:
    """With the result cache warm, a check runs no worker at all: in a fresh interpreter
    that imports the language server and runs `check`, torch is never imported (nor the
    worker package, nor precompile's capture side)."""
    from tests.harness import run_json

    outcome = run_json(
        "import sys, json\n"
        "import precompile_lsp.server\n"
        "from precompile_lsp.cli import main\n"
        "code = main(['check', '--format', 'json', '--output', 'report.json'])\n"
        "heavy = sorted(m for m in sys.modules if m in ('torch', 'precompile_lsp.worker', "
        "'precompile.capture_api', 'precompile.capturing', 'precompile._compat') "
        "or m.startswith(('torch.', 'precompile_lsp.worker.', 'precompile.capturing.')))\n"
        "print(json.dumps({'code': code, 'heavy': heavy}))\n",
        cwd=shop,
        cold=True,
    )
    assert outcome == {"code": 1, "heavy": []}
    report = json.loads((shop / "report.json").read_text())
    assert report["stats"]["captures"] == 0 and report["stats"]["cache_hits"] == 4


def test_verify_checks_the_file_it_was_given_with_the_keys_it_was_given(
    shop: Path, tmp_path: Path
) -> None:
    """`verify` loads the target's own artifact: a copy elsewhere is named as such (it
    would check one file and load another), and with --trusted-key the load itself
    refuses a pair the keys did not sign, not only the CLI's check before it."""
    import asyncio

    import precompile
    from precompile_lsp.engine import Engine

    artifact = shop / "artifacts" / "shop.serving.stale.py"
    copy = tmp_path / "copy.py"
    shutil.copyfile(artifact, copy)
    proc = precompile_cli("verify", str(copy), cwd=shop)
    assert proc.returncode == 2, proc.stderr
    assert "is a copy of shop.serving.stale's artifact" in proc.stderr
    assert "artifacts/shop.serving.stale.py" in proc.stderr

    _, public, _ = precompile.generate_key(tmp_path / "key")

    async def verify_with_keys() -> list[str]:
        engine = Engine(shop, trusted=True, use_cache=False, trusted_keys=[public])
        try:
            (decl,) = [d for d in await engine.discover_async() if d.key.endswith(".stale")]
            return (await engine.verify(decl)).verify_failures
        finally:
            await engine.close()

    (failure,) = asyncio.run(verify_with_keys())
    assert failure.startswith("it does not load:") and "is not signed" in failure
