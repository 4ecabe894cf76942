"""An artifact is stale when a name its capture read from outside the functions it ran
through is bound differently now -- not only when one of those functions changed.

helper-78's attack: ``K = 2.0`` at the top of a helper module, read by a traced helper,
changed to ``K = 3.0``; the artifact refused every call (its guard on ``K``) while plain
``precompile check`` reported nothing. Every way a function reads a name bound outside it
is a target here -- its module's global, a project module's attribute, a name imported
from one (through a re-exporting module too), a class attribute by name, through
``self`` (inherited from a base in another module too) and through ``type(self)``, an
imported enum's member, a value derived from another (``DERIVED = BASE * 2``, BASE
edited), a name a star import binds, a builtin its module comes to shadow, a submodule's
attribute through a dotted import (``pkg.consts.DOTTED``), a dataclass instance's field
default, a global its function reads where a nested function's parameter has its name
(helper-80's three misses), a name bound under an ``if`` whose test changed, a name or
module fn imports inside itself, a name read as a string (``getattr(helper, "K")``,
``vars(helper)["K"]``, ``helper.__dict__["K"]``, ``globals()["K"]``), ``self.__class__.K``, and ``super().K`` after
the class's bases changed, a global made by a function of its module (``K = compute()``,
the function's body edited), a global made from a name imported from another project
module (``X = BASE * 2``, BASE edited there) and an attribute ``__init__`` sets on the
instance (its default edited) (helper-82's)
-- under both
tracers
(and Inductor, whose artifacts carry the same records). Changes that bind nothing a
capture read (another constant, a comment, a new name, ``LOOKUP[K] = ...``, a module
global named like a class attribute read through the class) leave every artifact
current.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness import precompile_cli

HELPER = """import enum

import torch

K = 2.0
SCALE = 3.0
SHIFT = 1.0
DEEP = 1.0
BASE = 1.5
DERIVED = BASE * 2
UNUSED = 1.0
LOCAL = 2.0
GETATTRED = 2.0
VARSED = 2.0
DICTED = 2.0
IMPORTED_BASE = 2.0


class Base(torch.nn.Module):
    GAIN = 2.0


class Mode(enum.Enum):
    A = 2.0


def scale(x):
    return x * K


try:
    from pkg._accelerated import fused  # not shipped: the fallback below runs
except ImportError:
    def fused(x):
        return x * 2.0
"""

TARGETS = """import dataclasses

import torch

import pkg.consts
import precompile
from pkg import helper
from pkg.helper import scale

from .helper import SHIFT
from .helper import IMPORTED_BASE
from .reexport import DEEP
from .helper import Base, Mode
from .starred import starred

OFFSET = 1.0
NESTED = 2.0
FAST = True
if FAST:
    CHOSEN = 2.0
else:
    CHOSEN = 3.0
GLOBALED = 2.0
GOTTEN = 2.0
LOOKUP = {}
GAIN = 9.0


class Cfg:
    GAIN = 2.0


@dataclasses.dataclass
class Settings:
    scale: float = 2.0


SETTINGS = Settings()


class Net(torch.nn.Module):
    BIAS = 0.5

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) + self.BIAS


class Inherited(Base):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * self.GAIN


class ByType(torch.nn.Module):
    FACTOR = 2.0

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * type(self).FACTOR


class ByDunder(torch.nn.Module):
    DUNDER = 2.0

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * self.__class__.DUNDER


class Left(torch.nn.Module):
    PICKED = 2.0


class Right(torch.nn.Module):
    PICKED = 3.0


def computed_gain():
    return 2.0


COMPUTED = computed_gain()
FROM_IMPORTED = IMPORTED_BASE * 2


class ByInit(torch.nn.Module):
    def __init__(self, k=2.0):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.k = k

    def forward(self, x):
        return self.lin(x) * self.k


class Made:
    MADE = 2.0


def by_init_examples():
    torch.manual_seed(0)
    return [precompile.Example(ByInit().eval(), torch.randn(2, 4))]


class Rebased(Left):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * super().PICKED


def dunder_examples():
    torch.manual_seed(0)
    return [precompile.Example(ByDunder().eval(), torch.randn(2, 4))]


def rebased_examples():
    torch.manual_seed(0)
    return [precompile.Example(Rebased().eval(), torch.randn(2, 4))]


def inherited_examples():
    torch.manual_seed(0)
    return [precompile.Example(Inherited().eval(), torch.randn(2, 4))]


def by_type_examples():
    torch.manual_seed(0)
    return [precompile.Example(ByType().eval(), torch.randn(2, 4))]


def examples():
    torch.manual_seed(0)
    return [precompile.Example(torch.nn.Linear(4, 4).eval(), torch.randn(2, 4))]


def net_examples():
    torch.manual_seed(0)
    return [precompile.Example(Net().eval(), torch.randn(2, 4))]


@precompile.target(examples)
def by_helper(model, x):
    return scale(model(x))


@precompile.target(examples)
def by_module_attribute(model, x):
    return model(x) * helper.SCALE


@precompile.target(examples)
def by_global(model, x):
    return model(x) + OFFSET


