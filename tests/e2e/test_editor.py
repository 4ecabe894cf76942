"""The extension as a person meets it in VS Code, on the demo project."""

from __future__ import annotations

import subprocess
import sys
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
    """The target's ``def`` line (its findings sit on the decorator, the line above)."""
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
            lambda line=line: bench.active_tab().startswith("diagnostics.md")
            and bench.cursor() == (line, 1),
            f"{problem.code}'s link to open diagnostics.md at line {line}",
            30,
        )
        heading = f"## {problem.code.lower()}"
        shown = bench.wait_for(
            lambda heading=heading: [t for t in bench.editor_lines() if t.startswith(heading)],
            f"the {problem.code} section on screen",
            10,
        )
        assert shown == [heading]
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
    assert (gap.file, gap.line, gap.severity) == (
        SERVE,
        def_line(project, "rank") - 1,  # at the decorator, as every target-level finding
        "error",
    )
    assert "would be refused by the artifact" in gap.message
    missing = by_code["PC302"]
    assert (missing.file, missing.line, missing.severity) == (
        SERVE,
        def_line(project, "probability") - 1,  # at the decorator that declares the artifact
        "warning",
    )
    assert "does not exist; emit it" in missing.message
    brk = by_code["PC101"]
    assert (brk.file, brk.line, brk.column) == (
        TELEMETRY,
        line_of(project / TELEMETRY, "print("),
        5,
    )
    assert brk.message.startswith("graph break [GB0059]")
    assert brk.related == (
        ("serve.py", def_line(project, "score_logged") - 1, "target score_logged"),
        ("serve.py", line_of(project / SERVE, "telemetry.report("), "in score_logged"),
    )
    assert bench.status() == "Precompile: 3"
    assert bench.problem_counts() == "Errors: 1, Warnings: 2"
    follow_doc_links(bench, problems)


def toast(bench: Workbench, text: str, what: str) -> dict:
    return bench.wait_for(
        lambda: next((n for n in bench.notifications() if text in n["message"]), None), what
    )


def test_codelens_hover_and_source_actions(launch) -> None:
    bench = launch()
    bench.open_file(SERVE)
    bench.show_problems()
    findings(bench, 3)
    bench.command("View: Hide Panel")  # room for every lens of serve.py
    expected = [
        "1 frame · 0 graph breaks · 1 variant | Emit | Verify",
        "3 frames · 1 graph break · 2 variants | Emit | Verify",
        "1 frame · 0 graph breaks · 1 variant · covers 0/1 | Emit | Verify",
        "1 frame · 0 graph breaks · 1 variant | Emit | Verify",
    ]
    bench.wait_for(lambda: bench.codelenses() == expected, f"the lenses {expected}", 30)
    bench.shot("codelens")

    # Hover on the graph break: what, why, the hint, the user stack, the docs.
    bench.open_file(TELEMETRY)
    bench.hover_over("print")
    hover = bench.wait_for(
        lambda: (h := bench.hover_text()) and "PC101 graph-break" in h and h, "the hover", 30
    )
    bench.shot("hover")
    assert "PC101 graph-break: graph break [GB0059]" in hover
    assert "Hint:" in hover and "User stack, outermost first:" in hover
    assert "in score_logged (serve.py:" in hover and "PC101 documentation" in hover
    bench.page.mouse.move(0, 0)

    # Emit from the Source Action menu at probability: the artifact is written and the
    # missing-artifact finding clears.
    bench.open_file(SERVE)
    bench.goto(def_line(bench.project, "probability"))
    bench.menu("Source Action...", "Emit precompile artifact", shot="source-actions")
    toast(bench, "Precompile: emitted artifacts/recsys.serve.probability.py", "the emit message")
    bench.show_problems()
    findings(bench, 2)
    assert "PC302" not in {p.code for p in bench.problems() or []}
    bench.shot("emitted")
    assert (bench.project / "artifacts" / "recsys.serve.probability.py").is_file()

    bench.goto(def_line(bench.project, "probability"))
    bench.menu("Source Action...", "Verify artifact")
    toast(bench, "Precompile: probability's artifact verified against eager", "the verify message")
    bench.shot("verified")
    assert len(bench.problems() or []) == 2


def never_dropped(samples: list[dict], previous: set[str], what: str) -> None:
    """Every sample of the Problems panel, from the save until the new result, still
    shows every previous finding: none is wiped while the server re-checks."""
    assert samples, "nothing was sampled"
    start = samples[0]["t"]
    for sample in samples:
        at = (sample["t"] - start) / 1000
        assert not sample[
            "empty"
        ], f"{what}: the Problems panel said 'No problems' {at:.2f}s after the save"
        missing = previous - set(sample["rows"])
        assert (
            not missing
        ), f"{what}: {sorted(missing)} vanished {at:.2f}s after the save ({sample})"


