"""The language server: ``precompile lsp`` / ``python -m precompile_lsp`` over stdio.

A thin dispatcher over one engine per workspace folder. It never imports torch (captures
run in worker processes) and protects the protocol channel first thing: fd 1 becomes a
private duplicate that only the protocol writes to, and the real fd 1 is pointed at
stderr, so a stray print -- ours, a library's, a C extension's -- cannot corrupt the
stream. Captures run user code, so they run only when the client says the workspace is
trusted (initialization option ``trusted``); otherwise the server says so once and
offers nothing that executes code.

Every way a file can change -- ``didSave``, the client's watched-file events, our own
watcher for clients that do not watch -- goes to ``Engine.files_changed``, which drops
what did not change content and coalesces the rest, so one save is one re-check. Findings
stay published until their replacement is ready: a re-check never clears a file first.
A finding computed against an older version of a file is placed in the version the
client shows (the buffer being edited, the file as saved) by a line diff, or hidden when
its own line changed. Status notifications are sent only when something happens.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from lsprotocol import types

from precompile_lsp import server_actions
from precompile_lsp.logfilters import quiet_answered_cancels
from precompile_lsp.lsp_convert import path_of
from precompile_lsp.server_state import PrecompileServer
from precompile_lsp.settings import parse_settings
from precompile_lsp.stdio import protect_stdout

SERVER = PrecompileServer()
server_actions.register(SERVER)


@SERVER.feature(types.INITIALIZE)
def on_initialize(ls: PrecompileServer, params: types.InitializeParams) -> None:
    options = params.initialization_options or {}
    trusted = options.get("trusted", False) if isinstance(options, dict) else False
    ls.trusted = trusted is True
    if isinstance(options, dict):
        ls.settings, ls.initialization_errors = parse_settings(options.get("settings", options))
    folders = params.workspace_folders or []
    roots = [path_of(f.uri) for f in folders]
    if not roots and params.root_uri:
        roots = [path_of(params.root_uri)]
    elif not roots and params.root_path:
        roots = [Path(params.root_path)]
    ls.roots = [r.resolve() for r in roots if str(r)]


@SERVER.feature(types.INITIALIZED)
async def on_initialized(ls: PrecompileServer, params: types.InitializedParams) -> None:
    for error in ls.initialization_errors:
        ls.show(types.MessageType.Warning, f"{error}; using the default")
    ls.start_engines()
    await ls.refresh_settings()
    ls.client_watches = await ls.register_file_watching()
    if not ls.client_watches:
        ls.start_watchers()
    if not ls.trusted:
        ls.tell_untrusted()
        for engine in ls.engines.values():
            await engine.discover_async()
            await engine.refresh_serving_logs()  # reading logs runs no workspace code
        ls.publish()
        ls.status("idle")
        return
    for engine in ls.engines.values():
        ls.spawn(ls.check(engine))


@SERVER.feature(types.SHUTDOWN)
async def on_shutdown(ls: PrecompileServer, params: Any) -> None:
    for root in list(ls.engines):
        await ls.close_engine(root)


@SERVER.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)
async def on_folders(ls: PrecompileServer, params: types.DidChangeWorkspaceFoldersParams) -> None:
    """One engine per folder: removed folders lose theirs (and their diagnostics), added
    ones get one and a first check."""
    for folder in params.event.removed:
        root = path_of(folder.uri).resolve()
        await ls.close_engine(root)
        if root in ls.roots:
            ls.roots.remove(root)
    added = [path_of(f.uri).resolve() for f in params.event.added]
    ls.roots.extend(r for r in added if r not in ls.roots)
    ls.start_engines()
    if not ls.client_watches:
        ls.start_watchers()
    ls.publish()
    for root in added:
        engine = ls.engines.get(root)
        if engine is not None and ls.trusted:
            ls.spawn(ls.check(engine))
        elif engine is not None:
            await engine.discover_async()


@SERVER.feature(types.TEXT_DOCUMENT_DID_OPEN)
def on_open(ls: PrecompileServer, params: types.DidOpenTextDocumentParams) -> None:
    """A buffer may differ from the file its findings were computed from: place them in
    it. Opening a file whose targets were never checked checks them."""
    uri = params.text_document.uri
    path = path_of(uri)
    if ls.shown.get(uri):
        ls.publish_uri(uri)
    engine = ls.engine_for(path)
    if engine is None or not path.suffix == ".py" or not ls.trusted:
        return
    unchecked = [
        s
        for s in engine.targets.values()
        if s.decl.file == path.resolve() and s.result is None and not engine.running(s.decl)
    ]
    if unchecked:
        ls.spawn(ls.check(engine, [path]))


@SERVER.feature(types.TEXT_DOCUMENT_DID_SAVE)
def on_save(ls: PrecompileServer, params: types.DidSaveTextDocumentParams) -> None:
    uri = params.text_document.uri
    if ls.shown.get(uri):
        ls.publish_uri(uri)  # placed in the saved text until the new result lands
    if ls.settings.run_on_save:
        ls.changed_paths([path_of(uri)])


@SERVER.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def on_change(ls: PrecompileServer, params: types.DidChangeTextDocumentParams) -> None:
    uri = params.text_document.uri
    if ls.shown.get(uri):
        ls.publish_uri(uri)


@SERVER.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def on_close(ls: PrecompileServer, params: types.DidCloseTextDocumentParams) -> None:
    """Closing without saving discards the edits: the findings describe the file again."""
    uri = params.text_document.uri
    if ls.shown.get(uri):
        ls.publish_uri(uri)


@SERVER.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
def on_watched(ls: PrecompileServer, params: types.DidChangeWatchedFilesParams) -> None:
    ls.changed_paths([path_of(c.uri) for c in params.changes])


@SERVER.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
async def on_configuration(
    ls: PrecompileServer, params: types.DidChangeConfigurationParams
) -> None:
    settings = params.settings.get("precompile") if isinstance(params.settings, dict) else None
    if settings is not None:
        ls.apply_settings(settings)
    else:
        await ls.refresh_settings()


def main() -> None:
    channel = protect_stdout(binary=True)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    quiet_answered_cancels()
    SERVER.start_io(stdin=sys.stdin.buffer, stdout=channel)
    if SERVER.exit_code:
        sys.exit(SERVER.exit_code)


if __name__ == "__main__":
    main()
