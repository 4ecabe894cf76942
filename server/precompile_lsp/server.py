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

import asyncio
import logging
import sys
import threading
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method

from precompile.version import __version__
from precompile_lsp.config import ConfigError
from precompile_lsp.engine import Engine
from precompile_lsp.files import shown_path
from precompile_lsp.findings import Finding
from precompile_lsp.logfilters import quiet_answered_cancels
from precompile_lsp.lsp_convert import (
    Lines,
    Placement,
    hover_markdown,
    lens_title,
    path_of,
    to_diagnostic,
    to_range,
    uri_of,
)
from precompile_lsp.protocol import JobResult, Outcome
from precompile_lsp.serving_logs import lens_text
from precompile_lsp.settings import Settings, parse_settings
from precompile_lsp.stages import stage_percentage, stage_text
from precompile_lsp.stdio import protect_stdout

log = logging.getLogger("precompile_lsp")


class _Protocol(LanguageServerProtocol):
    """pygls's protocol, tolerant of a client that changes a document it never opened
    (pygls raises KeyError there, which the client shows as "Error in server")."""

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams) -> Any:
        document = params.text_document
        known = {unquote(uri) for uri in self.workspace.text_documents}
        if unquote(document.uri) not in known:
            changes = params.content_changes
            if not changes or not isinstance(
                changes[0], types.TextDocumentContentChangeWholeDocument
            ):
                # An edit to text we never saw cannot be applied; the next full text
                # (didOpen, or a whole-document change) brings the document in.
                log.warning(
                    "precompile: ignoring an incremental didChange of %s, which was never "
                    "opened (the client sent no didOpen)",
                    document.uri,
                )
                return
            # The whole new text: as good as a didOpen with it.
            self.workspace.put_text_document(
                types.TextDocumentItem(document.uri, "python", document.version, "")
            )
        yield from super().lsp_text_document__did_change(params)


class PrecompileServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(
            "precompile",
            __version__,
            protocol_cls=_Protocol,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
        )
        #: The process's exit status: 1 for an ``exit`` without ``shutdown`` first, as the
        #: protocol asks (pygls raises SystemExit with it inside the loop).
        self.exit_code = 0
        self.trusted = False
        self.settings = Settings()
        self.initialization_errors: list[str] = []
        self.roots: list[Path] = []
        self.engines: dict[Path, Engine] = {}
        self.shown: dict[str, list[Finding]] = {}
        self.published: dict[str, list[types.Diagnostic]] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.running = 0
        self.watchers: dict[Path, Any] = {}  # ours, when the client cannot watch files
        self.client_watches = False
        self.told_untrusted = False
        self.told: set[str] = set()  # configuration warnings already shown
        #: Listeners for the stages of running jobs, by (target key, job kind).
        self.stage_listeners: dict[tuple[str, str], Any] = {}

    # ------------------------------------------------------------ plumbing

    def start_io(self, stdin: Any = None, stdout: Any = None) -> None:
        """pygls's stdio server, with framing that survives a bad client (framing.py)."""
        from pygls.io_ import StdinAsyncReader, StdoutWriter

        from precompile_lsp import framing

        # pygls's shutdown() sets this event to end the loop.
        self._stop_event = threading.Event()
        reader = StdinAsyncReader(stdin or sys.stdin.buffer, self.thread_pool)
        writer = StdoutWriter(stdout or sys.stdout.buffer)
        self.protocol.set_writer(writer)
        try:
            asyncio.run(framing.serve(self._stop_event, reader, self.protocol, writer))
        except BrokenPipeError:
            log.error("precompile: the connection to the client is lost; shutting down")
        except KeyboardInterrupt:
            pass
        except SystemExit as exit_:
            self.exit_code = exit_.code if isinstance(exit_.code, int) else 1
        finally:
            self.shutdown()

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run in the background; a failure is logged to the client, never lost."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self.tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                error = t.exception()
                self.window_log_message(
                    types.LogMessageParams(
                        types.MessageType.Error, f"precompile: {type(error).__name__}: {error}"
                    )
                )

        task.add_done_callback(done)
        return task

    def engine_for(self, path: Path) -> Engine | None:
        path = path.resolve()
        best = None
        for root, engine in self.engines.items():
            if path == root or root in path.parents:
                if best is None or len(root.parts) > len(best[0].parts):
                    best = (root, engine)
        return best[1] if best else None

    def status(self, state: str, **extra: Any) -> None:
        findings = sum(len(f) for f in self.shown.values())
        self.protocol.notify("precompile/status", {"state": state, "findings": findings, **extra})

    def show(self, kind: types.MessageType, text: str) -> None:
        self.window_show_message(types.ShowMessageParams(kind, f"Precompile: {text}"))

    def tell_untrusted(self, refused: tuple[str, ...] = ()) -> None:
        """Say once what the trust gates of this server's engines refused and what trust
        would enable: captures, and any program a setting names (the interpreter)."""
        if self.told_untrusted:
            return
        self.told_untrusted = True
        named = [
            what
            for what in dict.fromkeys(
                [w for e in self.engines.values() for w in e.gate.deferred] + list(refused)
            )
            if what.startswith("run ")
        ]
        also = "".join(f"; it does not {what}" for what in named)
        self.show(
            types.MessageType.Warning,
            "this workspace is not trusted, so none of its programs run: no target is "
            f"captured (a capture imports its modules and calls their examples()){also}. "
            "Trust the workspace to see graph breaks and coverage gaps.",
        )

    def tell_config(self, engine: Engine) -> None:
        """A configuration's warnings (unknown keys), each once per server."""
        for warning in engine.config.warnings:
            if warning not in self.told:
                self.told.add(warning)
                self.show(types.MessageType.Warning, warning)

    # ------------------------------------------------------------ engines and findings

    def start_engines(self) -> None:
        for root in self.roots:
            if root in self.engines:
                continue
            try:
                engine = Engine(
                    root,
                    overrides=self.settings.engine_overrides(),
                    trusted=self.trusted,
                    on_event=self.on_engine_event,
                )
            except ConfigError as error:
                self.show(types.MessageType.Error, str(error))
                continue
            self.engines[root] = engine
            self.tell_config(engine)

    def on_engine_event(self, event: dict[str, Any]) -> None:
        if event["kind"] == "progress":
            # "idle" comes once the findings are published, never before.
            self.status("capturing", done=event["done"], total=event["total"])
        elif event["kind"] == "untrusted":
            self.tell_untrusted((event["what"],))
        elif event["kind"] == "stage":
            listener = self.stage_listeners.get((event["target"], event["job"]))
            if listener is not None:
                listener(event)
        elif event["kind"] == "log":
            self.window_log_message(
                types.LogMessageParams(types.MessageType.Info, event["message"])
            )
        elif event["kind"] == "warning":  # the engine says each once (a cache it cannot write)
            self.window_show_message(
                types.ShowMessageParams(types.MessageType.Warning, event["message"])
            )

    def publish(self) -> None:
        """Publish what changed of every engine's current findings; clear documents
        that have none now."""
        by_uri: dict[str, list[Finding]] = {}
        for engine in self.engines.values() if self.settings.enable else ():
            for path, findings in engine.findings_by_file().items():
                by_uri.setdefault(uri_of(path), []).extend(findings)
        placement = self.placement()
        for uri in set(by_uri) | set(self.shown):
            findings = by_uri.get(uri, [])
            if not findings and not self.shown.get(uri):
                continue
            self.shown[uri] = findings
            self.publish_uri(uri, placement)
        if self.settings.code_lens and self.client_supports_lens_refresh():
            self.spawn(self.workspace_code_lens_refresh_async(None))

    def placement(self) -> Placement:
        """Places findings in the file versions the client shows: open buffers first,
        then files on disk (read once per Placement: make one per batch)."""
        lines = Lines({u: doc.source for u, doc in self.workspace.text_documents.items()})
        return Placement(lines, self.text_of_version)

    def text_of_version(self, path: Path, version: str) -> str | None:
        engine = self.engine_for(path)
        return engine.texts.get(version) if engine is not None else None

    def visible(self, uri: str, placement: Placement | None = None) -> list[Finding]:
        """A document's findings as they apply to what the client shows now."""
        placement = placement or self.placement()
        return placement.place_all(self.shown.get(uri, []))

    def publish_uri(self, uri: str, placement: Placement | None = None) -> None:
        placement = placement or self.placement()
        codec = self.workspace.position_codec
        diagnostics = [
            to_diagnostic(f, placement.lines, codec) for f in self.visible(uri, placement)
        ]
        if self.published.get(uri) == diagnostics:
            return
        self.published[uri] = diagnostics
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=uri, diagnostics=diagnostics)
        )

    def client_supports_lens_refresh(self) -> bool:
        workspace = self.client_capabilities.workspace
        lens = getattr(workspace, "code_lens", None) if workspace else None
        return bool(getattr(lens, "refresh_support", False))

    async def check(self, engine: Engine, files: list[Path] | None = None) -> None:
        """A full check (first start, a folder added, a new configuration, Recheck)."""
        if not self.settings.enable:
            return
        if not self.trusted:
            self.tell_untrusted()
            return
        self.running += 1
        try:
            await engine.check(files)
        finally:
            self.running -= 1
        self.publish()
        if self.running == 0:
            self.status("idle")

    async def react(self, engine: Engine, files: list[Path]) -> None:
        """Files that may have changed: re-check what depends on them, publish and report
        only if something happened."""
        self.running += 1
        try:
            changed = await engine.files_changed(files)
        except ConfigError as error:
            self.show(types.MessageType.Error, f"{error}; keeping the previous configuration")
            return
        finally:
            self.running -= 1
        if not changed:
            return
        self.tell_config(engine)
        watcher = self.watchers.get(engine.root)
        if watcher is not None:
            watcher.config = engine.config
        self.publish()
        if self.running == 0:
            self.status("idle")

    def changed_paths(self, paths: list[Path]) -> None:
        """Saves and watched-file events, from the client or our own watcher."""
        if not self.settings.enable:
            return
        by_engine: dict[Engine, list[Path]] = {}
        for path in paths:
            engine = self.engine_for(path)
            if engine is not None:
                by_engine.setdefault(engine, []).append(path)
        for engine, files in by_engine.items():
            self.spawn(self.react(engine, files))

    def target_at(self, uri: str, line: int, named: list[str]) -> Any | None:
        """The target whose function (decorator to last line) holds ``line`` (0-based),
        else the first of ``named`` (targets the diagnostics under the cursor belong to)."""
        path = path_of(uri)
        engine = self.engine_for(path)
        if engine is None:
            return None
        path = path.resolve()
        for state in engine.targets.values():
            decl = state.decl
            last = max(decl.end_line, decl.definition.line)
            if decl.file == path and decl.decorator.line - 1 <= line <= last - 1:
                return decl
        return next((engine.targets[k].decl for k in named if k in engine.targets), None)

    async def register_file_watching(self) -> bool:
        """Ask the client to send workspace/didChangeWatchedFiles, so a ``git checkout`` or
        an external edit re-checks dependents; False when it cannot."""
        workspace = self.client_capabilities.workspace
        watched = getattr(workspace, "did_change_watched_files", None) if workspace else None
        if watched is None or not watched.dynamic_registration:
            return False
        try:
            await self.client_register_capability_async(
                types.RegistrationParams(
                    registrations=[
                        types.Registration(
                            id=str(uuid.uuid4()),
                            method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
                            register_options=types.DidChangeWatchedFilesRegistrationOptions(
                                watchers=[
                                    types.FileSystemWatcher(glob_pattern="**/*.py"),
                                    types.FileSystemWatcher(glob_pattern="**/pyproject.toml"),
                                    # Serving logs (re-read, never a capture).
                                    types.FileSystemWatcher(glob_pattern="**/*.jsonl"),
                                    *(
                                        types.FileSystemWatcher(glob_pattern=pattern)
                                        for pattern in sorted(
                                            {
                                                p
                                                for e in self.engines.values()
                                                for p in e.config.serving_logs
                                                if not p.endswith(".jsonl")
                                            }
                                        )
                                    ),
                                ]
                            ),
                        )
                    ]
                )
            )
        except Exception as error:  # a client that claims support but refuses
            log.warning("client/registerCapability failed (%s); watching files ourselves", error)
            return False
        return True

    def start_watchers(self) -> None:
        from precompile_lsp.watcher import Watcher

        loop = asyncio.get_running_loop()
        for root, engine in self.engines.items():
            if root not in self.watchers:
                watcher = Watcher(
                    engine.config, lambda changed: self.changed_paths(sorted(changed)), loop
                )
                watcher.start()
                self.watchers[root] = watcher

    async def close_engine(self, root: Path) -> None:
        watcher = self.watchers.pop(root, None)
        if watcher is not None:
            watcher.stop()
        engine = self.engines.pop(root, None)
        if engine is not None:
            await engine.close()

    # ------------------------------------------------------------ commands

    async def run_command(self, name: str, uri: str, key: str) -> str:
        if not self.trusted:
            self.tell_untrusted()
            return "Precompile: not trusted; nothing was run"
        path = path_of(uri)
        engine = self.engine_for(path)
        if engine is None:
            return f"Precompile: {uri} is not in a workspace folder"
        state = engine.targets.get(key)
        if state is None:
            await engine.discover_async([path])
            state = engine.targets.get(key)
        if state is None:
            return f"Precompile: no target {key} in {path.name}"
        kind = "emit" if name == "precompile.emit" else "verify"
        token = str(uuid.uuid4())
        progress = self.supports_progress()
        task = asyncio.current_task()
        if progress:
            await self.work_done_progress.create_async(token)
            future = self.work_done_progress.tokens.get(token)
            if future is not None and task is not None:
                future.add_done_callback(lambda f: task.cancel() if f.cancelled() else None)
            self.work_done_progress.begin(
                token,
                types.WorkDoneProgressBegin(
                    title=f"Precompile: {kind} {state.decl.function}",
                    cancellable=True,
                    message="starting",
                    percentage=0,
                ),
            )

            def on_stage(event: dict[str, Any]) -> None:
                self.work_done_progress.report(
                    token,
                    types.WorkDoneProgressReport(
                        message=stage_text(event), percentage=stage_percentage(event)
                    ),
                )

            self.stage_listeners[(state.decl.key, kind)] = on_stage
        try:
            if kind == "verify":
                result = await engine.verify(state.decl)
            else:
                result = await engine.emit(state.decl)
            if progress:
                self.work_done_progress.report(
                    token,
                    types.WorkDoneProgressReport(message="refreshing findings", percentage=98),
                )
            self.publish()
            if self.running == 0:
                self.status("idle")  # the findings count may have changed
            message = _command_message(kind, state.decl, result, engine)
        except asyncio.CancelledError:
            message = f"Precompile: {kind} of {state.decl.function} cancelled"
        finally:
            self.stage_listeners.pop((state.decl.key, kind), None)
        if progress:
            self.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))
            self.work_done_progress.tokens.pop(token, None)  # pygls keeps every token otherwise
        self.window_show_message(types.ShowMessageParams(types.MessageType.Info, message))
        return message

    def supports_progress(self) -> bool:
        window = self.client_capabilities.window
        return bool(window and window.work_done_progress)

    async def refresh_settings(self) -> None:
        workspace = self.client_capabilities.workspace
        if not (workspace and workspace.configuration):
            return
        try:
            values = await self.workspace_configuration_async(
                types.ConfigurationParams(items=[types.ConfigurationItem(section="precompile")])
            )
        except Exception as error:  # a client that fails the request keeps our settings
            log.warning("workspace/configuration failed: %s", error)
            return
        self.apply_settings(values[0] if values else None)

    def apply_settings(self, raw: Any) -> None:
        settings, errors = parse_settings(raw, self.settings)
        for error in errors:
            self.show(types.MessageType.Warning, f"{error}; keeping the previous value")
        enabled = settings.enable and not self.settings.enable
        changed = settings != self.settings
        self.settings = settings
        if changed:
            for engine in self.engines.values():
                if self.reconfigure(engine):
                    self.spawn(self.reread_logs(engine))
            self.publish()
        if enabled and self.trusted:
            for engine in self.engines.values():
                self.spawn(self.check(engine))

    async def reread_logs(self, engine: Engine) -> None:
        """Re-read the serving logs a new configuration names, and publish."""
        if await engine.refresh_serving_logs():
            self.publish()

    def reconfigure(self, engine: Engine) -> bool:
        try:
            engine.reconfigure(self.settings.engine_overrides())
        except ConfigError as error:
            self.show(types.MessageType.Error, f"{error}; keeping the previous configuration")
            return False
        self.tell_config(engine)
        return True


