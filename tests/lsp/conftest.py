"""A real LSP client (pytest-lsp) driving ``python -m precompile_lsp`` over stdio on a
fresh copy of tests/fixtures/lsp_workspace, with helpers that wait on what the server
publishes instead of sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Union

import pytest
import pytest_asyncio
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from tests.harness import REPO, fresh_env

WORKSPACE = REPO / "tests" / "fixtures" / "lsp_workspace"
WAIT = float(
    os.environ.get("PRECOMPILE_TEST_WAIT", "300")
)  # seconds; a first capture in a cold worker imports torch and Dynamo


def _state_and_parent(pid: int | str) -> tuple[str, int] | None:
    """A process's state letter and parent pid from /proc, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (workers and their forked captures)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        found = _state_and_parent(entry) if entry.isdigit() else None
        if found is not None and found[0] != "Z":
            parents[int(entry)] = found[1]
    below: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - below
        below |= frontier
    return below


def alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if (found := _state_and_parent(pid)) and found[0] != "Z"}


@dataclasses.dataclass
class Session:
    """One client connected to one server, on workspace folders it owns."""

    client: LanguageClient
    root: Path
    statuses: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: Every publishDiagnostics the client received, in order: (uri, diagnostics).
    published: list[tuple[str, list[types.Diagnostic]]] = dataclasses.field(default_factory=list)
    registrations: list[types.Registration] = dataclasses.field(default_factory=list)
    lens_refreshes: int = 0
    result: types.InitializeResult | None = None
    shut_down: bool = False

    async def start(
        self,
        profile: str = "visual-studio-code",
        *,
        trusted: bool = True,
        folders: list[Path] | None = None,
        options: dict[str, Any] | None = None,
    ) -> types.InitializeResult:
        """Initialize as ``profile``: a pytest-lsp client profile, or ``minimal`` (a
        client that sends didSave and nothing more: no file watching, no progress, no
        configuration requests)."""
        folders = folders or [self.root]
        capabilities = MINIMAL if profile == "minimal" else client_capabilities(profile)
        self.result = await self.client.initialize_session(
            types.InitializeParams(
                capabilities=capabilities,
                workspace_folders=[types.WorkspaceFolder(f.as_uri(), f.name) for f in folders],
                initialization_options={"trusted": trusted, **(options or {})},
            )
        )
        return self.result

    @property
    def server_pid(self) -> int:
        assert self.client._server is not None
        return self.client._server.pid

    def path(self, relative: str) -> Path:
        return self.root / relative

    def uri(self, relative: str) -> str:
        return self.path(relative).as_uri()

    def diagnostics(self, where: str | Path) -> list[types.Diagnostic]:
        """What the client shows for a file: relative to the root, or absolute."""
        uri = where.as_uri() if isinstance(where, Path) else self.uri(where)
        return list(self.client.diagnostics.get(uri, []))

    def codes(self, where: str | Path) -> list[str]:
        return sorted(str(d.code) for d in self.diagnostics(where))

    async def until(self, predicate: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if self.client.error is not None:
                raise AssertionError(f"the client failed while waiting for {what}") from (
                    self.client.error
                )
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
            await asyncio.sleep(0.05)

    async def settled(self, after: int = 0) -> dict[str, Any]:
        """Wait for the server to go idle after the ``after``-th status notification."""
        return await self.until(
            lambda: next((s for s in self.statuses[after:] if s["state"] == "idle"), None),
            f"an idle status after #{after}",
        )

    async def save(self, relative: str, text: str) -> int:
        """Write a file as an editor does and send didSave; returns the status mark to
        pass to settled()."""
        mark = len(self.statuses)
        self.path(relative).write_text(text, encoding="utf-8")
        self.client.text_document_did_save(
            types.DidSaveTextDocumentParams(types.TextDocumentIdentifier(self.uri(relative)))
        )
        return mark

    def open(self, relative: str) -> str:
        text = self.path(relative).read_text(encoding="utf-8")
        self.client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                types.TextDocumentItem(self.uri(relative), "python", 1, text)
            )
        )
        return text

    async def shutdown(self) -> None:
        """Shut the server down now (the fixture's teardown then only checks)."""
        self.shut_down = True
        await asyncio.wait_for(self.client.shutdown_session(), 30)

    async def stats(self) -> dict[str, Any]:
        """The engine's counters for the session's root (``precompile/stats``)."""
        result = await self.client.protocol.send_request_async("precompile/stats", None)
        entries = [e if isinstance(e, dict) else e._asdict() for e in result]
        [entry] = [e for e in entries if e["root"] == str(self.root.resolve())]
        return entry

    async def command(self, name: str, *arguments: Any) -> Any:
        return await self.client.workspace_execute_command_async(
            types.ExecuteCommandParams(command=name, arguments=list(arguments))
        )