@precompile.target(examples)
def by_class_attribute(model, x):
    return model(x) * Cfg.GAIN


@precompile.target(net_examples)
def by_self_attribute(model, x):
    return model(x)


@precompile.target(examples)
def by_builtin(model, x):
    return abs(model(x))


@precompile.target(examples)
def by_imported_name(model, x):
    return model(x) - SHIFT


@precompile.target(examples)
def by_two_hops(model, x):
    return model(x) - DEEP


@precompile.target(inherited_examples)
def by_inherited_attribute(model, x):
    return model(x)


@precompile.target(by_type_examples)
def by_type_of_self(model, x):
    return model(x)


@precompile.target(examples)
def by_enum_member(model, x):
    return model(x) * Mode.A.value


@precompile.target(examples)
def by_derived(model, x):
    return model(x) * helper.DERIVED


@precompile.target(examples)
def by_star_import(model, x):
    return starred(model, x)


@precompile.target(examples)
def by_dotted_module(model, x):
    return model(x) * pkg.consts.DOTTED


@precompile.target(examples)
def by_dataclass_default(model, x):
    return model(x) * SETTINGS.scale


@precompile.target(examples)
def by_local_import(model, x):
    from .helper import LOCAL

    return model(x) * LOCAL


@precompile.target(examples)
def by_local_module(model, x):
    from . import consts as c

    return model(x) * c.LOCALMOD


@precompile.target(examples)
def by_condition(model, x):
    return model(x) * CHOSEN


@precompile.target(examples)
def by_fallback_def(model, x):
    return helper.fused(model(x))


@precompile.target(examples)
def by_made_instance(model, x):
    return model(x) * Made().MADE


@precompile.target(examples)
def by_name_strings(model, x):
    scale = getattr(helper, "GETATTRED") * vars(helper)["VARSED"] * helper.__dict__["DICTED"]
    return model(x) * scale * globals()["GLOBALED"] * globals().get("GOTTEN")


@precompile.target(dunder_examples)
def by_dunder_class(model, x):
    return model(x)


@precompile.target(rebased_examples)
def by_super_after_rebase(model, x):
    return model(x)


@precompile.target(examples)
def by_computed(model, x):
    return model(x) * COMPUTED


@precompile.target(examples)
def by_derived_import(model, x):
    return model(x) * FROM_IMPORTED


@precompile.target(by_init_examples)
def by_instance_attribute(model, x):
    return model(x)


@precompile.target(examples)
def by_nested_shadow(model, x):
    def halved(NESTED):  # this NESTED is the parameter: the global is read below
        return NESTED / 2

    return halved(model(x)) * NESTED