def test_save_keeps_findings_until_replaced(launch) -> None:
    bench = launch()
    bench.open_file(SERVE)
    bench.show_problems()
    previous = {p.key for p in findings(bench, 3)}
    serve = bench.project / SERVE
    original = serve.read_text(encoding="utf-8")

    # A print in score, the clean target: a graph break, shown once the file is saved.
    docstring = line_of(serve, '"""Clean: one graph')
    printed = docstring + 1
    bench.goto(docstring)
    bench.page.keyboard.press("End")
    bench.page.keyboard.press("Enter")
    bench.page.keyboard.type('print("scoring")')
    bench.shot("edited")
    bench.start_sampling()
    bench.page.keyboard.press("Control+s")
    after = findings(bench, 4)
    samples = bench.stop_sampling()
    bench.shot("saved")
    never_dropped(samples, previous, "saving an edit")
    [new] = [p for p in after if p.key not in previous]
    assert (new.file, new.code, new.line) == (SERVE, "PC101", printed)
    assert new.related[0] == ("serve.py", def_line(bench.project, "score") - 1, "target score")

    # Undo the edit and save: the graph break goes, the others stay throughout.
    bench.page.locator(".editor-group-container.active .monaco-editor textarea").first.focus()
    for _ in range(20):  # auto-closed quotes and brackets are undo steps of their own
        if not any("print" in line for line in bench.editor_lines()):
            break
        bench.page.keyboard.press("Control+z")
    bench.start_sampling()
    bench.page.keyboard.press("Control+s")
    bench.wait_for(
        lambda: serve.read_text(encoding="utf-8") == original, "the undone file saved", 30
    )
    final = findings(bench, 3)
    samples = bench.stop_sampling()
    bench.shot("undone")
    never_dropped(samples, previous, "saving the undo")
    assert {p.key for p in final} == previous


def _stale(project: Path) -> None:
    """As `make demo` does: emit probability's artifact, then change its source."""
    subprocess.run(
        [sys.executable, "-m", "precompile_lsp.cli", "emit", "probability"],
        cwd=project,
        check=True,
        capture_output=True,
        timeout=300,
    )
    # Staleness is per function: the change is inside probability itself.
    serve = project / SERVE
    docstring = '"""Its committed artifact was emitted before the last change: stale."""'
    source = serve.read_text()
    assert docstring in source
    serve.write_text(
        source.replace(docstring, docstring + "\n    # changed after its artifact was emitted")
    )


def test_stale_artifact_quick_fix(launch) -> None:
    bench = launch(prepare=_stale)
    bench.open_file(SERVE)
    bench.show_problems()
    problems = findings(bench, 3)
    [stale] = [p for p in problems if p.code == "PC301"]
    assert stale.file == SERVE and stale.severity == "warning"
    assert "is stale" in stale.message
    bench.shot("stale")
    follow_doc_links(bench, [stale])

    bench.open_file(SERVE)
    bench.goto(stale.line, stale.column)
    bench.menu("Quick Fix...", "Re-emit precompile artifact", shot="quick-fix")
    toast(bench, "Precompile: emitted artifacts/recsys.serve.probability.py", "the re-emit message")
    after = findings(bench, 2)
    bench.shot("fixed")
    assert "PC301" not in {p.code for p in after}


def output_text(bench: Workbench) -> str:
    lines = bench.page.locator(".part.panel .monaco-editor .view-line").all_inner_texts()
    return "\n".join(lines).replace("\u00a0", " ")


def test_untrusted_then_trusted(launch) -> None:
    bench = launch(trust_prompt=True)
    prompt = bench.page.locator(".monaco-dialog-box")
    prompt.wait_for(timeout=60_000)
    bench.shot("trust-prompt")
    bench.click_button(prompt, "No, I don't trust the authors")

    # Restricted: the server runs nothing, and says so.
    bench.wait_for(lambda: bench.status() == "Precompile: not trusted", "the not-trusted status")
    toast(
        bench, "this workspace is not trusted, so none of its programs run", "the server's warning"
    )
    bench.open_file(SERVE)
    not_run = "precompile: not run (workspace not trusted)"
    bench.wait_for(lambda: bench.codelenses() == [not_run] * 4, "the not-run lenses", 60)
    bench.show_problems()
    bench.wait_for(lambda: bench.problems() == [], "an empty Problems panel", 10)
    bench.shot("restricted")
    assert not (bench.project / "artifacts").exists()
    assert "not trusted" in bench.status_tooltip()

    # Trust: the server restarts and checks.
    bench.command("Workspaces: Manage Workspace Trust")
    trust = bench.page.locator(".workspace-trust-editor")
    trust.wait_for()
    bench.shot("trust-editor")
    bench.click_button(trust, "Trust")
    bench.open_file(SERVE)
    bench.show_problems()
    findings(bench, 3)
    bench.shot("trusted")

    # The restart left no error, and pygls no warnings, in the user's log.
    bench.command("Precompile: Show Logs")
    log = bench.wait_for(
        lambda: (t := output_text(bench)) and "restarting the language server" in t and t,
        "the Precompile log",
        30,
    )
    bench.shot("log")
    assert "exited with code" not in log
    assert "Cancel notification" not in log


def test_missing_interpreter(launch) -> None:
    # No precompile.interpreter and no Python extension: the fallback, python3 on PATH,
    # is the system's, which has no torch-precompile (as on a new user's machine).
    bench = launch(interpreter=None)
    error = toast(bench, "the language server cannot start", "the missing-interpreter error")
    bench.page.wait_for_timeout(2000)  # time for a second error, were there one
    bench.shot("error")
    errors = [n for n in bench.notifications() if n["severity"] == "error"]
    assert errors == [error]
    assert '"python3" cannot import precompile_lsp' in error["message"]
    assert "Install it with `python3 -m pip install torch-precompile`" in error["message"]
    assert '"precompile.interpreter" setting' in error["message"]
    assert error["buttons"] == ["Open Setting", "Show Logs"]
    assert bench.status() == "Precompile"
    assert "the language server is not running" in bench.status_tooltip()

    # The fix it offers: the setting, opened where it can be set (in a remote window like
    # this one, machine settings are on the Remote tab; the User tab would find nothing).
    bench.click_button(bench.page.locator(".notification-toast"), "Open Setting")
    settings = bench.page.locator(".settings-editor")
    bench.wait_for(
        lambda: "Precompile: Interpreter" in settings.inner_text(), "the interpreter setting", 30
    )
    bench.shot("setting")
    assert "No Settings Found" not in settings.inner_text()
