"""``[tool.precompile]`` in pyproject.toml: where targets live and how they are checked.

Paths are relative to the pyproject.toml that holds the table (the workspace root). A
bad value is a ConfigError naming the key and what it accepts: the CLI exits 2 on it,
the language server shows it once and keeps its defaults.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

SEVERITIES = ("error", "warning", "information", "hint", "off")


class ConfigError(ValueError):
    """An invalid [tool.precompile] table or setting."""


@dataclasses.dataclass(frozen=True)
class Config:
    root: Path
    source_roots: tuple[Path, ...] = ()
    include: tuple[str, ...] = ("**/*.py",)
    exclude: tuple[str, ...] = (
        ".venv/**",
        "venv/**",
        "**/node_modules/**",
        ".precompile/**",
        "build/**",
        "dist/**",
    )
    artifact_dir: Path = Path("artifacts")
    backend: str = "inductor"
    tracer: str = "dynamo"
    timeout: float = 120.0
    workers: int = 1
    severity: dict[str, str] = dataclasses.field(default_factory=dict)
    python: str = sys.executable
    docs_url: str | None = None  # None: finding links open the docs shipped in the package

    def module_of(self, path: Path) -> str | None:
        """The importable module name of a file, from the innermost source root holding it."""
        path = path.resolve()
        for root in sorted(self.source_roots, key=lambda r: len(r.parts), reverse=True):
            try:
                relative = path.relative_to(root)
            except ValueError:
                continue
            parts = list(relative.with_suffix("").parts)
            if parts and parts[-1] == "__init__":
                parts.pop()
            if parts and all(p.isidentifier() for p in parts):
                return ".".join(parts)
        return None

    def is_included(self, path: Path) -> bool:
        path = path.resolve()
        try:
            relative = path.relative_to(self.root).as_posix()
        except ValueError:
            return False
        if self.artifact_dir.resolve() in path.parents:
            return False  # emitted artifacts are generated code, never targets
        if any(fnmatch.fnmatch(relative, pattern) for pattern in self.exclude):
            return False
        return any(
            fnmatch.fnmatch(relative, p) or fnmatch.fnmatch(relative, p.removeprefix("**/"))
            for p in self.include
        )

    def python_files(self) -> list[Path]:
        files = []
        for directory, dirnames, names in os.walk(self.root):
            dirnames[:] = [
                d
                for d in dirnames
                if not d.startswith(".") and d not in ("__pycache__", "node_modules")
            ]
            for name in names:
                path = Path(directory) / name
                if name.endswith(".py") and self.is_included(path):
                    files.append(path)
        return sorted(files)

    def default_artifact(self, module: str, function: str) -> Path:
        return self.artifact_dir / f"{module}.{function}.py"

    def severity_of(self, code: str, default: str) -> str:
        return self.severity.get(code, default)


def _strings(value: Any, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(
        f"[tool.precompile] {key} must be a string or a list of strings, got {value!r}"
    )


def _choice(value: Any, key: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(
            f"[tool.precompile] {key} must be one of {', '.join(choices)}; got {value!r}"
        )
    return str(value)


def find_pyproject(start: Path) -> Path | None:
    for directory in [start, *start.parents]:
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_config(root: Path, overrides: dict[str, Any] | None = None) -> Config:
    """The configuration of the workspace at ``root`` (its pyproject.toml, if any), with
    ``overrides`` (editor settings) applied on top."""
    root = root.resolve()
    pyproject = root / "pyproject.toml"
    table: dict[str, Any] = {}
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            raise ConfigError(f"{pyproject}: invalid TOML ({error})") from error
        table = dict(data.get("tool", {}).get("precompile", {}))
    table.update(overrides or {})
    known = {
        "source-roots",
        "include",
        "exclude",
        "artifact-dir",
        "backend",
        "tracer",
        "timeout",
        "workers",
        "severity",
        "python",
        "docs-url",
    }
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"[tool.precompile] has unknown keys {unknown}; known: {sorted(known)}")
    kwargs: dict[str, Any] = {"root": root}
    roots = _strings(table.get("source-roots", [".", "src"]), "source-roots")
    kwargs["source_roots"] = tuple((root / r).resolve() for r in roots)
    if "include" in table:
        kwargs["include"] = _strings(table["include"], "include")
    if "exclude" in table:
        kwargs["exclude"] = Config.exclude + _strings(table["exclude"], "exclude")
    if "artifact-dir" in table:
        if not isinstance(table["artifact-dir"], str):
            raise ConfigError("[tool.precompile] artifact-dir must be a string (a path)")
        kwargs["artifact_dir"] = root / table["artifact-dir"]
    else:
        kwargs["artifact_dir"] = root / "artifacts"
    if "backend" in table:
        kwargs["backend"] = _choice(table["backend"], "backend", ("inductor", "eager"))
    if "tracer" in table:
        kwargs["tracer"] = _choice(table["tracer"], "tracer", ("dynamo", "make_fx"))
    if "timeout" in table:
        timeout = table["timeout"]
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigError(
                f"[tool.precompile] timeout must be a positive number of seconds, got {timeout!r}"
            )
        kwargs["timeout"] = float(timeout)
    if "workers" in table:
        workers = table["workers"]
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(
                f"[tool.precompile] workers must be a positive integer, got {workers!r}"
            )
        kwargs["workers"] = workers
    if "severity" in table:
        severity = table["severity"]
        if not isinstance(severity, dict):
            raise ConfigError('[tool.precompile] severity must be a table: { PC101 = "error" }')
        for code, level in severity.items():
            if not (isinstance(code, str) and code.startswith("PC")):
                raise ConfigError(
                    f"[tool.precompile.severity] keys are finding codes like PC101, got {code!r}"
                )
            _choice(level, f"severity.{code}", SEVERITIES)
        kwargs["severity"] = dict(severity)
    if "python" in table:
        python = table["python"]
        if not isinstance(python, str):
            raise ConfigError("[tool.precompile] python must be a path to an interpreter")
        candidate = Path(python) if os.path.isabs(python) else root / python
        kwargs["python"] = str(candidate) if candidate.exists() else python
    if "docs-url" in table:
        kwargs["docs_url"] = _docs_url(table["docs-url"])
    return Config(**kwargs)


def _docs_url(value: Any) -> str:
    """A hosted copy of docs/diagnostics.md: an http(s) URL, to which ``#pc101`` is added."""
    if not (isinstance(value, str) and value.startswith(("https://", "http://"))):
        raise ConfigError(
            "[tool.precompile] docs-url must be the http(s) URL of a hosted docs/diagnostics.md "
            f"(links add #pc101 and the like), got {value!r}"
        )
    return value
