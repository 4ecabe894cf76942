"""The editor loop holds with every client: one that watches files (VS Code), ones that do
not (Neovim's default, Emacs eglot, Helix: the server watches for them), and a minimal
client (no watching, no progress, no configuration requests); each on a cold and on a
warm result cache, on the demo project.

For each: the demo's findings are published; then, with nothing edited, no job runs and at
most one status notification arrives in the next 10 s; one edit is exactly one re-check,
and while it runs the file's previous findings stay published; then quiet again. The
profiles run side by side, each with a server and a demo copy of its own (``each_profile``):
their waits overlap, and a failure names its profile."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from lsprotocol import types

from tests.harness import REPO, precompile_cli
from tests.lsp.conftest import Session, open_session

DEMO = REPO / "examples" / "demo_project"
SERVE = "src/recsys/serve.py"
TELEMETRY = "src/recsys/telemetry.py"
QUIET = 10.0  # seconds


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "demo"
    shutil.copytree(DEMO, root)
    return root


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's result cache as ``precompile check`` leaves it (the only thing the check
    writes is ``.precompile/``), checked once for the module: each warm case copies it
    into its own fresh demo copy, which the server then answers from (the test asserts
    four cache hits and no job, so a copy the server could not use fails)."""
    root = tmp_path_factory.mktemp("warm") / "demo"
    shutil.copytree(DEMO, root)
    proc = precompile_cli("check", cwd=root)
    assert proc.returncode == 1, proc.stderr  # the demo has an error: its coverage gap
    return root / ".precompile"


async def quiet_for(session: Session, seconds: float) -> None:
    """Nothing happens for ``seconds``: no job, at most one status notification."""
    before, mark = await session.stats(), len(session.statuses)
    await asyncio.sleep(seconds)
    after = await session.stats()
    assert after["jobs"] == before["jobs"], f"jobs ran with nothing changed: {before} -> {after}"
    statuses = session.statuses[mark:]
    assert len(statuses) <= 1, f"{len(statuses)} status notifications in {seconds:.0f} s"


def save(session: Session, profile: str, relative: str, text: str) -> int:
    """Write a file and tell the server as each client would: VS Code sends didSave and,
    for the watcher it was asked to register, a watched-file event; Neovim's default and
    the minimal client send didSave only (the server's own watcher sees the write too)."""
    mark = len(session.statuses)
    path = session.path(relative)
    path.write_text(text, encoding="utf-8")
    session.client.text_document_did_save(
        types.DidSaveTextDocumentParams(types.TextDocumentIdentifier(session.uri(relative)))
    )
    if profile == "visual-studio-code":
        session.client.workspace_did_change_watched_files(
            types.DidChangeWatchedFilesParams(
                [types.FileEvent(path.as_uri(), types.FileChangeType.Changed)]
            )
        )
    return mark


def demo_findings(session: Session) -> dict[str, list[str]]:
    return {
        relative: session.codes(relative) for relative in (SERVE, TELEMETRY, "src/recsys/model.py")
    }


EXPECTED = {
    SERVE: ["PC201", "PC302"],
    TELEMETRY: ["PC101"],
    "src/recsys/model.py": [],
}


PROFILES = ["visual-studio-code", "neovim", "minimal"]


async def each_profile(check: Callable[[str], Awaitable[None]]) -> None:
    """``check(profile)`` for every client profile, side by side (each on a server and a
    demo copy of its own, so their 10 s quiet windows overlap instead of adding up); every
    profile's failure is reported, named by its profile."""
    outcomes = await asyncio.gather(*(check(p) for p in PROFILES), return_exceptions=True)
    failed = {p: o for p, o in zip(PROFILES, outcomes) if isinstance(o, BaseException)}
    if failed:
        raise AssertionError(
            "\n".join(f"{p}: {type(o).__name__}: {o}" for p, o in failed.items())
        ) from next(iter(failed.values()))


@pytest.mark.parametrize("cache", ["cold", "warm"])
async def test_one_edit_one_recheck_and_quiet_otherwise(
    tmp_path: Path, cache: str, request: pytest.FixtureRequest
) -> None:
    """Per profile, each on a fresh demo copy (warm: holding the result cache a check
    left)."""

    warm = request.getfixturevalue("warm_cache") if cache == "warm" else None

    async def check(profile: str) -> None:
        root = tmp_path / profile / "demo"
        shutil.copytree(DEMO, root)
        if warm is not None:
            shutil.copytree(warm, root / ".precompile")
        async with open_session(root) as session:
            await one_edit_one_recheck(session, profile, cache)

    await each_profile(check)


