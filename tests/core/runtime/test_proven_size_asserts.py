"""Issue 29: a make_fx Inductor artifact's graph code skips the size/stride asserts of its
graph inputs that the driver proves on every call (``inductor_backend.
drop_proven_size_asserts``: about 0.4 us each, the MLP's five 2 us a call), and keeps
every assert the driver does not prove (a graph with a ``mark_unbacked`` dim).

What the skipped asserts would have caught is attacked after the first served calls, in
a fresh process: each graph input's layout, shape and storage changed under the served
artifact. Each change is served equal to eager (the driver copies an input into the
captured layout) or refused by the driver naming the tensor -- never reaches the kernels
in a layout they do not index by."""

from __future__ import annotations

import re
import textwrap
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.decorators import mark_unbacked

import precompile
from precompile.capturing.inductor_backend import PROVEN_ASSERT
from tests.fixtures.fast_path_net import Net, serve
from tests.harness import capture_pair, run_json, served_or_refused


def _set(model: nn.Module, x: torch.Tensor, owner: object, name: str, value: object) -> Any:
    setattr(owner, name, value)
    return model, x


#: Each change of what a skipped assert checked, made after two served calls: the words
#: a refusal must say, or None where the call must be served equal to eager.
CHANGES: dict[str, tuple[Any, str | None]] = {
    "parameter transposed twice (other strides)": (
        lambda m, x: _set(m, x, m.fc1.weight, "data", m.fc1.weight.data.t().contiguous().t()),
        "parameter 'fc1.weight' has strides (1, 16)",
    ),
    "buffer strided (stride 2)": (
        lambda m, x: _set(m, x, m, "scale", torch.full((8,), 3.0)[::2]),
        "buffer 'scale' has strides (2,)",
    ),
    "parameter data of another shape": (
        lambda m, x: _set(m, x, m.fc2.weight, "data", torch.randn(4, 17)),
        "has shape (4, 17)",
    ),
    "parameter data at a storage offset": (
        lambda m, x: _set(m, x, m.fc2.bias, "data", torch.randn(5)[1:]),
        None,
    ),
    "parameter data replaced (captured layout)": (
        lambda m, x: _set(m, x, m.fc1.weight, "data", torch.randn(16, 8)),
        None,
    ),
    "input transposed twice (other strides)": (lambda m, x: (m, x.t().contiguous().t()), None),
    "input of another batch size": (lambda m, x: (m, torch.randn(5, 8)), "has shape (5, 8)"),
    "input at a storage offset": (lambda m, x: (m, torch.randn(25, 8)[1:4]), None),
}

CHILD = """
import json, torch, warnings
warnings.simplefilter("ignore")
import precompile
from tests.core.runtime.test_proven_size_asserts import attack
print(json.dumps(attack({artifact!r}, {cache!r})))
"""


def attack(artifact: str, cache: str) -> dict[str, Any]:
    """In this process: the size asserts a served call runs (counted through the graph
    code's global, or for a Dynamo artifact, whose output modules bind torch's at load,
    through torch's), then per change a fresh model served twice, changed, served
    again: served (and whether equal to eager) or refused (its message)."""
    guards = torch._C._dynamo.guards
    real_assert = guards.assert_size_stride
    asserted: list[int] = []

    def counting(*args: Any) -> Any:
        asserted.append(1)
        return real_assert(*args)

    guards.assert_size_stride = counting
    run = precompile.load(artifact, cache)
    if "assert_size_stride" in run._namespace:
        run._namespace["assert_size_stride"] = counting
    outcomes: dict[str, Any] = {}
    torch.manual_seed(1)
    base = Net().eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        model = Net().eval()
        model.load_state_dict(base.state_dict())
        torch.testing.assert_close(run(model, x), model(x))
        outcomes["asserts per served call"] = len(asserted)
        for name, (change, _words) in CHANGES.items():
            model = Net().eval()
            model.load_state_dict(base.state_dict())
            for _ in range(2):
                torch.testing.assert_close(run(model, x), model(x))
            model, changed = change(model, x)
            outcomes[name] = served_or_refused(
                partial(run, model, changed), partial(model, changed)
            )
    return outcomes


