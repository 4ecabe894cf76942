"""A capture and the language server read a function's module the same way, and find the
same function in it: what the capture records (``function_records``, from the module as
Python loaded it) is what ``precompile check`` compares with the file on disk
(``source_digest.decode_source``, ``changed_functions``, ``changed_bindings``).

helper-85's attack on the staleness records: a CRLF, BOM or latin-1 file was stale with no
edit at all (the server decoded raw UTF-8); a line at column 0 inside a function (a
comment as some editors write it, a docstring's line) left no reads recorded at all (its
text could not be dedented and parsed again), as did a lambda split over lines; a class
defined inside ``try``/``except ImportError`` had no class rows; a form feed above a
function shifted its digest off its last line.
"""

from __future__ import annotations

import importlib
import itertools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

_numbers = itertools.count()


def _captured(
    tmp_path: Path,
    text: str,
    ran: Callable[[Any], list[Any]],
    *,
    newline: str = "\n",
    encoding: str = "utf-8",
    bom: bool = False,
) -> tuple[Path, list[dict[str, Any]]]:
    """Write ``text`` as a module of a fresh package (with ``newline``, in ``encoding``),
    import it, and record the functions ``ran(module)`` as a capture that ran them does."""
    from precompile.capturing.function_records import function_records

    package = f"sources_pkg{next(_numbers)}"
    folder = tmp_path / package
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    data = text.replace("\n", newline).encode(encoding)
    (folder / "m.py").write_bytes(b"\xef\xbb\xbf" + data if bom else data)
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module(f"{package}.m")
    finally:
        sys.path.remove(str(tmp_path))
    codes = [getattr(f, "__code__", f) for f in ran(module)]
    records = json.loads(json.dumps(function_records(codes, str(tmp_path / "a.py"))))
    return folder / "m.py", records


def _stale(tmp_path: Path, records: list[dict[str, Any]]) -> list[Any]:
    """What ``precompile check`` says changed, reading the files as it does."""
    from precompile.runtime.source_digest import changed_functions, decode_source
    from precompile.source_bindings import changed_bindings

    def module_text(module: str, path: str) -> str | None:
        return decode_source((tmp_path / path).read_bytes())

    functions = [record["function"] for record, _gone in changed_functions(records, module_text)]
    return functions + [names for _record, _read, names in changed_bindings(records, module_text)]


def _edit(path: Path, old: str, new: str, encoding: str = "utf-8") -> None:
    data = path.read_bytes()
    assert old.encode(encoding) in data, old
    path.write_bytes(data.replace(old.encode(encoding), new.encode(encoding), 1))


TARGET = "# coding: {encoding}\n# gain, in {note}\nK = 2.0\n\n\ndef target(x):\n    return x * K\n"


@pytest.mark.parametrize(
    ("newline", "encoding", "bom"),
    [("\r\n", "utf-8", False), ("\n", "utf-8", True), ("\n", "latin-1", False)],
    ids=["crlf", "bom", "latin-1"],
)
def test_a_module_is_read_as_python_reads_it(
    tmp_path: Path, newline: str, encoding: str, bom: bool
) -> None:
    """A Windows checkout's CRLF file, a file with a UTF-8 BOM, a latin-1 file with its
    coding cookie: unchanged, the artifact is current; the global it reads edited, stale."""
    text = TARGET.format(encoding=encoding, note="d\u00e9cibels")
    path, records = _captured(
        tmp_path, text, lambda m: [m.target], newline=newline, encoding=encoding, bom=bom
    )
    assert [r["function"] for r in records] == ["target"]
    assert _stale(tmp_path, records) == []
    _edit(path, "K = 2.0", "K = 3.0", encoding)
    assert _stale(tmp_path, records) == [["K"]]


COLUMN_ZERO = '''SCALE = 2.0

try:
    from _not_shipped import Net
except ImportError:

    class Net:
        BIAS = 1.0

        def __init__(self):
            self.gain = 3.0

        def forward(self, x):
            """Scale x.
Unindented, as a docstring may be."""
#            x = x * 0  (a comment at column 0, as some editors write one)
            return x * SCALE * self.gain + self.BIAS


double = (lambda x:
          x * SCALE)
'''


