"""torch-precompile: capture a PyTorch function once, serve it in any later process.

``import precompile`` is cheap and imports no torch: the public names below load their
modules on first use, so tools that only read artifacts (the CLI, the language server)
never pay for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from precompile.errors import (
    ArtifactTrustWarning,
    CacheFallbackWarning,
    EagerFallbackWarning,
    InferenceGradWarning,
    LayoutCopyWarning,
    Location,
    PrecompileError,
    RiskyGuardWarning,
    ServingFallbackWarning,
    SignatureError,
)
from precompile.version import __version__

_LAZY = {
    "capture": "precompile.capture_api",
    "Capture": "precompile.capture_api",
    "CaptureReport": "precompile.report",
    "MakeFxTracer": "precompile.tracers",
    "DynamoTracer": "precompile.tracers",
    "PrecompileSummary": "precompile.report",
    "load": "precompile.loading",
    "PrecompiledRunnable": "precompile.loading",
    "inspect_artifact": "precompile.artifact.metadata",
    "sign": "precompile.artifact.signing",
    "verify_signature": "precompile.artifact.signing",
    "generate_key": "precompile.artifact.signing",
    "target": "precompile.targets",
    "Example": "precompile.targets",
}

__all__ = [
    "ArtifactTrustWarning",
    "CacheFallbackWarning",
    "EagerFallbackWarning",
    "InferenceGradWarning",
    "LayoutCopyWarning",
    "Location",
    "PrecompileError",
    "RiskyGuardWarning",
    "ServingFallbackWarning",
    "SignatureError",
    "__version__",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'precompile' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
