"""A real VS Code (code-server) in headless Chromium, driven as a person drives it.

Everything asserted is read from the workbench's DOM: the Problems panel, the status
bar, CodeLens, hovers, notifications, editor tabs. Each step a test names is saved as a
screenshot under the scenario's output folder, so a failure can be looked at.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from playwright.sync_api import Locator, Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout

T = TypeVar("T")

#: Seconds to wait for what the server does: a first check captures four targets in
#: workers that import torch (about 10 s on 2 cores, more when the machine is busy).
WAIT = 240.0

PRECOMPILE_STATUS = '[id="torch-precompile.torch-precompile.precompile.status"]'

#: The Problems panel as rows (file, code, line, column, severity, message, link, related),
#: read from the tree: file rows (level 1), markers (level 2), related locations (level 3).
_READ_PROBLEMS = """() => {
  const panel = document.querySelector('.markers-panel');
  if (!panel || panel.offsetParent === null) return null;
  const out = [];
  let file = null;
  for (const row of panel.querySelectorAll('.monaco-list-row')) {
    const level = row.getAttribute('aria-level');
    const label = row.getAttribute('aria-label') || '';
    if (level === '1') {
      const m = label.match(/in file (\\S+)(?: of folder (\\S+))?$/);
      file = m ? (m[2] ? m[2] + '/' + m[1] : m[1]) : label;
    } else if (level === '2') {
      const code = row.querySelector('.marker-code');
      const link = row.querySelector('a.monaco-link');
      const at = (row.querySelector('.marker-line')?.textContent || '').match(/Ln (\\d+), Col (\\d+)/);
      const icon = row.querySelector('.marker-icon');
      out.push({
        file,
        code: code ? code.textContent.trim() : null,
        line: at ? Number(at[1]) : null,
        column: at ? Number(at[2]) : null,
        severity: icon ? [...icon.classList].find((c) => c !== 'marker-icon') : null,
        message: row.querySelector('.marker-message')?.textContent.trim() || '',
        href: link ? link.getAttribute('href') : null,
        related: [],
      });
    } else if (level === '3' && out.length) {
      const at = (row.querySelector('.marker-line')?.textContent || '').match(/Ln (\\d+)/);
      out[out.length - 1].related.push({
        file: row.querySelector('.related-info-resource')?.textContent.trim() || '',
        line: at ? Number(at[1]) : null,
        message: row.querySelector('.marker-description')?.textContent.trim() || '',
      });
    }
  }
  return out;
}"""

#: Records, every 50 ms until stopped, what a person sees of the findings: the Problems
#: panel's rows (file:code), whether it says there are none, and the status bar counts.
_START_SAMPLING = """(read) => {
  const readProblems = eval(read);
  window.__samples = [];
  window.__sampler = setInterval(() => {
    const rows = readProblems() || [];
    const empty = [...document.querySelectorAll('.markers-panel .message-box-container')]
      .some((e) => e.offsetParent !== null && /No problems/.test(e.textContent));
    const counts = document.querySelector('[id="status.problems"]')?.getAttribute('aria-label') || '';
    window.__samples.push({t: Date.now(), rows: rows.map((r) => r.file + ':' + r.code), empty, counts});
  }, 50);
}"""


@dataclasses.dataclass(frozen=True)
class Problem:
    file: str
    code: str
    line: int
    column: int
    severity: str
    message: str
    href: str | None
    related: tuple[tuple[str, int, str], ...]

    @property
    def key(self) -> str:
        return f"{self.file}:{self.code}"


class Workbench:
    """One browser page on one code-server showing ``project``; screenshots go to ``shots``."""

    def __init__(self, page: Page, shots: Path, project: Path) -> None:
        self.page = page
        self.shots = shots
        self.project = project
        self.step = 0
        shots.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ looking

    def shot(self, name: str) -> Path:
        self.step += 1
        path = self.shots / f"{self.step:02d}-{name}.png"
        self.page.screenshot(path=str(path))
        return path

    def wait_for(self, probe: Callable[[], T], what: str, timeout: float = WAIT) -> T:
        """Poll ``probe`` until it returns something true; on timeout, a screenshot and
        an assertion error saying what was awaited and what was last seen."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            last = probe()
            if last:
                return last
            if time.monotonic() > deadline:
                self.shot("timeout")
                (self.shots / f"{self.step:02d}-timeout.html").write_text(self.page.content())
                raise AssertionError(
                    f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}"
                )
            self.page.wait_for_timeout(250)

    def problems(self) -> list[Problem] | None:
        """The Problems panel's markers, or None while the panel is not shown."""
        rows = self.page.evaluate(_READ_PROBLEMS)
        if rows is None:
            return None
        return [
            Problem(
                **{k: v for k, v in row.items() if k != "related"},
                related=tuple((r["file"], r["line"], r["message"]) for r in row["related"]),
            )
            for row in rows
        ]

    def problem_keys(self) -> set[str]:
        return {p.key for p in self.problems() or []}

    def status(self) -> str:
        """The Precompile status bar item's text (codicons dropped)."""
        item = self.page.locator(PRECOMPILE_STATUS)
        return item.inner_text().strip() if item.count() else ""

    def status_tooltip(self) -> str:
        item = self.page.locator(PRECOMPILE_STATUS)
        return item.get_attribute("aria-label") or "" if item.count() else ""

    def problem_counts(self) -> str:
        """The workbench's own counter, e.g. 'Errors: 1, Warnings: 2'."""
        return self.page.locator('[id="status.problems"]').get_attribute("aria-label") or ""

    def notifications(self) -> list[dict[str, Any]]:
        """Visible notification toasts: severity, message, buttons."""
        return self.page.evaluate(
            """() => [...document.querySelectorAll('.notification-toast')].map((t) => ({
                severity: ['error', 'warning', 'info'].find((s) =>
                    t.querySelector('.notification-list-item-icon.codicon-' + s)) || null,
                message: t.querySelector('.notification-list-item-message')?.textContent.trim() || '',
                buttons: [...t.querySelectorAll('.notification-list-item-buttons-container .monaco-button')]
                    .map((b) => b.textContent.trim()),
            }))"""
        )

    def codelenses(self) -> list[str]:
        """The CodeLens lines of the visible editor, top to bottom."""
        return self.page.evaluate(
            """() => [...document.querySelectorAll('.editor-group-container.active .codelens-decoration')]
                .filter((d) => getComputedStyle(d).visibility !== 'hidden')
                .sort((a, b) => parseFloat(a.style.top) - parseFloat(b.style.top))
                .map((d) => d.textContent.replace(/\\u00a0/g, ' ').trim())"""
        )

    def hover_text(self) -> str:
        hover = self.page.locator(".monaco-hover:visible .hover-contents")
        return "\n".join(hover.all_inner_texts())

    def active_tab(self) -> str:
        tab = self.page.locator(".tabs-container .tab.active")
        return tab.first.get_attribute("aria-label") or "" if tab.count() else ""

    def cursor(self) -> tuple[int, int] | None:
        """The active editor's cursor, from the status bar ('Ln 35, Col 1')."""
        text = self.page.locator('[id="status.editor.selection"]').inner_text()
        found = re.search(r"Ln (\d+), Col (\d+)", text)
        return (int(found[1]), int(found[2])) if found else None

    def editor_lines(self) -> list[str]:
        """The visible lines of the active editor, top to bottom."""
        return self.page.evaluate(
            """() => [...document.querySelectorAll('.editor-group-container.active .view-lines .view-line')]
                .sort((a, b) => parseFloat(a.style.top) - parseFloat(b.style.top))
                .map((l) => l.textContent.replace(/\\u00a0/g, ' '))"""
        )

    # ------------------------------------------------------------ doing

    def command(self, title: str) -> None:
        """Run a command from the palette by its exact title."""
        self.page.keyboard.press("F1")
        box = self.page.locator(".quick-input-widget:visible input")
        box.wait_for()
        box.fill(f">{title}")
        row = self.page.locator(
            ".quick-input-widget:visible .monaco-list-row",
            has_text=re.compile(rf"^{re.escape(title)}"),
        )
        row.first.wait_for()
        self.page.keyboard.press("Enter")

    def open_file(self, relative: str) -> None:
        """Quick Open (Ctrl+P) by path, as a person does."""
        self.page.keyboard.press("Control+p")
        box = self.page.locator(".quick-input-widget:visible input")
        box.wait_for()
        box.fill(relative)
        name = Path(relative).name
        row = self.page.locator(".quick-input-widget:visible .monaco-list-row", has_text=name).first
        row.wait_for()
        row.click()
        self.wait_for(lambda: self.active_tab().startswith(name), f"{name} to open", 30)
        self.page.locator(".editor-group-container.active .monaco-editor textarea").first.focus()

    def goto(self, line: int, column: int = 1) -> None:
        """Go to Line (Ctrl+G) in the active editor."""
        self.page.keyboard.press("Control+g")
        box = self.page.locator(".quick-input-widget:visible input")
        box.wait_for()
        box.fill(f":{line}:{column}")
        self.page.keyboard.press("Enter")
        self.wait_for(lambda: self.cursor() == (line, column), f"the cursor at {line}:{column}", 10)

    def hover_over(self, token: str) -> None:
        """Rest the mouse on the first token of the active editor that reads ``token``."""
        spans = self.page.locator(".editor-group-container.active .view-lines .view-line span span")
        spans.filter(has_text=re.compile(rf"^{re.escape(token)}$")).first.hover()

    def show_problems(self) -> None:
        self.command("View: Focus Problems")
        self.page.locator(".markers-panel").first.wait_for()

    def menu(self, command: str, label: str, shot: str | None = None) -> None:
        """Open an action menu from the palette (``Source Action...``, ``Quick Fix...``)
        and choose ``label``. A menu that never opens (the palette's Enter lost while the
        workbench is busy) is opened again, as a person would; a menu that opens without
        ``label`` fails, naming what it offered."""
        rows = self.page.locator(".action-widget .monaco-list-row.action")
        for _ in range(3):
            self.command(command)
            try:
                rows.first.wait_for(timeout=10_000)
            except PlaywrightTimeout:
                self.page.keyboard.press("Escape")
                continue
            offered = self.wait_for(
                lambda: [r for r in rows.all_inner_texts() if r.strip()], "the menu's rows", 10
            )
            if shot:
                self.shot(shot)
            assert any(
                label in row for row in offered
            ), f"{command} offered {offered}, not {label!r}"
            self.pick(label)
            return
        self.shot("no-menu")
        raise AssertionError(f"{command} opened no menu in three tries")

    def pick(self, label: str) -> None:
        """Choose an entry of the action menu (Quick Fix, Source Action) by its label."""
        item = self.page.locator(".action-widget .monaco-list-row.action", has_text=label)
        item.first.wait_for()
        # The menu takes keys, as a person uses it (its pointer guard swallows early clicks).
        focused = self.page.locator(".action-widget .monaco-list-row.focused")
        for _ in range(20):
            if focused.count() and focused.first.get_attribute("aria-label") == label:
                self.page.keyboard.press("Enter")
                return
            self.page.keyboard.press("ArrowDown")
        raise AssertionError(f"{label!r} could not be selected in the menu")

    def click_button(self, container: Locator, label: str) -> None:
        container.get_by_role("button", name=label).first.click()

    # ------------------------------------------------------------ sampling

    def start_sampling(self) -> None:
        self.page.evaluate(_START_SAMPLING, _READ_PROBLEMS)

    def stop_sampling(self) -> list[dict[str, Any]]:
        return self.page.evaluate(
            "() => { clearInterval(window.__sampler); return window.__samples; }"
        )


def settings_json(path: Path, settings: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2), encoding="utf-8")
