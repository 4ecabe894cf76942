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

import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.decorators import mark_unbacked

import precompile
from precompile.capturing.inductor_backend import PROVEN_ASSERT
from tests.harness import capture_pair, run_json


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x))) * self.scale


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


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
    code's global), then per change a fresh model served twice, changed, served again:
    served (and whether equal to eager) or refused (its message)."""
    run = precompile.load(artifact, cache)
    namespace = run._namespace
    real_assert = namespace["assert_size_stride"]
    asserted: list[int] = []

    def counting(*args: Any) -> Any:
        asserted.append(1)
        return real_assert(*args)

    namespace["assert_size_stride"] = counting
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
            try:
                got = run(model, changed)
            except precompile.PrecompileError as error:
                outcomes[name] = ["refused", str(error)]
                continue
            except Exception as error:  # anything but a refusal naming the change
                outcomes[name] = ["failed otherwise", repr(error)]
                continue
            want = model(changed)
            same = got.shape == want.shape and got.dtype == want.dtype
            outcomes[name] = ["served", bool(same and torch.allclose(got, want))]
    return outcomes


@pytest.fixture(scope="module")
def static_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    torch.manual_seed(0)
    with torch.no_grad():
        return capture_pair(
            serve,
            Net().eval(),
            torch.randn(3, 8),
            directory=tmp_path_factory.mktemp("static"),
            backend="inductor",
        )


@pytest.fixture(scope="module")
def outcomes(static_pair: tuple[str, str]) -> dict[str, Any]:
    return dict(
        run_json(textwrap.dedent(CHILD.format(artifact=static_pair[0], cache=static_pair[1])))
    )


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
    kind, detail = outcomes[change]
    words = CHANGES[change][1]
    if words is None:
        assert [kind, detail] == ["served", True], (change, kind, detail)
    else:
        assert kind == "refused" and words in detail, (change, kind, detail)


def test_a_graph_with_a_dynamic_dim_keeps_its_asserts(tmp_path: Path) -> None:
    """The driver leaves some strides of a graph with a ``mark_unbacked`` dim to
    Inductor's asserts: none is skipped there, and the artifact still serves."""
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(4, 8)
    mark_unbacked(x, 0, min=2, max=32)
    with torch.no_grad():
        artifact, cache = capture_pair(serve, model, x, directory=tmp_path, backend="inductor")
    text = Path(artifact).read_text()
    assert PROVEN_ASSERT not in text and "_PROVEN_SIZE_ASSERTS" not in text
    assert "assert_size_stride(arg" in text
    run = precompile.load(artifact, cache)
    with torch.no_grad():
        for batch in (3, 9):
            y = torch.randn(batch, 8)
            torch.testing.assert_close(run(model, y), model(y))


def serve_two(model: nn.Module, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # y is read by Inductor's own kernel (by its captured strides), x by addmm.
    return model(x) + y


HOOKED_CHILD = """
import json, torch, warnings
import precompile
from tests.core.runtime.test_proven_size_asserts import hooked_attack
print(json.dumps(hooked_attack({static!r}, {two!r})))
"""


def _outcome(call: Any, eager: Any) -> list[Any]:
    try:
        got = call()
    except precompile.PrecompileError as error:
        return ["refused", str(error)]
    except Exception as error:
        return ["failed otherwise", repr(error)]
    want = eager()
    return ["served", bool(got.shape == want.shape and torch.allclose(got, want))]


def hooked_attack(static: list[str], two: list[str]) -> dict[str, Any]:
    """A warning the call itself issues once (after its checks passed: the inference
    grad warning, the layout copy warning) runs a warnings hook that changes the layout
    of a tensor the checks already proved."""
    outcomes: dict[str, Any] = {}
    warnings.simplefilter("always")
    torch.manual_seed(1)
    run = precompile.load(*static)
    model, x = Net().eval(), torch.randn(3, 8)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(run(model, x), model(x))

    def restride_weight(*_args: Any, **_kwargs: Any) -> None:
        weight = model.fc1.weight
        weight.data = weight.data.t().contiguous().t()

    warnings.showwarning = restride_weight
    # Under grad mode, with parameters that require grad: InferenceGradWarning.
    outcomes["grad warning hook restrides a parameter"] = _outcome(
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
        outcomes["layout copy warning hook restrides another input"] = _outcome(
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
    with torch.no_grad():
        two = capture_pair(
            serve_two,
            Net().eval(),
            torch.randn(3, 4),
            torch.randn(3, 8),
            directory=tmp_path,
            backend="inductor",
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
