"""An artifact is made from its target's example inputs as well as its code: the model
``examples()`` builds (``Net()`` becoming ``Net(k=3.0)``) and the shapes it passes. No trace
runs through ``examples``, so its source was never recorded, and ``precompile check``
called such an artifact current after the examples changed. ``capture(inputs_from=...)``
records it (``INPUT_SOURCES``), compared as a traced function is; a load never reads it.
"""

from __future__ import annotations

import importlib
import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness import run_json

_numbers = itertools.count()

MODULE = """import torch

import precompile

BATCH = 2
UNUSED = 1.0


class Net(torch.nn.Module):
    def __init__(self, k=1.0):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.k = k

    def forward(self, x):
        return self.lin(x) * self.k


def build():
    return Net().eval()


def examples():
    torch.manual_seed(0)
    return [precompile.Example(build(), torch.randn(BATCH, 4))]


def other():
    return 1


def target(model, x):
    return model(x)
"""


def _imported(tmp_path: Path, text: str) -> tuple[Any, Path]:
    """``text`` written as ``m.py`` of a fresh package under ``tmp_path`` and imported:
    the module and its file."""
    package = f"examples_pkg{next(_numbers)}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    source = tmp_path / package / "m.py"
    source.write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(f"{package}.m"), source
    finally:
        sys.path.remove(str(tmp_path))


def _capture(tmp_path: Path, tracer: str) -> tuple[Path, Path, Path]:
    """Write MODULE as a fresh package, import it, and capture ``target`` from its
    ``examples()`` as a target's emit does (``codes_run`` around the call of
    ``examples``); the module's file and the pair's paths."""
    import precompile
    from precompile.capturing.function_records import codes_run

    module, source = _imported(tmp_path, MODULE)
    (tmp_path / "art").mkdir()
    artifact, cache = tmp_path / "art" / "a.py", tmp_path / "art" / "a.cache"
    with codes_run() as made_by:
        (example,) = module.examples()
    with precompile.capture(
        module.target,
        artifact_path=artifact,
        cache_path=cache,
        tracer=precompile.MakeFxTracer() if tracer == "make_fx" else precompile.DynamoTracer(),
        backend="eager",
        inputs_from=made_by,
    ) as cap:
        cap(*example.args)
    return source, artifact, cache


def _said(artifact: Path) -> list[str]:
    from precompile_lsp.staleness import artifact_status

    status = artifact_status(artifact)
    assert status.exists and status.unreadable is None and status.refused is None, status
    return [s.describe(s.file.name) for s in status.stale]


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize("tracer", ["make_fx", "dynamo"])
def test_an_edit_to_what_made_the_example_inputs_makes_the_artifact_stale(
    tmp_path: Path, tracer: str
) -> None:
    source, artifact, cache = _capture(tmp_path, tracer)
    assert _said(artifact) == []
    # Beside examples(), not in it nor read by it: still current.
    _edit(source, "UNUSED = 1.0", "UNUSED = 5.0")
    _edit(source, "def other():\n    return 1", "def other():\n    return 2")
    assert _said(artifact) == []

    _edit(source, "torch.randn(BATCH, 4)", "torch.randn(BATCH, 4) * 2")
    assert _said(artifact) == ["`examples` (m.py), which made the example inputs, changed"]
    _edit(source, "torch.randn(BATCH, 4) * 2", "torch.randn(BATCH, 4)")
    assert _said(artifact) == []
    # A helper examples() calls, and the model's __init__, ran for it too.
    _edit(source, "    return Net().eval()", "    return Net(k=3.0).eval()")
    assert _said(artifact) == ["`build` (m.py), which made the example inputs, changed"]
    _edit(source, "    return Net(k=3.0).eval()", "    return Net().eval()")
    _edit(source, "        self.k = k", "        self.k = k * 1.5")
    assert "`Net.__init__` (m.py), which made the example inputs, changed" in _said(artifact)
    _edit(source, "        self.k = k * 1.5", "        self.k = k")
    assert _said(artifact) == []
    _edit(source, "BATCH = 2", "BATCH = 3")
    assert _said(artifact) == [
        "`BATCH` (m.py), which `examples` reads to make the example inputs, changed"
    ]
    _edit(source, "def examples():", "def make_examples():")
    assert "`examples` (m.py), which made the example inputs, is gone or renamed" in _said(artifact)

    # Serving never depended on the examples' source: a fresh process loads the pair and
    # serves the model it was captured with as eager does; the one examples() makes now
    # (k=3.0, a value the graph holds) is refused, never answered wrongly.
    served = run_json(
        "import json, sys, torch, precompile\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        f"from {source.parent.name}.m import Net\n"
        f"forward = precompile.load({str(artifact)!r}, {str(cache)!r})\n"
        "torch.manual_seed(0)\n"
        "model, x = Net().eval(), torch.randn(2, 4)\n"
        "same = torch.equal(forward(model, x), model(x))\n"
        "try:\n"
        "    forward(Net(k=3.0).eval(), x)\n"
        "    refused = None\n"
        "except precompile.PrecompileError as error:\n"
        "    refused = str(error)\n"
        "print(json.dumps([same, refused]))\n"
    )
    assert served[0] is True
    assert served[1] is not None, served
    assert "k = 3.0" in served[1] or "`model.k` is not 1.0" in served[1], served


