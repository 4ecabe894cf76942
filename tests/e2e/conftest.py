"""The real editor: code-server with the extension's .vsix installed, on a fresh copy of
the demo project and a fresh profile per scenario, seen through headless Chromium.

`make e2e` installs what this needs (code-server under .e2e/, Debian's Chromium,
Playwright) and builds the .vsix; screenshots land in .e2e/out/<scenario>/.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, sync_playwright

from tests.e2e.workbench import Workbench, settings_json
from tests.harness import REPO

E2E = REPO / ".e2e"
CODE_SERVER = E2E / "code-server" / "node_modules" / "code-server"
VSIX = REPO / "editor" / "vscode" / "out" / "torch-precompile.vsix"
DEMO = REPO / "examples" / "demo_project"
OUT = E2E / "out"
NODE = shutil.which("node") or "node"
WORK = E2E / "work"

#: A profile without the first-run noise, so that screenshots show the extension.
QUIET = {
    "workbench.startupEditor": "none",
    "workbench.tips.enabled": False,
    "workbench.enableExperiments": False,
    "extensions.ignoreRecommendations": True,
    "telemetry.telemetryLevel": "off",
    "update.mode": "none",
    "editor.minimap.enabled": False,
    "window.commandCenter": False,
    "files.autoSave": "off",
    "git.enabled": False,
}

Launch = Callable[..., Workbench]


def _needed(path: Path, what: str) -> Path:
    if not path.exists():
        pytest.fail(f"{path} is missing: {what} (`make e2e` sets everything up)")
    return path


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Debian's chromium is not installed (`make e2e` installs it)")
    _needed(CODE_SERVER, "code-server")
    _needed(VSIX, "the extension's .vsix")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield browser
        browser.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(process: subprocess.Popen[bytes]) -> None:
    """code-server, its extension host, the language server and its workers: one group."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait)
            # The group may outlive its leader for a moment.
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                os.killpg(process.pid, 0)
                time.sleep(0.1)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            continue


@pytest.fixture
def launch(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Launch]:
    """Start code-server on a fresh copy of the demo project and a fresh profile; returns
    the workbench page once it is shown. Stops everything afterwards."""
    name = request.node.name.removeprefix("test_")
    started: list[tuple[subprocess.Popen[bytes], Any]] = []

    def start(
        *,
        trust_prompt: bool = False,
        settings: dict[str, Any] | None = None,
        interpreter: str | None = sys.executable,
        env: dict[str, str] | None = None,
        prepare: Callable[[Path], None] | None = None,
    ) -> Workbench:
        work = WORK / name
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(OUT / name, ignore_errors=True)
        project = work / "recsys"
        shutil.copytree(DEMO, project, ignore=shutil.ignore_patterns("__pycache__", "artifacts"))
        if prepare is not None:
            prepare(project)
        profile, extensions = work / "profile", work / "extensions"
        user = dict(QUIET)
        # Off: the folder is trusted from the start; on: VS Code asks, as on a first open.
        user["security.workspace.trust.enabled"] = trust_prompt
        if interpreter is not None:
            user["precompile.interpreter"] = interpreter
        user.update(settings or {})
        settings_json(profile / "User" / "settings.json", user)
        base = [
            NODE,
            str(CODE_SERVER / "out" / "node" / "entry.js"),
            "--user-data-dir",
            str(profile),
            "--extensions-dir",
            str(extensions),
        ]
        environment = {**os.environ, "XDG_CONFIG_HOME": str(work / "config"), **(env or {})}
        subprocess.run(
            [*base, "--install-extension", str(VSIX)],
            check=True,
            capture_output=True,
            env=environment,
            timeout=120,
        )
        port = _free_port()
        with open(work / "code-server.log", "wb") as log:  # the child keeps its own copy
            process = subprocess.Popen(
                [
                    *base,
                    "--bind-addr",
                    f"127.0.0.1:{port}",
                    "--auth",
                    "none",
                    "--disable-telemetry",
                    "--disable-update-check",
                    "--disable-getting-started-override",
                    str(project),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,
            )
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        started.append((process, context))
        page = context.new_page()
        deadline = time.monotonic() + 60
        while True:
            try:
                page.goto(f"http://127.0.0.1:{port}/?folder={project}")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        page.locator(".monaco-workbench").wait_for(timeout=60_000)
        return Workbench(page, OUT / name, project)

    yield start
    for process, context in started:
        context.close()
        _stop(process)