@pytest.mark.parametrize(
    ("old", "new", "changed"),
    [
        ("SCALE = 2.0", "SCALE = 5.0", ["SCALE"]),
        ("BIAS = 1.0", "BIAS = 5.0", ["BIAS"]),
        ("self.gain = 3.0", "self.gain = 5.0", ["gain"]),
    ],
)
def test_a_function_with_a_line_at_column_zero_has_its_reads_recorded(
    tmp_path: Path, old: str, new: str, changed: list[str]
) -> None:
    """The reads of a method with a docstring line and a comment at column 0, of a class
    defined inside ``except ImportError``, and of a lambda split over lines: each edit to
    what they read is stale (none was: no reads were recorded for either function, and
    the class had no rows)."""
    path, records = _captured(tmp_path, COLUMN_ZERO, lambda m: [m.Net.forward, m.double])
    assert sorted(r["function"] for r in records) == ["<lambda>", "Net.forward"]
    assert _stale(tmp_path, records) == []
    _edit(path, old, new)
    stale = [name for names in _stale(tmp_path, records) for name in names]
    assert set(changed) <= set(stale), stale
    if changed == ["SCALE"]:
        assert stale.count("SCALE") == 2, stale  # the method's read and the lambda's


def test_a_form_feed_above_a_function_keeps_its_last_line_in_its_digest(tmp_path: Path) -> None:
    """A ``^L`` page break above a function: Python counts it on its line, ``str.splitlines``
    as a line of its own, which cut the function's last line out of its digest."""
    text = "import math\n\f\n\ndef target(x):\n    y = x + 1\n    return y * 2.0\n"
    path, records = _captured(tmp_path, text, lambda m: [m.target])
    assert _stale(tmp_path, records) == []
    _edit(path, "return y * 2.0", "return y * 3.0")
    assert _stale(tmp_path, records) == ["target"]


WORKSPACE_TARGET = """import torch

import precompile

SCALE = 2.0


def examples():
    torch.manual_seed(0)
    return [precompile.Example(torch.nn.Linear(4, 4).eval(), torch.randn(2, 4))]


@precompile.target(examples)
def run(model, x):
    return model(x) * SCALE
"""


def test_check_reads_a_crlf_module_with_a_bom_as_the_capture_did(tmp_path: Path) -> None:
    """``precompile check`` on a Windows checkout (CRLF, a UTF-8 BOM): the emitted
    artifact is current until what it read changes (it was stale with no edit at all:
    the language server decoded the bytes as plain UTF-8)."""
    from tests.harness import precompile_cli

    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "__init__.py").write_text("")
    module = root / "src" / "pkg" / "t.py"
    module.write_bytes(b"\xef\xbb\xbf" + WORKSPACE_TARGET.replace("\n", "\r\n").encode())
    (root / "pyproject.toml").write_text(
        '[tool.precompile]\nsource-roots = ["src"]\ntracer = "make_fx"\nbackend = "eager"\n'
        'artifact-dir = "artifacts"\n'
    )
    emitted = precompile_cli("check", "--emit", cwd=root, timeout=600)
    assert emitted.returncode == 0, emitted.stdout + emitted.stderr

    def stale() -> list[str]:
        proc = precompile_cli("check", "--format", "json", cwd=root, timeout=600)
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
        findings = json.loads(proc.stdout)["findings"]
        return [f["message"] for f in findings if f["code"] == "PC301"]

    assert stale() == []
    _edit(module, "SCALE = 2.0", "SCALE = 3.0")
    assert [("`SCALE`" in m) for m in stale()] == [True]


SUBCLASSED = """class Block:
    SCALE = 1.0

    def __init__(self):
        self.gain = 1.0

    def forward(self, x):
        return x * self.SCALE * self.gain


class WideBlock(Block):
    SCALE = 2.0


class TunedBlock(WideBlock):
    def __init__(self):
        super().__init__()
        self.gain = 3.0


class Other:
    SCALE = 4.0
"""


@pytest.mark.parametrize(
    ("old", "new", "changed"),
    [
        ("    SCALE = 2.0", "    SCALE = 5.0", ["SCALE"]),
        ("        self.gain = 3.0", "        self.gain = 5.0", ["gain"]),
        ("    SCALE = 1.0", "    SCALE = 5.0", ["SCALE"]),
        ("    SCALE = 4.0", "    SCALE = 5.0", []),
    ],
    ids=["subclass", "sub-subclass-init", "base", "unrelated"],
)
def test_a_method_run_on_a_subclass_instance_reads_through_the_subclass(
    tmp_path: Path, old: str, new: str, changed: list[str]
) -> None:
    """helper-85: ``Block.forward`` run on a ``WideBlock`` reads ``self.SCALE`` from
    WideBlock's body, yet its rows followed only Block's MRO, so an edit to the
    subclass (the instance's class) left the artifact current."""
    path, records = _captured(tmp_path, SUBCLASSED, lambda m: [m.Block.forward])
    assert _stale(tmp_path, records) == []
    _edit(path, old, new)
    said = {name for names in _stale(tmp_path, records) for name in names}
    # What changed is named (a subclass's row may name the other attributes read too:
    # its digests take in what it hands to its base); an unrelated class is not read.
    assert set(changed) <= said if changed else said == set(), said


