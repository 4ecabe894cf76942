"""A value the capture read through a class -- a class attribute inherited from a base in
another module, one read through ``type(self)``, an enum member's value, and the first
in a model Dynamo serves installed onto the live code -- changed in the
source between the capture and a fresh serving process is refused, never served by the
graph that baked the old value.

helper-80 found all three served silently wrong by Dynamo artifacts: Dynamo rebuilds a
variant's guards at load by reading each guard's source again, so the changed value
became the guard's own expectation and passed. The load now rebuilds them with the
values the capture read. make_fx fingerprinted an enum member by its name only; by its
value too now. Both tracers (and Dynamo with Inductor), each cold in a fresh process; the
unchanged source is served exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import run_json

CONSTS = """import enum

import torch


class Base(torch.nn.Module):
    SCALE = 2.0


class Mode(enum.Enum):
    A = 2.0
"""

MODELS = """import torch

from vpkg.consts import Base


class Child(Base):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * self.SCALE


class Broken(Base):
    # A graph break inside forward: Dynamo serves it installed onto the live code.

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        torch._dynamo.graph_break()
        return y * self.SCALE


class ByType(torch.nn.Module):
    SCALE = 2.0

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * type(self).SCALE
"""

FNS = """import torch

from vpkg.consts import Mode
from vpkg.models import Broken, ByType, Child


def call(model, x):
    return model(x)


def enum_member(model, x):
    return model(x) * Mode.A.value


def make(name):
    torch.manual_seed(0)
    kinds = {"inherited": Child, "by_type": ByType, "installed": Broken}
    model = kinds.get(name, lambda: torch.nn.Linear(4, 4))()
    return model.eval(), torch.randn(2, 4)
"""

CASES = {"inherited": "call", "by_type": "call", "enum_member": "enum_member", "installed": "call"}

CAPTURE = """
import json, warnings, torch, precompile
from vpkg import fns
warnings.simplefilter("ignore")
tracer = precompile.MakeFxTracer() if {tracer!r} == "make_fx" else precompile.DynamoTracer()
modes = {{}}
for name, fn in {cases!r}.items():
    model, x = fns.make(name)
    with torch.no_grad(), precompile.capture(
        getattr(fns, fn), artifact_path=f"{{name}}.py", cache_path=f"{{name}}.cache",
        tracer=tracer, backend={backend!r},
    ) as cap:
        cap(model, x)
    modes[name] = getattr(cap.report(), "serving_mode", None)
print(json.dumps(modes))
"""

SERVE = """
import json, warnings, torch, precompile
from vpkg import fns
warnings.simplefilter("ignore")
cells = {{}}
for name, fn in {cases!r}.items():
    model, x = fns.make(name)
    with torch.no_grad():
        want = getattr(fns, fn)(model, x)
        try:
            got = precompile.load(f"{{name}}.py", f"{{name}}.cache")(model, x)
            cells[name] = "exact" if torch.equal(got, want) else "wrong"
        except precompile.PrecompileError as error:
            cells[name] = "refused: " + str(error)
print(json.dumps(cells))
"""


@pytest.mark.parametrize(
    ("tracer", "backend"), [("make_fx", "eager"), ("dynamo", "eager"), ("dynamo", "inductor")]
)
def test_a_value_read_through_a_class_and_changed_since_capture_is_refused(
    tmp_path: Path, tracer: str, backend: str
) -> None:
    package = tmp_path / "vpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "consts.py").write_text(CONSTS)
    (package / "models.py").write_text(MODELS)
    (package / "fns.py").write_text(FNS)
    path = [tmp_path]
    capture = CAPTURE.format(tracer=tracer, backend=backend, cases=CASES)
    modes = run_json(capture, cwd=tmp_path, pythonpath=path)
    if tracer == "dynamo":  # both of Dynamo's ways of serving
        assert modes["installed"] == "installed" and modes["inherited"] == "standalone", modes
    unchanged = run_json(SERVE.format(cases=CASES), cwd=tmp_path, pythonpath=path)
    assert unchanged == dict.fromkeys(CASES, "exact"), unchanged

    (package / "consts.py").write_text(CONSTS.replace("= 2.0", "= 3.0"))
    (package / "models.py").write_text(MODELS.replace("SCALE = 2.0", "SCALE = 3.0"))
    changed = run_json(SERVE.format(cases=CASES), cwd=tmp_path, pythonpath=path)
    for name in CASES:
        assert changed[name].startswith("refused: "), changed
        assert "2.0" in changed[name], changed  # the value the capture read