async def one_edit_one_recheck(session: Session, profile: str, cache: str) -> None:
    await session.start(profile)
    await session.settled()
    await session.until(lambda: demo_findings(session) == EXPECTED, "the demo's findings")
    first = await session.stats()
    assert first["targets"] == 4
    if cache == "warm":
        assert first["jobs"] == 0 and first["cacheHits"] == 4, first
    else:
        assert first["jobs"] == 4, first
    await quiet_for(session, QUIET)

    # One edit of the helper that graph-breaks: every target that imported it (serve.py
    # imports it, so all four) is captured again exactly once, however many
    # notifications the client sends for the save; that is one re-check.
    telemetry = session.path(TELEMETRY)
    edited = telemetry.read_text().replace("import torch\n", "import torch  # edited\n\n")
    [before] = session.diagnostics(TELEMETRY)
    published = len(session.published)
    await session.settled(save(session, profile, TELEMETRY, edited))
    after = await session.stats()
    assert after["jobs"] == first["jobs"] + 4, (first, after)
    assert after["rechecks"] == first["rechecks"] + 1, (first, after)
    assert demo_findings(session) == EXPECTED
    # The file's finding was never cleared while its dependents were re-captured: it
    # moved down with its line (one line was added above it) and stayed.
    for uri, diagnostics in session.published[published:]:
        if uri == session.uri(TELEMETRY):
            assert [d.code for d in diagnostics] == ["PC101"], diagnostics
            assert diagnostics[0].range.start.line == before.range.start.line + 1
    await quiet_for(session, QUIET)


async def test_saving_a_target_file_keeps_its_findings_until_replaced(tmp_path: Path) -> None:
    """A save of the file that holds the targets re-captures all four; until each result
    lands, what was shown stays shown, placed in the saved text. Per profile, side by side,
    each on a fresh demo copy."""

    async def check(profile: str) -> None:
        root = tmp_path / profile / "demo"
        shutil.copytree(DEMO, root)
        async with open_session(root) as session:
            await findings_kept_until_replaced(session, profile)

    await each_profile(check)


async def findings_kept_until_replaced(session: Session, profile: str) -> None:
    await session.start(profile)
    await session.settled()
    await session.until(lambda: demo_findings(session) == EXPECTED, "the demo's findings")
    serve = session.path(SERVE)
    source = serve.read_text(encoding="utf-8")
    # Two lines added at the top: every finding below moves down by two.
    before = {d.code: d.range.start.line for d in session.diagnostics(SERVE)}
    published = len(session.published)
    mark = save(session, profile, SERVE, "# a comment\n# another\n" + source)
    await session.settled(mark)
    for uri, diagnostics in session.published[published:]:
        if uri == session.uri(SERVE):
            assert sorted(d.code for d in diagnostics) == ["PC201", "PC302"], diagnostics
            lines = {d.code: d.range.start.line for d in diagnostics}
            assert lines == {code: line + 2 for code, line in before.items()}
    assert session.codes(SERVE) == ["PC201", "PC302"]


async def test_the_daemon_reports_one_edit_once_then_idles(workspace: Path) -> None:
    """``precompile daemon``: a first report, one edit -> one new report, then nothing."""
    from tests.harness import fresh_env

    process = await asyncio.create_subprocess_exec(
        *[str(a) for a in (REPO / ".venv" / "bin" / "python",)]
        if (REPO / ".venv" / "bin" / "python").exists()
        else [__import__("sys").executable],
        "-m",
        "precompile_lsp.cli",
        "daemon",
        cwd=workspace,
        env=fresh_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None and process.stdout is not None
    reports: list[str] = []
    lines: list[str] = []

    async def read_reports() -> None:
        assert process.stderr is not None
        async for raw in process.stderr:
            line = raw.decode()
            if line.startswith("precompile daemon:"):
                reports.append(line)

    async def read_lines() -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            lines.append(raw.decode())

    readers = [asyncio.create_task(read_reports()), asyncio.create_task(read_lines())]
    try:

        async def until(count: int, timeout: float = 300) -> None:
            deadline = asyncio.get_running_loop().time() + timeout
            while len(reports) < count:
                assert asyncio.get_running_loop().time() < deadline, f"no report {count}"
                assert process.returncode is None, "the daemon exited"
                await asyncio.sleep(0.1)

        await until(1)
        assert any("PC101" in line for line in lines)
        await asyncio.sleep(QUIET)
        assert len(reports) == 1, reports

        telemetry = workspace / TELEMETRY
        telemetry.write_text(
            telemetry.read_text().replace("print(", "# print(").replace("# Dynamo", "  # Dynamo")
        )
        await until(2)
        assert any(line.startswith("- ") and "PC101" in line for line in lines), lines
        await asyncio.sleep(QUIET)
        assert len(reports) == 2, reports
    finally:
        process.terminate()
        await process.wait()
        for reader in readers:
            reader.cancel()
