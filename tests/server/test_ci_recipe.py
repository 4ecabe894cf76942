"""examples/ci's GitHub Actions workflow cannot run here; what can be checked is: it is
valid YAML of a workflow's shape, its matrix and the --shard it passes agree, and every
``precompile`` command and option it runs exists in the CLI's --help."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from tests.harness import REPO, precompile_cli

WORKFLOW = REPO / "examples" / "ci" / "precompile.yml"


def _steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job["steps"]]


def test_the_workflow_runs_only_commands_the_cli_has(tmp_path: Path) -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert set(workflow["jobs"]) == {"check", "merge"}
    assert workflow["jobs"]["merge"]["needs"] == "check"
    shards = workflow["jobs"]["check"]["strategy"]["matrix"]["shard"]
    assert shards == [1, 2, 3, 4]
    uses = {step["uses"].split("@")[0] for step in _steps(workflow) if "uses" in step}
    assert {
        "actions/cache/restore",
        "actions/cache/save",
        "github/codeql-action/upload-sarif",
        "actions/upload-artifact",
        "actions/download-artifact",
    } <= uses
    # The matrix value, as the runner substitutes it (no other expression is in a command).
    commands = [
        shlex.split(line.replace("${{ matrix.shard }}", "K"))
        for step in _steps(workflow)
        if "run" in step
        for line in step["run"].splitlines()
        if line.strip().startswith("precompile ")
    ]
    assert {c[1] for c in commands} == {"check", "merge"}
    assert not any("${{" in word for c in commands for word in c), commands
    helps = {}
    for command in commands:
        sub = command[1]
        if sub not in helps:
            proc = precompile_cli(sub, "--help", cwd=tmp_path)
            assert proc.returncode == 0, proc.stderr
            helps[sub] = proc.stdout
        for option in (word for word in command[2:] if word.startswith("--")):
            assert re.search(rf"(^|\s){re.escape(option)}\b", helps[sub]), (sub, option)
        if sub == "check":
            shard = command[command.index("--shard") + 1]
            assert shard == f"K/{len(shards)}"
            assert command[command.index("--format") + 1] == "json"
    # The upload to code scanning reads the file the merge wrote.
    [upload] = [s for s in _steps(workflow) if s.get("uses", "").startswith("github/codeql")]
    merged = [c for c in commands if c[1] == "merge" and "--output" in c]
    assert upload["with"]["sarif_file"] in {c[c.index("--output") + 1] for c in merged}


def test_the_docs_explain_the_recipe() -> None:
    page = (REPO / "docs" / "ci.md").read_text()
    assert "examples/ci/precompile.yml" in page
    assert "docs/ci.md" in (REPO / "README.md").read_text()