"""

#: Target -> what its staleness message says changed (each of several), after the edits.
CHANGED: dict[str, str | tuple[str, ...]] = {
    "by_helper": "`K` (src/pkg/helper.py), which `scale` reads, changed",
    "by_module_attribute": "`SCALE` (src/pkg/helper.py), which `by_module_attribute` reads",
    "by_global": "`OFFSET` (src/pkg/t.py), which `by_global` reads, changed",
    "by_class_attribute": "`Cfg.GAIN` (src/pkg/t.py), which `by_class_attribute` reads",
    "by_self_attribute": "`Net.BIAS` (src/pkg/t.py), which `Net.forward` reads, changed",
    "by_builtin": "`abs` (src/pkg/t.py), which `by_builtin` reads, changed",
    "by_imported_name": "`SHIFT` (src/pkg/helper.py), which `by_imported_name` reads",
    "by_two_hops": "`DEEP` (src/pkg/helper.py), which `by_two_hops` reads",
    "by_inherited_attribute": "`Base.GAIN` (src/pkg/helper.py), which `Inherited.forward` reads",
    "by_type_of_self": "`ByType.FACTOR` (src/pkg/t.py), which `ByType.forward` reads",
    "by_enum_member": "`Mode.A` (src/pkg/helper.py), which `by_enum_member` reads",
    "by_derived": "`DERIVED` (src/pkg/helper.py), which `by_derived` reads",
    "by_star_import": "`STARRED` (src/pkg/consts.py), which `starred` reads",
    "by_dotted_module": "`DOTTED` (src/pkg/consts.py), which `by_dotted_module` reads",
    "by_dataclass_default": "`Settings.scale` (src/pkg/t.py), which `by_dataclass_default` reads",
    "by_nested_shadow": "`NESTED` (src/pkg/t.py), which `by_nested_shadow` reads",
    "by_condition": "`CHOSEN` (src/pkg/t.py), which `by_condition` reads",
    # A function the capture ran through, defined inside a ``try``: its own record.
    "by_fallback_def": "`fused` (src/pkg/helper.py) changed",
    # An attribute of an instance the target makes (``Made().gain``).
    "by_made_instance": "`Made.MADE` (src/pkg/t.py), which `by_made_instance` reads",
    "by_local_import": "`LOCAL` (src/pkg/helper.py), which `by_local_import` reads",
    "by_local_module": "`LOCALMOD` (src/pkg/consts.py), which `by_local_module` reads",
    "by_name_strings": (
        "`DICTED`, `GETATTRED`, `VARSED` (src/pkg/helper.py), which `by_name_strings` reads",
        "`GLOBALED`, `GOTTEN` (src/pkg/t.py), which `by_name_strings` reads",
    ),
    "by_dunder_class": (
        "`ByDunder.DUNDER` (src/pkg/t.py), which `ByDunder.forward` reads",
        # Its examples() changed too (capture(inputs_from=...), INPUT_SOURCES).
        "`dunder_examples` (src/pkg/t.py), which made the example inputs, changed",
    ),
    # The bases changed: every attribute read through the class, `lin` (an instance's)
    # too.
    "by_super_after_rebase": (
        "`Rebased.PICKED`, `Rebased.lin` (src/pkg/t.py), which `Rebased.forward` reads"
    ),
    # What a global was made with (helper-82's ``K = compute()``); an attribute set on
    # the instance by ``__init__`` (its default), which sets ``lin`` too.
    "by_computed": "`COMPUTED` (src/pkg/t.py), which `by_computed` reads",
    # A global made from a name imported from another project module.
    "by_derived_import": "`IMPORTED_BASE` (src/pkg/helper.py), which `by_derived_import` reads",
    "by_instance_attribute": (
        "`ByInit.k`, `ByInit.lin` (src/pkg/t.py), which `ByInit.forward` reads"
    ),
}


def _workspace(tmp_path: Path, tracer: str, backend: str) -> Path:
    root = tmp_path / "ws"
    package = root / "src" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text(HELPER)
    (package / "t.py").write_text(TARGETS)
    (package / "reexport.py").write_text("from pkg.helper import DEEP\n")
    (package / "starred.py").write_text(
        "from pkg.consts import *  # noqa: F403\n\n\ndef starred(model, x):\n"
        "    return model(x) * STARRED  # noqa: F405\n"
    )
    (package / "consts.py").write_text("STARRED = 2.0\nDOTTED = 2.0\nLOCALMOD = 2.0\n")
    (root / "pyproject.toml").write_text(
        f'[tool.precompile]\nsource-roots = ["src"]\ntracer = "{tracer}"\n'
        f'backend = "{backend}"\nartifact-dir = "artifacts"\n'
    )
    return root


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def _stale(root: Path) -> dict[str, str]:
    proc = precompile_cli("check", "--format", "json", cwd=root, timeout=600)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return {
        f["target"].rsplit(".", 1)[-1]: f["message"]
        for f in json.loads(proc.stdout)["findings"]
        if f["code"] == "PC301"
    }


@pytest.mark.parametrize(
    ("tracer", "backend"), [("make_fx", "eager"), ("dynamo", "eager"), ("dynamo", "inductor")]
)
def test_a_name_a_capture_read_bound_differently_makes_its_artifact_stale(
    tmp_path: Path, tracer: str, backend: str
) -> None:
    root = _workspace(tmp_path, tracer, backend)
    emitted = precompile_cli("check", "--emit", cwd=root, timeout=600)
    assert emitted.returncode == 0, emitted.stdout + emitted.stderr
    assert len(list((root / "artifacts").glob("*.py"))) == len(CHANGED)
    from precompile.artifact.metadata import inspect_artifact

    # What made each target's example inputs is the workspace's own code, never the
    # worker's (whose frames, from a source checkout, pointed out of the workspace).
    for artifact in (root / "artifacts").glob("*.py"):
        made = inspect_artifact(artifact)["INPUT_SOURCES"]
        assert made, artifact
        for record in made:
            assert (root / "artifacts" / record["path"]).resolve().is_relative_to(root.resolve())

    helper, targets = root / "src" / "pkg" / "helper.py", root / "src" / "pkg" / "t.py"
    # Nothing a capture read is bound differently: every artifact stays current.
    _edit(helper, "UNUSED = 1.0\n", "UNUSED = 5.0\n\n# the gain\n")
    _edit(helper, "K = 2.0\n", "K = 2.0  # the gain\n")
    _edit(targets, "OFFSET = 1.0\n", "OFFSET = 1.0\nNEW = 2\n")
    # Another name imported beside one a capture read; a submodule of a package it read.
    _edit(targets, "from .helper import SHIFT\n", "from .helper import SHIFT, UNUSED\n")
    _edit(targets, "import pkg.consts\n", "import pkg.consts\nimport pkg.starred\n")
    # A store keyed by a name a capture read (it binds LOOKUP, not OFFSET); a module
    # global named as a class attribute a capture read through a class (Inherited.GAIN
    # is Base's, never the module's GAIN).
    _edit(targets, "LOOKUP = {}\n", "LOOKUP = {}\nLOOKUP[OFFSET] = 'offset'\n")
    _edit(targets, "GAIN = 9.0\n", "GAIN = 10.0\n")
    # A function defined beside the ones a value was made with, and a method of a class
    # whose instance attributes a capture read that sets none of them.
    _edit(targets, "def computed_gain():", "def spare():\n    return 1\n\n\ndef computed_gain():")
    _edit(
        targets,
        "    def forward(self, x):\n        return self.lin(x) * self.k\n",
        "    def forward(self, x):\n        return self.lin(x) * self.k\n\n"
        "    def describe(self):\n        return 'by init'\n",
    )
    assert _stale(root) == {}

    _edit(helper, "K = 2.0", "K = 3.0")
    _edit(helper, "SCALE = 3.0", "SCALE = 4.0")
    _edit(helper, "SHIFT = 1.0", "SHIFT = 5.0")
    _edit(helper, "DEEP = 1.0", "DEEP = 5.0")
    _edit(helper, "    GAIN = 2.0", "    GAIN = 5.0")
    _edit(helper, "    A = 2.0", "    A = 5.0")
    _edit(helper, "BASE = 1.5", "BASE = 2.5")
    _edit(root / "src" / "pkg" / "consts.py", "STARRED = 2.0", "STARRED = 5.0")
    _edit(targets, "    FACTOR = 2.0", "    FACTOR = 5.0")
    _edit(targets, "OFFSET = 1.0", "OFFSET = 2.0")
    _edit(targets, "    GAIN = 2.0", "    GAIN = 3.0")
    _edit(targets, "    BIAS = 0.5", "    BIAS = 0.25")
    _edit(targets, "NEW = 2\n", "NEW = 2\nabs = torch.neg\n")
    _edit(root / "src" / "pkg" / "consts.py", "DOTTED = 2.0", "DOTTED = 5.0")
    _edit(targets, "    scale: float = 2.0", "    scale: float = 5.0")
    _edit(targets, "NESTED = 2.0", "NESTED = 5.0")
    _edit(targets, "FAST = True", "FAST = False")
    _edit(helper, "LOCAL = 2.0", "LOCAL = 5.0")
    _edit(root / "src" / "pkg" / "consts.py", "LOCALMOD = 2.0", "LOCALMOD = 5.0")
    for name in ("GETATTRED", "VARSED", "DICTED"):
        _edit(helper, f"{name} = 2.0", f"{name} = 5.0")
    _edit(targets, "GLOBALED = 2.0", "GLOBALED = 5.0")
    _edit(targets, "GOTTEN = 2.0", "GOTTEN = 5.0")
    _edit(targets, "    DUNDER = 2.0", "    DUNDER = 5.0")
    _edit(targets, "class Rebased(Left):", "class Rebased(Right):")
    _edit(targets, "    return 2.0\n\n\nCOMPUTED", "    return 5.0\n\n\nCOMPUTED")
    _edit(targets, "def __init__(self, k=2.0):", "def __init__(self, k=5.0):")
    _edit(helper, "IMPORTED_BASE = 2.0", "IMPORTED_BASE = 5.0")
    _edit(helper, "        return x * 2.0", "        return x * 5.0")
    _edit(targets, "    MADE = 2.0", "    MADE = 5.0")
    # What the example inputs are made with: the batch the artifact was captured on.
    _edit(
        targets,
        "[precompile.Example(ByDunder().eval(), torch.randn(2, 4))]",
        "[precompile.Example(ByDunder().eval(), torch.randn(3, 4))]",
    )
    stale = _stale(root)
    assert set(stale) == set(CHANGED), stale
    for name, said in CHANGED.items():
        for part in (said,) if isinstance(said, str) else said:
            assert part in stale[name], (name, stale[name])


GOOD_RECORD = {"module": "pkg.t", "function": "f", "path": "t.py", "sha256": "0" * 64}


@pytest.mark.parametrize(
    "records",
    [
        [5],
        [{**GOOD_RECORD, "line": "7"}],
        [{**GOOD_RECORD, "reads": [5]}],
        [{**GOOD_RECORD, "reads": [{"module": 1, "path": "y", "scope": "", "names": 3}]}],
        [
            {
                **GOOD_RECORD,
                "reads": [
                    {"module": "m", "path": "m.py", "scope": "", "module_sha256": "", "names": 3}
                ],
            }
        ],
    ],
)
@pytest.mark.parametrize("key", ["FUNCTION_SOURCES", "INPUT_SOURCES"])
def test_a_function_record_of_the_wrong_shape_is_an_unreadable_artifact(
    tmp_path: Path, records: list[object], key: str
) -> None:
    """A workspace may hold an artifact edited by hand or written by another tool: the
    language server reads its records without running it, and one of the wrong shape is
    reported as an artifact that cannot be read, never an internal error."""
    from precompile.artifact.metadata import (
        ARTIFACT_FORMAT,
        ARTIFACT_FORMAT_VERSION,
        METADATA_END,
    )
    from precompile.write_policy import ARTIFACT_MARKER
    from precompile_lsp.staleness import artifact_status

    artifact = tmp_path / "pkg.t.f.py"
    rows = {"FUNCTION_SOURCES": [GOOD_RECORD], "INPUT_SOURCES": []} | {key: records}
    artifact.write_text(
        f"{ARTIFACT_MARKER.decode()}\nFORMAT = {ARTIFACT_FORMAT!r}\n"
        f"FORMAT_VERSION = {ARTIFACT_FORMAT_VERSION!r}\n"
        + "".join(f"{name} = {value!r}\n" for name, value in rows.items())
        + f"{METADATA_END}\n"
    )
    status = artifact_status(artifact)
    assert status.exists and status.unreadable is not None, status
    assert f"{key}[0]" in status.unreadable and "edited" in status.unreadable
    if key == "INPUT_SOURCES":
        artifact.write_text(
            artifact.read_text().replace(f"INPUT_SOURCES = {records!r}", "INPUT_SOURCES = 5")
        )
        status = artifact_status(artifact)
        assert status.unreadable is not None and "INPUT_SOURCES is not a list" in status.unreadable


MADE = """
def with_gain(g):
    def deco(cls):
        cls.GAIN = g * SCALE
        return cls
    return deco


