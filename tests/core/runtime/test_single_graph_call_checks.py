"""Every per-call check of the single-graph driver, each with its own message and
invariant; and the snapshot fast path noticing changes to an already-verified model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from precompile import PrecompileError
from precompile.capturing.fx_lifting import lift_module_state
from precompile.runtime.single_graph_model_state import lift_live_module_state


class Net(nn.Module):
    def __init__(self, hidden: int = 3) -> None:
        super().__init__()
        self.lin = nn.Linear(4, hidden)
        self.bn = nn.BatchNorm1d(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x))


class WiderNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.extra = nn.Linear(3, 3)


def scaled(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    return model(batch["x"]) * batch["scale"]


def batch(rows: int = 2) -> dict[str, Any]:
    return {"x": torch.randn(rows, 4), "scale": 2.0}


@pytest.fixture(scope="module")
def runnable(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = tmp_path_factory.mktemp("driver")
    paths = directory / "net.py", directory / "net.cache"
    with precompile.capture(
        scaled,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.MakeFxTracer(),
        backend="eager",
    ) as cap:
        cap(Net().eval(), batch())
    return precompile.load(*paths)


def refused(run: Any, *args: Any, invariant: int, words: tuple[str, ...], **kwargs: Any) -> None:
    with pytest.raises(PrecompileError) as info:
        run(*args, **kwargs)
    assert info.value.invariant == invariant, str(info.value)
    assert f"invariant {invariant}" in str(info.value)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_a_matching_call_is_served(runnable: Any) -> None:
    model, b = Net().eval(), batch()
    torch.testing.assert_close(runnable(model, b), scaled(model, b))


def test_arity(runnable: Any) -> None:
    refused(runnable, Net().eval(), invariant=2, words=("takes 2 positional arguments", "got 1"))


def test_keywords(runnable: Any) -> None:
    refused(
        runnable, Net().eval(), batch=batch(), invariant=2, words=("keyword arguments ['batch']",)
    )


def test_module_slot(runnable: Any) -> None:
    refused(
        runnable,
        torch.randn(2, 4),
        batch(),
        invariant=2,
        words=("argument 0 must be the nn.Module", "Tensor"),
    )


def test_input_structure(runnable: Any) -> None:
    refused(
        runnable, Net().eval(), [torch.randn(2, 4), 2.0], invariant=3, words=("nested differently",)
    )
    # fn reads the dict by key only: a key it never reads is served, a missing one is not.
    model, extra = Net().eval(), {**batch(), "extra": 1}
    torch.testing.assert_close(runnable(model, extra), scaled(model, extra))
    refused(
        runnable, Net().eval(), {"x": torch.randn(2, 4)}, invariant=3, words=("no key 'scale'",)
    )


def test_static_shape(runnable: Any) -> None:
    refused(
        runnable,
        Net().eval(),
        batch(rows=5),
        invariant=3,
        words=("shape (5, 4)", "(2, 4)", "mark_unbacked"),
    )


def test_dtype(runnable: Any) -> None:
    b = batch()
    b["x"] = b["x"].double()
    refused(runnable, Net().eval(), b, invariant=6, words=("dtype torch.float64", "torch.float32"))


def test_device(runnable: Any) -> None:
    b = batch()
    b["x"] = b["x"].to("meta")
    refused(runnable, Net().eval(), b, invariant=6, words=("device meta", "cpu"))


def test_baked_python_value(runnable: Any) -> None:
    b = batch()
    b["scale"] = 3.0
    refused(runnable, Net().eval(), b, invariant=3, words=("3.0", "baked 2.0"))
    b["scale"] = 2  # same value, another type: still not what was captured
    refused(runnable, Net().eval(), b, invariant=3, words=("is the int 2;", "baked the float 2.0"))


def test_parameter_names(runnable: Any) -> None:
    refused(
        runnable,
        WiderNet().eval(),
        batch(),
        invariant=2,
        words=("unexpected ['extra.weight', 'extra.bias']",),
    )


def test_parameter_shape(runnable: Any) -> None:
    refused(
        runnable,
        Net(hidden=5).eval(),
        batch(),
        invariant=2,
        words=("'lin.weight' has shape (5, 4)", "(3, 4)"),
    )


def test_parameter_dtype(runnable: Any) -> None:
    refused(
        runnable,
        Net().eval().double(),
        batch(),
        invariant=2,
        words=("'lin.weight' has dtype torch.float64",),
    )


def test_parameter_device(runnable: Any) -> None:
    refused(
        runnable,
        Net().eval().to("meta"),
        batch(),
        invariant=2,
        words=("'lin.weight' is on device meta",),
    )


def test_requires_grad(runnable: Any) -> None:
    # An inference artifact's graph runs with grad off, where a parameter's
    # requires_grad changes no value: a model frozen since capture is served (a training
    # capture refuses it: tests/core/runtime/test_grad_modes_served.py).
    model, b = Net().eval(), batch()
    model.lin.weight.requires_grad_(False)
    with torch.no_grad():
        torch.testing.assert_close(runnable(model, b), scaled(model, b))


def test_submodule_training_flag(runnable: Any) -> None:
    model = Net().eval()
    model.bn.train()
    refused(
        runnable,
        model,
        batch(),
        invariant=2,
        words=("submodule 'bn'", "training mode", "captured in eval"),
    )


def test_fast_path_notices_changes_to_a_verified_model(runnable: Any) -> None:
    model, b = Net().eval(), batch()
    runnable(model, b)  # verified: later calls take the snapshot fast path
    model.lin.weight = nn.Parameter(torch.randn(5, 4))
    refused(runnable, model, b, invariant=2, words=("'lin.weight' has shape (5, 4)",))
    model.lin.weight = nn.Parameter(torch.randn(3, 4))  # a valid new weight is picked up
    torch.testing.assert_close(runnable(model, b), scaled(model, b))
    model.lin.weight.data = model.lin.weight.data.double()  # same Parameter object
    refused(runnable, model, b, invariant=2, words=("dtype torch.float64",))
    model.lin.weight.data = model.lin.weight.data.float()
    model.bn.train()
    refused(runnable, model, b, invariant=2, words=("submodule 'bn'",))
    model.bn.eval()
    saved = model.bn.running_var
    model.bn.running_var = torch.ones(7)  # a store into the buffer dict: noticed
    refused(runnable, model, b, invariant=2, words=("'bn.running_var' has shape (7,)",))
    model.bn.running_var = saved
    # A buffer added that BatchNorm never reads nor enumerates: noticed and served
    # (issue 26: the graph does not depend on it).
    model.bn.register_buffer("extra", torch.ones(1))
    torch.testing.assert_close(runnable(model, b), scaled(model, b))
    del model.bn.extra
    torch.testing.assert_close(runnable(model, b), scaled(model, b))
    model.lin.bias.requires_grad_(False)  # no dict changes: the tensor guard sees it,
    with torch.no_grad():  # and the re-verification serves it (inference: grad off)
        torch.testing.assert_close(runnable(model, b), scaled(model, b))
    model.lin.bias.requires_grad_(True)
    model.lin.weight.data = torch.randn(4, 3).t()  # same meta, other strides and values
    torch.testing.assert_close(runnable(model, b), scaled(model, b))


def test_fast_path_serves_across_ambient_dispatch_states(runnable: Any) -> None:
    # Inference mode and autocast change the dispatch keys the C-level tensor guard
    # compares: such calls are still checked (served, or refused under autocast, which
    # the capture did not run under), in any alternation.
    model, b = Net().eval(), batch()
    expected = scaled(model, b)
    for _ in range(2):
        with torch.inference_mode():
            torch.testing.assert_close(runnable(model, b), expected)
            torch.testing.assert_close(runnable(model, b), expected)
        torch.testing.assert_close(runnable(model, b), expected)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            refused(runnable, model, b, invariant=6, words=("torch.autocast(cpu: torch.bfloat16)",))
    with torch.inference_mode():
        model.lin.weight.data = model.lin.weight.data.double()
        refused(runnable, model, b, invariant=2, words=("dtype torch.float64",))


def test_ambient_autocast_other_than_the_captures_is_refused(runnable: Any) -> None:
    # Eager under autocast computes in bfloat16; the graph, captured without autocast,
    # in float32: the call is refused rather than answered in the wrong dtype.
    model, b = Net().eval(), batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert scaled(model, b).dtype == torch.bfloat16
        refused(
            runnable,
            model,
            b,
            invariant=6,
            words=("under torch.autocast(cpu: torch.bfloat16)", "captured without torch.autocast"),
        )
        assert runnable.covers(model, b)["served_by"] is None  # decided by the same checks
    torch.testing.assert_close(runnable(model, b), scaled(model, b))


def test_a_capture_under_autocast_serves_only_under_that_autocast(tmp_path: Path) -> None:
    paths = tmp_path / "ac.py", tmp_path / "ac.cache"
    model, b = Net().eval(), batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with precompile.capture(
            scaled,
            artifact_path=paths[0],
            cache_path=paths[1],
            tracer=precompile.MakeFxTracer(),
            backend="eager",
        ) as cap:
            cap(model, b)
    run = precompile.load(*paths)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, expected = run(model, b), scaled(model, b)
        assert out.dtype == expected.dtype == torch.bfloat16
        torch.testing.assert_close(out, expected)
    refused(run, model, b, invariant=6, words=("without torch.autocast", "captured under"))
    with torch.autocast("cpu", dtype=torch.float16):
        refused(run, model, b, invariant=6, words=("cpu: torch.float16",))
    # Another device's autocast turned on as well (the per-call check reads every
    # device's state at once from torch's dispatch keys).
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.set_autocast_enabled("mtia", True)
        try:
            refused(run, model, b, invariant=6, words=("cpu: torch.bfloat16, mtia:",))
        finally:
            torch.set_autocast_enabled("mtia", False)
        torch.testing.assert_close(run(model, b), scaled(model, b))


def test_default_dtype_is_checked(runnable: Any) -> None:
    model, b = Net().eval(), batch()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        refused(runnable, model, b, invariant=6, words=("default dtype is torch.float64",))
    finally:
        torch.set_default_dtype(previous)
    torch.testing.assert_close(runnable(model, b), scaled(model, b))


def test_grad_mode_does_not_leak_into_the_graph(runnable: Any) -> None:
    out = runnable(Net().eval(), batch())
    assert out.grad_fn is None and torch.is_grad_enabled()


def test_driver_and_capture_lift_state_identically() -> None:
    shared = nn.Linear(3, 3)
    a = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    b = nn.Sequential(shared, nn.Linear(3, 3))
    b[1].weight = a[0].weight  # tied across two module arguments
    a.add_module("again", shared)  # one submodule reachable from both
    for mods in ([a], [a, b], [b, a]):
        tensors, names, _ = lift_live_module_state(mods)
        lifted = lift_module_state(mods)
        assert names == lifted.names
        assert all(x is y for x, y in zip(tensors, lifted.tensors))
        assert len(tensors) == len(lifted.tensors)


def test_errors_carry_structured_fields(runnable: Any, tmp_path: Path) -> None:
    with pytest.raises(PrecompileError) as info:
        runnable(Net().eval(), batch(rows=3))
    assert info.value.invariant == 3 and info.value.to_dict()["invariant"] == 3