def _inductor_capture(fn: Any, *args: Any, directory: Path, tracer: Any = None) -> tuple[str, str]:
    """``fn`` on ``args`` captured with Inductor under ``no_grad`` (make_fx unless
    ``tracer``): the pair's paths."""
    with torch.no_grad():
        return capture_pair(fn, *args, directory=directory, tracer=tracer, backend="inductor")


def _inductor_pair(
    factory: pytest.TempPathFactory, name: str, tracer: Any = None
) -> tuple[str, str]:
    """``serve`` on a seeded ``Net`` captured with Inductor (make_fx unless ``tracer``)."""
    torch.manual_seed(0)
    return _inductor_capture(
        serve, Net().eval(), torch.randn(3, 8), directory=factory.mktemp(name), tracer=tracer
    )


def _attacked(pair: tuple[str, str]) -> dict[str, Any]:
    """``attack`` on ``pair`` in a fresh process."""
    return dict(run_json(textwrap.dedent(CHILD.format(artifact=pair[0], cache=pair[1]))))


def _assert_served_or_refused(change: str, outcome: list[Any], words: str | None) -> None:
    """A change nothing refuses (``CHANGES`` names no words for it) is served equal to
    eager; any other is refused in ``words``."""
    kind, detail = outcome
    if CHANGES[change][1] is None:
        assert [kind, detail] == ["served", True], (change, kind, detail)
    else:
        assert words is not None and kind == "refused" and words in detail, (change, kind, detail)


def _serves_batches(artifact: str, cache: str, model: Net) -> None:
    """The pair, loaded here, serves ``model`` equal to eager at batch sizes 3 and 9."""
    run = precompile.load(artifact, cache)
    with torch.no_grad():
        for batch in (3, 9):
            y = torch.randn(batch, 8)
            torch.testing.assert_close(run(model, y), model(y))


@pytest.fixture(scope="module")
def static_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return _inductor_pair(tmp_path_factory, "static")


@pytest.fixture(scope="module")
def outcomes(static_pair: tuple[str, str]) -> dict[str, Any]:
    return _attacked(static_pair)


def test_the_graph_code_skips_every_input_assert_the_driver_proves(
    static_pair: tuple[str, str], outcomes: dict[str, Any]
) -> None:
    text = Path(static_pair[0]).read_text()
    proven = precompile.inspect_artifact(static_pair[0])
    # Every graph input (4 parameters, the buffer, x): its assert is a comment, listed.
    assert text.count(f"{PROVEN_ASSERT}assert_size_stride(") == 6
    code_lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not any("assert_size_stride(arg" in line for line in code_lines)
    assert "_PROVEN_SIZE_ASSERTS = [" in text
    assert proven["GRAPH_INPUT_STRIDES"] == [(8, 1), (1,), (16, 1), (1,), (1,), (8, 1)]
    # A served call runs none of them (Inductor's own call ran 6).
    assert outcomes["asserts per served call"] == 0


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_skipped_assert_s_change_is_served_as_eager_or_refused(
    outcomes: dict[str, Any], change: str
) -> None:
    _assert_served_or_refused(change, outcomes[change], CHANGES[change][1])


def test_a_graph_with_a_dynamic_dim_keeps_its_asserts(tmp_path: Path) -> None:
    """The driver leaves some strides of a graph with a ``mark_unbacked`` dim to
    Inductor's asserts: none is skipped there, and the artifact still serves."""
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(4, 8)
    mark_unbacked(x, 0, min=2, max=32)
    artifact, cache = _inductor_capture(serve, model, x, directory=tmp_path)
    text = Path(artifact).read_text()
    assert PROVEN_ASSERT not in text and "_PROVEN_SIZE_ASSERTS" not in text
    assert "assert_size_stride(arg" in text
    _serves_batches(artifact, cache, model)