class Meta(type):
    def __new__(mcs, name, bases, ns):
        ns["BIAS"] = 2.0
        return super().__new__(mcs, name, bases, ns)


class A:
    GAIN = 2.0

    def __init_subclass__(cls, **kwargs):
        cls.MARK = 1.0


SCALE = 1.0
GAIN = 9.0


@with_gain(2.0)
class Cfg(A, metaclass=Meta):
    OWN = 1.0


def unrelated():
    return 1
"""


@pytest.mark.parametrize(
    ("old", "new", "stale"),
    [
        ("@with_gain(2.0)", "@with_gain(5.0)", True),  # the decorator's argument
        ("cls.GAIN = g * SCALE", "cls.GAIN = g * 3", True),  # the decorator's body
        ('ns["BIAS"] = 2.0', 'ns["BIAS"] = 5.0', True),  # the metaclass's body
        ("class Cfg(A,", "class Cfg(object,", True),  # its bases
        ("cls.MARK = 1.0", "cls.MARK = 2.0", True),  # a base's __init_subclass__
        ("SCALE = 1.0", "SCALE = 2.0", True),  # a global the header's maker reads
        ("GAIN = 9.0", "GAIN = 10.0", False),  # a module global, not the attribute
        ("return 1", "return 2", False),  # a function the class is not made with
    ],
)
def test_a_class_attribute_reads_the_class_header_and_what_the_class_is_made_with(
    old: str, new: str, stale: bool
) -> None:
    """``Cfg.GAIN`` (a read recorded in the class scope ``Cfg``) changes with the class's
    header and with a decorator, metaclass or base's ``__init_subclass__`` defined beside
    it (helper-82's class-decorator, metaclass, __init_subclass__ and change-of-bases
    misses), not with a module global of
    the same name (its false stale)."""
    import ast

    from precompile.source_bindings import binding_digests

    edited = MADE.replace(old, new, 1)
    assert edited != MADE
    names = ["GAIN", "BIAS", "OWN", "MARK"]
    before = binding_digests(MADE, ast.parse(MADE), names, "Cfg")
    after = binding_digests(edited, ast.parse(edited), names, "Cfg")
    assert (before != after) is stale, (old, new)


MADE_BY = """import torch

