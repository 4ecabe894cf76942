"""What ``precompile check`` does at the edges a new user reaches first: a path outside
the workspace, a workspace with no target, a source too big to parse, one that is not
text, and the help of every option. None of these runs a capture."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from precompile_lsp.cli import build_parser
from precompile_lsp.files import MAX_SOURCE_BYTES
from tests.harness import precompile_cli

PYPROJECT = '[project]\nname = "edge"\nversion = "0"\n\n[tool.precompile]\nsource-roots = ["src"]\n'

TARGET = """import precompile


def calls():
    return []


@precompile.target(calls)
def forward(x):
    return x
"""


def _workspace(tmp_path: Path, pyproject: str = PYPROJECT) -> Path:
    root = tmp_path / "edge"
    (root / "src" / "edge").mkdir(parents=True)
    (root / "pyproject.toml").write_text(pyproject)
    (root / "src" / "edge" / "__init__.py").write_text("")
    (root / "src" / "edge" / "plain.py").write_text("x = 1\n")
    return root


def test_a_path_outside_the_workspace_is_a_usage_error(tmp_path: Path) -> None:
    root = _workspace(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "mod.py").write_text(TARGET)
    proc = precompile_cli("check", str(root / "src"), str(outside), cwd=root)
    assert proc.returncode == 2, proc.stderr
    assert str(outside) in proc.stderr and str(root) in proc.stderr
    assert "outside the workspace" in proc.stderr and "cd into" in proc.stderr
    # A path with no pyproject above it: the workspace is the current directory.
    proc = precompile_cli("check", "/etc", cwd=root)
    assert proc.returncode == 2 and "/etc is outside the workspace" in proc.stderr, proc.stderr


def test_no_target_warns_and_exits_0_by_default(tmp_path: Path) -> None:
    root = _workspace(tmp_path)
    proc = precompile_cli("check", cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"warning: no @precompile.target found", proc.stderr), proc.stderr
    assert "--fail-on-empty" in proc.stderr


def test_no_target_fails_with_the_flag_or_the_setting(tmp_path: Path) -> None:
    root = _workspace(tmp_path)
    proc = precompile_cli("check", "--fail-on-empty", cwd=root)
    assert proc.returncode == 1, proc.stderr
    assert "error: no @precompile.target found" in proc.stderr
    (root / "pyproject.toml").write_text(PYPROJECT + "fail-on-empty = true\n")
    proc = precompile_cli("check", "--format", "json", cwd=root)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["stats"]["targets"] == 0
    (root / "pyproject.toml").write_text(PYPROJECT + 'fail-on-empty = "yes"\n')
    proc = precompile_cli("check", cwd=root)
    assert proc.returncode == 2 and "fail-on-empty must be true or false" in proc.stderr


def _findings(proc: object) -> list[dict[str, object]]:
    stdout = proc.stdout  # type: ignore[attr-defined]
    return list(json.loads(stdout)["findings"])


def test_a_huge_file_mentioning_precompile_is_a_finding(tmp_path: Path) -> None:
    root = _workspace(tmp_path)
    huge = root / "src" / "edge" / "huge.py"
    padding = "DATA = [" + "0, " * ((MAX_SOURCE_BYTES // 3) + 10) + "]\n"
    huge.write_text(TARGET + padding)
    size = huge.stat().st_size
    # A big file that cannot hold a target is only logged.
    (root / "src" / "edge" / "tables.py").write_text(padding)
    proc = precompile_cli("check", "--format", "json", cwd=root)
    assert proc.returncode == 1, proc.stderr
    [finding] = _findings(proc)
    assert finding["code"] == "PC005" and finding["severity"] == "error"
    assert finding["file"] == "src/edge/huge.py" and finding["line"] == 1
    message = str(finding["message"])
    assert str(size) in message and "4.0 MiB" in message
    assert "Move the targets into a smaller module" in message


def test_an_undecodable_source_is_a_finding(tmp_path: Path) -> None:
    root = _workspace(tmp_path)
    bad = root / "src" / "edge" / "bad.py"
    bad.write_bytes(b"import precompile\n# caf\xe9\n" + TARGET.encode())
    # With a coding cookie the same byte is text: no finding.
    (root / "src" / "edge" / "latin.py").write_bytes(
        b"# -*- coding: latin-1 -*-\nNAME = 'caf\xe9'\n"
    )
    proc = precompile_cli("check", "--format", "json", cwd=root)
    assert proc.returncode == 1, proc.stderr
    [finding] = _findings(proc)
    assert (finding["code"], finding["file"], finding["line"], finding["column"]) == (
        "PC002",
        "src/edge/bad.py",
        2,
        5,
    )
    message = str(finding["message"])
    assert "not valid utf-8" in message and "0xe9" in message and "offset 23" in message
    assert "coding:" in message


def _options(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    """Every argument of every subcommand, as (command, action)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [
                    (name, a) for a in sub._actions if not isinstance(a, argparse._HelpAction)
                ]
    return found


OPTIONS = _options(build_parser())


@pytest.mark.parametrize(
    "command, action",
    OPTIONS,
    ids=[f"{c} {'/'.join(a.option_strings) or a.dest}" for c, a in OPTIONS],
)
def test_every_option_has_help(command: str, action: argparse.Action) -> None:
    assert action.help and action.help.strip(), (command, action.option_strings or action.dest)


def test_check_help_describes_each_option() -> None:
    proc = precompile_cli("check", "--help", cwd=Path.cwd())
    assert proc.returncode == 0, proc.stderr
    options = proc.stdout.split("options:", 1)[1]
    # Each option's entry: from its line to the next option's, less its name and metavar.
    entries = re.split(r"\n  (?=-)", options)
    described = {}
    for entry in entries:
        names = re.findall(r"--[a-z-]+", entry.split("  ", 1)[0] if "  " in entry else entry)
        text = re.sub(r"^\s*(-{1,2}[a-z-]+(\s+(\{[^}]*\}|[A-Z_]+))?,?\s*)+", "", entry.strip())
        for name in names:
            described[name] = text.strip()
    for option in ("--format", "--fail-on", "--fail-on-empty", "--output", "--emit", "--jobs"):
        assert described.get(option), (option, proc.stdout)