def _command_message(kind: str, decl: Any, result: JobResult, engine: Engine) -> str:
    if result.status is Outcome.CANCELLED:
        return f"Precompile: {kind} of {decl.function} was superseded by a newer run"
    if result.status.failed:
        return f"Precompile: {kind} of {decl.function} failed: {result.message}"
    if result.failure is not None:
        return f"Precompile: {kind} of {decl.function} failed: {result.failure.message}"
    if kind == "emit":
        artifact, _ = engine.artifact_of(decl)
        return f"Precompile: emitted {shown_path(artifact, engine.root)}"
    failures = result.verify_failures
    state = engine.targets.get(decl.key)
    stale = bool(state and state.artifact and state.artifact.stale)
    if failures or stale:
        problems = [f"{len(failures)} failure{'s' * (len(failures) != 1)}"] if failures else []
        if stale:
            problems.append("stale: its sources changed since it was emitted")
        return f"Precompile: {decl.function}'s artifact failed verification ({'; '.join(problems)})"
    return f"Precompile: {decl.function}'s artifact verified against eager"


SERVER = PrecompileServer()


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


@SERVER.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(
        code_action_kinds=[types.CodeActionKind.QuickFix, types.CodeActionKind.Source]
    ),
)
def on_code_action(ls: PrecompileServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    if not ls.trusted:
        return []
    uri = params.text_document.uri
    only = params.context.only
    actions: list[types.CodeAction] = []

    def wanted(kind: str) -> bool:
        return not only or any(kind.startswith(o) for o in only)

    named = []
    for diagnostic in params.context.diagnostics:
        data = diagnostic.data if isinstance(diagnostic.data, dict) else {}
        if not data.get("target"):
            continue
        named.append(data["target"])
        if data.get("fix") == "emit" and wanted(types.CodeActionKind.QuickFix):
            actions.append(
                types.CodeAction(
                    title="Re-emit precompile artifact",
                    kind=types.CodeActionKind.QuickFix,
                    diagnostics=[diagnostic],
                    is_preferred=True,
                    command=types.Command(
                        title="Re-emit precompile artifact",
                        command="precompile.emit",
                        arguments=[uri, data["target"]],
                    ),
                )
            )
    decl = ls.target_at(uri, params.range.start.line, named)
    if decl is not None and wanted(types.CodeActionKind.Source):
        for title, command in (
            ("Emit precompile artifact", "precompile.emit"),
            ("Verify artifact", "precompile.verify"),
        ):
            actions.append(
                types.CodeAction(
                    title=title,
                    kind=types.CodeActionKind.Source + ".precompile",
                    command=types.Command(
                        title=title, command=command, arguments=[uri_of(decl.file), decl.key]
                    ),
                )
            )
    return actions


@SERVER.feature(types.TEXT_DOCUMENT_CODE_LENS)
def on_code_lens(ls: PrecompileServer, params: types.CodeLensParams) -> list[types.CodeLens]:
    if not ls.settings.code_lens:
        return []
    path = path_of(params.text_document.uri).resolve()
    engine = ls.engine_for(path)
    if engine is None:
        return []
    lines = ls.placement().lines
    lenses = []
    for state in engine.targets.values():
        if state.decl.file != path:
            continue
        where = to_range(state.decl.decorator, lines.of(path), ls.workspace.position_codec)
        uri = uri_of(path)
        if not ls.trusted:
            title = "precompile: not run (workspace not trusted)"
        else:
            title = lens_title(state.result, rechecking=engine.running(state.decl))
        production = engine.production.current.get(state.decl.key) if engine.production else None
        if production is not None:
            title = f"{title} · {lens_text(production)}"
        lenses.append(types.CodeLens(range=where, command=types.Command(title=title, command="")))
        if ls.trusted:
            lenses.append(
                types.CodeLens(
                    range=where,
                    command=types.Command(
                        title="Emit", command="precompile.emit", arguments=[uri, state.decl.key]
                    ),
                )
            )
            lenses.append(
                types.CodeLens(
                    range=where,
                    command=types.Command(
                        title="Verify", command="precompile.verify", arguments=[uri, state.decl.key]
                    ),
                )
            )
    return lenses


@SERVER.feature(types.TEXT_DOCUMENT_HOVER)
def on_hover(ls: PrecompileServer, params: types.HoverParams) -> types.Hover | None:
    line = params.position.line + 1
    for finding in ls.visible(params.text_document.uri):
        if (
            finding.code in ("PC101", "PC201", "PC103", "PC202", "PC001")
            and finding.span.line <= line <= finding.span.end_line
        ):
            return types.Hover(
                contents=types.MarkupContent(
                    kind=types.MarkupKind.Markdown, value=hover_markdown(finding)
                )
            )
    return None


@SERVER.command("precompile.emit")
async def cmd_emit(ls: PrecompileServer, uri: str, key: str) -> str:
    return await ls.run_command("precompile.emit", uri, key)


@SERVER.command("precompile.verify")
async def cmd_verify(ls: PrecompileServer, uri: str, key: str) -> str:
    return await ls.run_command("precompile.verify", uri, key)


@SERVER.command("precompile.recheck")
async def cmd_recheck(ls: PrecompileServer, *args: Any) -> str:
    if not ls.trusted:
        ls.tell_untrusted()
        return "Precompile: not trusted; nothing was run"
    for engine in ls.engines.values():
        await ls.check(engine)
    return "Precompile: workspace rechecked"


@SERVER.feature("precompile/stats")
def on_stats(ls: PrecompileServer, params: Any) -> list[dict[str, Any]]:
    """What each engine has done so far: jobs handed to workers, captures, cache hits,
    re-check batches. For a client's status view, and for telling that the server is
    quiet when nothing changes."""
    return [
        {
            "root": str(root),
            "jobs": engine.stats.jobs,
            "captures": engine.stats.captures,
            "cacheHits": engine.stats.cache_hits,
            "emits": engine.stats.emits,
            "verifies": engine.stats.verifies,
            "rechecks": engine.stats.rechecks,
            "targets": len(engine.targets),
        }
        for root, engine in ls.engines.items()
    ]


def main() -> None:
    channel = protect_stdout(binary=True)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    quiet_answered_cancels()
    SERVER.start_io(stdin=sys.stdin.buffer, stdout=channel)
    if SERVER.exit_code:
        sys.exit(SERVER.exit_code)


if __name__ == "__main__":
    main()
