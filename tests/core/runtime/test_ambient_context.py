"""The ambient context of a call (issue 26): torch modes around a served call, inputs
passed as one tensor at capture, a reseed inside fn, a torch.Generator argument, a call
from inside torch.compile, and a model class defined in ``__main__``. Each artifact is
served in a fresh process and compared with eager, or refused naming the cause."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import precompile
from precompile import PrecompileError
from tests.fixtures import ambient_models
from tests.harness import capture_pair, run_json

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


def _serve(pair: tuple[str, str], body: str) -> dict[str, Any]:
    """Load ``pair`` in a fresh process and run ``body`` (with ``run``, ``model``,
    ``x``, ``attempt`` and the fixture module ``am`` bound); what it put in ``out``."""
    code = (
        textwrap.dedent(
            f"""
        import json, warnings
        warnings.simplefilter("ignore")
        import torch
        import precompile
        from tests.fixtures import ambient_models as am
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4)
        x = torch.randn(2, 4)
        run = precompile.load({pair[0]!r}, {pair[1]!r})
        out = {{}}
        def attempt(name, call, expected):
            try:
                got = call()
            except precompile.PrecompileError as error:
                out[name] = {{"result": "refused", "message": str(error)}}
            else:
                exact = torch.allclose(got, expected)
                out[name] = {{"result": "exact" if exact else "wrong", "message": ""}}
        """
        )
        + textwrap.dedent(body)
        + "\nprint(json.dumps(out))\n"
    )
    return run_json(code)


#: A cell served exactly (the harness's cell format: docs/architecture.md, "Tests").
EXACT = {"result": "exact", "message": ""}


def _results(out: dict[str, Any], *cells: str) -> list[str]:
    return [out[cell]["result"] for cell in cells]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 4)


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_a_call_under_a_torch_mode_is_refused_naming_it(tracer: str, tmp_path: Path) -> None:
    model = _model()
    x = torch.randn(2, 4)
    pair = capture_pair(
        ambient_models.linear_relu, model, x, directory=tmp_path, tracer=TRACERS[tracer]()
    )
    out = _serve(
        pair,
        """
        from torch.utils.flop_counter import FlopCounterMode
        attempt("plain", lambda: run(model, x), am.linear_relu(model, x))
        for mode in (am.DoublingRelu, am.DoublingReluKernel):
            with mode():
                attempt(mode.__name__, lambda: run(model, x), am.linear_relu(model, x))
        with FlopCounterMode(display=False):
            attempt("flops", lambda: run(model, x), am.linear_relu(model, x))
        attempt("after", lambda: run(model, x), am.linear_relu(model, x))
        """,
    )
    assert _results(out, "plain", "after") == ["exact", "exact"], out
    for name, kind in (("DoublingRelu", "TorchFunctionMode"),):
        assert out[name]["result"] == "refused", out
        message = out[name]["message"]
        assert f"this call runs under tests.fixtures.ambient_models.{name} (a {kind})" in message
        assert "the capture ran under no torch mode" in message
        assert "Call the artifact outside the mode" in message
    # A dispatch mode sees the eager backend's graph run the very ATen operations eager
    # runs (issue 26): served, and compared with eager under the same mode -- one that
    # changes results changes the graph's as it changes eager's. Inductor refuses it
    # (tests/core/runtime/test_noop_changes_served.py).
    assert _results(out, "DoublingReluKernel", "flops") == ["exact", "exact"], out


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_a_loaded_artifact_called_inside_torch_compile_is_served(
    tracer: str, tmp_path: Path
) -> None:
    model = _model()
    x = torch.randn(2, 4)
    pair = capture_pair(
        ambient_models.linear_relu, model, x, directory=tmp_path, tracer=TRACERS[tracer]()
    )
    out = _serve(
        pair,
        """
        compiled = torch.compile(lambda m, t: run(m, t) * 3, backend="eager")
        attempt("compiled", lambda: compiled(model, x), am.linear_relu(model, x) * 3)
        attempt("again", lambda: compiled(model, x + 1), am.linear_relu(model, x + 1) * 3)
        """,
    )
    assert out == {"compiled": EXACT, "again": EXACT}, out


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_inputs_passed_as_one_tensor_at_capture_must_be_one_tensor(
    backend: str, tmp_path: Path
) -> None:
    model = _model()
    x = torch.randn(1, 3, 4)
    aliased = capture_pair(
        ambient_models.attention, model, x, x, x, directory=tmp_path, name="same", backend=backend
    )
    distinct = capture_pair(
        ambient_models.attention,
        model,
        *torch.randn(3, 1, 3, 4),
        directory=tmp_path,
        name="distinct",
        backend=backend,
    )
    body = """
        x = torch.randn(1, 3, 4)
        q, k, v = torch.randn(3, 1, 3, 4)
        attempt("self", lambda: run(model, x, x, x), am.attention(model, x, x, x))
        attempt("distinct", lambda: run(model, q, k, v), am.attention(model, q, k, v))
        attempt("q is k", lambda: run(model, q, q, v), am.attention(model, q, q, v))
    """
    out = _serve(aliased, body)
    assert out["self"] == EXACT, out
    for cell in ("distinct", "q is k"):
        assert out[cell]["result"] == "refused", out
        assert "were one tensor at capture" in out[cell]["message"], out
        assert "this call passes different tensors there" in out[cell]["message"], out
    # Captured with distinct tensors: every pattern is served exactly.
    assert _serve(distinct, body) == {"self": EXACT, "distinct": EXACT, "q is k": EXACT}


def test_a_reseed_inside_fn_is_refused_at_capture(tmp_path: Path) -> None:
    with pytest.raises(PrecompileError) as caught:
        capture_pair(ambient_models.reseeded_noise, _model(), torch.randn(2, 4), directory=tmp_path)
    message = str(caught.value)
    assert "fn reseeds torch's random number generator (torch.manual_seed() at " in message
    assert "ambient_models.py:" in message
    assert "seed outside fn" in message


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_a_generator_argument_is_refused_at_capture_in_the_same_words(
    tracer: str, tmp_path: Path
) -> None:
    with pytest.raises(PrecompileError) as caught:
        capture_pair(
            ambient_models.with_generator,
            _model(),
            torch.randn(2, 4),
            torch.Generator().manual_seed(1),
            directory=tmp_path,
            tracer=TRACERS[tracer](),
        )
    message = str(caught.value)
    assert "is a torch.Generator; an artifact can neither carry a generator's state" in message
    assert "draw the random tensor outside fn with the generator" in message


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_a_model_class_defined_in_main_is_warned_of_at_capture(tracer: str, tmp_path: Path) -> None:
    cls = type("Tied", (nn.Linear,), {"__module__": "__main__"})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            capture_pair(
                ambient_models.linear_relu,
                cls(4, 4),
                torch.randn(2, 4),
                directory=tmp_path,
                tracer=TRACERS[tracer](),
            )
        except PrecompileError:
            pass  # Dynamo may also refuse the class's frames; the warning came first
    said = [
        str(w.message) for w in seen if "__main__.Tied is defined in the running" in str(w.message)
    ]
    assert len(said) == 1, [str(w.message) for w in seen]
    assert "Define the class in an importable module" in said[0]


@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_a_capture_under_a_torch_mode_is_refused(tracer: str, tmp_path: Path) -> None:
    """Dynamo captured under a mode served a call under the same mode wrongly: the graph
    held the mode's doubling, and the mode doubled again."""
    with pytest.raises(PrecompileError) as caught, ambient_models.DoublingRelu():
        capture_pair(
            ambient_models.linear_relu,
            _model(),
            torch.randn(2, 4),
            directory=tmp_path,
            tracer=TRACERS[tracer](),
        )
    message = str(caught.value)
    assert "capture was called under tests.fixtures.ambient_models.DoublingRelu" in message
    assert "capture outside the mode" in message
