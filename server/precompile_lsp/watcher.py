"""A debounced file watcher (watchdog) that feeds the engine the files whose content may
have changed.

Only content events count -- created, modified, moved, deleted -- never opened or
closed: the workers' own reads of the sources they import would otherwise look like
changes, and a re-check that reads the files again would never end. Only files a finding
can depend on count (``Config.may_matter``), and folders that cannot hold them --
``.git``, ``.precompile``, virtual environments, the artifact directory, caches -- are not
watched at all. Editors save atomically (a temporary file renamed over the original)
and ``git checkout`` touches many files at once: paths are collected and delivered in one
batch once the tree has been quiet for ``delay``. Whether a delivered file really
changed is the engine's call: it compares content hashes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from precompile_lsp.config import Config


class Watcher:
    def __init__(
        self,
        config: Config,
        on_change: Callable[[set[Path]], Any],
        loop: asyncio.AbstractEventLoop,
        delay: float = 0.3,
    ) -> None:
        from watchdog.events import (
            DirCreatedEvent,
            DirMovedEvent,
            FileCreatedEvent,
            FileDeletedEvent,
            FileModifiedEvent,
            FileMovedEvent,
            FileSystemEventHandler,
        )
        from watchdog.observers import Observer

        self.config = config
        self.on_change = on_change
        self.loop = loop
        self.delay = delay
        self.changed: set[Path] = set()
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None
        self.watched: set[Path] = set()
        watcher = self
        content = [FileCreatedEvent, FileModifiedEvent, FileMovedEvent, FileDeletedEvent]

        class Files(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                for raw in (event.src_path, getattr(event, "dest_path", None)):
                    if raw:
                        watcher._add(Path(str(raw)))

        class TopLevel(Files):
            """The root itself, not recursively: its own files (pyproject.toml, modules
            at the top) and new folders, which get a recursive watch of their own."""

            def on_any_event(self, event: Any) -> None:
                if isinstance(event, (DirCreatedEvent, DirMovedEvent)):
                    raw = getattr(event, "dest_path", None) or event.src_path
                    watcher._watch_folder(Path(str(raw)))
                else:
                    super().on_any_event(event)

        self.files_handler = Files()
        self.observer = Observer()
        self.observer.schedule(
            TopLevel(),
            str(config.root),
            recursive=False,
            event_filter=[*content, DirCreatedEvent, DirMovedEvent],
        )
        self.content = content
        for child in sorted(config.root.iterdir()):
            if child.is_dir():
                self._watch_folder(child)

    def _watch_folder(self, folder: Path) -> None:
        if folder in self.watched or not folder.is_dir() or self.config.is_skipped_dir(folder):
            return
        self.watched.add(folder)
        self.observer.schedule(
            self.files_handler, str(folder), recursive=True, event_filter=self.content
        )

    def _add(self, path: Path) -> None:
        if not (self.config.may_matter(path) or self.config.is_serving_log(path)):
            return
        with self.lock:
            self.changed.add(path.resolve())
            if self.timer is not None:
                self.timer.cancel()
            self.timer = threading.Timer(self.delay, self._flush)
            self.timer.daemon = True
            self.timer.start()

    def _flush(self) -> None:
        with self.lock:
            changed, self.changed = self.changed, set()
        if changed and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.on_change, changed)

    def start(self) -> None:
        self.observer.start()

    def stop(self) -> None:
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
        self.observer.stop()
        self.observer.join(timeout=5)
