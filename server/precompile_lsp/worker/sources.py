"""The source files a job's result depends on, and how a job reads them: the bytes on
disk, never a bytecode cache, and the key records the bytes that were compiled.

A result (a check's findings, an emitted artifact, a verify's verdict) is keyed by the
hashes of the files the capture imported that no version stands for (``recorded``). The
capture must have run exactly those bytes. Python's import system does not promise that:
it reuses ``__pycache__/*.pyc`` (or ``PYTHONPYCACHEPREFIX``'s) whenever the source's
modification time, in whole seconds, and its size match what the ``.pyc`` recorded. A
save within the second of the last import that keeps the size (``x * 2.0`` -> ``x * 3.0``,
a formatter's second save, a checkout) was captured from the old bytecode and stored
under the new file's hash: findings for code no longer there, an artifact emitted from
it, and a verify that compared it with the old code's own eager answer -- all reported
as current.

So in a job's process every source file is loaded through one place,
``SourceFileLoader.get_code`` -- whichever finder made the loader (``sys.path``, a
package's ``__path__``, an editable install's finder, ``spec_from_file_location``): a
recorded file is compiled from the bytes read from disk, their hash kept (``compiled``),
and no ``.pyc`` is written into the user's folders. The key takes that hash, not the
file's hash at the end of the job, so an edit saved while the job ran makes the next
check capture again. Files a version stands for (installed distributions, the standard
library, this product) keep their bytecode: their version, not their bytes, is in the key.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import marshal
import os
import sys
import sysconfig
from pathlib import PurePath
from types import CodeType
from typing import Any

import precompile
from precompile.artifact.pair import file_sha256
from precompile.errors import PrecompileError


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

_INSTALLED_FOLDERS = frozenset({"site-packages", "dist-packages"})


def installed(real: str, root: str) -> bool:
    """Whether ``real`` (a resolved path) is an installed distribution's file: inside a
    folder named site-packages or dist-packages -- for a file of workspace ``root``, one
    inside the workspace (a virtual environment kept there), not one the workspace
    itself happens to sit in."""
    inside = real.removeprefix(realpath(root) + os.sep)
    return not _INSTALLED_FOLDERS.isdisjoint(PurePath(inside).parts[:-1])


def recorded(real: str, root: str) -> bool:
    """Whether a result records the hash of ``real`` (a resolved path) for workspace
    ``root``: the workspace's files, and any that is neither installed nor versioned."""
    if installed(real, root):
        return False
    return real.startswith(realpath(root) + os.sep) or not real.startswith(_VERSIONED)


def holder(real: str) -> str:
    """The file on disk that holds a module's bytes: ``real`` itself, or for a module
    imported from an archive (``lib.zip/pkg/mod.py``) the archive, whose hash then stands
    for it."""
    path = real
    while not os.path.isfile(path):
        parent = os.path.dirname(path)
        if parent == path:
            return real
        path = parent
    return path


_workspace: list[str] = []
#: Resolved path -> sha256 of the bytes compiled for it in this process, since
#: ``import_from_disk``.
compiled: dict[str, str] = {}

_SOURCE_GET_CODE = importlib.machinery.SourceFileLoader.get_code


def _get_code(self: importlib.machinery.SourceFileLoader, fullname: str) -> CodeType | None:
    """``SourceFileLoader.get_code`` in a job: a recorded file compiled from its bytes on
    disk, their hash kept; any other file as Python loads it."""
    path = self.get_filename(fullname)
    real = realpath(path)
    if not _workspace or not recorded(real, _workspace[0]):
        return _SOURCE_GET_CODE(self, fullname)
    data = self.get_data(path)
    digest = hashlib.sha256(data).hexdigest()
    # Compiled twice from other bytes (a reload after an edit): no file has both, so
    # the result is never taken from the cache for either.
    compiled[real] = digest if compiled.get(real, digest) == digest else "changed during the job"
    code: Any = self.source_to_code(data, path)
    return code


def import_from_disk(root: str) -> None:
    """From now on in this process, load every file a result for workspace ``root``
    records from its bytes on disk, and keep their hashes (``compiled``)."""
    if not _workspace:
        loader: Any = importlib.machinery.SourceFileLoader
        loader.get_code = _get_code
    _workspace[:] = [root]


#: Resolved path -> (sha256 of the file when the worker started, or None where the
#: module's code is not that file's, and then the stale ``.pyc`` it came from) for each
#: recorded module imported before the worker ran any of its own code (by
#: ``sitecustomize`` or a ``.pth`` file). No job imports such a module again.
preloaded: dict[str, tuple[str | None, str]] = {}


def note_preloaded() -> None:
    """At the worker's start: what each module imported so far that no version stands
    for was compiled from."""
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        # (Not a relative name such as ``torch.ops``'s "_ops.py", nor a missing file.)
        if path and os.path.isabs(path) and recorded(real := realpath(path), os.sep):
            if os.path.isfile(real):
                preloaded[real] = _loaded_from(module, real)


def _loaded_from(module: Any, real: str) -> tuple[str | None, str]:
    """sha256 of ``real`` where the module's code is that file's (it was compiled from
    the file, or taken from a ``.pyc`` whose code is the file's); else None and the
    ``.pyc``."""
    try:
        with open(real, "rb") as f:
            data = f.read()
    except OSError:
        return None, ""
    cached = getattr(module.__spec__, "cached", None)
    if cached and isinstance(module.__loader__, importlib.machinery.SourceFileLoader):
        try:
            with open(cached, "rb") as f:
                pyc = marshal.loads(f.read()[16:])
            if pyc != compile(data, real, "exec", dont_inherit=True):
                return None, cached
        except (OSError, ValueError, EOFError, TypeError, SyntaxError):
            pass  # no readable .pyc: the module was compiled from the file
    return hashlib.sha256(data).hexdigest(), ""


def refuse_stale_preloaded(root: str) -> None:
    """Refuse a job of workspace ``root`` whose process holds a recorded module imported
    at the worker's start with other code than its file's now: no job imports it again,
    so the capture would run that code under the file's hash."""
    for real, (digest, pyc) in preloaded.items():
        if not recorded(real, root):
            continue
        started = f"{real} was imported when the worker started (by sitecustomize or a .pth file)"
        if digest is None:
            raise PrecompileError(
                f"{started} from a stale .pyc ({pyc}) whose code is not the file's: a "
                f"capture would run that code",
                hint=f"delete {pyc}, then check again",
            )
        if digest != file_sha256(real):
            raise PrecompileError(
                f"{started} and has changed since: a capture would run the code it held then",
                hint="run the check again (a new precompile check starts a new worker) or "
                "restart the language server",
            )
