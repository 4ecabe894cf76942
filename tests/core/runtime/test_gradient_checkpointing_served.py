"""``model.gradient_checkpointing_enable()`` on an eval ``transformers`` model is served
(issue 26's no-op list), by two rules that each cover a class, both tracers:

- a flag read only as ``self.flag and self.training`` (or ``getattr(self, "flag",
  default) and self.training``) decides nothing while the module is in eval: the
  artifact accepts any value of it and checks the module's ``training`` flag instead
  (``neutral_reads.read_only_under_training``), so the same model put in ``train()`` is
  refused, and a flag that decides in eval too (``or``, alone) stays refused;
- a forward hook whose whole body is ``output.requires_grad_(True)``
  (``enable_input_require_grads``) changes nothing an inference artifact returns
  (``hook_kinds.marks_grad_only``); a hook that does more stays refused.

Each cell is served in a fresh process, with the change made before ``load`` and after
it, and compared with eager on the changed model."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from tests.fixtures import training_flag_models as tf
from tests.harness import capture_pair, run_json

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}

#: name -> (fn, model factory, example input), by their names in ``tf``.
MODELS = {
    "bert": ("bert_hidden", "tf.bert()", "tf.bert_ids()"),
    "gated": ("call_no_grad", "tf.GatedNet().eval()", "torch.randn(2, 4)"),
    "decides": ("call_no_grad", "tf.Decides().eval()", "torch.randn(2, 4)"),
}

_PRELUDE = """
import json, warnings
warnings.simplefilter("ignore")
import torch
import precompile
from tests.fixtures import training_flag_models as tf
out = {}
def fresh(name):
    torch.manual_seed(0)
    return eval(MODELS[name][1]), eval(MODELS[name][2])
def attempt(cell, name, change, before_load=False):
    # Serve ``name``'s artifact on the changed model -- loaded after the change
    # (``before_load``) or before it -- and compare with eager on that model.
    model, x = fresh(name)
    fn = getattr(tf, MODELS[name][0])
    change(model)
    with torch.random.fork_rng():
        expected = fn(model, x.clone())
    run = precompile.load(*PAIRS[name]) if before_load else RUN[name]
    try:
        got = run(model, x.clone())
    except precompile.PrecompileError as error:
        out[cell] = {"result": "refused", "message": str(error)}
        return
    same = torch.allclose(got, expected, atol=1e-6) and not got.requires_grad
    out[cell] = {"result": "exact" if same else "wrong", "message": ""}
"""

_CELLS = """
def checkpointing(m):
    m.gradient_checkpointing_enable()
def both(m):
    m.recompute = True
    m.offload = True
attempt("bert checkpointing, after load", "bert", checkpointing)
attempt("bert checkpointing, before load", "bert", checkpointing, before_load=True)
attempt("bert input grads hook, after load", "bert", lambda m: m.enable_input_require_grads())
attempt("bert checkpointing in train()", "bert", lambda m: (checkpointing(m), m.train()))
attempt("flags read under training, after load", "gated", lambda m: both(m.block))
attempt("flags read under training, before load", "gated", lambda m: both(m.block),
        before_load=True)
attempt("flags in train() of the gated module", "gated",
        lambda m: (both(m.block), m.block.train()))
attempt("grad-marking hook", "gated", lambda m: m.emb.register_forward_hook(tf.mark_grad))
attempt("grad-marking hook, before load", "gated",
        lambda m: m.emb.register_forward_hook(tf.mark_grad), before_load=True)
attempt("hook that also scales", "gated",
        lambda m: m.emb.register_forward_hook(tf.scale_output))
