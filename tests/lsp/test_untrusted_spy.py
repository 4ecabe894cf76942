"""The real language server, started as VS Code starts it (in the workspace folder), on a
hostile untrusted workspace: a spy inside the server process records every process it
starts and every module it executes, and none is the workspace's -- at start, after a
pyproject.toml change, after didOpen and didSave. Trust granted (the editor restarts the
server with ``trusted``), the probe and a capture do happen."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from lsprotocol import types
from pytest_lsp import ClientServerConfig

from tests.harness import fresh_env
from tests.lsp.conftest import Session, _read_code_actions_as_sent, alive, descendants

#: Loaded by ``site`` in the server (it is on PYTHONPATH): logs, as JSON lines, every
#: process start (audit events and the calls themselves) and every module whose code is
#: executed from a file, with that file.
SPY = r"""
import json, os, sys
_LOG = os.environ.get("PRECOMPILE_SPY_LOG")
def _record(kind, detail):
    if _LOG:
        with open(_LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps({"pid": os.getpid(), "kind": kind, "detail": detail}) + "\n")
_STARTS = ("subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.fork",
           "os.forkpty", "pty.spawn")
def _hook(event, args):
    if event in _STARTS:
        _record("start", [event, repr(args)[:400]])
    elif event == "import":
        _record("import", args[0])
if _LOG:
    sys.addaudithook(_hook)
    import importlib._bootstrap_external as _external
    _exec_module = _external._LoaderBasics.exec_module
    def _exec_spied(self, module):
        _record("exec", [module.__name__, getattr(module.__spec__, "origin", None)])
        return _exec_module(self, module)
    _external._LoaderBasics.exec_module = _exec_spied
"""

TARGETS = """from pathlib import Path

Path(__file__).resolve().parents[2].joinpath("module-imported").write_text("imported")

import torch

import precompile


def calls():
    Path(__file__).resolve().parents[2].joinpath("examples-ran").write_text("ran")
    return [(torch.nn.Linear(2, 2), torch.ones(1, 2))]


@precompile.target(calls)
def tiny(model, x):
    return model(x) + 1
