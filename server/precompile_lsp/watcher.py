"""A debounced file watcher (watchdog) that feeds the engine changed Python files.

Editors save atomically (write a temporary file, rename it over the original) and
``git checkout`` touches many files at once: every create, modify and move destination
is collected, and the batch is delivered once the tree has been quiet for ``delay``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Watcher:
    def __init__(
        self,
        root: Path,
        on_change: Callable[[set[Path]], Any],
        loop: asyncio.AbstractEventLoop,
        delay: float = 0.3,
    ) -> None:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        self.root = root
        self.on_change = on_change
        self.loop = loop
        self.delay = delay
        self.changed: set[Path] = set()
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None
        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                if event.is_directory:
                    return
                for raw in (getattr(event, "src_path", None), getattr(event, "dest_path", None)):
                    if raw and str(raw).endswith(".py") and "/." not in str(raw):
                        watcher._add(Path(str(raw)))

        self.observer = Observer()
        self.observer.schedule(Handler(), str(root), recursive=True)

    def _add(self, path: Path) -> None:
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
        if changed:
            self.loop.call_soon_threadsafe(self.on_change, changed)

    def start(self) -> None:
        self.observer.start()

    def stop(self) -> None:
        self.observer.stop()
        self.observer.join(timeout=5)
