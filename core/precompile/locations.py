"""Finding the user's line in a stack: which frames are user code, and exact columns.

Every capture refusal and every node of a captured graph is placed at the innermost frame
that is neither torch, the standard library, nor precompile itself, so the editor can
underline the expression the user wrote. CPython reports UTF-8 byte offsets; we convert
to code points, the unit every output format converts from.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import linecache
import os
import site
import sys
import sysconfig
import types
from collections.abc import Iterable

from precompile.errors import Location


def _package_dir(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.realpath(next(iter(spec.submodule_search_locations))) + os.sep


#: Never the user's code: torch, precompile, and its language server (found, not
#: imported), whose worker calls a target's examples() and imports the user's modules --
#: from a source checkout (an editable install) its frames are not in site-packages.
_LIBRARY_DIRS = tuple(
    d
    for d in (
        _package_dir("torch"),
        os.path.realpath(os.path.dirname(__file__)) + os.sep,
        _package_dir("precompile_lsp"),
    )
    if d
)
_STDLIB_DIR = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep


def _site_dirs() -> tuple[str, ...]:
    """Where installed libraries live: this environment's site-packages, and every
    other install folder on the path -- the base interpreter's (a venv made with
    ``--system-site-packages``), the user's (``pip install --user``), Debian's
    ``dist-packages``, a folder a ``.pth`` file adds. Only the first used to count:
    every other installed library was taken for the project's code, its globals walked
    and held against a trace."""
    found = [sysconfig.get_paths()[k] for k in ("purelib", "platlib")]
    found += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    found += [site.getusersitepackages()] if hasattr(site, "getusersitepackages") else []
    found += [
        p
        for p in sys.path
        if os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages")
    ]
    return tuple(dict.fromkeys(os.path.realpath(p) + os.sep for p in found if p))


_SITE_DIRS = _site_dirs()


@dataclasses.dataclass(frozen=True)
class StackFrame:
    """One frame of a user stack, positioned like a Location, with its function name."""

    file: str
    line: int
    column: int
    function: str

    def location(self) -> Location:
        return Location(self.file, self.line, self.column)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


# Per file name, for the life of the process: a capture asks these of every module in
# sys.modules and every code object it saw (hundreds of thousands of calls in a large
# process), and ``os.path.realpath`` walks the path with an ``lstat`` per component.
_real_paths: dict[str, str] = {}
_user_file_cache: dict[str, bool] = {}
_project_file_cache: dict[str, bool] = {}


def real_path(filename: str) -> str:
    """``os.path.realpath(filename)``, computed once per file name."""
    path = _real_paths.get(filename)
    if path is None:
        path = _real_paths[filename] = os.path.realpath(filename)
    return path


def is_user_file(filename: str) -> bool:
    """True for code the user wrote or installed (third-party libraries count), never for
    torch, precompile (and its language server) or the standard library."""
    cached = _user_file_cache.get(filename)
    if cached is not None:
        return cached
    if not filename or filename.startswith("<"):
        result = False
    else:
        path = real_path(filename)
        if path.startswith(_LIBRARY_DIRS):
            result = False
        elif path.startswith(_SITE_DIRS):
            result = True
        else:
            result = not path.startswith(_STDLIB_DIR)
    _user_file_cache[filename] = result
    return result


def is_project_file(filename: str) -> bool:
    """User code that is not an installed library: what a project edits, and what an
    artifact records function by function (installed libraries change by version)."""
    cached = _project_file_cache.get(filename)
    if cached is None:
        cached = is_user_file(filename) and not real_path(filename).startswith(_SITE_DIRS)
        _project_file_cache[filename] = cached
    return cached


def is_project_module(module: object) -> bool:
    """A module object whose file is project code (``is_project_file``): the modules whose
    globals a capture watches and puts back."""
    file = getattr(module, "__file__", None)
    return isinstance(module, types.ModuleType) and isinstance(file, str) and is_project_file(file)


def codepoint_column(filename: str, line: int, byte_column: int | None) -> int:
    """Convert CPython's UTF-8 byte offset on a source line to a code-point column."""
    text = linecache.getline(filename, line)
    if byte_column is None:
        return len(text) - len(text.lstrip()) if text else 0
    return len(text.encode("utf-8")[:byte_column].decode("utf-8", errors="ignore"))


def _frame_of(code: types.CodeType, lasti: int, lineno: int | None) -> StackFrame:
    positions = next(itertools.islice(code.co_positions(), max(lasti, 0) // 2, None), None)
    line = lineno or (positions[0] if positions else None) or code.co_firstlineno
    byte_col = positions[2] if positions and positions[0] == line else None
    return StackFrame(
        file=code.co_filename,
        line=line,
        column=codepoint_column(code.co_filename, line, byte_col),
        function=code.co_name,
    )


def live_user_stack(frame: types.FrameType | None, boundary: types.CodeType) -> list[StackFrame]:
    """The user frames of a live stack, outermost first, inside ``boundary`` (the code
    that runs the captured function): what runs inside a capture, never its callers."""
    frames = []
    while frame is not None and frame.f_code is not boundary:
        if is_user_file(frame.f_code.co_filename):
            frames.append(_frame_of(frame.f_code, frame.f_lasti, frame.f_lineno))
        frame = frame.f_back
    frames.reverse()
    return frames


def traceback_user_stack(tb: types.TracebackType | None) -> list[StackFrame]:
    """The user frames of an exception's traceback, outermost first."""
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        if is_user_file(code.co_filename):
            frames.append(_frame_of(code, tb.tb_lasti, tb.tb_lineno))
        tb = tb.tb_next
    return frames


def definition_location(code: types.CodeType) -> Location:
    """Where a function's ``def`` is (a decorated function's code starts at its first
    decorator, which is not the line a user would look at)."""
    lines = linecache.getlines(code.co_filename)
    for number in range(code.co_firstlineno, min(len(lines), code.co_firstlineno + 50) + 1):
        text = lines[number - 1]
        stripped = text.lstrip()
        if stripped.startswith(("def ", "async def ")):
            return Location(code.co_filename, number, len(text) - len(stripped))
    return Location(code.co_filename, code.co_firstlineno, 0)


def innermost(frames: Iterable[StackFrame]) -> Location | None:
    """The innermost frame of the project's own code (what the user can edit), else the
    innermost user frame (an installed library's)."""
    frames = list(frames)
    own = [f for f in frames if is_project_file(f.file)]
    if own:
        return own[-1].location()
    return frames[-1].location() if frames else None
