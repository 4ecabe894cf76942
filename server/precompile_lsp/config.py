"""``[tool.precompile]`` in pyproject.toml: where targets live and how they are checked.

Paths are relative to the pyproject.toml that holds the table (the workspace root). A
bad value is a ConfigError naming the key, the file it came from and what it accepts:
the CLI exits 2 on it, the language server shows it once and keeps its previous
configuration. An unknown key is only a warning (a newer version's key, or a typo): it
is named, and the rest of the table still applies.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import math
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from precompile_lsp.files import relative_path
from precompile_lsp.trust import TrustGate

SEVERITIES = ("error", "warning", "information", "hint", "off")
BACKENDS = ("inductor", "eager")
TRACERS = ("dynamo", "make_fx")
KEYS = (
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
    "fail-on-empty",
    "serving-logs",
    "cache-dir",
    "cache-max-mb",
    "executor",
    "ray-address",
)
EXECUTORS = ("local", "ray")
#: The keys the editor sets too (``settings.Settings``), by their names in the editor.
EDITOR_NAMES = {
    "timeout": "timeout",
    "severity": "severity",
    "docs-url": "docsUrl",
    "serving-logs": "servingLogs",
}
#: The keys ``precompile check`` sets from its options, by option. No key is both an
#: editor setting and an option, so an overridden key says which of them set it.
CLI_OPTIONS = {"workers": "--jobs", "cache-dir": "--cache-dir"}


def _timeout_problem(value: Any) -> str | None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        return f" must be a finite positive number of seconds (e.g. 120), got {value!r}"
    return None


def _severity_problem(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f' must be a table, e.g. {{ PC101 = "error" }}, got {value!r}'
    for code, level in value.items():
        if not (isinstance(code, str) and code.startswith("PC")):
            return f" keys are finding codes like PC101, got {code!r}"
        if level not in SEVERITIES:
            return f".{code} must be one of {', '.join(SEVERITIES)}, got {level!r}"
    return None


def _docs_url_problem(value: Any) -> str | None:
    if not (isinstance(value, str) and value.startswith(("https://", "http://"))):
        return (
            " must be the http(s) URL of a hosted docs/diagnostics.md (links add #pc101 and "
            f"the like), got {value!r}"
        )
    return None


def _serving_logs_problem(value: Any) -> str | None:
    globs = [value] if isinstance(value, str) else value
    if not (isinstance(globs, list) and all(isinstance(v, str) for v in globs)):
        return f" must be a string or a list of strings, got {value!r}"
    if not all(v.strip() for v in globs):
        return f" must be globs of log files, not empty strings, got {value!r}"
    return None


#: The one set of rules for the values the editor and ``[tool.precompile]`` both set:
#: what is wrong with a value (after its name), or None. ``load_config`` and
#: ``settings.parse_settings`` both apply them, so a value one refuses the other refuses
#: in the same words. (Rules that need the workspace, such as serving-log globs leading
#: out of it, are ``load_config``'s, which every editor value also goes through.)
VALUE_RULES: dict[str, Callable[[Any], str | None]] = {
    "timeout": _timeout_problem,
    "severity": _severity_problem,
    "docs-url": _docs_url_problem,
    "serving-logs": _serving_logs_problem,
}


def editor_setting_problem(key: str, value: Any) -> str | None:
    """What is wrong with an editor setting's value, in the words ``load_config`` uses
    for it, or None."""
    problem = VALUE_RULES[key](value)
    if problem is None:
        return None
    return f"the editor setting precompile.{EDITOR_NAMES[key]}{problem} (from the editor)"


#: Directory names never searched for targets nor watched: tools' own state, caches.
SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "site-packages"})


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
    #: Whether ``python`` was shown to run as a Python 3 interpreter (an untrusted
    #: workspace's interpreter is not run, so not probed: the trust gate refuses).
    python_probed: bool = True
    #: What was wrong but not fatal (unknown keys), each naming the key and the file.
    warnings: tuple[str, ...] = ()
    docs_url: str | None = None  # None: finding links open the docs shipped in the package
    #: ``precompile check`` exits 1 when it finds no target at all (a glob or source-root
    #: mistake would otherwise make CI pass while checking nothing).
    fail_on_empty: bool = False
    #: Globs of serving logs (docs/serving.md) whose production refusals are findings:
    #: relative ones under the root (never leading out of it), or absolute paths.
    serving_logs: tuple[str, ...] = ()
    #: Where the result cache lives (None: ``.precompile/cache`` in the workspace). A
    #: folder CI persists and shares between runners; outside the workspace is allowed,
    #: since the user named it.
    cache_dir: Path | None = None
    #: The result cache's size bound: past it, least recently used entries are evicted.
    cache_max_bytes: int = 512 * 1024 * 1024
    #: Who runs capture, emit and verify jobs: ``local`` worker processes, or tasks of a
    #: Ray cluster (``ray``: docs/cluster.md).
    executor: str = "local"
    #: The Ray cluster to connect to (``ray.init(address=...)``); None starts a local one
    #: with ``workers`` CPUs.
    ray_address: str | None = None

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

    def is_skipped_dir(self, path: Path) -> bool:
        """A directory that holds no targets and nothing a capture should react to:
        hidden folders (``.git``, ``.precompile``), caches, virtual environments, the
        artifact directory, and whatever ``exclude`` names as ``dir/**``."""
        if path.name.startswith(".") or path.name in SKIPPED_DIRS:
            return True
        resolved = path.resolve()
        if resolved == self.artifact_dir.resolve() or (resolved / "pyvenv.cfg").is_file():
            return True
        relative = relative_path(resolved, self.root)
        if relative is None:
            return False
        for pattern in self.exclude:
            if pattern.endswith("/**"):
                stem = pattern[: -len("/**")]
                if fnmatch.fnmatch(relative, stem) or fnmatch.fnmatch(
                    relative, stem.removeprefix("**/")
                ):
                    return True
        return False

    def is_included(self, path: Path) -> bool:
        path = path.resolve()
        relative = relative_path(path, self.root)
        if relative is None:
            return False
        if self.artifact_dir.resolve() in path.parents:
            return False  # emitted artifacts are generated code, never targets
        if any(fnmatch.fnmatch(relative, pattern) for pattern in self.exclude):
            return False
        return any(
            fnmatch.fnmatch(relative, p) or fnmatch.fnmatch(relative, p.removeprefix("**/"))
            for p in self.include
        )

    def may_matter(self, path: Path) -> bool:
        """Whether a change to ``path`` can change a finding: the workspace's
        pyproject.toml, or a Python file inside the root outside skipped folders (a
        target's dependencies are any workspace module its capture imported)."""
        path = path.resolve()
        if path == self.root / "pyproject.toml":
            return True
        if path.suffix != ".py" or relative_path(path, self.root) is None:
            return False
        parent = path.parent
        while parent != self.root and self.root in parent.parents:
            if self.is_skipped_dir(parent):
                return False
            parent = parent.parent
        return True

    def is_serving_log(self, path: Path) -> bool:
        """Whether ``path`` is one of the configured serving logs (a change to it
        re-reads the logs; it never triggers a capture)."""
        if not self.serving_logs:
            return False
        path = path.resolve()
        relative = relative_path(path, self.root)
        for pattern in self.serving_logs:
            expanded = os.path.expanduser(pattern)
            if os.path.isabs(expanded):
                if fnmatch.fnmatch(str(path), expanded):
                    return True
            elif relative is not None and (
                fnmatch.fnmatch(relative, pattern)
                or fnmatch.fnmatch(relative, pattern.replace("**/", ""))
            ):
                return True
        return False

    def python_files(self) -> list[Path]:
        files = []
        for directory, dirnames, names in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if not self.is_skipped_dir(Path(directory) / d)]
            for name in names:
                path = Path(directory) / name
                if name.endswith(".py") and self.is_included(path):
                    files.append(path)
        return sorted(files)

    def default_artifact(self, module: str, function: str) -> Path:
        return self.artifact_dir / f"{module}.{function}.py"


