"""Where a finding sits: target-level findings at the decorator that declares the target,
an exception of user code at the workspace line that raised it (with the frames that led
there), and a target's own bad decorator argument on that target only.

One ``precompile check`` of tests/fixtures/located_workspace (eager captures of tiny
functions)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import FIXTURES, check_json


def line_of(path: Path, needle: str) -> int:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in {path}")


@pytest.fixture(scope="module")
def located(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("located") / "located"
    shutil.copytree(FIXTURES / "located_workspace", root)
    code, document = check_json(root, "--no-cache")
    assert code == 1
    return root, document


def _of(document: dict[str, Any], target: str) -> list[dict[str, Any]]:
    return [f for f in document["findings"] if f["target"] == target]


def _related(finding: dict[str, Any]) -> list[tuple[str, int, str]]:
    return [(r["file"], r["line"], r["message"]) for r in finding["related"]]


def test_target_level_findings_sit_at_the_decorator(located: tuple[Path, dict[str, Any]]) -> None:
    root, document = located
    source = root / "src/located/gap.py"
    [gap] = _of(document, "located.gap.narrow")
    assert gap["code"] == "PC201"
    assert (gap["file"], gap["line"], gap["column"]) == (
        "src/located/gap.py",
        line_of(source, "@precompile.target(calls, covers=wider)"),
        0,
    )


def test_a_raising_examples_points_at_the_line_that_raised(
    located: tuple[Path, dict[str, Any]],
) -> None:
    root, document = located
    [failed] = _of(document, "located.raising.explodes")
    assert failed["code"] == "PC001"
    assert "examples() failed: KeyError: 'columns'" in failed["message"]
    # Where it was raised (a helper the examples call), with the way there.
    helpers = root / "src/located/helpers.py"
    raising = root / "src/located/raising.py"
    assert (failed["file"], failed["line"], failed["column"]) == (
        "src/located/helpers.py",
        line_of(helpers, '["columns"]'),
        4,
    )
    assert _related(failed) == [
        ("src/located/raising.py", line_of(raising, "@precompile.target"), "target explodes"),
        ("src/located/raising.py", line_of(raising, "helpers.size()"), "called from calls"),
    ]
    details = failed["details"]
    assert "Traceback" in details and "in calls" in details and "in size" in details
    assert 'return {"rows": 3}["columns"]' in details


def test_an_import_error_points_at_the_failing_import(
    located: tuple[Path, dict[str, Any]],
) -> None:
    root, document = located
    source = root / "src/located/importer.py"
    [failed] = _of(document, "located.importer.lost")
    assert failed["code"] == "PC001"
    assert "ModuleNotFoundError: No module named 'not_a_module_anywhere'" in failed["message"]
    assert (failed["file"], failed["line"]) == (
        "src/located/importer.py",
        line_of(source, "import not_a_module_anywhere"),
    )
    assert _related(failed) == [
        ("src/located/importer.py", line_of(source, "@precompile.target"), "target lost")
    ]


def test_a_bad_decorator_argument_stays_on_its_target(
    located: tuple[Path, dict[str, Any]],
) -> None:
    root, document = located
    source = root / "src/located/bad_options.py"
    [wrong] = _of(document, "located.bad_options.wrong")
    assert wrong["code"] == "PC001"
    assert "backend must be 'inductor' or 'eager', got 'tpu'" in wrong["message"]
    assert "fix this decorator's arguments" in wrong["message"]
    assert (wrong["file"], wrong["line"]) == (
        "src/located/bad_options.py",
        line_of(source, 'backend="tpu"'),
    )
    # The other target of the module is captured as usual: no finding, a summary.
    assert _of(document, "located.bad_options.fine") == []
    [fine] = [t for t in document["targets"] if t["target"] == "located.bad_options.fine"]
    assert fine["summary"] and "frame" in fine["summary"]
