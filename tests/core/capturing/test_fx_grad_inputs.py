"""make_fx inference captures (training=False) whose example input requires grad, under
grad mode: the artifact carries the captured forward and backward graphs, so in a fresh
process its outputs carry grad and a backward fills the input's and the parameters'
.grad exactly as eager's does -- for the eager and the Inductor backend. What it cannot
serve exactly is refused at capture (or, for a double backward, when it runs)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from precompile import PrecompileError
from tests.fixtures import fx_grad_inputs as cases
from tests.harness import capture_pair, run_saving_job, watched_load

SERVED = [("mlp", "eager"), ("conv", "eager"), ("custom", "eager"), ("two_inputs", "eager")]
SERVED += [("mlp", "inductor"), ("conv", "inductor")]


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private, empty Inductor cache for this module's captures and loads."""
    folder = tmp_path_factory.mktemp("inductor-cache")
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, inductor_cache: Path
) -> dict[tuple[str, str], dict[str, Any]]:
    """Each case captured once per backend in this process (the capture's own call is
    recorded too), then served next to an eager twin in one fresh process each."""
    results: dict[tuple[str, str], dict[str, Any]] = {}
    for case, backend in SERVED:
        directory = tmp_path_factory.mktemp(f"{case}-{backend}")
        model, inputs = cases.build(case)
        reference, ref_inputs = cases.build(case)
        out = str(directory / "a.py"), str(directory / "a.cache")
        with precompile.capture(
            cases.FUNCTIONS[case],
            artifact_path=out[0],
            cache_path=out[1],
            tracer=precompile.MakeFxTracer(),
            backend=backend,
        ) as cap:
            captured = cap(model, *inputs)
        expected = cases.FUNCTIONS[case](reference, *ref_inputs)
        fresh = run_saving_job(
            "tests.fixtures.fx_grad_inputs",
            {"artifact": out[0], "cache": out[1], "case": case},
            directory / "job.json",
            TORCHINDUCTOR_CACHE_DIR=str(inductor_cache),
        )
        results[(case, backend)] = {
            "fresh": fresh,
            "captured": captured,
            "expected": expected,
            "paths": out,
        }
    return results