def find_pyproject(start: Path) -> Path | None:
    for directory in [start, *start.parents]:
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


class _Table:
    """The merged table, able to say where each key came from for its error messages."""

    def __init__(self, pyproject: Path, values: dict[str, Any], overrides: dict[str, Any]):
        self.pyproject = pyproject
        self.values = {**values, **overrides}
        self.overridden = set(overrides)

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def where(self, key: str) -> str:
        """How the user names ``key``: the editor setting, the command line's option, or
        the table's key."""
        if key in self.overridden and key in CLI_OPTIONS:
            return f"the option {CLI_OPTIONS[key]}"
        if key in self.overridden:
            return f"the editor setting precompile.{EDITOR_NAMES.get(key, key)}"
        return f"[tool.precompile] {key}"

    def source(self, key: str) -> str:
        """Where the value of ``key`` was set."""
        if key in self.overridden:
            return "on the command line" if key in CLI_OPTIONS else "from the editor"
        return f"in {self.pyproject}"

    def check(self, key: str) -> Any:
        """The value of ``key``, or a ConfigError by the key's rule (``VALUE_RULES``)."""
        problem = VALUE_RULES[key](self[key])
        if problem is not None:
            raise ConfigError(f"{self.where(key)}{problem} ({self.source(key)})")
        return self[key]

    def error(self, key: str, what: str) -> ConfigError:
        return ConfigError(
            f"{self.where(key)} {what}, got {self.values[key]!r} ({self.source(key)})"
        )