def serve_two(model: nn.Module, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # y is read by Inductor's own kernel (by its captured strides), x by addmm.
    return model(x) + y


HOOKED_CHILD = """
import json, torch, warnings
import precompile
from tests.core.runtime.test_proven_size_asserts import hooked_attack
print(json.dumps(hooked_attack({static!r}, {two!r})))
"""


def _served_twice(artifact: str, cache: str) -> tuple[Any, Net, torch.Tensor]:
    """Every warning shown; the pair loaded and a fresh model (seed 1) and input served
    twice under ``no_grad`` (the fast paths taken): the runnable, the model, the input."""
    warnings.simplefilter("always")
    torch.manual_seed(1)
    run = precompile.load(artifact, cache)
    model, x = Net().eval(), torch.randn(3, 8)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(run(model, x), model(x))
    return run, model, x


def _restriding_weight(model: Net) -> Callable[..., None]:
    """A warnings hook that gives ``model.fc1.weight`` other strides (``.data`` swapped)."""

    def restride_weight(*_args: Any, **_kwargs: Any) -> None:
        weight = model.fc1.weight
        weight.data = weight.data.t().contiguous().t()

    return restride_weight


def hooked_attack(static: list[str], two: list[str]) -> dict[str, Any]:
    """A warning the call itself issues once (after its checks passed: the inference
    grad warning, the layout copy warning) runs a warnings hook that changes the layout
    of a tensor the checks already proved."""
    outcomes: dict[str, Any] = {}
    run, model, x = _served_twice(*static)
    warnings.showwarning = _restriding_weight(model)
    # Under grad mode, with parameters that require grad: InferenceGradWarning.
    outcomes["grad warning hook restrides a parameter"] = served_or_refused(
        lambda: run(model, x), lambda: model(x).detach()
    )
    warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]
    run = precompile.load(*two)
    model, x, y = Net().eval(), torch.randn(3, 8), torch.randn(3, 4)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(run(model, y, x), model(x) + y)
        other_x = x.t().contiguous().t()

        def restride_y(*_args: Any, **_kwargs: Any) -> None:
            y.data = y.data.t().contiguous().t()

        warnings.showwarning = restride_y
        # x in another layout: copied, with a LayoutCopyWarning, after y was checked.
        outcomes["layout copy warning hook restrides another input"] = served_or_refused(
            lambda: run(model, y, other_x), lambda: model(other_x) + y
        )
        outcomes["y strides after"] = list(y.stride())
    return outcomes


def test_a_warnings_hook_that_restrides_a_proven_tensor_is_caught(
    static_pair: tuple[str, str], tmp_path: Path
) -> None:
    """The checks ran before the warning, the hook after: the call is checked again, so
    the graph never takes a tensor in a layout its (skipped) asserts would have refused."""
    torch.manual_seed(0)
    two = _inductor_capture(
        serve_two, Net().eval(), torch.randn(3, 4), torch.randn(3, 8), directory=tmp_path
    )
    outcomes = run_json(
        textwrap.dedent(HOOKED_CHILD.format(static=list(static_pair), two=list(two)))
    )
    assert outcomes["y strides after"] == [1, 3]  # the hook ran
    kind, detail = outcomes["grad warning hook restrides a parameter"]
    assert kind == "refused" and "parameter 'fc1.weight' has strides (1, 16)" in detail, (
        kind,
        detail,
    )
    assert outcomes["layout copy warning hook restrides another input"] == ["served", True]


# ---- Dynamo: the frames' guards are the proof (inductor_backend.dynamo_proven_inputs)

#: The Dynamo driver's words for each refused change (its frame guard's TENSOR_MATCH).
DYNAMO_WORDS: dict[str, str] = {
    "parameter transposed twice (other strides)": "`model.fc1.weight` has stride 1 at dim 0",
    "buffer strided (stride 2)": "`model.scale` has stride 2 at dim 0",
    "parameter data of another shape": "`model.fc2.weight` has size 17 at dim 1",
    "input of another batch size": "`x` has size 5 at dim 0",
}


@pytest.fixture(scope="module")
def dynamo_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return _inductor_pair(tmp_path_factory, "dynamo", precompile.DynamoTracer())


@pytest.fixture(scope="module")
def dynamo_outcomes(dynamo_pair: tuple[str, str]) -> dict[str, Any]:
    return _attacked(dynamo_pair)


