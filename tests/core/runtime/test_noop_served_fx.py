"""Serving code's no-op changes that make_fx artifacts used to refuse (issue 26):

- ``requires_grad_(False)`` on a model whose forward reads a module attribute holding its
  own parameters (``nn.LSTM``'s ``_flat_weights``, or a user's list of them): the value
  check of such an attribute compares a parameter by shape, dtype and device -- its
  ``requires_grad`` is the parameter's own check, which an inference artifact serves
  (docs/serving.md) -- and a refusal of such an attribute names what differs; where the
  forward reads a held parameter's ``requires_grad``, it stays a dependency;
- a ``TorchDispatchMode`` (``FlopCounterMode``, a recording mode, one that changes
  results) around a training step of the eager backend: make_fx traced the backward as
  eager's autograd engine dispatched it, so the mode sees eager's operations, in eager's
  order -- except onto parameters that already hold a gradient, refused saying why;
- ``train()`` on a 1-layer LSTM with dropout 0 stays refused: nn.LSTM reads its flag and
  passes it to torch's lstm kernel, where Python cannot follow it; the refusal says so.

Each artifact is served in a fresh process and compared with eager on the changed model.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from tests.fixtures import fx_trust_models as fm
from tests.fixtures import param_cache_models as pm
from tests.harness import capture_pair, run_python

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}
MODELS = {
    "cache": ("pm.ParamCache().eval()", "torch.randn(2, 4)"),
    "lstm": ("pm.LSTMHead().eval()", "torch.randn(2, 5, 4)"),
    "flag": ("pm.ReadsHeldFlag().eval()", "torch.randn(2, 4)"),
}
#: Dynamo does not trace RNNs (it gives up on the frame): the LSTM is make_fx's.
DYNAMO_MODELS = {"cache", "flag"}
#: Models whose forward reads a held parameter's requires_grad.
READS_FLAG = {"flag"}


def _serve(pairs: dict[str, tuple[str, str]], body: str) -> dict[str, Any]:
    """Load every pair in one fresh process (``RUN[name]``), run ``body``, return ``out``."""
    code = textwrap.dedent(
        """
        import json, warnings
        warnings.simplefilter("ignore")
        import torch
        from torch import nn
        import precompile
        from tests.fixtures import param_cache_models as pm, fx_trust_models as fm
        from tests.fixtures.fx_trust_cells import DoublingMatmulKernel
        from tests.fixtures.noop_models import RecordingOps
        from torch.utils.flop_counter import FlopCounterMode
        out = {}
        """
    )
    code += f"RUN = {{n: precompile.load(*p) for n, p in {pairs!r}.items()}}\n"
    code += textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module", params=sorted(TRACERS))
def cached(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    tracer = request.param
    directory = tmp_path_factory.mktemp(tracer)
    pairs = {}
    for name, (factory, example) in MODELS.items():
        if tracer == "dynamo" and name not in DYNAMO_MODELS:
            continue
        torch.manual_seed(0)
        model, x = eval(factory), eval(example)
        pairs[name] = capture_pair(
            pm.infer, model, x, directory=directory, name=name, tracer=TRACERS[tracer]()
        )
    body = f"MODELS = {MODELS!r}\n" + textwrap.dedent(
        """
        def attempt(cell, name, change):
            torch.manual_seed(0)
            model, x = eval(MODELS[name][0]), eval(MODELS[name][1])
            change(model)
            expected = pm.infer(model, x)  # grad on, as serving code often calls
            try:
                got = RUN[name](model, x)
            except precompile.PrecompileError as error:
                out[cell] = "refused: " + str(error)
                return
            out[cell] = "exact" if torch.equal(got, expected.detach()) else "WRONG"

        for name in RUN:
            attempt(f"{name} unchanged", name, lambda m: None)
            attempt(f"{name} requires_grad_(False)", name, lambda m: m.requires_grad_(False))
        attempt("held parameter of another shape", "cache",
                lambda m: m.held.__setitem__(0, nn.Parameter(torch.zeros(5, 4))))
        attempt("held tensor requiring grad", "cache", lambda m: m.view.requires_grad_(True))
        if "lstm" in RUN:
            attempt("lstm train()", "lstm", lambda m: m.train())
        """
    )
    return tracer, _serve(pairs, body)


def test_requires_grad_false_on_a_model_holding_its_parameters_is_served(cached: Any) -> None:
    tracer, out = cached
    names = sorted(MODELS) if tracer == "make_fx" else sorted(DYNAMO_MODELS)
    for name in sorted(set(names) - READS_FLAG):
        assert out[f"{name} unchanged"] == "exact", out
        assert out[f"{name} requires_grad_(False)"] == "exact", out


def test_a_refused_held_tensor_is_named_by_what_differs(cached: Any) -> None:
    tracer, out = cached
    shape, grad = out["held parameter of another shape"], out["held tensor requiring grad"]
    assert shape.startswith("refused: "), out
    if tracer == "make_fx":
        assert "held[0] = a parameter of shape (5, 4)" in shape, shape
        assert "read a parameter of shape (3, 4)" in shape, shape
        assert grad.startswith("refused: "), out
        assert "view = a tensor of shape (3, 4), dtype torch.float32 on cpu, requiring" in grad
        assert "read a tensor of shape (3, 4), dtype torch.float32 on cpu, not requiring" in grad
    else:
        assert grad == "exact" or grad.startswith("refused: "), out


def test_requires_grad_false_is_refused_where_the_forward_reads_the_held_flag(
    cached: Any,
) -> None:
    """Where the forward branches on a held parameter's ``requires_grad``, the flag is
    a dependency (make_fx: a read of a real tensor's flag is a read of the flag as the
    caller set it, not of the grad mode), and the frozen model is refused."""
    tracer, out = cached
    assert out["flag unchanged"] == "exact", out
    refusal = out["flag requires_grad_(False)"]
    assert refusal.startswith("refused: "), out
    if tracer == "make_fx":
        assert "parameter 'fc.weight' has requires_grad=False" in refusal, refusal


@pytest.mark.parametrize("cached", ["make_fx"], indirect=True)
def test_lstm_train_stays_refused_saying_the_flag_was_read(cached: Any) -> None:
    """nn.LSTM reads ``self.training`` and passes it to torch's lstm kernel, whose C++
    body decides (dropout between layers only in training): the trace cannot show that
    the graph does not depend on it, so the refusal says the flag was read."""
    _, out = cached
    refusal = out["lstm train()"]
    assert refusal.startswith("refused: "), out
    assert "submodule 'lstm' (LSTM)" in refusal, refusal
    assert "read its training flag" in refusal, refusal


def test_a_dispatch_mode_around_a_training_step_sees_eagers_operations(tmp_path: Path) -> None:
    """make_fx traced the step's backward as eager's autograd engine dispatched it, onto
    parameters whose .grad was None: a mode around the served step sees eager's operations
    (FlopCounterMode counts eager's FLOPs), and one that changes results changes them as
    in eager; onto gradients already held, eager adds into .grad in place as its backward
    runs, so a mode would see other operations: refused, saying so."""
    model, args = fm.build("train_step")
    pair = capture_pair(fm.train_step, model, *args, directory=tmp_path, training=True)
    out = _serve(
        {"step": pair},
        """
        def step(call, mode=None, held=False):
            model, args = fm.build("train_step")
            if held:
                call(model, *args)
            if mode is None:
                loss = call(model, *args)
                return loss, [p.grad for p in model.parameters()], None
            with mode() as m:
                loss = call(model, *args)
            return loss, [p.grad for p in model.parameters()], m

        def same(a, b):
            return torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))

        served, eager = step(RUN["step"], RecordingOps), step(fm.train_step, RecordingOps)
        out["ops"] = [served[2].ops, eager[2].ops]
        out["ops values"] = same(served, eager)
        flops = lambda: FlopCounterMode(display=False)
        served, eager = step(RUN["step"], flops), step(fm.train_step, flops)
        out["flops"] = [
            {str(k): v for k, v in r[2].get_flop_counts()["Global"].items()}
            for r in (served, eager)
        ]
        out["flops values"] = same(served, eager)
        served = step(RUN["step"], DoublingMatmulKernel)
        eager = step(fm.train_step, DoublingMatmulKernel)
        out["doubling"] = same(served, eager) and not same(eager, step(fm.train_step))
        try:
            step(RUN["step"], flops, held=True)
            out["held"] = "served"
        except precompile.PrecompileError as error:
            out["held"] = str(error)
        out["held without a mode"] = same(
            step(RUN["step"], held=True), step(fm.train_step, held=True)
        )
        """,
    )
    served_ops, eager_ops = out["ops"]
    assert served_ops == eager_ops and "aten.mm.default" in eager_ops, out["ops"]
    assert out["ops values"] and out["flops values"], out
    served_flops, eager_flops = out["flops"]
    assert served_flops == eager_flops and sum(eager_flops.values()) > 0, out["flops"]
    assert out["doubling"] is True, out
    assert "already hold a gradient ('fc1.weight' and 5 more)" in out["held"], out["held"]
    assert "set_to_none=True" in out["held"], out["held"]
    assert out["held without a mode"] is True, out