def _strings(table: _Table, key: str) -> tuple[str, ...]:
    value = table[key]
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise table.error(key, "must be a string or a list of strings")


def _choice(table: _Table, key: str, choices: tuple[str, ...]) -> str:
    if table[key] not in choices:
        raise table.error(key, f"must be one of {', '.join(choices)}")
    return str(table[key])


@functools.lru_cache(maxsize=16)
def _interpreter_problem(python: str, stamp: tuple[int, int]) -> str | None:
    """Why ``python`` cannot run captures, or None. Cached by the file's identity and
    modification time, so a reload of an unchanged configuration costs nothing."""
    try:
        proc = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info[0])"],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as error:
        return f"does not run ({error})"
    if proc.returncode != 0 or proc.stdout.strip() != "3":
        detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"does not run as a Python 3 interpreter (exit {proc.returncode}: {detail})"
    return None


def _interpreter(table: _Table, root: Path, gate: TrustGate) -> tuple[str, bool]:
    """The interpreter ``python`` names, and whether it was probed. What can be checked
    without running it always is; running it (the probe) only when ``gate`` allows, since
    it is a program the workspace chose."""
    value = table["python"]
    if not isinstance(value, str) or not value.strip():
        raise table.error("python", "must be the path of a Python interpreter")
    candidate = Path(value).expanduser()
    if not candidate.is_absolute():
        candidate = root / candidate
    if not candidate.exists():
        raise table.error(
            "python",
            f"names an interpreter that does not exist ({candidate}); point it at the "
            f"python of the environment that has torch and torch-precompile installed",
        )
    if candidate.is_dir() or not os.access(candidate, os.X_OK):
        raise table.error("python", f"is not an executable file ({candidate})")
    if not gate.allows(f"run the interpreter {table.where('python')} names ({value})"):
        return str(candidate), False
    status = candidate.stat()
    problem = _interpreter_problem(str(candidate), (status.st_ino, status.st_mtime_ns))
    if problem is not None:
        raise table.error("python", f"{problem} ({candidate})")
    return str(candidate), True