def test_a_dynamo_graph_skips_every_input_assert_its_frame_guards_prove(
    dynamo_pair: tuple[str, str], dynamo_outcomes: dict[str, Any]
) -> None:
    text = Path(dynamo_pair[0]).read_text()
    assert "GUARD_RUNTIME = {'path': 'plain'" in text
    # Every graph input (4 parameters, the buffer, x): its assert is a comment, listed.
    assert text.count(f"{PROVEN_ASSERT}assert_size_stride(") == 6
    assert "_PROVEN_SIZE_ASSERTS = [" in text
    assert dynamo_outcomes["asserts per served call"] == 0


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_dynamo_skipped_assert_s_change_is_served_as_eager_or_refused(
    dynamo_outcomes: dict[str, Any], change: str
) -> None:
    _assert_served_or_refused(change, dynamo_outcomes[change], DYNAMO_WORDS.get(change))


def test_a_dynamo_graph_with_a_dynamic_dim_keeps_its_asserts(tmp_path: Path) -> None:
    """A dim marked dynamic is a symbolic size in the graph and no exact size in its
    TENSOR_MATCH: the inputs it reaches keep their asserts, and the artifact serves."""
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(4, 8)
    torch._dynamo.mark_dynamic(x, 0)
    artifact, cache = _inductor_capture(
        serve, model, x, directory=tmp_path, tracer=precompile.DynamoTracer()
    )
    text = Path(artifact).read_text()
    kept = [line for line in text.splitlines() if PROVEN_ASSERT not in line]
    # x's assert (a symbolic batch size) stays; the static parameters' and buffer's go.
    assert sum(bool(re.search(r"assert_size_stride\(arg\d+_1, \(s\d+, 8\)", k)) for k in kept) == 1
    assert text.count(f"{PROVEN_ASSERT}assert_size_stride(") == 5
    _serves_batches(artifact, cache, model)


def serve_printing(model: Net, x: torch.Tensor) -> torch.Tensor:
    """A graph break on ``print``: the write runs the user's ``sys.stdout`` between the
    two graphs of one call, after the first frame's guards."""
    h = model.act(model.fc1(x))
    print("between the graphs")
    return model.fc2(h) * model.scale + x[:, :4]


BROKEN_CHILD = """
import json, torch, warnings
warnings.simplefilter("ignore")
from tests.core.runtime.test_proven_size_asserts import broken_attack
print(json.dumps(broken_attack({artifact!r}, {cache!r})))
"""


def broken_attack(artifact: str, cache: str) -> dict[str, Any]:
    """The broken section (``print``) runs a ``sys.stdout`` that restrides a tensor the
    second graph takes: a parameter (``.data`` swapped), the input (``as_strided_``).
    Eager is run with the same writer on a same model and input."""
    import io
    import sys

    run = precompile.load(artifact, cache)
    outcomes: dict[str, Any] = {}
    torch.manual_seed(1)
    base = Net().eval()

    class Writer(io.StringIO):
        def __init__(self, action: Any) -> None:
            super().__init__()
            self.action = action

        def write(self, text: str) -> int:
            self.action()
            return len(text)

    def fresh() -> tuple[Net, torch.Tensor]:
        model = Net().eval()
        model.load_state_dict(base.state_dict())
        return model, torch.arange(24.0).reshape(3, 8) / 7

    actions = {
        "parameter restrided between the graphs": lambda m, x: _set(
            m, x, m.fc2.weight, "data", m.fc2.weight.data.t().contiguous().t()
        ),
        "input restrided in place between the graphs": lambda m, x: x.as_strided_((3, 8), (1, 3)),
    }
    stdout = sys.stdout
    try:
        with torch.no_grad():
            for name, action in actions.items():
                model, x = fresh()
                sys.stdout = io.StringIO()
                for _ in range(2):
                    torch.testing.assert_close(run(model, x), serve_printing(model, x))
                sys.stdout = Writer(lambda m=model, t=x, a=action: a(m, t))

                def eager(action: Any = action) -> torch.Tensor:
                    model, x = fresh()
                    sys.stdout = Writer(lambda m=model, t=x, a=action: a(m, t))
                    return serve_printing(model, x)

                outcomes[name] = served_or_refused(partial(run, model, x), eager)
    finally:
        sys.stdout = stdout
    return outcomes


