"""Editor settings: from ``initializationOptions`` and ``workspace/configuration``
(section ``precompile``), camelCase on the wire. A bad value falls back to its default
and is reported once, never failing the server. The values ``[tool.precompile]`` sets too
(timeout, severity, docs URL, serving logs) are checked by ``config.VALUE_RULES``, the
rules and words ``load_config`` uses."""

from __future__ import annotations

import dataclasses
from typing import Any

from precompile_lsp.config import EDITOR_NAMES, editor_setting_problem


@dataclasses.dataclass(frozen=True)
class Settings:
    enable: bool = True
    run_on_save: bool = True
    timeout: float | None = None  # None: the workspace's [tool.precompile] timeout
    severity: dict[str, str] = dataclasses.field(default_factory=dict)
    code_lens: bool = True
    docs_url: str | None = None  # None: [tool.precompile] docs-url, else the shipped docs
    #: Serving-log globs (None: [tool.precompile] serving-logs); checked like that key.
    serving_logs: tuple[str, ...] | None = None

    def engine_overrides(self) -> dict[str, Any]:
        overrides: dict[str, Any] = {}
        if self.timeout is not None:
            overrides["timeout"] = self.timeout
        if self.severity:
            overrides["severity"] = dict(self.severity)
        if self.docs_url is not None:
            overrides["docs-url"] = self.docs_url
        if self.serving_logs is not None:
            overrides["serving-logs"] = list(self.serving_logs)
        return overrides


_FIELDS = {
    "enable": "enable",
    "runOnSave": "run_on_save",
    "timeout": "timeout",
    "severity": "severity",
    "codeLens": "code_lens",
    "docsUrl": "docs_url",
    "servingLogs": "serving_logs",
}


#: Settings fields that are ``[tool.precompile]`` keys too, checked by its rules.
_ENGINE_KEYS = {_FIELDS[editor]: key for key, editor in EDITOR_NAMES.items()}


def parse_settings(raw: Any, base: Settings | None = None) -> tuple[Settings, list[str]]:
    """Settings from a client's dict; unknown keys are ignored (clients send their whole
    section), bad values keep the previous value and are listed in the returned errors."""
    settings = base or Settings()
    if not isinstance(raw, dict):
        return settings, [] if raw is None else [
            f"precompile settings must be an object, got {type(raw).__name__}"
        ]
    changes: dict[str, Any] = {}
    errors = []
    for key, field in _FIELDS.items():
        if key not in raw or raw[key] is None:
            continue
        value = raw[key]
        if field in ("enable", "run_on_save", "code_lens"):
            if isinstance(value, bool):
                changes[field] = value
            else:
                errors.append(f"precompile.{key} must be true or false, got {value!r}")
        elif field == "docs_url" and value == "":
            changes[field] = None  # cleared: back to pyproject.toml or the shipped docs
        elif field == "serving_logs" and value == []:
            changes[field] = None  # cleared: back to pyproject.toml
        else:
            # The values [tool.precompile] sets too: its rules, in its words.
            problem = editor_setting_problem(_ENGINE_KEYS[field], value)
            if problem is not None:
                errors.append(problem)
            elif field == "timeout":
                changes[field] = float(value)
            elif field == "serving_logs":
                changes[field] = (value,) if isinstance(value, str) else tuple(value)
            else:
                changes[field] = dict(value) if field == "severity" else value
    return dataclasses.replace(settings, **changes), errors
