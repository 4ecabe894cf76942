"""The write policy: the tools replace only files they wrote themselves.

A write goes to a path that is new, or that holds a file of the same kind written by this
product. The kind is recognised by the file's content, never by its name: ``artifact=
"README.md"`` names a file that is not an artifact, whatever its suffix, and is refused
rather than replaced. One recogniser per kind, here, and every writer of the core (the
pair a capture writes, a signature ``sign`` writes, a key ``keygen`` writes) goes through
``refusal`` via ``artifact.pair.write_files``; the engine asks the same question before it
starts an emit, so the user hears of a refusal before a capture runs.

Where a write may go (inside the workspace) is the engine's rule: only it knows the
workspace. This module imports neither torch nor the server (the engine imports it).
"""

from __future__ import annotations

import json
import os
import pickletools
import re
import stat
import zipfile
from collections.abc import Callable

from precompile.errors import PrecompileError

#: The first bytes of every artifact's header comment (``emit.artifact_header``).
ARTIFACT_MARKER = b"# torch-precompile artifact:"
SIGNATURE_FORMAT = "torch-precompile-signature"
#: The ``format`` of a cache envelope (``precompile.artifact.envelope``, which imports torch when
#: it reads or writes one; recognising one here must not).
CACHE_FORMAT = "torch-precompile-cache"

#: What each kind is called in a refusal.
KIND_NAMES = {
    "artifact": "torch-precompile artifact",
    "cache": "torch-precompile cache",
    "signature": "torch-precompile signature",
    "report": "report of precompile check, merge or coverage",
    "key": "key",
}