@pytest.mark.parametrize("given", [5, [1, 2], ["examples"]])
def test_inputs_from_must_be_functions_or_code(tmp_path: Path, given: Any) -> None:
    import precompile

    fn: Any = lambda x: x  # noqa: E731
    with pytest.raises(TypeError, match="inputs_from must be the Python function"):
        precompile.capture(
            fn,
            artifact_path=tmp_path / "a.py",
            cache_path=tmp_path / "a.cache",
            inputs_from=given,
        )


def _made(calls: Any) -> list[str]:
    """The qualified names of this file's functions ``codes_run`` saw ``calls()`` run."""
    from precompile.capturing.function_records import codes_run

    with codes_run() as ran:
        calls()
    return [code.co_qualname for code in ran if code.co_filename == __file__]


def _helper() -> int:
    return 1


def test_what_made_the_inputs_is_recorded_beside_any_profiler_and_on_threads() -> None:
    """helper-86: ``codes_run`` handed a C-level profiler (cProfile's) back to
    ``sys.setprofile`` as a function, so the next call raised; it replaced a Python
    profiler instead of chaining it, removed a hook the examples installed themselves,
    and saw nothing a thread the examples started ran."""
    import concurrent.futures
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        assert _made(_helper) == ["_helper"]
        assert sys.getprofile() is profiler
        assert _helper() == 1
    finally:
        profiler.disable()
    sys.setprofile(None)

    seen: list[str] = []

    def outer(frame: Any, event: str, arg: object) -> None:
        if event == "call":
            seen.append(frame.f_code.co_name)

    sys.setprofile(outer)
    try:
        assert _made(_helper) == ["_helper"]
        assert sys.getprofile() is outer and "_helper" in seen
    finally:
        sys.setprofile(None)

    def installs_its_own() -> None:
        sys.setprofile(outer)

    try:
        _made(installs_its_own)
        assert sys.getprofile() is outer  # the block's own hook is left in place
    finally:
        sys.setprofile(None)

    def on_a_thread() -> None:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            assert pool.submit(_helper).result() == 1

    assert "_helper" in _made(on_a_thread)
    assert sys.getprofile() is None

    # A thread starts with threading's profiler: chained there, not the caller's one.
    import threading

    seen.clear()
    threading.setprofile(outer)
    try:
        assert "_helper" in _made(on_a_thread)
        assert "_helper" in seen
        assert threading.getprofile() is outer
    finally:
        threading.setprofile(None)


