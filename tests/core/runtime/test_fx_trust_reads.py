"""make_fx captures whose Python read state that no graph input carries: each change is
served exactly or refused naming it, in a fresh process, on the first served call
("cold") and after one ("/warm", through the per-call fast path)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from torch import nn

import precompile
from precompile import PrecompileError
from tests.fixtures import fx_trust_reads
from tests.harness import capture_pair, run_job, run_json, run_python, run_script

#: case -> {cell: words the refusal must contain, or None: served exactly}
EXPECTED: dict[str, dict[str, tuple[str, ...] | None]] = {
    "grad_branch": {
        "no_grad": None,
        "no_grad/warm": None,
        "unchanged": ("reads the grad mode", "torch.is_grad_enabled()", "torch.no_grad()"),
    },
    "requires_grad_branch": {
        "no_grad": None,
        "requires grad under no_grad": ("requires_grad=True", "fn reads requires_grad"),
        "requires grad under no_grad/warm": ("requires_grad=True", "fn reads requires_grad"),
    },
    "layout_branch": {
        "unchanged": None,
        "transposed input": ("input 0 has strides (1, 4)", "fn reads memory layout"),
        "transposed input/warm": ("input 0 has strides (1, 4)", ".is_contiguous()"),
    },
    "defaults": {
        "unchanged": None,
        "entry defaults": ("captured function entry.__defaults__[0] is 5.0", "read 2.0"),
        "entry defaults/warm": ("captured function entry.__defaults__[0] is 5.0", "read 2.0"),
        "forward defaults": ("DefaultsNet.forward.__defaults__[0] is 5.0", "read 2.0"),
        "forward defaults/warm": ("DefaultsNet.forward.__defaults__[0] is 5.0", "read 2.0"),
        "helper defaults": ("global helper.__defaults__[0]", "is 5.0", "read 2.0"),
        "helper defaults/warm": ("global helper.__defaults__[0]", "is 5.0", "read 2.0"),
        "helper closure": ("global scaler (closure variable 'k')", "is 5.0", "read 2.0"),
        "helper closure/warm": ("global scaler (closure variable 'k')", "is 5.0", "read 2.0"),
    },
    "closure_entry": {
        "unchanged": None,
        "entry closure": ("closure_entry (closure variable 'k') is 5.0", "read 2.0"),
        "entry closure/warm": ("closure_entry (closure variable 'k') is 5.0", "read 2.0"),
    },
    "sentinel": {
        "unchanged": None,
        "sentinel swapped": ("mode = the builtins.object bound to", ".SLOW", ".FAST"),
        "sentinel swapped/warm": ("mode = the builtins.object bound to", ".SLOW", ".FAST"),
    },
    "plain": {
        # Layout is read by no user code: any layout is served (the graph runs ATen ops).
        "transposed input": None,
        "autocast bf16": ("torch.autocast(cpu: torch.bfloat16)", "captured without"),
        "autocast bf16/warm": ("torch.autocast(cpu: torch.bfloat16)", "captured without"),
    },
}


#: Values told apart only by identity, and reads that follow the grad or inference mode.
IDENTITY_EXPECTED: dict[str, dict[str, tuple[str, ...] | None]] = {
    "marker": {
        "unchanged": None,
        "marker swapped": ("mode = the ", "Marker bound to", ".MARK_SLOW", ".MARK_FAST"),
        "marker swapped/warm": ("mode = the ", "Marker bound to", ".MARK_SLOW", ".MARK_FAST"),
    },
    "missing": {
        "unchanged": None,
        "missing swapped": ("default = ", "dataclasses.MISSING"),
        "missing swapped/warm": ("default = ", "dataclasses.MISSING"),
    },
    "intermediate_requires_grad": {
        "no_grad": None,
        "no_grad/warm": None,
        "unchanged": ("reads the grad mode", ".requires_grad of a tensor fn computed"),
        "unchanged/warm": ("reads the grad mode", ".requires_grad of a tensor fn computed"),
    },
    "inference_mode_branch": {
        "unchanged": None,
        "inference_mode": ("reads the inference mode", "torch.is_inference_mode_enabled()"),
        "inference_mode/warm": ("reads the inference mode",),
    },
    "partial_entry": {
        "unchanged": None,
        "partial keywords": ("partial_entry", ".keywords['k']", "is 5.0", "read 2.0"),
        "partial keywords/warm": ("partial_entry", ".keywords['k']", "is 5.0", "read 2.0"),
        # A partial's __setstate__ replaces its parts in place: no dict sees it.
        "partial state": ("partial_entry", ".keywords['k']", "is 5.0", "read 2.0"),
        "partial state/warm": ("partial_entry", ".keywords['k']", "is 5.0", "read 2.0"),
    },
}


#: torch settings fn reads, and values it reads through classes and project modules.
SETTINGS_EXPECTED: dict[str, dict[str, tuple[str, ...] | None]] = {
    "state_branch": {
        "unchanged": None,
        "deterministic": ("torch.are_deterministic_algorithms_enabled()", "False", "True now"),
        "deterministic/warm": ("torch.are_deterministic_algorithms_enabled()", "True now"),
        "matmul precision": ("torch.get_float32_matmul_precision()", "'medium' now"),
        "matmul precision/warm": ("torch.get_float32_matmul_precision()", "'medium' now"),
        "one thread": ("torch.get_num_threads()", "1 now"),
        "one thread/warm": ("torch.get_num_threads()", "1 now"),
        "mkldnn off": ("torch.backends.mkldnn.enabled", "was True", "False now"),
        "mkldnn off/warm": ("torch.backends.mkldnn.enabled", "False now"),
    },
    # fn reads none of them: none is a reason to refuse.
    "plain": {
        "deterministic": None,
        "matmul precision/warm": None,
        "one thread": None,
        "mkldnn off/warm": None,
    },
    # False in the trace as in eager.
    "compiling_branch": {"unchanged": None, "unchanged/warm": None},
    "config_class_attr": {
        "unchanged": None,
        "config class attr": ("Config.scale is 5.0", "read 2.0"),
        "config class attr/warm": ("Config.scale is 5.0", "read 2.0"),
        # helper-87: served as traced after one call (no dict changes).
        "config class swapped": ("has cfg = a tests.fixtures.fx_trust_reads.LoudConfig",),
        "config class swapped/warm": ("has cfg = a tests.fixtures.fx_trust_reads.LoudConfig",),
    },
    "global_class_attr": {
        "unchanged": None,
        "global class attr": ("Settings.k is 5.0", "read 2.0"),
        "global class attr/warm": ("Settings.k is 5.0", "read 2.0"),
    },
    "module_attr": {
        "unchanged": None,
        "module attr": ("global SCALE of module tests.fixtures.fx_trust_reads_config", "5.0"),
        "module attr/warm": ("global SCALE of module tests.fixtures.fx_trust_reads_config",),
    },
    "call_override": {
        "unchanged": None,
        "call override": ("CallNet.__call__ is function", "_scaled_call", "_wrapped_call_impl"),
        "call override/warm": ("CallNet.__call__ is function", "_scaled_call"),
    },
    "property_swap": {
        "unchanged": None,
        "property swap": ("PropertyNet.scale.fget is function", "<lambda>", "PropertyNet.scale"),
        "property swap/warm": ("PropertyNet.scale.fget is function", "<lambda>"),
        # The same property object re-initialised with another getter (helper-87).
        "property reinit": ("PropertyNet.scale.fget is function", "<lambda>"),
        "property reinit/warm": ("PropertyNet.scale.fget is function", "<lambda>"),
    },
    "staticmethod_swap": {
        "unchanged": None,
        "staticmethod swap": ("StaticNet.scale.__func__ is function", "<lambda>"),
        "staticmethod swap/warm": ("StaticNet.scale.__func__ is function", "<lambda>"),
        "staticmethod reinit": ("StaticNet.scale.__func__ is function", "<lambda>"),
        "staticmethod reinit/warm": ("StaticNet.scale.__func__ is function", "<lambda>"),
    },
    # helper-90, on the rule above: a logger's level (asked by isEnabledFor) was
    # compared only at the first call, and each of these was served as traced; a
    # module-level logger's LOG.debug() was refused at capture (its level cache), a
    # queue's task count was compared as if it were data.
    "library_more": {
        "unchanged": None,
        "unchanged/warm": None,
        "queue task done": None,
        "queue task done/warm": None,
        "str subclass rebuilt equal": None,
        "str subclass rebuilt equal/warm": None,
        # A project class on str was fingerprinted by its instance dict alone.
        "str subclass value": ("mode.<its value> = 'slow' but the trace read 'fast'",),
        "str subclass value/warm": ("mode.<its value> = 'slow' but the trace read 'fast'",),
        "logger level": (
            "has log = logger 'tests.fixtures.fx_trust_reads.held' at effective " "level 10",
        ),
        "logger level/warm": ("log = logger", "at effective level 10", "read logger"),
        "memoryview byte": ("view = a memoryview of b'\\x05'", "read a memoryview of b'\\x02'"),
        "memoryview byte/warm": ("view = a memoryview of b'\\x05'",),
        "stringio text": ("text (the state it declares)", "'5.0' but the trace read '2.0'"),
        "stringio text/warm": ("text (the state it declares)",),
        "structure field": ("pair.<its C state>",),
        "structure field/warm": ("pair.<its C state>",),
        "array subclass element": ("gains.<its C state>",),
        "array subclass element/warm": ("gains.<its C state>",),
        "struct reinit": ("packer (the state it declares)", "'<f' but the trace read '<d'"),
        "struct reinit/warm": ("packer (the state it declares)",),
        "template text": ("words.template = '$v$v' but the trace read '$v'",),
        "template text/warm": ("words.template = '$v$v' but the trace read '$v'",),
        "partialmethod keywords": ("LibraryMoreNet.scaled.keywords['k'] is 5.0", "read 2.0"),
        "partialmethod keywords/warm": ("LibraryMoreNet.scaled.keywords['k'] is 5.0",),
    },
    # Logging decides nothing a forward computes: captured (a module-level logger's
    # cache filled by the trace was refused as a store), and served at any level.
    "logging_only": {
        "unchanged": None,
        "root logger level": None,
        "root logger level/warm": None,
        "logger level": None,
        "logger level/warm": None,
    },
    # A value Python finds on the class's metaclass: its dict was watched by nobody
    # (make_fx served every one of these as traced; Dynamo refuses at capture:
    # test_a_value_read_through_a_metaclass_is_refused_by_dynamo).
    "metaclass_attr": {
        "unchanged": None,
        "unchanged/warm": None,
        "metaclass value": ("Tuning.gain is 5.0 but the trace read 2.0",),
        "metaclass value/warm": ("Tuning.gain is 5.0 but the trace read 2.0",),
        "metaclass property": ("Tuning.gain is a property", "read 2.0"),
        "metaclass property/warm": ("Tuning.gain is a property", "read 2.0"),
        "class shadows metaclass": ("Tuned.gain is 5.0, which no class along its MRO",),
        "class shadows metaclass/warm": ("Tuned.gain is 5.0, which no class along its MRO",),
    },
    # Library objects whose data no store into a dict changes: an array's element, a
    # queue's head, a thread-local's attribute, a weak dictionary's value, a context
    # variable, a view of a dict were all served as traced (each by its type alone).
    "library_state": {
        "unchanged": None,
        "unchanged/warm": None,
        "array rebuilt equal": None,
        "array rebuilt equal/warm": None,
        "context variable set equal": None,
        "context variable set equal/warm": None,
        "array element": ("has gains = array('d', [5.0])", "read array('d', [2.0])"),
        "array element/warm": ("has gains = array('d', [5.0])", "read array('d', [2.0])"),
        "queue head": ("has pending.queue[0] = 5.0 but the trace read 0.5",),
        "queue head/warm": ("has pending.queue[0] = 5.0 but the trace read 0.5",),
        "thread-local attribute": ("has local.k = 5.0 but the trace read 1.5",),
        "thread-local attribute/warm": ("has local.k = 5.0 but the trace read 1.5",),
        "weak value": ("weak.data['b']().value = 5.0", "read 0.25"),
        "weak value/warm": ("weak.data['b']().value = 5.0", "read 0.25"),
        "context variable": ("global CONTEXT_GAIN.get()", "is 5.0", "read 2.0"),
        "context variable/warm": ("global CONTEXT_GAIN.get()", "is 5.0", "read 2.0"),
        "viewed dict": ("global VIEWED['shift']", "is 5.0", "read 1.0"),
        "viewed dict/warm": ("global VIEWED['shift']", "is 5.0", "read 1.0"),
    },
    # helper-89: an immutable value of a standard-library class was fingerprinted by
    # its type alone, so one replaced by another value was served as traced.
    "stdlib_values": {
        "unchanged": None,
        "delay rebuilt equal": None,
        "delay rebuilt equal/warm": None,
        "delay replaced": ("delay = datetime.timedelta(seconds=5)", "timedelta(seconds=2)"),
        "delay replaced/warm": ("delay = datetime.timedelta(seconds=5)",),
        "path replaced": ("path = PurePosixPath('abcd')", "read PurePosixPath('ab')"),
        "path replaced/warm": ("path = PurePosixPath('abcd')",),
        "pattern replaced": ("pattern = re.compile('zz')", "read re.compile('ab')"),
        "pattern replaced/warm": ("pattern = re.compile('zz')",),
    },
    # helper-89: a class swapped on a dict or list subclass or a __slots__ object (no
    # instance dict) was served as traced after one call.
    "class_swaps": {
        "unchanged": None,
        "unchanged/warm": None,
        "dict subclass swapped": ("has table = a tests.fixtures.fx_trust_reads.LoudTable",),
        "dict subclass swapped/warm": ("has table = a tests.fixtures.fx_trust_reads.LoudTable",),
        "list subclass swapped": ("has gains = a tests.fixtures.fx_trust_reads.LoudGains",),
        "list subclass swapped/warm": ("has gains = a tests.fixtures.fx_trust_reads.LoudGains",),
        "slots object swapped": ("has slotted = a tests.fixtures.fx_trust_reads.LoudSlotted",),
        "slots object swapped/warm": ("slotted = a tests.fixtures.fx_trust_reads.LoudSlotted",),
    },
    # helper-87: a deque, UserDict or ChainMap (standard-library classes) was
    # fingerprinted by its type alone, so a changed element or length was served as
    # traced.
    "stdlib_containers": {
        "unchanged": None,
        "unchanged/warm": None,
        "deque element": ("has window[0] = 9.0 but the trace read 0.5",),
        "deque element/warm": ("has window[0] = 9.0 but the trace read 0.5",),
        "deque appended": ("window = deque([0.5, 1.5, 2.5])", "read deque([0.5, 1.5])"),
        "deque appended/warm": ("window = deque([0.5, 1.5, 2.5])", "read deque([0.5, 1.5])"),
        "global deque element": ("global WINDOW[0]", "is 9.0", "read 1.0"),
        "user dict value": ("global OPTIONS.data['shift']", "is 5.0", "read 1.0"),
        "user dict value/warm": ("global OPTIONS.data['shift']", "is 5.0", "read 1.0"),
        "chain map lookup": ("global LAYERS.maps[1]['gain']", "is 5.0", "read 2.0"),
        "chain map lookup/warm": ("global LAYERS.maps[1]['gain']", "is 5.0", "read 2.0"),
        "global deque element/warm": ("global WINDOW[0]", "is 9.0", "read 1.0"),
    },
}


def capture(case: str, directory: Path) -> tuple[str, str]:
    model, x = fx_trust_reads.build(case)
    with fx_trust_reads.capture_context(case):
        return capture_pair(fx_trust_reads.CASES[case][1], model, x, directory=directory, name=case)


def serve(directory: Path, expected: dict[str, dict[str, tuple[str, ...] | None]]) -> None:
    job = {case: (capture(case, directory), list(cells)) for case, cells in expected.items()}
    results = run_job("tests.fixtures.fx_trust_reads", job, directory / "job.json")
    problems = []
    for case, cells in expected.items():
        for cell, words in cells.items():
            got = results[f"{case}: {cell}"]
            if words is None:
                if got["result"] != "exact":
                    problems.append(f"{case}: {cell}: expected exact, got {got}")
            elif got["result"] != "refused" or not all(w in got["message"] for w in words):
                problems.append(f"{case}: {cell}: expected a refusal naming {words}, got {got}")
    assert not problems, "\n".join(problems)


def test_reads_of_state_no_graph_input_carries_are_checked_per_call(tmp_path: Path) -> None:
    serve(tmp_path, EXPECTED)


def test_identity_partial_and_mode_reads_are_checked_per_call(tmp_path: Path) -> None:
    serve(tmp_path, IDENTITY_EXPECTED)


def test_torch_settings_class_and_module_values_are_checked_per_call(tmp_path: Path) -> None:
    serve(tmp_path, SETTINGS_EXPECTED)


def test_a_value_read_through_a_metaclass_is_refused_by_dynamo(tmp_path: Path) -> None:
    """Dynamo guards only which class ``Tuned`` is where the forward reads
    ``Tuned.gain`` off its metaclass (torch 2.13): the metaclass's value changed, or
    ``gain`` set on ``Tuned``, was served as traced. Refused at capture, naming both."""
    model, x = fx_trust_reads.build("metaclass_attr")
    with pytest.raises(PrecompileError) as refused:
        capture_pair(
            fx_trust_reads.call, model, x, directory=tmp_path, tracer=precompile.DynamoTracer()
        )
    text = str(refused.value)
    assert "`Tuned.gain` may resolve through the metaclass" in text, text
    assert "tests.fixtures.fx_trust_reads.Tuning" in text and "MakeFxTracer" in text, text


@pytest.mark.parametrize(
    ("case", "words", "hint"),
    [
        (
            "fx_tracing_branch",
            (
                "fn branches on torch.fx._symbolic_trace.is_fx_tracing() at",
                "fx_trust_reads.py:",
                "true while make_fx traces fn",
            ),
            "remove the branch",
        ),
        (
            "backend_query_branch",
            ("torch.backends.cudnn.is_acceptable() with arguments at", "fx_trust_reads.py:"),
            "pass the result as an argument",
        ),
    ],
)
def test_reads_whose_trace_answer_a_served_call_would_not_get_are_refused_at_capture(
    case: str, words: tuple[str, ...], hint: str, tmp_path: Path
) -> None:
    with pytest.raises(PrecompileError) as info:
        capture(case, tmp_path)
    assert all(w in str(info.value) for w in words), str(info.value)
    assert hint in (info.value.hint or "") and info.value.invariant == 3


def test_an_inference_capture_that_reads_grad_mode_under_grad_is_refused(tmp_path: Path) -> None:
    # The trace runs with grad off (inference): the capture's own call, made with grad
    # on, would be answered from the other branch.
    model, x = fx_trust_reads.build("grad_branch")
    with pytest.raises(PrecompileError, match="reads the grad mode") as info:
        with precompile.capture(
            fx_trust_reads.call,
            artifact_path=tmp_path / "g.py",
            cache_path=tmp_path / "g.cache",
            tracer=precompile.MakeFxTracer(),
            backend="eager",
        ) as cap:
            cap(model, x)
    assert info.value.invariant == 5 and "torch.no_grad()" in str(info.value)


def test_reading_the_layout_of_an_input_with_unbacked_dims_is_refused(tmp_path: Path) -> None:
    model, x = fx_trust_reads.build("layout_branch")
    torch._dynamo.decorators.mark_unbacked(x, 0)
    with pytest.raises(PrecompileError, match="reads memory layout.*mark_unbacked"):
        with precompile.capture(
            fx_trust_reads.call,
            artifact_path=tmp_path / "l.py",
            cache_path=tmp_path / "l.cache",
            tracer=precompile.MakeFxTracer(),
            backend="eager",
        ) as cap:
            cap(model, x)


def test_a_captured_function_with_baked_values_must_be_findable_when_served(
    tmp_path: Path,
) -> None:
    # A closure no module-level name holds: another process could rebuild it with other
    # values, and the artifact could not tell. The capture loads what it wrote, so it is
    # refused there already.
    model, x = fx_trust_reads.build("plain")
    unbound_entry = fx_trust_reads.make_unbound_entry(2.0)
    with pytest.raises(PrecompileError) as info:
        with precompile.capture(
            unbound_entry,
            artifact_path=tmp_path / "e.py",
            cache_path=tmp_path / "e.cache",
            tracer=precompile.MakeFxTracer(),
            backend="eager",
        ) as cap:
            cap(model, x)
    assert "binds no module-level name to a function make_unbound_entry.<locals>" in str(info.value)
    assert "pass those values to it as arguments" in str(info.value)


def test_a_partial_no_module_level_name_holds_is_refused_at_capture(tmp_path: Path) -> None:
    # Its keywords are baked, and nothing another process can look up holds it.
    model, x = fx_trust_reads.build("plain")
    unbound = functools.partial(fx_trust_reads.scaled_call, k=2.0)
    with pytest.raises(PrecompileError) as info:
        capture_pair(unbound, model, x, directory=tmp_path)
    assert "functools.partial of 'scaled_call' that no module-level name holds" in str(info.value)
    assert "bind the partial to a module-level name" in (info.value.hint or "")


class _Unnamed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.mode = object()  # no module-level name holds it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * (2.0 if self.mode is not None else 3.0)


def test_a_sentinel_no_global_holds_is_refused_at_capture(tmp_path: Path) -> None:
    with pytest.raises(PrecompileError, match="no module-level name is bound to it") as info:
        with precompile.capture(
            fx_trust_reads.call,
            artifact_path=tmp_path / "s.py",
            cache_path=tmp_path / "s.cache",
            tracer=precompile.MakeFxTracer(),
            backend="eager",
        ) as cap:
            cap(_Unnamed().eval(), torch.randn(4, 4))
    assert "module argument 0" in str(info.value) and "enum.Enum" in (info.value.hint or "")


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("environ", ("fn reads the process environment (os.environ at", "fx_trust_reads.py")),
        ("random", ("fn draws from Python's random module (random.uniform() at",)),
    ],
)
def test_environment_and_python_random_reads_are_refused_at_capture(
    case: str, words: tuple[str, ...], tmp_path: Path
) -> None:
    with pytest.raises(PrecompileError) as info:
        capture(case, tmp_path)
    assert all(w in str(info.value) for w in words), str(info.value)
    assert "pass" in (info.value.hint or "") and "argument" in (info.value.hint or "")


def test_a_script_function_with_baked_values_is_checked_only_from_that_script(
    tmp_path: Path,
) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        "import sys, torch, precompile\n"
        "from torch import nn\n"
        "def step(model, x, k=2.0):\n"
        "    return model(x) * k\n"
        "if __name__ == '__main__':\n"
        "    with precompile.capture(step, artifact_path=sys.argv[1], cache_path=sys.argv[2],\n"
        "                            tracer=precompile.MakeFxTracer(), backend='eager') as cap:\n"
        "        cap(nn.Linear(4, 4), torch.randn(2, 4))\n"
    )
    paths = str(tmp_path / "s.py"), str(tmp_path / "s.cache")
    made = run_script(script, *paths)
    assert made.returncode == 0, made.stderr
    other = run_python(f"import precompile; precompile.load({paths[0]!r}, {paths[1]!r})")
    assert other.returncode != 0
    assert "ran as __main__ at capture" in other.stderr, other.stderr
    assert "Move the function into an importable module" in other.stderr


_SENTINEL_MODULE = """
import torch
from torch import nn


