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

Which file an import finds depends on more than the files found: a module created in an
earlier folder of the path shadows it, an optional import (``try: import fast``) finds a
module created since, a symbolic link re-pointed leads elsewhere. So every lookup the
path-based finder makes in a job is recorded too (``looked``): each place it looked, in
its order, up to the one it took, with what each held (``files.path_state``); in an
installed distribution's folder only a lookup that found nothing (an install since makes
it find something). The engine compares those states as it compares the files' hashes.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import marshal
import os
import sys
import sysconfig
from importlib.machinery import (
    BYTECODE_SUFFIXES,
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    FileFinder,
    SourceFileLoader,
)
from pathlib import PurePath
from types import CodeType
from typing import Any

import precompile
from precompile.artifact.pair import file_sha256
from precompile.errors import PrecompileError
from precompile_lsp.files import ABSENT, DIRECTORY, path_state


def _folders(*paths: str) -> tuple[str, ...]:
    return tuple(sorted({os.path.realpath(p) + os.sep for p in paths}))


#: Folders whose modules a version stands for: the standard library (the build is in
#: the engine's key; also where a workspace keeps its own Python, ``conda create -p``)
#: and this product's own packages (its version is too, except in a workspace that
#: holds the product: working on it). Everything else imported from outside
#: site-packages -- an editable install of a sibling library, a PYTHONPATH or .pth
#: folder -- has no version that changes with its code, so its files are hashed like
#: the workspace's.
_STDLIB = _folders(sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"])
_PRODUCT = _folders(
    os.path.dirname(precompile.__file__), os.path.dirname(os.path.dirname(__file__))
)

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
    if "-packages" not in real:
        return False
    inside = real.removeprefix(realpath(root) + os.sep)
    return not _INSTALLED_FOLDERS.isdisjoint(PurePath(inside).parts[:-1])


def recorded(real: str, root: str) -> bool:
    """Whether a result records the hash of ``real`` (a resolved path) for workspace
    ``root``: the workspace's files, and any that is neither installed nor versioned."""
    if installed(real, root) or real.startswith(_STDLIB):
        return False
    return real.startswith(realpath(root) + os.sep) or not real.startswith(_PRODUCT)


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


#: The job's workspace root, once ``import_from_disk`` installed the load path (a list:
#: empty until then, so the load path is installed once per process).
_workspace: list[str] = []
#: Resolved path -> sha256 of the bytes compiled for it in this process, since
#: ``import_from_disk``.
compiled: dict[str, str] = {}

_SOURCE_GET_CODE = SourceFileLoader.get_code


def _get_code(self: SourceFileLoader, fullname: str) -> CodeType | None:
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
    _remember_source(path, data)
    return code


def _remember_source(path: str, data: bytes) -> None:
    """Make the text compiled the source that ``inspect`` and tracebacks read for
    ``path`` in this job. ``linecache`` reads the file again whenever its size or time
    on disk changed, so an edit saved while the job ran (while ``examples()`` ran, say)
    had the capture record the new text's digests (``FUNCTION_SOURCES``) for the old
    code it traced: the artifact then held ``x * 2.0``, and every later check read its
    records as matching ``x * 3.0`` on disk. An entry without a time is never checked
    against the disk."""
    import io
    import linecache

    try:
        text = importlib.util.decode_source(data)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return  # the compile above would have raised: nothing to remember
    # Lines as a file reads them: ``decode_source`` made every newline ``\n``, and only
    # that ends a line (``str.splitlines`` also splits at a form feed, U+2028, ...).
    lines = io.StringIO(text).readlines()
    linecache.cache[path] = (len(data), None, lines, path)


#: Path -> what it held (``files.path_state``) for each place a lookup looked, since
#: ``import_from_disk``.
looked: dict[str, str] = {}

_FIND_SPEC = FileFinder.find_spec
#: In FileFinder's order: extension modules, then source, then bytecode.
_SUFFIXES = (*EXTENSION_SUFFIXES, *SOURCE_SUFFIXES, *BYTECODE_SUFFIXES)


def _places(folder: str, tail: str) -> list[tuple[str, bool]]:
    """Where a lookup of ``tail`` in ``folder`` looks, in the path-based finder's order,
    each with whether a folder (not a file) there is what it takes: a package's
    ``__init__``, a module file, then a namespace package's folder."""
    package = os.path.join(folder, tail)
    return [
        *((os.path.join(package, "__init__" + suffix), False) for suffix in _SUFFIXES),
        *((os.path.join(folder, tail + suffix), False) for suffix in _SUFFIXES),
        (package, True),
    ]


def _find_spec(self: FileFinder, fullname: str, target: Any = None) -> Any:
    """``FileFinder.find_spec`` in a job: the lookup, and what it looked at recorded."""
    spec = _FIND_SPEC(self, fullname, target)
    if _workspace:
        _note_lookup(os.fspath(self.path), fullname.rpartition(".")[2], spec is None)
    return spec


def _note_lookup(folder: str, tail: str, missed: bool) -> None:
    """Record the places a lookup of ``tail`` in ``folder`` looked, up to the one it
    took (all of them where it ``missed``): in a folder whose files the key records, and
    in an installed distribution's folder where nothing was found."""
    root = _workspace[0]
    real = realpath(os.path.join(folder, tail))
    if not (recorded(real, root) or (missed and installed(real, root))):
        return
    for place, folder_taken in _places(folder, tail):
        state = looked[place] = path_state(place)
        if (state == DIRECTORY) if folder_taken else (state not in (ABSENT, DIRECTORY)):
            return


class _FolderNotThere:
    """The finder of a path entry that is no folder (a source root not created yet): it
    finds nothing, as the import system's own answer for such an entry does, but records
    each lookup, so that creating the folder with the module in it changes what the
    lookup found."""

    def __init__(self, path: str) -> None:
        self.path = path

    def find_spec(self, fullname: str, target: Any = None) -> None:
        _note_lookup(self.path, fullname.rpartition(".")[2], True)

    def invalidate_caches(self) -> None:
        """Nothing cached: the next lookup after the folder exists asks again."""


def _folder_not_there(path: str) -> _FolderNotThere:
    """A path hook, tried before the others: an entry inside the workspace that does not
    exist (a source root not created yet). Any other entry is left to the import
    system's own hooks -- one outside the workspace too (an interpreter's
    ``python311.zip``, which no one creates)."""
    if (
        not _workspace
        or os.path.exists(path or ".")
        or not realpath(path).startswith(realpath(_workspace[0]) + os.sep)
    ):
        raise ImportError("not a missing folder of the workspace")
    return _FolderNotThere(path)


def import_from_disk(root: str) -> None:
    """From now on in this process, load every file a result for workspace ``root``
    records from its bytes on disk, and keep their hashes (``compiled``); and record
    where each lookup of a module looked (``looked``), in a folder of the path that does
    not exist too."""
    if not _workspace:
        loader: Any = SourceFileLoader
        loader.get_code = _get_code
        finder: Any = FileFinder
        finder.find_spec = _find_spec
        sys.path_hooks.insert(0, _folder_not_there)
    _workspace[:] = [root]
    # An entry looked at before (no finder: not a folder then) is asked again.
    for path, entry_finder in list(sys.path_importer_cache.items()):
        if entry_finder is None or isinstance(entry_finder, _FolderNotThere):
            del sys.path_importer_cache[path]


#: Resolved path -> (sha256 of the file when the worker imported it, or None where the
#: module's code is not that file's; the stale ``.pyc`` it came from, if that is why) for
#: each recorded module the worker imported before any job: at the interpreter's start
#: (``sitecustomize``, a ``.pth`` file) or with its warm-up imports (a plugin torch
#: loads). No job imports such a module again.
preloaded: dict[str, tuple[str | None, str]] = {}


def note_preloaded() -> None:
    """In the warm worker, after each batch of its imports: what each module imported
    so far that no version stands for was compiled from (first seen, first kept)."""
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        # (Not a relative name such as ``torch.ops``'s "_ops.py", nor a missing file.)
        if path and os.path.isabs(path) and recorded(real := realpath(path), os.sep):
            if real not in preloaded and os.path.isfile(real):
                preloaded[real] = _loaded_from(module, real)


def _pyc_used(pyc: bytes, source: bytes, real: str) -> bool:
    """Whether the import system would have taken ``pyc`` for the source ``real`` (its
    header matches: the magic number, then the source's mtime and size or its hash);
    where not, it compiled the source."""
    if pyc[:4] != importlib.util.MAGIC_NUMBER:
        return False
    flags = int.from_bytes(pyc[4:8], "little")
    if flags & 0b1:  # hash-based: checked against the source unless marked unchecked
        return not flags & 0b10 or pyc[8:16] == importlib.util.source_hash(source)
    stat = os.stat(real)
    mtime, size = int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF
    return pyc[8:12] == mtime.to_bytes(4, "little") and pyc[12:16] == size.to_bytes(4, "little")


def _same_code(a: CodeType, b: CodeType) -> bool:
    """Code objects equal but for their line and column tables (a ``.pyc`` written under
    ``-X no_debug_ranges`` lacks columns; the code is the same)."""
    if (a.co_code, a.co_names, a.co_varnames, a.co_flags) != (
        b.co_code,
        b.co_names,
        b.co_varnames,
        b.co_flags,
    ) or len(a.co_consts) != len(b.co_consts):
        return False
    return all(
        _same_code(x, y) if isinstance(x, CodeType) and isinstance(y, CodeType) else x == y
        for x, y in zip(a.co_consts, b.co_consts, strict=True)
    )


def _loaded_from(module: Any, real: str) -> tuple[str | None, str]:
    """sha256 of ``real`` where the module's code is that file's: the import system
    compiled the file, or took a ``.pyc`` whose code is the file's. Else None, with the
    ``.pyc`` where a stale one is why (a file that no longer compiles, or cannot be read,
    has changed since the import)."""
    try:
        with open(real, "rb") as f:
            data = f.read()
        code = compile(data, real, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError):
        return None, ""
    cached = getattr(getattr(module, "__spec__", None), "cached", None)
    if cached and isinstance(getattr(module, "__loader__", None), SourceFileLoader):
        try:
            with open(cached, "rb") as f:
                pyc = f.read()
            stale = _pyc_used(pyc, data, real) and not _same_code(marshal.loads(pyc[16:]), code)
        except (OSError, ValueError, EOFError, TypeError):
            stale = False  # no readable .pyc: the import compiled the file
        if stale:
            return None, cached
    return hashlib.sha256(data).hexdigest(), ""


def refuse_stale_preloaded(root: str) -> None:
    """Refuse a job of workspace ``root`` whose process holds a recorded module the
    worker imported before any job with other code than its file's now: no job imports
    it again, so the capture would run that code under the file's hash. Else the key
    takes the hash checked here (``compiled``), not one read again at the job's end."""
    for real, (digest, pyc) in preloaded.items():
        if not recorded(real, root):
            continue
        now = file_sha256(real)
        started = f"{real} was imported when the worker started, before any job"
        if digest is None and pyc:
            raise PrecompileError(
                f"{started}, from a stale .pyc ({pyc}) whose code is not the file's: a "
                f"capture would run that code",
                hint=f"delete {pyc}, then check again",
            )
        if digest is None or digest != now:
            raise PrecompileError(
                f"{started} (by sitecustomize, a .pth file or a plugin), and has changed "
                f"since: a capture would run the code it held then",
                hint="run the check again (a new precompile check starts a new worker), or "
                "restart the language server or precompile daemon",
            )
        compiled.setdefault(real, digest)
