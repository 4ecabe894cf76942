"""Every ``[tool.precompile]`` key reaches where it acts, and is validated where it is read:
a bad value is an error naming the key and the file; an unknown key is a warning naming
it; ``tracer`` and ``backend`` are part of what a cached result is keyed by."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest

from precompile_lsp.config import Config, ConfigError, load_config
from precompile_lsp.engine import Engine
from precompile_lsp.protocol import JobKind
from precompile_lsp.trust import TrustGate
from tests.harness import precompile_cli

TARGETS = """import torch
from torch import nn

import precompile


def calls():
    torch.manual_seed(0)
    return [(nn.Linear(4, 2).eval(), torch.randn(3, 4))]


@precompile.target(calls)
def plain(model, x):
    return model(x).relu()
"""


def workspace(tmp_path: Path, table: str) -> Path:
    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "__init__.py").write_text("")
    (root / "src" / "pkg" / "targets.py").write_text(TARGETS)
    (root / "pyproject.toml").write_text(f"[tool.precompile]\n{table}\n")
    return root


def config_of(tmp_path: Path, table: str, gate: TrustGate | None = None) -> Config:
    root = tmp_path / "ws"
    if root.exists():
        (root / "pyproject.toml").write_text(f"[tool.precompile]\n{table}\n")
        return load_config(root, gate=gate)
    return load_config(workspace(tmp_path, table), gate=gate)


# ------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "table, fragment",
    [
        ("timeout = nan", "timeout must be a finite positive number"),
        ("timeout = inf", "timeout must be a finite positive number"),
        ("timeout = -1", "timeout must be a finite positive number"),
        ("timeout = 0", "timeout must be a finite positive number"),
        ('timeout = "10"', "timeout must be a finite positive number"),
        ("timeout = true", "timeout must be a finite positive number"),
        ('backend = "tvm"', "backend must be one of inductor, eager"),
        ('tracer = "fx"', "tracer must be one of dynamo, make_fx"),
        ("workers = 0", "workers must be a positive integer"),
        ("workers = 1.5", "workers must be a positive integer"),
        ("source-roots = 3", "source-roots must be a string or a list of strings"),
        ("include = [1]", "include must be a string or a list of strings"),
        ("exclude = {}", "exclude must be a string or a list of strings"),
        ("artifact-dir = 5", "artifact-dir must be a path"),
        ('severity = "error"', "severity must be a table"),
        ('severity = { PC101 = "loud" }', "severity.PC101 must be one of error, warning"),
        ('severity = { E501 = "error" }', "keys are finding codes like PC101"),
        ('python = "no/such/python"', "python names an interpreter that does not exist"),
        ("python = 3", "python must be the path of a Python interpreter"),
    ],
)
def test_a_bad_value_names_the_key_and_the_file(tmp_path: Path, table: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as raised:
        config_of(tmp_path, table)
    message = str(raised.value)
    assert fragment in message
    assert str(tmp_path / "ws" / "pyproject.toml") in message


def test_an_interpreter_that_does_not_run_is_a_config_error(tmp_path: Path) -> None:
    fake = tmp_path / "python-that-fails"
    fake.write_text("#!/bin/sh\necho 'no such module' >&2\nexit 3\n")
    fake.chmod(0o755)
    not_executable = tmp_path / "python-not-executable"
    not_executable.write_text("")
    trusted = TrustGate(trusted=True)
    with pytest.raises(ConfigError, match=r"python does not run as a Python 3 interpreter"):
        config_of(tmp_path, f'python = "{fake}"', trusted)
    with pytest.raises(ConfigError, match=r"python is not an executable file"):
        config_of(tmp_path, f'python = "{not_executable}"', trusted)
    # ...and the CLI says so, with exit 2, not "internal error".
    root = workspace(tmp_path / "cli", f'python = "{fake}"')
    proc = precompile_cli("check", cwd=root)
    assert proc.returncode == 2
    assert "does not run as a Python 3 interpreter" in proc.stderr
    assert "internal error" not in proc.stderr


def test_an_unknown_key_is_a_warning_naming_it(tmp_path: Path) -> None:
    config = config_of(tmp_path, 'backend = "eager"\nbakend = "eager"')
    [warning] = config.warnings
    assert "bakend is not a known key" in warning and "pyproject.toml" in warning
    assert config.backend == "eager"  # the rest applies


#: Values the editor and [tool.precompile] both set, each bad in one way: (the key in
#: pyproject.toml, its editor name, the value, what the one message says).
BAD_SHARED_VALUES = [
    ("timeout", "timeout", -1, "must be a finite positive number of seconds"),
    ("timeout", "timeout", math.nan, "must be a finite positive number of seconds"),
    ("timeout", "timeout", True, "must be a finite positive number of seconds"),
    ("severity", "severity", "error", "must be a table"),
    ("severity", "severity", {"E501": "error"}, "keys are finding codes like PC101"),
    ("severity", "severity", {"PC101": "loud"}, ".PC101 must be one of error, warning"),
    ("docs-url", "docsUrl", "docs/diag.md", "must be the http(s) URL"),
    ("docs-url", "docsUrl", 3, "must be the http(s) URL"),
    ("serving-logs", "servingLogs", 3, "must be a string or a list of strings"),
    ("serving-logs", "servingLogs", ["logs/*.jsonl", ""], "not empty strings"),
]


def _toml(value: object) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return json.dumps(value)  # true, numbers, strings and lists are written alike


@pytest.mark.parametrize(("key", "editor", "value", "said"), BAD_SHARED_VALUES)
def test_editor_settings_and_the_table_refuse_alike(
    tmp_path: Path, key: str, editor: str, value: object, said: str
) -> None:
    """One set of rules (``config.VALUE_RULES``): a value the editor sends is refused by
    the server's settings exactly as ``load_config`` refuses it as an override, and the
    same value in pyproject.toml is refused for the same reason."""
    from precompile_lsp.settings import Settings, parse_settings

    root = workspace(tmp_path, "")
    with pytest.raises(ConfigError) as info:
        load_config(root, {key: value})
    kept, errors = parse_settings({editor: value})
    assert errors == [str(info.value)]
    assert kept == Settings()
    assert str(info.value).startswith(
        f"the editor setting precompile.{editor}{' ' if said[0] != '.' else ''}"
    )
    assert said in str(info.value) and "(from the editor)" in str(info.value)
    in_table = tmp_path / "table"
    in_table.mkdir()
    (in_table / "pyproject.toml").write_text(f"[tool.precompile]\n{key} = {_toml(value)}\n")
    with pytest.raises(ConfigError) as table_info:
        load_config(in_table)
    assert said in str(table_info.value) and f"[tool.precompile] {key}" in str(table_info.value)


def test_editor_overrides_are_named_as_editor_settings(tmp_path: Path) -> None:
    root = workspace(tmp_path, "")
    with pytest.raises(ConfigError, match=r"the editor setting precompile.timeout"):
        load_config(root, {"timeout": math.inf})


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("cache-dir", "a-file", "the option --cache-dir names a file, not a folder"),
        ("workers", 0, "the option --jobs must be a positive integer"),
    ],
)
def test_check_options_are_named_as_options(
    tmp_path: Path, key: str, value: object, said: str
) -> None:
    """``precompile check``'s options reach the configuration as overrides too; an error
    in one names the option the user typed, not an editor setting."""
    root = workspace(tmp_path, "")
    (root / "a-file").write_text("")
    if key == "cache-dir":
        value = str(root / "a-file")
    with pytest.raises(ConfigError) as info:
        load_config(root, {key: value})
    assert str(info.value).startswith(said), info.value
    assert str(info.value).endswith("(on the command line)"), info.value


# ------------------------------------------------------------ each key reaches where it acts


def test_paths_keys_reach_discovery_and_artifacts(tmp_path: Path) -> None:
    root = workspace(tmp_path, 'source-roots = ["src"]\nartifact-dir = "out/arts"')
    (root / "src" / "pkg" / "skipped.py").write_text(TARGETS)
    (root / "src" / "pkg" / "gen").mkdir()
    (root / "src" / "pkg" / "gen" / "made.py").write_text(TARGETS)
    (root / "pyproject.toml").write_text(
        "[tool.precompile]\n"
        'source-roots = ["src"]\n'
        'artifact-dir = "out/arts"\n'
        'include = ["src/**/*.py"]\n'
        'exclude = ["src/pkg/skipped.py", "src/pkg/gen/**"]\n'
    )
    engine = Engine(root)
    found = sorted(d.key for d in engine.discover())
    assert found == ["pkg.targets.plain"]  # include/exclude applied; module from the root
    decl = engine.targets["pkg.targets.plain"].decl
    artifact, declared = engine.emit_paths.artifact_of(decl)
    assert artifact == (root / "out" / "arts" / "pkg.targets.plain.py").resolve()
    assert not declared
    job = engine.requests.job_request(decl, JobKind.EMIT)
    assert job.artifact == str(artifact)
    assert job.source_roots == [str((root / "src").resolve())]
    # The artifact directory is never searched for targets nor watched.
    assert engine.config.is_skipped_dir(root / "out" / "arts")
    assert engine.config.is_skipped_dir(root / "src" / "pkg" / "gen")


def test_run_keys_reach_the_jobs(tmp_path: Path) -> None:
    root = workspace(
        tmp_path,
        'backend = "eager"\ntracer = "make_fx"\ntimeout = 7.5\nworkers = 2\n'
        f"python = {json.dumps(sys.executable)}\n"
        'severity = { PC101 = "error", PC302 = "off" }',
    )
    engine = Engine(root, trusted=True)  # starting a worker runs the workspace's python
    [decl] = engine.discover()
    job = engine.requests.job_request(decl, JobKind.CHECK)
    assert (job.backend, job.tracer, job.timeout) == ("eager", "make_fx", 7.5)
    assert engine.config.severity == {"PC101": "error", "PC302": "off"}
    assert engine.config.python == os.path.realpath(sys.executable) or engine.config.python == (
        sys.executable
    )

    async def spawn() -> list[str]:
        await engine.pool.start()
        pythons = [w.python for w in engine.pool.workers]
        await engine.close()
        return pythons

    assert asyncio.run(spawn()) == [engine.config.python] * 2  # `workers` of `python`


def test_literal_decorator_options_win_over_the_workspace(tmp_path: Path) -> None:
    root = workspace(tmp_path, 'backend = "inductor"\ntracer = "dynamo"')
    module = root / "src" / "pkg" / "targets.py"
    module.write_text(
        module.read_text().replace(
            "@precompile.target(calls)",
            '@precompile.target(calls, backend="eager", tracer="make_fx")',
        )
    )
    engine = Engine(root)
    [decl] = engine.discover()
    job = engine.requests.job_request(decl, JobKind.CHECK)
    assert (job.backend, job.tracer) == ("eager", "make_fx")


def test_tracer_and_backend_are_part_of_the_cache_key(tmp_path: Path) -> None:
    """Changing either re-captures; an unchanged configuration does not."""
    root = workspace(tmp_path, 'backend = "eager"\ntracer = "dynamo"')

    def check() -> dict:  # type: ignore[type-arg]
        proc = precompile_cli("check", "--format", "json", cwd=root)
        assert proc.returncode in (0, 1), proc.stderr
        return json.loads(proc.stdout)

    first = check()
    assert first["stats"]["captures"] == 1
    [row] = first["targets"]
    assert (row["tracer"], row["backend"]) == ("dynamo", "eager")
    assert check()["stats"]["captures"] == 0  # unchanged: from the cache

    (root / "pyproject.toml").write_text(
        '[tool.precompile]\nbackend = "eager"\ntracer = "make_fx"\n'
    )
    by_make_fx = check()
    assert by_make_fx["stats"]["captures"] == 1
    [row] = by_make_fx["targets"]
    assert row["tracer"] == "make_fx"  # the capture really used the configured tracer

    (root / "pyproject.toml").write_text(
        '[tool.precompile]\nbackend = "inductor"\ntracer = "make_fx"\n'
    )
    assert check()["stats"]["captures"] == 1
    assert check()["stats"]["captures"] == 0


def test_a_check_that_finds_no_target_says_where_it_looked(tmp_path: Path) -> None:
    root = workspace(tmp_path, 'source-roots = ["lib"]')
    shutil.rmtree(root / "src")
    (root / "lib").mkdir()
    proc = precompile_cli("check", cwd=root)
    assert proc.returncode == 0
    assert "no @precompile.target found" in proc.stderr
    assert str((root / "lib").resolve()) in proc.stderr
