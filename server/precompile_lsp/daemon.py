"""``precompile daemon``: check once, then watch the workspace and print what changes.

The watcher hands the engine every path that may have changed; the engine drops what
did not change content, so one edit is one re-check and one report, and an idle
workspace prints nothing.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from precompile_lsp.config import ConfigError
from precompile_lsp.engine import Engine
from precompile_lsp.files import shown_path
from precompile_lsp.findings import Finding
from precompile_lsp.watcher import Watcher


def _lines(findings: dict[Path, list[Finding]], root: Path) -> set[str]:
    return {
        f"{shown_path(f.file, root)}:{f.span.line}:{f.span.column + 1}: {f.severity} {f.code} {f.message}"
        for fs in findings.values()
        for f in fs
    }


def run_daemon(root: Path, files: list[Path] | None) -> int:
    async def main() -> None:
        def tell(event: dict[str, object]) -> None:
            if event["kind"] in ("log", "warning"):  # e.g. a result cache it cannot write
                print(event["message"], file=sys.stderr, flush=True)

        engine = Engine(root, trusted=True, on_event=tell)
        shown: set[str] = set()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        def report(findings: dict[Path, list[Finding]]) -> None:
            nonlocal shown
            current = _lines(findings, engine.root)
            for line in sorted(current - shown):
                print(f"+ {line}", flush=True)
            for line in sorted(shown - current):
                print(f"- {line}", flush=True)
            shown = current
            print(
                f"precompile daemon: {len(current)} findings; watching {engine.root}",
                file=sys.stderr,
                flush=True,
            )

        report(await engine.check(files))
        queue: asyncio.Queue[set[Path]] = asyncio.Queue()
        watcher = Watcher(engine.config, queue.put_nowait, loop)
        watcher.start()
        try:
            while not stop.is_set():
                getter = asyncio.create_task(queue.get())
                stopper = asyncio.create_task(stop.wait())
                done, pending = await asyncio.wait(
                    {getter, stopper}, return_when=asyncio.FIRST_COMPLETED
                )
                for task in pending:
                    task.cancel()
                if getter in done:
                    try:
                        changed = await engine.files_changed(getter.result())
                    except ConfigError as error:
                        print(f"precompile daemon: {error}", file=sys.stderr, flush=True)
                        continue
                    watcher.config = engine.config
                    if changed:
                        report(engine.findings_by_file())
        finally:
            watcher.stop()
            await engine.close()

    asyncio.run(main())
    return 0
