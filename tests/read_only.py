"""A read-only copy of a workspace: a tmpfs, filled, then remounted read-only (as a
checkout on a read-only volume, or a container's read-only root, is)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False)


@contextlib.contextmanager
def read_only_copy(source: Path, mountpoint: Path) -> Iterator[Path]:
    """``source`` copied to ``mountpoint/ws``, which cannot be written while the context
    lasts. Needs root (or CAP_SYS_ADMIN), as CI has: without it the test fails saying so
    rather than passing without having checked anything."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    mounted = _mount("-t", "tmpfs", "tmpfs", str(mountpoint))
    if mounted.returncode != 0:
        pytest.fail(
            f"cannot mount a tmpfs to make a read-only workspace ({mounted.stderr.strip()}); "
            f"this test needs root or CAP_SYS_ADMIN (CI runs as root)"
        )
    try:
        workspace = mountpoint / "ws"
        shutil.copytree(source, workspace)
        remounted = _mount("-o", "remount,ro", str(mountpoint))
        assert remounted.returncode == 0, remounted.stderr
        probe = workspace / "probe"
        with pytest.raises(OSError):
            probe.write_text("")
        yield workspace
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)