BASE = 2.0
CFG = {"gain": 2.0}
CFG.update(gain=BASE)
torch.manual_seed(0)


def compute():
    return BASE * 2


K = compute()
J = 1.0


def setup():
    global J
    J = 2.0


setup()


class Net(torch.nn.Module):
    def __init__(self, k=2.0):
        super().__init__()
        self.k = k
        setattr(self, "j", 1.0)

    def forward(self, x):
        return x * self.k * self.j

    def spare(self):
        return 1
"""


@pytest.mark.parametrize(
    ("old", "new", "names", "scope", "stale"),
    [
        ("return BASE * 2", "return BASE * 3", ["K"], "", True),  # what K was made with
        ("BASE = 2.0", "BASE = 3.0", ["K"], "", True),  # what that function reads
        ("def compute():", "def compute(n=1):", ["compute"], "", False),  # its own record
        ("K = compute()", "K = compute()\n\n\ndef K():\n    pass", ["K"], "", True),
        ("k=2.0", "k=3.0", ["k"], "Net", True),  # set on the instance by __init__
        ('"j", 1.0', '"j", 2.0', ["j"], "Net", True),  # setattr(self, "j", ...)
        ("return 1", "return 2", ["k", "j"], "Net", False),  # a method setting neither
        ("return x * self.k", "return x + self.k", ["k"], "Net", False),  # a reader
        # A global changed in place at import (helper-82's ``CFG.update(...)``): a
        # method's call, setattr, del of an item; not torch's own state by a call of it.
        ("CFG.update(gain=BASE)", "CFG.update(gain=3.0)", ["CFG"], "", True),
        ("BASE = 2.0", "BASE = 3.0", ["CFG"], "", True),
        ("torch.manual_seed(0)", 'setattr(CFG, "gain", 1.0)', ["CFG"], "", True),
        ("torch.manual_seed(0)", 'del CFG["gain"]', ["CFG"], "", True),
        ("torch.manual_seed(0)", "torch.manual_seed(1)", ["torch", "CFG", "K"], "", False),
        # A function setting a global it declares (helper-82's ``global K`` in a setup
        # function), called at import.
        (
            "K = compute()",
            "K = compute()\n\n\ndef setup():\n    global K\n    K = 1\n",
            ["K"],
            "",
            True,
        ),
        ("    J = 2.0", "    J = 3.0", ["J"], "", True),
    ],
)
def test_a_binding_counts_what_made_its_value(
    old: str, new: str, names: list[str], scope: str, stale: bool
) -> None:
    """A global made by calling a function of its module (``K = compute()``) changes with
    that function's body; an attribute a class's body does not bind, with the methods
    that set it on the instance (``self.k = k`` in ``__init__``, with its default); a
    name a definition comes to bind, with that; a global changed in place at import
    (``CFG.update(...)``), with that statement (helper-82's misses). A function read
    itself counts only as bound (the capture records its own body where it ran)."""
    import ast

    from precompile.source_bindings import binding_digests

    edited = MADE_BY.replace(old, new, 1)
    assert edited != MADE_BY
    before = binding_digests(MADE_BY, ast.parse(MADE_BY), names, scope)
    after = binding_digests(edited, ast.parse(edited), names, scope)
    assert (before != after) is stale, (old, new)


SHAPES = {
    "overridden": "class Net:\n    k = 1.0\n\n    def __init__(self, k=2.0):\n        self.k = k\n",
    "spelled": (
        "class Net:\n    def __init__(self):\n        vars(self)['a'] = 1.0\n"
        "        self.__dict__['b'] = 1.0\n        self.__dict__.update(c=1.0)\n"
        "        object.__setattr__(self, 'd', 1.0)\n        self.__setattr__('e', 1.0)\n"
        "        type(self).f = 1.0\n        self.__class__.g = 1.0\n"
    ),
    "decorated": (
        "def with_k(k):\n    return lambda f: f\n\n\nclass Net:\n"
        "    @with_k(2.0)\n    def __init__(self):\n        self.k = 1.0\n"
    ),
    "conditional": (
        "FAST = True\nif FAST:\n    def f(x):\n        return x\nelse:\n"
        "    def f(x):\n        return -x\n"
    ),
    "class_body_def": (
        "K = 1\n\n\nclass Net:\n    K = 2\n\n    def make():\n        return K\n\n"
        "    k = make()\n"
    ),
    "locals": "n = 10\n\n\ndef make(n=3):\n    return n\n\n\nK = make()\n",
    "identical": "".join(f"def make():\n    return {v}\n\n\n" for v in (1, 2, 1)) + "K = make()\n",
    # Values computed through the instance in a method counted whole, and a module
    # global named like an instance attribute (never what ``self.dim`` reads).
    "through_self": (
        "dim = 10\n\n\nclass Net:\n    def __init__(self):\n        self.setup()\n"
        "        self.k = self._make_k()\n        self.scale = self.dim ** -0.5\n\n"
        "    def setup(self):\n        self.dim = 4\n\n"
        "    def _make_k(self):\n        return 2.0\n\n"
        "    def unrelated(self):\n        return 1\n"
    ),
    # A subclass handing values to its base's __init__, which sets the attribute.
    "subclass": (
        "class Base:\n    def __init__(self, k=1.0, j=1.0):\n        self.k = k\n"
        "        self.j = j\n\n\nclass Sub(Base):\n    def __init__(self):\n"
        "        super().__init__(k=2.0)\n\n\nclass Named(Base):\n"
        "    def __init__(self):\n        Base.__init__(self, 2.0)\n\n"
        "    def forward(self, x):\n        return super().forward(x)\n"
    ),
    # A registry a module function fills when called at import; a decorator that
    # replaces the function it decorates (so that function never runs, and has no record).
    "filled": (
        "REG = {}\n\n\ndef fill():\n    REG['a'] = 1.0\n\n\nfill()\n\n\n"
        "def peek():\n    return REG.get('a')\n\n\n"
        "def cached(fn):\n    return lambda x: x * 2\n\n\n@cached\ndef f(x):\n    return x\n"
    ),
    # Stores into a class by its name: a staticmethod's, the module's, a module
    # function's (called at import).
    "class_stores": (
        "class Net:\n    def __init__(self):\n        self.lin = 1\n\n    @staticmethod\n"
        "    def configure():\n        Net.k = 2.0\n\n\ndef init_params(v):\n"
        "    setattr(Net, 'j', v)\n\n\nNet.m = 3.0\ninit_params(4.0)\n"
    ),
    "spelled_reads": (
        "class Net:\n    A = 1.0\n    B = 1.0\n    C = 1.0\n\n    def __init__(self):\n"
        "        self.a = type(self).A * 2\n        self.b = self.__class__.B * 2\n"
        "        self.c = getattr(self, 'C') * 2\n"
    ),
    # A generated dispatch table: 1,500 ``elif`` branches nest 1,500 blocks deep.
    "elif_chain": "X = 700\nif X == 0:\n    K = 0.0\n"
    + "".join(f"elif X == {i}:\n    K = {i}.0\n" for i in range(1, 1500)),
}


@pytest.mark.parametrize(
    ("shape", "old", "new", "names", "scope", "stale"),
    [
        # An __init__ setting what the class body binds too: the instance's wins.
        ("overridden", "k=2.0", "k=3.0", ["k"], "Net", True),
        # The other spellings of a store on the instance or its class.
        ("spelled", "['a'] = 1.0", "['a'] = 9.0", ["a"], "Net", True),
        ("spelled", "['b'] = 1.0", "['b'] = 9.0", ["b"], "Net", True),
        ("spelled", "c=1.0", "c=9.0", ["c"], "Net", True),
        ("spelled", "'d', 1.0", "'d', 9.0", ["d"], "Net", True),
        ("spelled", "'e', 1.0", "'e', 9.0", ["e"], "Net", True),
        ("spelled", "f = 1.0", "f = 9.0", ["f"], "Net", True),
        ("spelled", "g = 1.0", "g = 9.0", ["g"], "Net", True),
        ("decorated", "@with_k(2.0)", "@with_k(3.0)", ["k"], "Net", True),  # its decorator
        ("conditional", "FAST = True", "FAST = False", ["f"], "", True),  # which def binds f
        # A function defined in a class body reads the module's K, not the class's.
        ("class_body_def", "K = 1\n", "K = 5\n", ["k"], "Net", True),
        ("class_body_def", "    K = 2\n", "    K = 5\n", ["k"], "Net", False),
        # A definition's parameters and locals are not the module's globals.
        ("locals", "n = 10", "n = 11", ["K"], "", False),
        ("locals", "n=3", "n=4", ["K"], "", True),
        # Three definitions, the last like the first: deleting it changes which binds K.
        ("identical", "def make():\n    return 1\n\n\nK", "K", ["K"], "", True),
        # helper-84's ``self.k = self._make_k()`` and ``self.dim`` set by another method.
        ("through_self", "return 2.0", "return 3.0", ["k"], "Net", True),
        ("through_self", "self.dim = 4", "self.dim = 5", ["scale"], "Net", True),
        ("through_self", "return 1", "return 2", ["k", "scale"], "Net", False),
        ("through_self", "dim = 10\n", "dim = 11\n", ["k", "scale"], "Net", False),
        # helper-84's subclass passing a value to its base's ``__init__``.
        ("subclass", "k=2.0", "k=3.0", ["k"], "Sub", True),
        ("subclass", "self, 2.0", "self, 3.0", ["k"], "Named", True),
        (
            "subclass",
            "(k=2.0)\n",
            "(k=2.0)\n\n    def other(self):\n        return 1\n",
            ["k"],
            "Sub",
            False,
        ),
        # helper-84's ``fill()`` at import, and a decorator replacing f.
        ("filled", "REG['a'] = 1.0", "REG['a'] = 2.0", ["REG"], "", True),
        ("filled", "\n\nfill()\n", "\n\n", ["REG"], "", True),
        ("filled", "return REG.get('a')", "return REG.get('b')", ["REG"], "", False),
        ("filled", "x: x * 2", "x: x * 3", ["f"], "", True),
        ("filled", "@cached\n", "", ["f"], "", True),
        ("filled", "    return x\n", "    return -x\n", ["f"], "", False),  # its own record
        # helper-84's stores from a staticmethod, at module level, from a module function.
        ("class_stores", "Net.k = 2.0", "Net.k = 5.0", ["k"], "Net", True),
        ("class_stores", "Net.m = 3.0", "Net.m = 5.0", ["m"], "Net", True),
        ("class_stores", "'j', v)", "'j', -v)", ["j"], "Net", True),
        ("class_stores", "init_params(4.0)", "init_params(5.0)", ["j"], "Net", True),
        # A function added beside them (a store by the class's name reads the class, so
        # the methods count whole there: a false stale by choice, docs/diagnostics.md).
        (
            "class_stores",
            "init_params(4.0)\n",
            "init_params(4.0)\n\n\ndef spare():\n    return 1\n",
            ["k", "m", "j"],
            "Net",
            False,
        ),
        # helper-85: what a method counted whole reads of its class, however spelled.
        ("spelled_reads", "A = 1.0", "A = 2.0", ["a"], "Net", True),
        ("spelled_reads", "B = 1.0", "B = 2.0", ["b"], "Net", True),
        ("spelled_reads", "C = 1.0", "C = 2.0", ["c"], "Net", True),
        # Deeper than Python's recursion limit: walked, not a RecursionError.
        ("elif_chain", "K = 1200.0", "K = -1.0", ["K"], "", True),
        ("elif_chain", "X = 700", "X = 701", ["K"], "", True),
    ],
)
def test_a_binding_is_followed_as_python_resolves_it(
    shape: str, old: str, new: str, names: list[str], scope: str, stale: bool
) -> None:
    """helper-84's attack on the rules above: an attribute set on the instance is what
    its methods set even where the class body binds it, however the store is spelled,
    with the method's decorators; a definition read itself counts the tests it sits
    under; a definition's body is resolved in its module (not the class it sits in),
    and its parameters are not globals."""
    import ast

    from precompile.source_bindings import binding_digests

    text = SHAPES[shape]
    edited = text.replace(old, new, 1)
    assert edited != text, (old, text)
    before = binding_digests(text, ast.parse(text), names, scope)
    after = binding_digests(edited, ast.parse(edited), names, scope)
    assert (before != after) is stale, (shape, old, new)


BLOCKS = {
    "if": "if FAST:\n    def f(x):\n        return 1\nelse:\n    def f(x):\n        return 2\n",
    "try": "try:\n    from _c import f\nexcept ImportError:\n    def f(x):\n        return 1\n",
    "finally": "try:\n    pass\nfinally:\n    def f(x):\n        return 1\n",
    "with": "with ctx():\n    def f(x):\n        return 1\n",
    "for": "for _ in ():\n    pass\nelse:\n    def f(x):\n        return 1\n",
    "while": "while True:\n    def f(x):\n        return 1\n    break\n",
    "match": "match MODE:\n    case 1:\n        def f(x):\n            return 1\n",
    "method": "if FAST:\n    class Net:\n        if X:\n            def f(self):\n                return 1\n",
    # Lambdas after three lines were added above them (helper-86: found by their exact
    # first line, a lambda was gone once anything above it moved); one inside g is g's.
    "lambdas": "\n\n# added\nA = lambda x: 1\n\n\ndef g():\n    return lambda y: 3\n\n\n"
    "B = [lambda z: 2]\n",
}


@pytest.mark.parametrize(
    ("block", "qualname", "line", "body"),
    [
        ("if", "f", 2, "return 1"),
        ("if", "f", 5, "return 2"),  # the same name in the other branch: by line
        ("try", "f", 4, "return 1"),
        ("finally", "f", 4, "return 1"),
        ("with", "f", 2, "return 1"),
        ("for", "f", 4, "return 1"),
        ("while", "f", 2, "return 1"),
        ("match", "f", 3, "return 1"),
        ("method", "Net.f", 4, "return 1"),
        ("lambdas", "<lambda>", 1, "lambda x: 1"),
        ("lambdas", "<lambda>", 8, "lambda z: 2"),
        ("lambdas", "g.<locals>.<lambda>", 5, "lambda y: 3"),
    ],
)
def test_a_function_defined_inside_a_block_is_found_by_its_record(
    block: str, qualname: str, line: int, body: str
) -> None:
    """A function defined in a block of its scope (``try: ... except ImportError: def
    f``, ``if FAST: def f``) is the module's as much as one at its top level: its source
    is found, so a capture records it and an edit to its body makes the artifact stale
    (it had no record, and ``check`` called the artifact current)."""
    from precompile.runtime.source_digest import function_source

    source = function_source(BLOCKS[block], qualname, line)
    assert source is not None and source.splitlines()[-1].strip() == body, source


@pytest.mark.parametrize("branches", [5_000, 20_000])
def test_a_module_deeper_than_the_parser_reaches_has_changed_every_name_read(
    branches: int,
) -> None:
    """A text whose ``elif`` chain nests past what ``ast.parse`` reaches does not parse
    (nor can Python import it; 5,000 branches are a RecursionError there, 20,000 a
    "parser stack overflowed" MemoryError): every name read there has changed, reported,
    not an exception out of the language server's staleness check."""
    from precompile.source_bindings import changed_bindings

    deep = "X = 1\nif X == 0:\n    K = 0.0\n" + "elif X == 1:\n    K = 1.0\n" * branches
    record = {
        "reads": [
            {"module": "m", "path": "m.py", "scope": "", "module_sha256": "0", "names": {"K": "0"}}
        ]
    }
    found = list(changed_bindings([record], lambda module, path: deep))
    assert [names for _record, _read, names in found] == [["K"]]


def test_an_attribute_of_an_instance_made_in_the_function_is_read_from_its_class() -> None:
    """``Cfg().k`` reads ``k`` as Cfg's instances have it (helper-84): an attribute read
    of Cfg, so the capture records where Cfg's methods set it."""
    import ast

    from precompile.source_bindings import function_reads

    source = (
        "def f(model, x):\n    made = Made()\n"
        "    return model(x) * Cfg(2).k * helper(x).j * made.m * getattr(Other(), 'o')\n"
    )
    _names, _first, attributes, _chains = function_reads(ast.parse(source).body[0])
    assert attributes["Cfg"] == {"k"} and attributes["helper"] == {"j"}, attributes
    # Bound to a local first (helper-85), or read with getattr.
    assert attributes["Made"] == {"m"} and attributes["Other"] == {"o"}, attributes


def test_a_global_read_through_globals_is_a_read_of_that_name() -> None:
    """``globals()["K"]`` and ``globals().get("K")`` read the global K, as ``K`` does
    (helper-82); a computed name is not followed (``--verify`` is)."""
    import ast

    from precompile.source_bindings import function_reads

    source = (
        "def f(model, x, name):\n"
        "    return model(x) * globals()['K'] * globals().get('G') * globals()[name]\n"
    )
    names, _first, _attributes, _chains = function_reads(ast.parse(source).body[0])
    assert {"K", "G"} <= set(names), names
