"""The language server's state and what it does on its own: one engine per workspace
folder, the trust decision, publishing findings placed in the version the client shows,
file watching, settings. ``server`` wires the protocol's lifecycle notifications to it
and starts it; ``server_actions`` answers the editor's requests."""

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
from precompile_lsp.findings import Finding
from precompile_lsp.lsp_convert import (
    Lines,
    Placement,
    to_diagnostic,
    uri_of,
)
from precompile_lsp.settings import Settings, parse_settings

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
