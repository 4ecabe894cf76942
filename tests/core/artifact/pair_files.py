"""Helpers the artifact tests share to tamper with a pair on disk: a copy of a pair, and
its cache envelope read and written back as torch saves it."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch


def copy_pair(pair: tuple[Path, Path], directory: Path) -> tuple[Path, Path]:
    out = directory / "copy.py", directory / "copy.cache"
    out[0].write_bytes(pair[0].read_bytes())
    out[1].write_bytes(pair[1].read_bytes())
    return out


def read_envelope(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)


def write_envelope(envelope: dict[str, Any], path: Path) -> None:
    buffer = io.BytesIO()
    torch.save(envelope, buffer)
    path.write_bytes(buffer.getvalue())
