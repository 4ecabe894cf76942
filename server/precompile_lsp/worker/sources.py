"""The source files a job's result depends on, and how a job reads them: the bytes on
disk, never a bytecode cache.

A result (a check's findings, an emitted artifact, a verify's verdict) is keyed by the
hashes of the files the capture imported that no version stands for (``recorded``). The
capture must have run exactly those bytes. Python's import system does not promise that:
it reuses ``__pycache__/*.pyc`` (or ``PYTHONPYCACHEPREFIX``'s) whenever the source's
modification time, in whole seconds, and its size match what the ``.pyc`` recorded. A
save within the second of the last import that keeps the size (``x * 2.0`` -> ``x * 3.0``,
a formatter's second save, a checkout) was captured from the old bytecode and stored
under the new file's hash: findings for code no longer there, an artifact emitted from
it, and a verify that compared it with the old code's own eager answer -- all reported
as current. So a job child imports every recorded file by compiling what it reads from
disk, and writes no ``.pyc`` into the user's folders either. Files a version stands for
(installed distributions, the standard library, this product) keep their bytecode: their
version, not their bytes, is in the key.
"""

from __future__ import annotations

import functools
import importlib.machinery
import os
import sys
import sysconfig
from types import CodeType

import precompile


def _versioned_prefixes() -> tuple[str, ...]:
    """Folders whose modules a version stands for: the standard library (the build is in
    the engine's key) and this product's own packages (its version is too). Everything
    else imported from outside site-packages -- an editable install of a sibling library,
    a PYTHONPATH or .pth folder -- has no version that changes with its code, so its
    files are hashed like the workspace's."""
    paths = sysconfig.get_paths()
    folders = {paths["stdlib"], paths["platstdlib"]}
    folders |= {os.path.dirname(precompile.__file__), os.path.dirname(os.path.dirname(__file__))}
    return tuple(os.path.realpath(f) + os.sep for f in folders)


_VERSIONED = _versioned_prefixes()

#: Resolving the path of every imported module (thousands, with torch) was more than
#: half of a warm check job's dependency walk; the warm worker resolves those it
#: imported before forking, so a job resolves only its own. A resolved path changes only
#: if a symlink is re-pointed while the worker runs.
realpath = functools.cache(os.path.realpath)


def installed(real: str) -> bool:
    """Whether ``real`` (a resolved path) is an installed distribution's file."""
    return "site-packages" in real or "dist-packages" in real


def recorded(real: str, root: str) -> bool:
    """Whether a result records the hash of ``real`` (a resolved path) for workspace
    ``root``: the workspace's files, and any that is neither installed nor versioned."""
    if installed(real):
        return False
    return real.startswith(realpath(root) + os.sep) or not real.startswith(_VERSIONED)


_workspace: list[str] = []


class _FromDisk(importlib.machinery.SourceFileLoader):
    """``SourceFileLoader`` that compiles a recorded file from its bytes on disk, and
    leaves every other file to the bytecode cache as Python would."""

    def get_code(self, fullname: str) -> CodeType | None:
        path = self.get_filename(fullname)
        if not _workspace or not recorded(realpath(path), _workspace[0]):
            return super().get_code(fullname)
        return self.source_to_code(self.get_data(path), path)


def import_from_disk(root: str) -> None:
    """From now on in this process, import every file a result for workspace ``root``
    records from its bytes on disk (``_FromDisk``). Forgets the finders made so far, so
    a folder already on ``sys.path`` (a PYTHONPATH folder) is read the same way."""
    if not _workspace:
        hook = importlib.machinery.FileFinder.path_hook(
            (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
            (_FromDisk, importlib.machinery.SOURCE_SUFFIXES),
            (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES),
        )
        sys.path_hooks.insert(0, hook)
        sys.path_importer_cache.clear()
    _workspace[:] = [root]
