"""`make demo`: precompile check on a copy of the bundled demo project.

The demo project (examples/demo_project) has a clean target, one whose helper
graph-breaks, one whose declared production traffic its examples do not cover, and one
whose artifact went stale. The demo works on a temporary copy, so the repository never
changes: it first emits an artifact and edits its source (the stale one), then runs
``precompile check`` and ``precompile check --emit --verify``, and serves an emitted
artifact from a fresh process -- with ``fallback=`` and a serving log in the project's
``logs/`` (which its pyproject.toml names as ``serving-logs``), fed a batch size the capture
did not see -- and shows what ``precompile coverage`` and ``precompile check`` say of it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent / "demo_project"


def precompile(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "precompile_lsp.cli", *args], cwd=cwd, capture_output=True, text=True
    )


def show(title: str, proc: subprocess.CompletedProcess[str], seconds: float) -> None:
    print(f"\n$ {title}   ({seconds:.1f} s, exit {proc.returncode})")
    print("  " + proc.stdout.rstrip().replace("\n", "\n  "))
    if proc.returncode == 2:
        print(proc.stderr, file=sys.stderr)
        raise SystemExit(1)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="precompile-demo-") as tmp:
        project = Path(tmp) / "demo_project"
        shutil.copytree(PROJECT, project)
        print(f"demo project copied to {project}")
        setup = precompile("emit", "probability", cwd=project)
        if setup.returncode != 0:
            print(setup.stderr, file=sys.stderr)
            raise SystemExit(1)
        serve = project / "src" / "recsys" / "serve.py"
        docstring = '"""Its committed artifact was emitted before the last change: stale."""'
        source = serve.read_text()
        assert docstring in source
        # Staleness is per function: the edit is inside probability itself.
        serve.write_text(
            source.replace(docstring, docstring + "\n    # changed after its artifact was emitted")
        )
        print(
            "emitted artifacts/recsys.serve.probability.py, then edited probability(): that artifact is now stale"
        )
        for args in (("check",), ("check", "--emit", "--verify"), ("check",)):
            started = time.monotonic()
            proc = precompile(*args, cwd=project)
            show("precompile " + " ".join(args), proc, time.monotonic() - started)
        code = (
            "import warnings, torch, precompile; warnings.simplefilter('ignore');"
            "from recsys.model import batch; model, users, items = batch(8);"
            "from recsys.serve import score;"
            "run = precompile.load('artifacts/recsys.serve.score.py', 'artifacts/recsys.serve.score.cache',"
            " fallback=score, serving_log='logs/');"
            "print('  served', tuple(run(model, users, items).shape), 'scores from', run);"
            "big = batch(32); run(*big); s = run.stats();"
            "print(f\"  a batch of 32 (the capture saw 8): served {s['served']}, fallback {s['fallback']}; logged in logs/\")"
        )
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=project,
            env={**__import__("os").environ, "PYTHONPATH": str(project / "src")},
            capture_output=True,
            text=True,
        )
        print(
            f"\n$ serve artifacts/recsys.serve.score.py from a fresh process   ({time.monotonic() - started:.1f} s)"
        )
        print(proc.stdout.rstrip() or proc.stderr)
        if proc.returncode != 0:
            raise SystemExit(1)
        for args in (("coverage", "logs/*.jsonl"), ("check",)):
            started = time.monotonic()
            proc = precompile(*args, cwd=project)
            show("precompile " + " ".join(args), proc, time.monotonic() - started)
        if "PC401 production refused 1 of 2 calls of `score`" not in proc.stdout:
            print("the production finding is missing", file=sys.stderr)
            raise SystemExit(1)


if __name__ == "__main__":
    main()
