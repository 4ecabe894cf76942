"""What every ``precompile`` subcommand shares: the exit codes, the workspace a command
runs in (the folder of the nearest pyproject.toml), the files it names, and the progress
line. Imports neither torch nor pygls."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


FAIL_ON = {"error": 3, "warning": 2, "never": 99}


def workspace_root(paths: list[str]) -> Path:
    from precompile_lsp.config import find_pyproject

    start = Path(paths[0]).resolve() if paths else Path.cwd()
    if start.is_file():
        start = start.parent
    pyproject = find_pyproject(start)
    return pyproject.parent if pyproject else Path.cwd().resolve()


class OutsideWorkspace(ValueError):
    """A path named on the command line that is not inside the workspace being checked."""


def workspace_files(paths: list[str], root: Path | None = None) -> list[Path] | None:
    """The Python files ``paths`` name. With ``root``, each must lie inside it: a path
    outside the workspace would otherwise be checked against nothing and pass."""
    if not paths:
        return None
    files: list[Path] = []
    for raw in paths:
        path = Path(raw).resolve()
        if root is not None and path != root and root not in path.parents:
            raise OutsideWorkspace(
                f"{raw} is outside the workspace {root} (the folder of the nearest "
                f"pyproject.toml above the first path, else the current directory), so "
                f"nothing in it would be checked; cd into the project that holds {raw} "
                f"and run precompile check there, or name paths inside {root}"
            )
        if path.is_dir():
            files.extend(sorted(path.rglob("*.py")))
        elif path.exists():
            files.append(path)
        else:
            raise FileNotFoundError(f"no such file or directory: {raw}")
    return files


class Progress:
    """A live progress line on a terminal (stderr); silent otherwise, or with --quiet."""

    def __init__(self, quiet: bool = False) -> None:
        self.tty = sys.stderr.isatty() and not quiet

    def __call__(self, event: dict[str, Any]) -> None:
        if event["kind"] in ("log", "warning"):
            self.done()
            print(event["message"], file=sys.stderr)
            return
        if not self.tty:
            return
        if event["kind"] == "progress":
            sys.stderr.write(
                f"\r\033[Kprecompile: capturing {event['done']}/{event['total']} {event.get('target') or ''}"
            )
            sys.stderr.flush()
        elif event["kind"] == "stage":
            from precompile_lsp.stages import stage_text

            sys.stderr.write(
                f"\r\033[Kprecompile: {event['job']} {event['target']}: {stage_text(event)}"
            )
            sys.stderr.flush()

    def done(self) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
