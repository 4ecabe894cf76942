"""The extension as a person meets it in VS Code, on the demo project."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from precompile_lsp.doclinks import DIAGNOSTICS
from tests.e2e.workbench import Problem, Workbench

SERVE = "src/recsys/serve.py"
TELEMETRY = "src/recsys/telemetry.py"


def line_of(path: Path, text: str) -> int:
    """1-based line of the first line containing ``text``."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {path}")


def def_line(project: Path, function: str) -> int:
    """Where target-level findings are reported: the target's ``def`` line."""
    return line_of(project / SERVE, f"def {function}(")


def follow_doc_links(bench: Workbench, problems: list[Problem]) -> None:
    """Click each code's link in the Problems panel: the shipped docs open at its section."""
    page = DIAGNOSTICS.resolve()
    headings = page.read_text(encoding="utf-8").splitlines()
    for problem in problems:
        assert problem.href is not None, f"{problem.code} has no documentation link"
        link = urllib.parse.urlsplit(problem.href)
        assert urllib.parse.unquote(link.path) == str(page), problem.href
        line = int(link.fragment.removeprefix("L"))
        assert headings[line - 1] == f"## {problem.code.lower()}"
        bench.page.locator(".markers-panel a.monaco-link", has_text=problem.code).first.click()
        bench.wait_for(
            lambda: bench.active_tab().startswith("diagnostics.md") and bench.cursor() == (line, 1),
            f"{problem.code}'s link to open diagnostics.md at line {line}",
            30,
        )
        shown = bench.wait_for(
            lambda: [t for t in bench.editor_lines() if t.startswith(f"## {problem.code.lower()}")],
            f"the {problem.code} section on screen",
            10,
        )
        assert shown == [f"## {problem.code.lower()}"]
        bench.shot(f"doc-{problem.code}")


def findings(bench: Workbench, count: int) -> list[Problem]:
    """Wait for the Problems panel to list ``count`` markers and the server to be idle."""
    return bench.wait_for(
        lambda: (p := bench.problems()) is not None
        and len(p) == count
        and f"Precompile: {count}" in bench.status()
        and p,
        f"{count} problems and an idle status",
    )


def test_first_diagnostics(launch) -> None:
    bench = launch()
    bench.open_file(SERVE)
    bench.show_problems()
    problems = findings(bench, 3)
    bench.shot("problems")
    project = bench.project
    by_code = {p.code: p for p in problems}
    assert sorted(by_code) == ["PC101", "PC201", "PC302"]
    gap = by_code["PC201"]
    assert (gap.file, gap.line, gap.severity) == (SERVE, def_line(project, "rank"), "error")
    assert "would be refused by the artifact" in gap.message
    missing = by_code["PC302"]
    assert (missing.file, missing.line, missing.severity) == (
        SERVE,
        def_line(project, "probability") - 1,  # at the decorator that declares the artifact
        "warning",
    )
    assert "does not exist; emit it" in missing.message
    brk = by_code["PC101"]
    assert (brk.file, brk.line, brk.column) == (TELEMETRY, line_of(project / TELEMETRY, "print("), 5)
    assert brk.message.startswith("graph break [GB0059]")
    assert brk.related == (
        ("serve.py", def_line(project, "score_logged"), "target score_logged"),
        ("serve.py", line_of(project / SERVE, "telemetry.report("), "in score_logged"),
    )
    assert bench.status() == "Precompile: 3"
    assert bench.problem_counts() == "Errors: 1, Warnings: 2"
    follow_doc_links(bench, problems)