def load_config(
    root: Path, overrides: dict[str, Any] | None = None, *, gate: TrustGate | None = None
) -> Config:
    """The configuration of the workspace at ``root`` (its pyproject.toml, if any), with
    ``overrides`` (editor settings, or the options of ``precompile check``) applied on
    top. Settings that name programs run them only if ``gate`` allows (default: an
    untrusted gate, so nothing of the workspace runs unless the caller says it is
    trusted)."""
    gate = gate if gate is not None else TrustGate(trusted=False)
    root = root.resolve()
    pyproject = root / "pyproject.toml"
    values: dict[str, Any] = {}
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            raise ConfigError(f"{pyproject}: invalid TOML ({error})") from error
        section = data.get("tool", {}).get("precompile", {})
        if not isinstance(section, dict):
            raise ConfigError(f"{pyproject}: [tool.precompile] must be a table")
        values = dict(section)
    table = _Table(pyproject, values, dict(overrides or {}))
    warnings = tuple(
        f"{table.where(key)} is not a known key and is ignored ({table.source(key)}; "
        f"known keys: {', '.join(KEYS)})"
        for key in sorted(set(table.values) - set(KEYS))
    )
    kwargs: dict[str, Any] = {"root": root, "warnings": warnings}
    roots = _strings(table, "source-roots") if "source-roots" in table else (".", "src")
    kwargs["source_roots"] = tuple((root / r).resolve() for r in roots)
    if "include" in table:
        kwargs["include"] = _strings(table, "include")
    if "exclude" in table:
        kwargs["exclude"] = Config.exclude + _strings(table, "exclude")
    kwargs["artifact_dir"] = root / "artifacts"
    if "artifact-dir" in table:
        if not isinstance(table["artifact-dir"], str) or not table["artifact-dir"].strip():
            raise table.error("artifact-dir", "must be a path (a string)")
        kwargs["artifact_dir"] = root / table["artifact-dir"]
    if "backend" in table:
        kwargs["backend"] = _choice(table, "backend", BACKENDS)
    if "tracer" in table:
        kwargs["tracer"] = _choice(table, "tracer", TRACERS)
    if "timeout" in table:
        kwargs["timeout"] = float(table.check("timeout"))
    if "workers" in table:
        workers = table["workers"]
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise table.error("workers", "must be a positive integer")
        kwargs["workers"] = workers
    if "severity" in table:
        severity = table.check("severity")
        kwargs["severity"] = dict(severity)
    if "python" in table:
        kwargs["python"], kwargs["python_probed"] = _interpreter(table, root, gate)
    if "docs-url" in table:
        kwargs["docs_url"] = table.check("docs-url")
    if "fail-on-empty" in table:
        if not isinstance(table["fail-on-empty"], bool):
            raise table.error("fail-on-empty", "must be true or false")
        kwargs["fail_on_empty"] = table["fail-on-empty"]
    if "serving-logs" in table:
        kwargs["serving_logs"] = _serving_logs(table, root)
    kwargs.update(_cache_settings(table, root))
    kwargs.update(_executor(table))
    return Config(**kwargs)


def _executor(table: _Table) -> dict[str, Any]:
    """``executor`` and ``ray-address``. ``ray`` needs the ray package in the engine's
    environment (the extra ``torch-precompile[ray]``): without it the setting is an error
    here, naming the install, rather than a failure of every job later. Only looked up
    (``find_spec``), never imported: the engine imports ray when it starts the cluster."""
    settings: dict[str, Any] = {}
    if "executor" in table:
        settings["executor"] = _choice(table, "executor", EXECUTORS)
    if "ray-address" in table:
        address = table["ray-address"]
        if not isinstance(address, str) or not address.strip():
            raise table.error(
                "ray-address", 'must be the address of a Ray cluster (e.g. "ray://head:10001")'
            )
        settings["ray_address"] = address
    if settings.get("executor") == "ray":
        import importlib.util

        try:
            found = importlib.util.find_spec("ray") is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise table.error(
                "executor",
                f"needs the ray package, which is not installed for {sys.executable}: "
                f'pip install torch-precompile[ray] (or set executor = "local")',
            )
    return settings


def _serving_logs(table: _Table, root: Path) -> tuple[str, ...]:
    """Serving-log globs: a relative one must stay inside the workspace (reading a log
    is allowed in an untrusted workspace, so it may not name files elsewhere); an
    absolute one is taken as the user wrote it."""
    value = table.check("serving-logs")
    patterns = (value,) if isinstance(value, str) else tuple(value)
    for pattern in patterns:
        if os.path.isabs(os.path.expanduser(pattern)):
            continue
        if relative_path(Path(os.path.normpath(root / pattern)), root) is None:
            raise table.error(
                "serving-logs",
                f"names {pattern!r}, which leads out of the workspace {root}; name logs "
                f"inside it (e.g. logs/*.jsonl) or give an absolute path",
            )
    return patterns


def _cache_settings(table: _Table, root: Path) -> dict[str, Any]:
    """``cache-dir`` (relative to the workspace root; ``~`` expanded) and ``cache-max-mb``."""
    settings: dict[str, Any] = {}
    if "cache-dir" in table:
        value = table["cache-dir"]
        if not isinstance(value, str) or not value.strip():
            raise table.error("cache-dir", "must be a folder path (a string)")
        settings["cache_dir"] = (root / Path(value).expanduser()).resolve()
        if settings["cache_dir"].exists() and not settings["cache_dir"].is_dir():
            raise table.error("cache-dir", "names a file, not a folder; name a folder")
    if "cache-max-mb" in table:
        value = table["cache-max-mb"]
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise table.error("cache-max-mb", "must be a positive number of MiB (e.g. 512)")
        settings["cache_max_bytes"] = int(value * 1024 * 1024)
    return settings