def line_of(path: Path, needle: str) -> int:
    """0-based line of the first line of ``path`` containing ``needle``."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in {path}")


def column_in(encoding: str | None, text: str) -> int:
    """Length of ``text`` in the position encoding the server negotiated."""
    if encoding == types.PositionEncodingKind.Utf8:
        return len(text.encode("utf-8"))
    if encoding == types.PositionEncodingKind.Utf32:
        return len(text)
    return len(text.encode("utf-16-le")) // 2


#: A client with the least an LSP client can have: it syncs documents and says when one is
#: saved, and nothing else.
MINIMAL = types.ClientCapabilities(
    text_document=types.TextDocumentClientCapabilities(
        synchronization=types.TextDocumentSyncClientCapabilities(did_save=True)
    )
)


class _RecordingDiagnostics(dict[str, Any]):
    """pytest-lsp's diagnostics store, also keeping every publication in order."""

    def __init__(self, history: list[tuple[str, list[types.Diagnostic]]]) -> None:
        super().__init__()
        self.history = history

    def __setitem__(self, uri: str, diagnostics: Any) -> None:
        self.history.append((uri, list(diagnostics)))
        super().__setitem__(uri, diagnostics)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "lab"
    shutil.copytree(WORKSPACE, root)
    return root


def _read_code_actions_as_sent(client: LanguageClient) -> None:
    """lsprotocol reads every ``Command | CodeAction`` that has a ``command`` key as a
    Command, so a CodeAction that runs a command arrives mangled. Clients (VS Code's
    ``Command.is``) tell them apart by the type of ``command``; so does this one."""
    converter = client.protocol._converter

    def structure(value: Any, _: type) -> types.Command | types.CodeAction:
        kind = types.Command if isinstance(value.get("command"), str) else types.CodeAction
        return converter.structure(value, kind)

    # The hook is keyed by typing.Union, which ``X | Y`` is not.
    converter.register_structure_hook(Union[types.Command, types.CodeAction], structure)  # noqa: UP007


SERVER = ClientServerConfig(
    server_command=[sys.executable, "-m", "precompile_lsp"], server_env=fresh_env()
)


@contextlib.asynccontextmanager
async def open_session(workspace: Path) -> AsyncIterator[Session]:
    """A started server process with a client listening for what it sends; initialize is
    left to the test (profile, trust and folders differ). Teardown is bounded: a server
    that will not shut down is killed, and the test fails for it. The ``session`` fixture
    is one; a test that runs several sessions side by side opens them here."""
    client = await SERVER.start()
    _read_code_actions_as_sent(client)
    state = Session(client, workspace)
    client.diagnostics = _RecordingDiagnostics(state.published)

    @client.feature("precompile/status")
    def on_status(params: Any) -> None:
        state.statuses.append(
            {
                k: getattr(params, k)
                for k in ("state", "findings", "done", "total")
                if hasattr(params, k)
            }
        )

    @client.feature(types.CLIENT_REGISTER_CAPABILITY)
    def on_register(params: types.RegistrationParams) -> None:
        state.registrations.extend(params.registrations)

    @client.feature(types.WORKSPACE_CODE_LENS_REFRESH)
    def on_lens_refresh(params: Any) -> None:
        state.lens_refreshes += 1

    server = client._server
    try:
        yield state
    finally:
        # Shutting down takes every worker (and every capture they forked) with it.
        below = (
            descendants(server.pid) if server is not None and server.returncode is None else set()
        )
        clean = True
        try:
            if not state.shut_down:
                await asyncio.wait_for(client.shutdown_session(), 30)
            if server is not None:
                await asyncio.wait_for(server.wait(), 30)
        except (TimeoutError, Exception):
            clean = False
        if server is not None and server.returncode is None:
            server.kill()
            clean = False
        await client.stop()
        deadline = asyncio.get_running_loop().time() + 10
        while alive(below) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        left = alive(below)
        for pid in left:
            os.kill(pid, 9)
        assert clean, "the server did not shut down when asked"
        assert not left, "the server left worker processes behind"


@pytest_asyncio.fixture
async def session(workspace: Path) -> AsyncIterator[Session]:
    """A session (``open_session``) on the test's ``workspace``."""
    async with open_session(workspace) as state:
        yield state