class Marker:
    pass


FAST = {kind}()
SLOW = {kind}()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.mode = FAST

    def forward(self, x):
        return self.fc(x) * (2.0 if self.mode is FAST else 3.0)


def call(model, x):
    return model(x)
"""


@pytest.mark.parametrize("kind", ["object", "Marker"])
def test_a_sentinel_a_capture_script_imports_is_named_by_its_module(
    kind: str, tmp_path: Path
) -> None:
    # The capture script binds FAST in its __main__ too; a serving process runs another
    # __main__, and must still find FAST (by sentinel_mod.FAST) and serve.
    (tmp_path / "sentinel_mod.py").write_text(_SENTINEL_MODULE.replace("{kind}", kind))
    paths = str(tmp_path / "s.py"), str(tmp_path / "s.cache")
    (tmp_path / "capture_script.py").write_text(
        "import sys, torch, precompile\n"
        "from sentinel_mod import FAST, SLOW, Net, call\n"
        "torch.manual_seed(0)\n"
        "with precompile.capture(call, artifact_path=sys.argv[1], cache_path=sys.argv[2],\n"
        "                        tracer=precompile.MakeFxTracer(), backend='eager') as cap:\n"
        "    cap(Net().eval(), torch.randn(2, 4))\n"
    )
    made = run_script(tmp_path / "capture_script.py", *paths, pythonpath=[tmp_path])
    assert made.returncode == 0, made.stderr
    serve = (
        "import json, torch, precompile, sentinel_mod as m\n"
        f"run = precompile.load({paths[0]!r}, {paths[1]!r})\n"
        "torch.manual_seed(0)\n"
        "net, x = m.Net().eval(), torch.randn(2, 4)\n"
        "out = {'unchanged': bool(torch.allclose(run(net, x), net(x)))}\n"
        "net.mode = m.SLOW\n"
        "try:\n"
        "    run(net, x)\n"
        "    out['swapped'] = 'served'\n"
        "except precompile.PrecompileError as e:\n"
        "    out['swapped'] = str(e)\n"
        "print(json.dumps(out))\n"
    )
    result = run_json(serve, pythonpath=[tmp_path])
    assert result["unchanged"] is True
    shown = "builtins.object" if kind == "object" else "sentinel_mod.Marker"
    assert f"mode = the {shown} bound to sentinel_mod.SLOW" in result["swapped"]
    assert "sentinel_mod.FAST" in result["swapped"]


SERVE_MODULE_HELD = """
import json, warnings, torch, precompile
from tests.fixtures import fx_trust_reads_config as cfg
from tests.fixtures.fx_trust_reads import ModuleHeld, module_held_step
warnings.simplefilter("ignore")
run = precompile.load({artifact!r}, {cache!r})
torch.manual_seed(0)
model, x = ModuleHeld(), torch.randn(2, 4)
cells = {{}}
for label in ("unchanged", "changed", "restored"):
    cfg.SCALE = {{"unchanged": 2.0, "changed": 5.0, "restored": 2.0}}[label]
    try:
        exact = torch.equal(run(model, x), module_held_step(model, x).detach())
        cells[label] = {{"result": "exact" if exact else "wrong", "message": ""}}
    except precompile.PrecompileError as error:
        cells[label] = {{"result": "refused", "message": str(error)}}
print(json.dumps(cells))
"""


def test_a_project_module_held_as_an_attribute_is_checked_per_call(tmp_path: Path) -> None:
    # self.cfg = cfgmod; forward reads self.cfg.SCALE: the value read through it is state.
    from tests.fixtures.fx_trust_reads import ModuleHeld, module_held_step

    torch.manual_seed(0)
    artifact, cache = capture_pair(
        module_held_step, ModuleHeld(), torch.randn(2, 4), directory=tmp_path, name="held"
    )
    cells = run_json(SERVE_MODULE_HELD.format(artifact=artifact, cache=cache))
    assert cells["unchanged"]["result"] == cells["restored"]["result"] == "exact", cells
    assert cells["changed"]["result"] == "refused", cells
    assert "SCALE" in cells["changed"]["message"], cells