NESTED = """from . import m as me


class Holder:
    class Sub:
        K = 2.0
        J = 1.0


class Net:
    class Cfg:
        K = 2.0

    def forward(self, x):
        return x * self.Cfg.K


def target(x):
    return x * Holder.Sub.K


def through_module(x):
    return x * me.Holder.Sub.K
"""


@pytest.mark.parametrize(
    ("ran", "old", "new", "changed"),
    [
        ("target", "        K = 2.0\n        J", "        K = 5.0\n        J", ["K"]),
        ("target", "        J = 1.0", "        J = 5.0", []),
        ("forward", "    class Cfg:\n        K = 2.0", "    class Cfg:\n        K = 5.0", ["K"]),
        ("through_module", "        K = 2.0\n        J", "        K = 5.0\n        J", ["K"]),
    ],
    ids=["global-nested", "unread-sibling", "self-nested", "module-nested"],
)
def test_an_attribute_of_a_nested_class_is_read_where_that_class_binds_it(
    tmp_path: Path, ran: str, old: str, new: str, changed: list[str]
) -> None:
    """helper-88: ``Holder.Sub.K`` (and ``self.Cfg.K``) had a row for ``Sub`` in
    Holder's body, whose digest is of the class statement's header: an edit of ``K``
    inside it left the artifact current."""
    path, records = _captured(
        tmp_path, NESTED, lambda m: [m.Net.forward if ran == "forward" else getattr(m, ran)]
    )
    assert _stale(tmp_path, records) == []
    _edit(path, old, new)
    said = {name for names in _stale(tmp_path, records) for name in names}
    assert set(changed) <= said if changed else said == set(), said


SPELLED = """import sys

globals()["G1"] = 2.0
vars()["G2"] = 2.0
setattr(sys.modules[__name__], "G3", 2.0)
globals().update(G4=2.0)
globals().update({"G5": 2.0})
globals().__setitem__("G6", 2.0)
sys.modules[__name__].G7 = 2.0


def __getattr__(name):
    if name == "LAZY":
        return 2.0
    raise AttributeError(name)


def target(x):
    return x * G1 * G2 * G3 * G4 * G5 * G6 * G7 * sys.modules[__name__].LAZY


def magnitude(x):
    return abs(x)


def lazy(x):
    from . import m

    return x * m.LAZY
"""


@pytest.mark.parametrize(
    ("ran", "old", "new", "changed"),
    [
        ("target", 'globals()["G1"] = 2.0', 'globals()["G1"] = 3.0', ["G1"]),
        ("target", 'vars()["G2"] = 2.0', 'vars()["G2"] = 3.0', ["G2"]),
        ("target", '"G3", 2.0', '"G3", 3.0', ["G3"]),
        ("target", "update(G4=2.0)", "update(G4=3.0)", ["G4"]),
        ("target", '{"G5": 2.0}', '{"G5": 3.0}', ["G5"]),
        ("target", '"G6", 2.0', '"G6", 3.0', ["G6"]),
        ("target", "G7 = 2.0", "G7 = 3.0", ["G7"]),
        ("lazy", "        return 2.0", "        return 3.0", ["LAZY"]),
        # A builtin is looked up without the module's __getattr__: no needless stale.
        ("magnitude", "        return 2.0", "        return 3.0", []),
    ],
    ids=[
        "globals",
        "vars",
        "setattr",
        "update-keywords",
        "update-dict",
        "setitem",
        "module-attribute",
        "module-getattr",
        "builtin-beside-getattr",
    ],
)
def test_a_global_bound_by_other_spellings_is_read_where_they_bind_it(
    tmp_path: Path, ran: str, old: str, new: str, changed: list[str]
) -> None:
    """helper-88: a global bound by ``globals()["K"] = v``, ``vars()["K"] = v`` or
    ``setattr(sys.modules[__name__], "K", v)``, or answered by the module's
    ``__getattr__`` (PEP 562), had the digest of no statement: an edit of its value left
    the artifact current."""
    path, records = _captured(tmp_path, SPELLED, lambda m: [getattr(m, ran)])
    assert _stale(tmp_path, records) == []
    _edit(path, old, new)
    said = {name for names in _stale(tmp_path, records) for name in names}
    assert set(changed) <= said if changed else said == set(), said