"""

PYPROJECT = """[tool.precompile]
source-roots = ["src"]
backend = "eager"
tracer = "make_fx"
python = "./evil.sh"
"""

MARKERS = ("evil-ran", "module-imported", "examples-ran", "decoy-imported")


def hostile_workspace(tmp_path: Path) -> Path:
    root = tmp_path / "hostile"
    (root / "src" / "evilpkg").mkdir(parents=True)
    (root / "src" / "evilpkg" / "__init__.py").write_text("")
    (root / "src" / "evilpkg" / "targets.py").write_text(TARGETS)
    for name in ("evil.sh", "evil2.sh"):  # runs the real interpreter, once it has marked
        script = root / name
        script.write_text(
            f'#!/bin/sh\necho "$@" >> "$(dirname "$0")/evil-ran"\nexec {sys.executable} "$@"\n'
        )
        script.chmod(0o755)
    # The folder the editor starts the server in: a module named like one the server
    # imports would run if the folder were on its sys.path.
    (root / "pygls.py").write_text(
        "from pathlib import Path\nPath(__file__).with_name('decoy-imported').write_text('x')\n"
    )
    (root / "pyproject.toml").write_text(PYPROJECT)
    return root


@contextlib.asynccontextmanager
async def server_in(root: Path, log: Path, spy: Path) -> AsyncIterator[Session]:
    """A server started in ``root`` (as VS Code does) with the spy loaded; shut down and
    checked for leftover processes on the way out."""
    config = ClientServerConfig(
        server_command=[
            "/bin/sh",
            "-c",
            'cd "$1" && exec "$2" -m precompile_lsp',
            "sh",
            str(root),
            sys.executable,
        ],
        server_env=fresh_env(
            PYTHONPATH=f"{spy}:{fresh_env()['PYTHONPATH']}", PRECOMPILE_SPY_LOG=str(log)
        ),
    )
    client = await config.start()
    _read_code_actions_as_sent(client)
    session = Session(client, root)

    @client.feature("precompile/status")
    def on_status(params: Any) -> None:
        session.statuses.append({"state": getattr(params, "state", None)})

    @client.feature(types.CLIENT_REGISTER_CAPABILITY)
    def on_register(params: types.RegistrationParams) -> None:
        session.registrations.extend(params.registrations)

    @client.feature(types.WORKSPACE_CODE_LENS_REFRESH)
    def on_lens_refresh(params: Any) -> None:
        session.lens_refreshes += 1

    server = client._server
    assert server is not None
    try:
        yield session
    finally:
        below = descendants(server.pid)
        await asyncio.wait_for(client.shutdown_session(), 60)
        await asyncio.wait_for(server.wait(), 30)
        await client.stop()
        deadline = asyncio.get_running_loop().time() + 10
        while alive(below) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        assert not alive(below), "the server left processes behind"


def spied(log: Path) -> list[dict[str, object]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def warnings(session: Session) -> list[str]:
    return [m.message for m in session.client.messages if m.type == types.MessageType.Warning]


async def test_the_untrusted_server_starts_and_imports_nothing_of_the_workspace(
    tmp_path: Path,
) -> None:
    root = hostile_workspace(tmp_path)
    spy = tmp_path / "spy"
    spy.mkdir()
    (spy / "sitecustomize.py").write_text(SPY)
    untrusted_log, trusted_log = tmp_path / "untrusted.log", tmp_path / "trusted.log"
    targets = root / "src" / "evilpkg" / "targets.py"

    async with server_in(root, untrusted_log, spy) as session:
        await session.start(trusted=False)
        await session.settled()
        # Told once what trust would enable, naming the interpreter it did not run.
        [told] = warnings(session)
        assert "not trusted" in told and "Trust the workspace" in told
        assert "./evil.sh" in told, told

        # A pyproject.toml change: the new interpreter is read (its unknown key is
        # reported, which tells that the change was processed), not run.
        (root / "pyproject.toml").write_text(
            PYPROJECT.replace("./evil.sh", "./evil2.sh") + "unknown-key = 1\n"
        )
        session.client.workspace_did_change_watched_files(
            types.DidChangeWatchedFilesParams(
                changes=[
                    types.FileEvent(
                        uri=(root / "pyproject.toml").as_uri(), type=types.FileChangeType.Changed
                    )
                ]
            )
        )
        await session.until(
            lambda: any("unknown-key" in w for w in warnings(session)), "the new configuration"
        )

        # Opening and saving a target's file.
        session.open("src/evilpkg/targets.py")
        await session.save("src/evilpkg/targets.py", targets.read_text() + "\n# saved\n")
        await asyncio.sleep(3)
        assert descendants(session.server_pid) == set()
        lenses = await session.client.text_document_code_lens_async(
            types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=targets.as_uri()))
        )
        assert [lens.command.title for lens in lenses or [] if lens.command] == [
            "precompile: not run (workspace not trusted)"
        ]

    assert [m for m in MARKERS if (root / m).exists()] == []
    records = spied(untrusted_log)
    assert any(r["kind"] == "exec" for r in records), "the spy did not record anything"
    assert [r for r in records if r["kind"] == "start"] == []
    executed_from_workspace = [
        r
        for r in records
        if r["kind"] == "exec"
        and isinstance(r["detail"], list)
        and str(r["detail"][1] or "").startswith(str(root))
    ]
    assert executed_from_workspace == []
    assert not any(
        r["kind"] == "import" and str(r["detail"]).split(".")[0] == "evilpkg" for r in records
    )

    # Trust granted: the editor restarts the server with `trusted`. The interpreter's
    # probe runs, a worker starts with it, and the target is captured.
    (root / "pyproject.toml").write_text(PYPROJECT)
    async with server_in(root, trusted_log, spy) as session:
        await session.start(trusted=True)
        await session.until(lambda: (root / "examples-ran").exists(), "a capture")
        await session.settled()
        assert warnings(session) == []
    ran = (root / "evil-ran").read_text()
    assert "-c import sys" in ran and "-m precompile_lsp.worker" in ran  # probe, worker
    assert (root / "module-imported").exists()
    assert not (root / "decoy-imported").exists()  # the folder is never on the server's path
    server_starts = [
        r for r in spied(trusted_log) if r["kind"] == "start" and "evil.sh" in str(r["detail"])
    ]
    assert server_starts, "the trusted server's starts of the interpreter were not seen"
