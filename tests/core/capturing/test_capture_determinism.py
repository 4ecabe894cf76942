"""An artifact depends on what the trace read, not on what else ran in the process:
an import during the trace runs the import system's hooks (pytest's assertion rewriter,
editable-install finders), and nothing of them may reach the artifact."""

from __future__ import annotations

import importlib.abc
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

import precompile


class NoisyFinder(importlib.abc.MetaPathFinder):
    """A finder that reads attributes of its own, as import hooks do."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        self.finder_only_attribute = getattr(self, "finder_only_attribute", 0) + 1
        return None


def imports_while_traced(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    import colorsys  # noqa: F401  (imported for the first time inside the trace)

    return model(x) * 2


def _capture(path: Path) -> str:
    with precompile.capture(
        imports_while_traced,
        artifact_path=path / "a.py",
        cache_path=path / "a.cache",
        tracer=precompile.MakeFxTracer(),
        backend="eager",
    ) as cap:
        cap(nn.Linear(3, 2), torch.ones(4, 3))
    return (path / "a.py").read_text()


def test_an_import_hook_run_by_the_trace_leaves_no_trace_in_the_artifact(tmp_path: Path) -> None:
    sys.modules.pop("colorsys", None)
    finder = NoisyFinder()
    sys.meta_path.insert(0, finder)
    try:
        (tmp_path / "first").mkdir()
        first = _capture(tmp_path / "first")
    finally:
        sys.meta_path.remove(finder)
    assert getattr(finder, "finder_only_attribute", 0) > 0, "the trace did not import"
    assert "finder_only_attribute" not in first
    (tmp_path / "second").mkdir()  # the module is imported now: no hook runs
    assert _capture(tmp_path / "second") == first