def _assert_same(actual: Any, expected: Any, path: str) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: {actual!r}"
        torch.testing.assert_close(actual, expected, msg=lambda m: f"{path}: {m}")
        assert actual.requires_grad == expected.requires_grad, path
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), path
        for key in expected:
            _assert_same(actual[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected)):
            _assert_same(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


@pytest.mark.parametrize(("case", "backend"), SERVED)
def test_outputs_carry_grad_and_backward_fills_grads_like_eager(
    served: dict[tuple[str, str], dict[str, Any]], case: str, backend: str
) -> None:
    result = served[(case, backend)]
    fresh = result["fresh"]
    for step in ("first", "second", "no_grad", "detached", "summed"):
        _assert_same(fresh["served"][step], fresh["eager"][step], f"{case}/{backend}/{step}")
    first = fresh["served"]["first"]
    # Not vacuous: with grad on the outputs carry grad (a backward node of their own),
    # and the backward reached the input and every parameter.
    assert first["requires_grad"][0] and first["has_grad_fn"][0]
    assert first["input_grads"][0] is not None and first["input_grads"][0].abs().sum() > 0
    assert all(g is not None for g in first["param_grads"].values())
    # Under no_grad the outputs carry none, like eager's.
    assert not any(fresh["served"]["no_grad"]["requires_grad"])
    # The capture's own call served eager's answer, with grad.
    _assert_same(result["captured"], result["expected"], f"{case}/{backend}/capture")


def test_mlp_outputs_without_gradient_stay_without(
    served: dict[tuple[str, str], dict[str, Any]],
) -> None:
    for backend in ("eager", "inductor"):
        out = served[("mlp", backend)]["fresh"]["served"]["first"]["out"]
        assert out["label"].dtype == torch.int64 and not out["label"].requires_grad
        assert out["flat"].requires_grad and out["k"] == 3
        fresh = served[("mlp", backend)]["fresh"]
        assert fresh["served"]["write_view"] is fresh["eager"]["write_view"] is None


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_double_backward_is_refused_when_it_runs(
    served: dict[tuple[str, str], dict[str, Any]], backend: str
) -> None:
    refusal = served[("mlp", backend)]["fresh"]["refusals"]["double_backward"]
    assert refusal is not None and "create_graph=True" in refusal


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_a_backward_under_autocast_is_refused_when_it_runs(
    served: dict[tuple[str, str], dict[str, Any]], backend: str
) -> None:
    # The captured backward holds the dtypes of a backward without autocast.
    refusal = served[("mlp", backend)]["fresh"]["refusals"]["backward_under_autocast"]
    assert refusal is not None and "torch.autocast" in refusal


def test_an_input_captured_without_grad_is_refused_when_it_requires_grad(
    served: dict[tuple[str, str], dict[str, Any]],
) -> None:
    refusal = served[("two_inputs", "eager")]["fresh"]["refusals"]["second_input_requires_grad"]
    assert refusal is not None and "input 1 requires grad but was captured without" in refusal


ZERO_COMPILE_SERVE = """
from tests.fixtures import fx_grad_inputs as cases
model, (x,) = cases.build("conv")
twin, (x_ref,) = cases.build("conv")
out, ref = run(model, x), twin(x_ref)
g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
out.backward(g)
ref.backward(g)
pairs = [(out, ref), (x.grad, x_ref.grad)]
pairs += list(zip([p.grad for p in model.parameters()], [p.grad for p in twin.parameters()]))
error = max(float((a - b).abs().max()) for a, b in pairs)
"""


def test_inductor_forward_and_backward_load_from_the_cache_compiling_nothing(
    served: dict[tuple[str, str], dict[str, Any]], tmp_path: Path
) -> None:
    """Both output modules' kernels come from the cache: a fresh process with empty
    Inductor folders starts no compiler process and writes no kernel."""
    artifact, cache = served[("conv", "inductor")]["paths"]
    result = watched_load(artifact, cache, ZERO_COMPILE_SERVE, tmp_path / "inductor-cache")
    assert result["error"] < 1e-4, result["error"]
    assert result["spawned"] == [] and result["cache_files"] == []


# ---------------------------------------------------------------- refused at capture


def _refused(fn: Any, *args: Any, directory: Path) -> PrecompileError:
    with pytest.raises(PrecompileError) as info:
        capture_pair(fn, *args, directory=directory)
    return info.value


def test_buffer_mutation_with_a_grad_input_is_refused(tmp_path: Path) -> None:
    model = torch.nn.BatchNorm1d(4).train()  # train mode updates the running statistics
    error = _refused(
        lambda m, x: m(x), model, torch.randn(5, 4, requires_grad=True), directory=tmp_path
    )
    assert "mutates buffer 'running_mean' in place" in str(error)
    assert error.invariant == 5 and "torch.no_grad()" in (error.hint or "")


@pytest.mark.parametrize(
    ("fn", "words"),
    [
        (lambda m, x: (m(x), x), "output value 1 is an input of fn"),
        (lambda m, x: (m(x), x[0]), "output value 1 is a view of an input of fn"),
        (lambda m, x: (m(x), m.weight), "output value 1 is an input of fn"),
    ],
)
def test_outputs_aliasing_inputs_are_refused(tmp_path: Path, fn: Any, words: str) -> None:
    error = _refused(
        fn, torch.nn.Linear(4, 2), torch.randn(5, 4, requires_grad=True), directory=tmp_path
    )
    assert words in str(error) and ".clone()" in (error.hint or "")


def test_backward_inside_an_inference_capture_is_refused(tmp_path: Path) -> None:
    def step(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        loss = m(x).sum()
        loss.backward(inputs=list(m.parameters()))  # into the parameters only
        return loss.detach()

    error = _refused(
        step, torch.nn.Linear(4, 2), torch.randn(5, 4, requires_grad=True), directory=tmp_path
    )
    assert "training=True" in (error.hint or "")


def test_dynamic_dims_with_a_grad_input_are_refused(tmp_path: Path) -> None:
    x = torch.randn(5, 4, requires_grad=True)
    torch._dynamo.decorators.mark_unbacked(x, 0)
    error = _refused(lambda m, x: m(x), torch.nn.Linear(4, 2), x, directory=tmp_path)
    assert "mark_unbacked" in str(error) and "not supported yet" in str(error)