def test_the_products_own_code_is_never_what_made_the_inputs() -> None:
    """helper-86: from a source checkout, the worker's own frames (``_calls``, its
    import hooks) were recorded as what made the inputs, with paths out of the
    workspace, so moving the workspace made every artifact stale."""
    import precompile.capture_api
    import precompile_lsp.worker.jobs
    from precompile.locations import is_project_file

    assert not is_project_file(precompile_lsp.worker.jobs.__file__)
    assert not is_project_file(precompile.capture_api.__file__)
    assert is_project_file(__file__)


def test_a_callable_instance_is_recorded_by_its_call(tmp_path: Path) -> None:
    from precompile.capturing.function_records import input_records

    class Examples:
        def __call__(self) -> list[Any]:
            return []

    records = input_records(Examples(), str(tmp_path / "a.py"))
    assert [r["function"] for r in records] == [Examples.__call__.__qualname__]
    assert input_records(len, str(tmp_path / "a.py")) == []


def test_a_helper_both_traced_and_run_by_examples_is_said_once(tmp_path: Path) -> None:
    """A function the trace ran and examples() ran too is one change, said once."""
    import precompile
    from precompile.capturing.function_records import codes_run

    module, source = _imported(
        tmp_path,
        "import torch\n\nimport precompile\n\n\ndef shift(t):\n    return t + 1\n\n\n"
        "def examples():\n    return [precompile.Example(shift(torch.ones(2)))]\n\n\n"
        "def target(x):\n    return shift(x) * 2\n",
    )
    with codes_run() as made_by:
        (example,) = module.examples()
    artifact = tmp_path / "a.py"
    with precompile.capture(
        module.target,
        artifact_path=artifact,
        cache_path=tmp_path / "a.cache",
        tracer=precompile.MakeFxTracer(),
        backend="eager",
        inputs_from=made_by,
    ) as cap:
        cap(*example.args)
    _edit(source, "return t + 1", "return t + 2")
    assert _said(artifact) == ["`shift` (m.py) changed"]


BUILT = """class Block:
    def __init__(self):
        self.scale = self.default_scale()

    def default_scale(self):
        return 1.0

    def forward(self, x):
        return x * self.scale


class WideBlock(Block):
    def default_scale(self):
        return 2.0


class Made:
    DIM = 4

    def __init__(self, scale):
        self.scale = scale

    @classmethod
    def make(cls):
        return cls(cls.DIM ** -0.5)

    def forward(self, x):
        return x * self.scale
"""


@pytest.mark.parametrize(
    ("make", "old", "new", "said"),
    [
        ("WideBlock", "        return 2.0", "        return 3.0", "`WideBlock.default_scale`"),
        ("Made.make", "    DIM = 4", "    DIM = 9", "`Made.DIM`"),
    ],
    ids=["template-method", "classmethod-factory"],
)
def test_how_the_model_was_built_is_what_made_the_inputs(
    tmp_path: Path, make: str, old: str, new: str, said: str
) -> None:
    """What the traced method reads through ``self`` was computed when the model was
    built: a subclass's override the base's ``__init__`` calls (the template method), a
    classmethod factory's ``cls.DIM ** -0.5``. The trace's records do not reach either
    (helper-85's probes); the functions examples() ran to build the model do."""
    import operator

    from precompile.capturing.function_records import codes_run, input_records
    from precompile.runtime.source_digest import changed_functions, decode_source
    from precompile.source_bindings import changed_bindings

    module, source = _imported(tmp_path, BUILT)
    with codes_run() as made_by:
        operator.attrgetter(make)(module)()
    records = input_records(made_by, str(tmp_path / "a.py"))

    def changed() -> list[str]:
        def module_text(module: str, path: str) -> str | None:
            return decode_source((tmp_path / path).read_bytes())

        functions = [f"`{r['function']}`" for r, _gone in changed_functions(records, module_text)]
        return functions + [
            f"`{read['scope']}.{name}`"
            for _record, read, names in changed_bindings(records, module_text)
            for name in names
        ]

    assert changed() == []
    _edit(source, old, new)
    assert changed() == [said]