def _head(path: str, size: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(size)


def is_artifact(path: str) -> bool:
    """An artifact's python_code starts with its header comment."""
    return _head(path, len(ARTIFACT_MARKER)) == ARTIFACT_MARKER


def is_cache(path: str) -> bool:
    """A cache is a ``torch.save`` zip whose pickled dict starts ``{"format":
    CACHE_FORMAT, ...}``. Only the first bytes of the pickle are read, as opcodes, never
    unpickled: recognising a file must not run it, and the bundle after may be large."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("/data.pkl")), None)
            if name is None:
                return False
            with archive.open(name) as f:
                head = f.read(4096)
    except (zipfile.BadZipFile, ValueError):
        return False
    strings: list[str] = []
    try:
        for opcode, arg, _ in pickletools.genops(head):
            if isinstance(arg, str) and "UNICODE" in opcode.name:
                strings.append(arg)
                if len(strings) >= 2:
                    break
    except Exception:  # the head ends mid-opcode, or is no pickle at all
        pass
    return strings[:2] == ["format", CACHE_FORMAT]


def is_signature(path: str) -> bool:
    """A signature is a small JSON object naming its format."""
    data = _head(path, 64 * 1024)
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(record, dict) and record.get("format") == SIGNATURE_FORMAT


#: The last line of a text report (``precompile check``'s summary).
_TEXT_SUMMARY = re.compile(r"^\d+ targets? checked in [\d.]+ s \(\d+ captured, \d+ from cache\): ")
#: A finding's first line in the text format (``file:line:col: severity PCnnn message``).
_TEXT_FINDING = re.compile(r"^\S.*:\d+:\d+: (error|warning|information|hint) PC\d{3} ")
#: A GitHub annotation of a finding: its title starts with the finding's code.
_ANNOTATION = re.compile(r"^::(error|warning|notice) [^:]*title=PC\d{3} ")
#: The top-level keys of each JSON report, exactly: ``check`` (``shard`` when sharded,
#: and ``merge``'s) and ``coverage``.
_JSON_REPORTS = (
    frozenset({"version", "root", "findings", "targets", "stats"}),
    frozenset({"version", "root", "findings", "targets", "stats", "shard"}),
    frozenset(
        {
            "version",
            "root",
            "logs",
            "records",
            "artifacts",
            "findings",
            "warnings",
            "max_refused",
            "over_max_refused",
        }
    ),
)
#: An empty file with such a name is a module (an empty ``__init__.py`` makes a package):
#: its existence is its content.
_SOURCE_SUFFIXES = (".py", ".pyi", ".pyw")


def is_report(path: str) -> bool:
    """A report ``precompile check``, ``merge`` or ``coverage`` wrote with ``--output``,
    recognised by its whole shape, never by a line a user could paste into their own file:
    the JSON documents, by exactly their top-level keys; SARIF whose every run's tool is
    torch-precompile; text of finding lines (and their indented continuations) ending in
    the check's summary line; GitHub annotations of findings only. An empty file is one
    (nothing to lose: ``mktemp`` makes them), unless it is a Python module."""
    data = _head(path, 64 * 1024 * 1024)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    try:
        document = json.loads(text)
    except ValueError:
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines:
            return not path.endswith(_SOURCE_SUFFIXES)
        if all(_ANNOTATION.match(line) for line in lines):
            return True
        *body, last = lines
        return bool(_TEXT_SUMMARY.match(last)) and all(
            line[0].isspace() or _TEXT_FINDING.match(line) for line in body
        )
    if not isinstance(document, dict):
        return False
    if frozenset(document) in _JSON_REPORTS and document.get("version") == 1:
        return True
    runs = document.get("runs")
    if not isinstance(runs, list):
        return False
    try:
        # Every run ours: a log merged from several tools' (sarif-multitool) holds
        # another tool's findings too, which replacing it would lose.
        return bool(runs) and all(
            run["tool"]["driver"]["name"] == "torch-precompile" for run in runs
        )
    except (TypeError, KeyError):
        return False


def _never(path: str) -> bool:
    """A key file is never replaced: that would lose the key (``precompile keygen``)."""
    return False


RECOGNISERS: dict[str, Callable[[str], bool]] = {
    "artifact": is_artifact,
    "cache": is_cache,
    "signature": is_signature,
    "report": is_report,
    "key": _never,
}


class OverwriteRefusedError(PrecompileError):
    """A write that would replace a file this product did not write (or write outside
    where it may): refused, and the file is left as it was."""


def refusal(path: str | os.PathLike[str], kind: str, shown: str | None = None) -> str | None:
    """Why ``path`` may not be written as a file of ``kind``, or None when it may (it is
    absent, or holds a file of that kind). Reads only the start of an existing file.
    ``shown`` is how the message names the path (default: as given)."""
    path = os.fspath(path)
    name = path if shown is None else shown
    try:
        # lstat, never stat or open, first: a FIFO would block the open forever, and a
        # rename over a device node or a symbolic link (/dev/null, /dev/stdout) replaces
        # the node itself. Only a regular file can be this product's own.
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"{name} cannot be examined ({error.strerror or error})"
    if not stat.S_ISREG(mode):
        return f"{name} is {_not_regular(mode)}, never written"
    try:
        ours = RECOGNISERS[kind](path)
    except OSError as error:
        return f"{name} already exists and cannot be read ({error.strerror or error})"
    if ours:
        return None
    if kind == "key":
        return f"{name} already exists; a key file is never overwritten (that would lose the key)"
    return f"{name} already exists and is not a {KIND_NAMES[kind]}, so it is never overwritten"


def _not_regular(mode: int) -> str:
    """What a path that is not a regular file holds, as a refusal names it."""
    for test, what in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return what
    return "not a regular file"


REFUSAL_HINT = (
    "choose a path that is new or holds this product's own file of that kind (e.g. "
    "artifacts/NAME.py), or move the existing file away if you mean to replace it"
)


def check_writes(files: list[tuple[str, str]]) -> None:
    """Raise OverwriteRefusedError naming every ``(path, kind)`` that may not be
    written; nothing is written then."""
    problems = [p for path, kind in files if (p := refusal(path, kind)) is not None]
    if problems:
        raise OverwriteRefusedError("; ".join(problems), hint=REFUSAL_HINT)


def pair_paths(artifact_path: str, cache_path: str | None = None) -> list[tuple[str, str]]:
    """Every path the pair of ``artifact_path`` occupies, with its kind: the artifact,
    its cache (default ``NAME.cache``) and its signature (``NAME.sig``; an unsigned
    write removes it). Temporaries and backups are random ``.NAME.*.tmp``/``.bak``
    siblings created exclusively, so they cannot take another file's place."""
    root, _ = os.path.splitext(artifact_path)
    return [
        (artifact_path, "artifact"),
        (root + ".cache" if cache_path is None else cache_path, "cache"),
        (root + ".sig", "signature"),
    ]


def pair_collision(artifact_path: str, cache_path: str | None = None) -> str | None:
    """Why the pair's own paths overlap (``artifact="bar.sig"`` is its own signature
    path; ``artifact="bar.cache"`` its own cache), or None."""
    seen: dict[str, str] = {}
    for path, kind in pair_paths(artifact_path, cache_path):
        real = os.path.realpath(path)
        if real in seen:
            return (
                f"the pair's {seen[real]} and its {kind} would both be {path!r} (the cache "
                f"and the signature go beside the artifact as NAME.cache and NAME.sig)"
            )
        seen[real] = kind
    return None
