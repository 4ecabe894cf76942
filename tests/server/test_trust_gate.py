"""One trust gate (trust.py): an untrusted engine runs no program of the workspace -- not
the interpreter ``[tool.precompile] python`` names, not a worker, not a capture -- and
granting trust later runs what waited for it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from precompile_lsp.config import ConfigError, load_config
from precompile_lsp.engine import Engine
from precompile_lsp.trust import TrustGate

TARGETS = """from pathlib import Path

Path(__file__).resolve().parents[2].joinpath("module-imported").write_text("imported")

import torch

import precompile


def calls():
    return [(torch.nn.Linear(2, 2), torch.ones(1, 2))]


@precompile.target(calls)
def tiny(model, x):
    return model(x) + 1
"""


def workspace(tmp_path: Path, interpreter: str) -> Path:
    """A workspace whose ``python`` is a script that leaves a marker each time it runs
    (then runs the real interpreter) and whose target's module leaves one on import."""
    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "__init__.py").write_text("")
    (root / "src" / "pkg" / "targets.py").write_text(TARGETS)
    script = root / "evil.sh"
    script.write_text(f'#!/bin/sh\necho ran >> "$(dirname "$0")/evil-ran"\n{interpreter}\n')
    script.chmod(0o755)
    (root / "pyproject.toml").write_text(
        '[tool.precompile]\nsource-roots = ["src"]\nbackend = "eager"\ntracer = "make_fx"\n'
        'python = "./evil.sh"\n'
    )
    return root


def test_an_untrusted_configuration_names_its_interpreter_without_running_it(
    tmp_path: Path,
) -> None:
    root = workspace(tmp_path, "exit 3")
    gate = TrustGate(trusted=False)
    config = load_config(root, gate=gate)
    assert config.python == str(root / "evil.sh") and not config.python_probed
    assert not (root / "evil-ran").exists()
    assert gate.deferred == ["run the interpreter [tool.precompile] python names (./evil.sh)"]
    # What can be told without running it still is: a missing interpreter is an error.
    (root / "pyproject.toml").write_text('[tool.precompile]\npython = "./missing"\n')
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(root, gate=gate)


def test_an_untrusted_engine_runs_nothing_until_trusted(tmp_path: Path) -> None:
    root = workspace(tmp_path, f'exec {sys.executable} "$@"')
    events: list[dict[str, object]] = []

    async def scenario() -> None:
        engine = Engine(root, use_cache=False, on_event=events.append)
        try:
            assert not engine.trusted
            assert await engine.check() == {}
            [decl] = engine.discover()
            refused = await engine.run_target(decl)  # a direct job is refused too
            assert refused.status.value == "cancelled" and "not trusted" in (refused.message or "")
            await engine.files_changed([root / "pyproject.toml", decl.file])
            assert not (root / "evil-ran").exists() and not (root / "module-imported").exists()
            assert engine.pool.workers == [] and not engine.pool.started
            before = engine.stats.captures
            assert any(e.get("kind") == "untrusted" for e in events)
            assert "capture pkg.targets.tiny" in engine.gate.deferred

            # Granted: the interpreter's probe runs, then the capture (in a worker started
            # with that interpreter, which imports the module).
            findings = await engine.trust()
            assert engine.config.python_probed
            assert (root / "evil-ran").read_text().count("ran") >= 2  # probe + worker
            assert (root / "module-imported").exists()
            assert engine.stats.captures == before + 1
            assert [f.code for fs in findings.values() for f in fs] == []
        finally:
            await engine.close()

    asyncio.run(scenario())


def test_trust_granted_to_a_broken_interpreter_is_the_config_error(tmp_path: Path) -> None:
    """The probe that trust enables reports what it finds, as it would at start."""
    root = workspace(tmp_path, "echo 'no python here' >&2; exit 3")

    async def scenario() -> None:
        engine = Engine(root, use_cache=False)
        try:
            with pytest.raises(ConfigError, match="does not run as a Python 3 interpreter"):
                await engine.trust()
            assert (root / "evil-ran").exists()
        finally:
            await engine.close()

    asyncio.run(scenario())