attempt("flag read with or", "decides", lambda m: setattr(m, "double", True))
attempt("flag read alone", "decides", lambda m: setattr(m, "shift", True))
"""


def _capture(tracer: str, directory: Path, backend: str = "eager") -> dict[str, Any]:
    pairs = {}
    for name, (fn, factory, example) in MODELS.items():
        torch.manual_seed(0)
        model, x = eval(factory), eval(example)
        pairs[name] = capture_pair(
            getattr(tf, fn),
            model,
            x,
            directory=directory,
            name=f"{name}-{tracer}-{backend}",
            tracer=TRACERS[tracer](),
            backend=backend,
        )
    return pairs


def _serve(pairs: dict[str, Any], body: str) -> dict[str, Any]:
    code = (
        textwrap.dedent(_PRELUDE)
        + f"MODELS = {MODELS!r}\nPAIRS = {pairs!r}\n"
        # transformers fills a class registry as a model is built, which Dynamo's guards
        # read: build one before loading (test_third_party_model.py).
        + "tf.bert()\n"
        + "RUN = {n: precompile.load(*p) for n, p in PAIRS.items()}\n"
        + textwrap.dedent(body)
        + "\nprint(json.dumps(out))\n"
    )
    return dict(run_json(code))


@pytest.fixture(scope="module", params=sorted(TRACERS))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tracer = request.param
    return tracer, _serve(_capture(tracer, tmp_path_factory.mktemp(tracer)), _CELLS)


@pytest.mark.parametrize(
    "cell",
    [
        "bert checkpointing, after load",
        "bert checkpointing, before load",
        "bert input grads hook, after load",
        "flags read under training, after load",
        "flags read under training, before load",
        "grad-marking hook",
        "grad-marking hook, before load",
    ],
)
def test_checkpointing_flags_and_grad_marking_hooks_are_served_exactly(
    served: Any, cell: str
) -> None:
    _tracer, out = served
    assert out[cell]["result"] == "exact", out[cell]


def test_the_same_model_in_training_is_refused_naming_its_training_flag(served: Any) -> None:
    tracer, out = served
    cell = out["bert checkpointing in train()"]
    assert cell["result"] == "refused", cell
    assert "training" in cell["message"], cell
    # Only the gated module's own flag tells the modes apart here: the check the rule
    # put in place of the flag's is what refuses.
    cell = out["flags in train() of the gated module"]
    assert cell["result"] == "refused", cell
    named = {"make_fx": "submodule 'block' (Gated)", "dynamo": "model.block.training"}
    assert named[tracer] in cell["message"], cell
    assert "training" in cell["message"], cell


def test_a_flag_that_decides_in_eval_or_a_hook_that_changes_values_stays_refused(
    served: Any,
) -> None:
    tracer, out = served
    for cell, name in (("flag read with or", "double"), ("flag read alone", "shift")):
        assert out[cell]["result"] == "refused", out[cell]
        assert name in out[cell]["message"], out[cell]
    cell = out["hook that also scales"]
    assert cell["result"] == "refused", cell
    assert "scale_output" in cell["message"], cell


def test_inductor_serves_training_only_flags_and_grad_marking_hooks(tmp_path: Path) -> None:
    # The rules are the capture's and the checks' (not the backend's): one small
    # Inductor artifact per tracer shows they hold there, and that train() is refused.
    pairs = {}
    for tracer in sorted(TRACERS):
        torch.manual_seed(0)
        pairs[tracer] = capture_pair(
            tf.call_no_grad,
            tf.GatedNet().eval(),
            torch.randn(2, 4),
            directory=tmp_path,
            name=f"gated-{tracer}-inductor",
            tracer=TRACERS[tracer](),
            backend="inductor",
        )
    body = """
    def change(m):
        m.block.recompute = True
        m.block.offload = True
        m.emb.register_forward_hook(tf.mark_grad)
    for tracer in list(PAIRS):
        RUN["gated"] = RUN[tracer]
        attempt(f"{tracer} served", "gated", change)
        attempt(f"{tracer} in train()", "gated", lambda m: (change(m), m.block.train()))
    """
    out = _serve(pairs, body)
    for tracer in TRACERS:
        assert out[f"{tracer} served"]["result"] == "exact", out
        assert out[f"{tracer} in train()"]["result"] == "refused", out
        assert "training" in out[f"{tracer} in train()"]["message"], out