def test_a_tensor_restrided_between_two_dynamo_graphs_is_caught(tmp_path: Path) -> None:
    """The second graph's frame (the resume function) checks its guards right before it
    runs, after the broken section: a tensor restrided there is refused or served equal
    to eager, though its Inductor assert is skipped."""
    torch.manual_seed(0)
    artifact, cache = _inductor_capture(
        serve_printing,
        Net().eval(),
        torch.randn(3, 8),
        directory=tmp_path,
        tracer=precompile.DynamoTracer(),
    )
    text = Path(artifact).read_text()
    assert "GUARD_RUNTIME = {'path': 'plain'" in text
    assert text.count(f"{PROVEN_ASSERT}assert_size_stride(") >= 6  # both graphs'
    outcomes = run_json(textwrap.dedent(BROKEN_CHILD.format(artifact=artifact, cache=cache)))
    kind, detail = outcomes["parameter restrided between the graphs"]
    assert kind == "refused" and "`model.fc2.weight` has stride 1 at dim 0" in detail, (
        kind,
        detail,
    )
    assert outcomes["input restrided in place between the graphs"] == ["served", True]


DYNAMO_HOOKED_CHILD = """
import json, torch, warnings
import precompile
from tests.core.runtime.test_proven_size_asserts import dynamo_hooked_attack
print(json.dumps(dynamo_hooked_attack({artifact!r}, {cache!r})))
"""


def dynamo_hooked_attack(artifact: str, cache: str) -> dict[str, Any]:
    """An input passed in another layout is copied with a LayoutCopyWarning, after the
    frame's guards proved the parameters: a warnings hook that restrides one then must
    not reach the graph (whose assert on it is skipped)."""
    outcomes: dict[str, Any] = {}
    run, model, x = _served_twice(artifact, cache)
    with torch.no_grad():
        other_x = x.t().contiguous().t()
        warnings.showwarning = _restriding_weight(model)
        outcomes["layout copy warning hook restrides a parameter"] = served_or_refused(
            lambda: run(model, other_x), lambda: model(other_x)
        )
        warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]
        outcomes["weight strides after"] = list(model.fc1.weight.stride())
        outcomes["the next call"] = served_or_refused(lambda: run(model, x), lambda: model(x))
    return outcomes


def test_a_dynamo_warnings_hook_that_restrides_a_proven_tensor_is_caught(
    dynamo_pair: tuple[str, str],
) -> None:
    """The layout copy's warning is issued after the graph ran: the graph took the
    tensors the guards proved; the next call's guards see the hook's change."""
    outcomes = run_json(
        textwrap.dedent(DYNAMO_HOOKED_CHILD.format(artifact=dynamo_pair[0], cache=dynamo_pair[1]))
    )
    assert outcomes["weight strides after"] == [1, 16]  # the hook ran
    assert outcomes["layout copy warning hook restrides a parameter"] == ["served", True]
    kind, detail = outcomes["the next call"]
    assert kind == "refused" and "`model.fc1.weight` has stride 1 at dim 0" in detail, (
        kind,
        detail,
    )


class PrintingNet(Net):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x))
        print("between the graphs")
        return self.fc2(h) * self.scale


def test_dynamo_s_own_guard_manager_keeps_every_assert(tmp_path: Path) -> None:
    """A break inside ``forward`` (a frame reached by an ordinary call) is served
    installed, by Dynamo's guard manager, which skips tensor guards under a dict whose
    version tag is unchanged (``p.data = ...`` changes none): no assert is skipped."""
    torch.manual_seed(0)
    model, x = PrintingNet().eval(), torch.randn(3, 8)
    artifact, cache = _inductor_capture(
        serve, model, x, directory=tmp_path, tracer=precompile.DynamoTracer()
    )
    text = Path(artifact).read_text()
    assert "GUARD_RUNTIME = {'path': 'dynamo'" in text
    assert PROVEN_ASSERT not in text and "_PROVEN_SIZE_ASSERTS" not in text
    assert text.count("assert_size_stride(arg") == 7
