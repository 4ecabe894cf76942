"""What the graph depends on, not what the trace touched (issue 26): changes serving code
makes that cannot alter a result are served exactly -- a library module's attribute the
trace never read, ``train()`` on a model whose modules never read their flag, an extra
buffer, a dispatch mode or module tracker that only watches, ``ReLU.inplace`` where the
graph proves relu's input is not read again, ``Embedding.padding_idx`` in an inference
artifact -- while the changes whose value reached the graph (``ReLU.inplace`` where the
input is reused, a Dropout's ``train()``) and the modes that change results stay
refused, naming the change and why. Each
artifact is served in a fresh process and compared with eager on the changed model, for
both tracers; one Inductor artifact shows the mechanism holds there."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from tests.fixtures import noop_models as nm
from tests.harness import capture_pair, run_json

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}

#: name -> (model factory, example input): each captured once per tracer.
MODELS = {
    "block": ("nm.BasicBlock().eval()", "torch.randn(1, 4, 5, 5)"),
    "residual": ("nm.Residual().eval()", "torch.randn(2, 4)"),
    "tagger": ("nm.Tagger().eval()", "torch.tensor([[0, 1, 2, 5]])"),
    "dropout": ("nm.WithDropout().eval()", "torch.randn(2, 4)"),
    "buffers": ("nm.BufferSum().eval()", "torch.randn(2, 4)"),
    "timm": ("nm.TimmResidual().eval()", "torch.randn(2, 4)"),
    "reused": ("nm.ReusedRelu().eval()", "torch.randn(2, 4)"),
    "reused_dropout": ("nm.ReusedDropout().eval()", "torch.randn(2, 4)"),
    "branches": ("nm.BranchesOnInplace().eval()", "torch.randn(2, 4)"),
}

_PRELUDE = """
import json, warnings
warnings.simplefilter("ignore")
import torch
import precompile
from tests.fixtures import noop_models as nm, ambient_models as am
from torch.utils.flop_counter import FlopCounterMode
from torch.utils.module_tracker import ModuleTracker
out = {}
def fresh(name):
    torch.manual_seed(0)
    return eval(MODELS[name][0]), eval(MODELS[name][1])
def attempt(cell, name, change=lambda m: None, mode=None):
    # Serve ``name``'s artifact on the changed model (under ``mode``), and compare
    # with eager on that same changed model under the same mode.
    model, x = fresh(name)
    change(model)
    expected = nm.call_no_grad(model, x.clone())
    try:
        if mode is None:
            got = RUN[name](model, x.clone())
        else:
            with mode() as m:
                got = RUN[name](model, x.clone())
    except precompile.PrecompileError as error:
        out[cell] = {"result": "refused", "message": str(error)}
        return
    out[cell] = {"result": "exact" if torch.equal(got, expected) else "wrong", "message": ""}
"""


def _serve(pairs: dict[str, tuple[str, str]], body: str) -> dict[str, Any]:
    """Load every pair in one fresh process (``RUN[name]``) and run ``body``."""
    code = (
        textwrap.dedent(_PRELUDE)
        + f"MODELS = {MODELS!r}\n"
        + f"RUN = {{n: precompile.load(*p) for n, p in {pairs!r}.items()}}\n"
        + textwrap.dedent(body)
        + "\nprint(json.dumps(out))\n"
    )
    return run_json(code)


def _capture(tracer: str, directory: Path, backend: str = "eager", only: Any = None):
    pairs = {}
    for name, (factory, example) in MODELS.items():
        if only is not None and name not in only:
            continue
        torch.manual_seed(0)
        model, x = eval(factory), eval(example)
        pairs[name] = capture_pair(
            nm.call_no_grad,
            model,
            x,
            directory=directory,
            name=f"{name}-{tracer}-{backend}",
            tracer=TRACERS[tracer](),
            backend=backend,
        )
    return pairs


@pytest.fixture(scope="module", params=sorted(TRACERS))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Every cell below, served from one capture per model, in one fresh process."""
    tracer = request.param
    pairs = _capture(tracer, tmp_path_factory.mktemp(tracer))
    out = _serve(
        pairs,
        """
        # Attributes the forward never reads, or read by nothing that reached the graph.
        attempt("unread stride", "block", lambda m: setattr(m, "stride", 2))
        attempt("eval DropPath.drop_prob", "residual",
                lambda m: setattr(m.drop_path, "drop_prob", 0.3))
        attempt("train() without train-dependent modules", "tagger", lambda m: m.train())
        attempt("train() of a Linear beside a DropPath", "residual", lambda m: m.fc1.train())
        attempt("extra buffer", "residual",
                lambda m: m.register_buffer("extra", torch.ones(3)))
        attempt("extra buffer on a BatchNorm", "block",
                lambda m: m.bn1.register_buffer("extra", torch.ones(3)))
        attempt("extra buffer the forward enumerates", "buffers",
                lambda m: m.register_buffer("extra", torch.ones(3)))
        # Read by the trace and baked into the graph: refused, naming the change.
        attempt("train() with a Dropout", "dropout", lambda m: m.train())
        attempt("DropPath in training", "residual", lambda m: m.drop_path.train())
        # Library values whose other values the graph proves harmless: relu's input is
        # read by nothing after it; padding_idx only shapes a gradient this inference
        # graph does not compute (issue 26).
        attempt("ReLU.inplace", "residual", lambda m: setattr(m.act, "inplace", True))
        attempt("Embedding.padding_idx", "tagger", lambda m: setattr(m.emb, "padding_idx", 3))
        attempt("Embedding.scale_grad_by_freq", "tagger",
                lambda m: setattr(m.emb, "scale_grad_by_freq", True))
        attempt("ReLU.inplace where relu's input is read again", "reused",
                lambda m: setattr(m.act, "inplace", True))
        attempt("Dropout.inplace in eval, its input read again", "reused_dropout",
                lambda m: setattr(m.drop, "inplace", True))
        attempt("ReLU.inplace that user code branches on", "branches",
                lambda m: setattr(m.act, "inplace", True))
        attempt("timm-order DropPath.drop_prob", "timm",
                lambda m: setattr(m.drop_path, "drop_prob", 0.3))
        # Why ReLU.inplace cannot be served blindly: where relu's input is read again,
        # an in-place relu changes eager's result.
        torch.manual_seed(0)
        reused, x = nm.ReusedRelu().eval(), torch.randn(2, 4)
        before = nm.call_no_grad(reused, x)
        reused.act.inplace = True
        out["inplace changes a result"] = not torch.equal(before, nm.call_no_grad(reused, x))
        # Modes and trackers around the call.
        attempt("RecordingOps", "block", mode=nm.RecordingOps)
        attempt("DoublingReluKernel", "block", mode=am.DoublingReluKernel)
        attempt("DoublingRelu", "block", mode=am.DoublingRelu)
        attempt("FlopCounterMode", "block", mode=lambda: FlopCounterMode(display=False))
        attempt("ModuleTracker", "block", mode=ModuleTracker)
        model, x = fresh("block")
        try:
            with nm.RecordingOps() as served_ops:
                RUN["block"](model, x)
            with FlopCounterMode(display=False) as served_flops:
                RUN["block"](model, x)
        except precompile.PrecompileError as error:
            out["same ops"] = out["flops"] = {"result": "refused", "message": str(error)}
        else:
            with nm.RecordingOps() as eager_ops:
                nm.call_no_grad(model, x)
            out["same ops"] = served_ops.ops == eager_ops.ops and len(served_ops.ops) > 5
            with FlopCounterMode(display=False) as eager_flops:
                nm.call_no_grad(model, x)
            out["flops"] = [served_flops.get_total_flops(), eager_flops.get_total_flops()]
        handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: o * 2)
        attempt("global hook that changes results", "block")
        handle.remove()
        attempt("after", "block")
        """,
    )
    return tracer, out


EXACT = [
    "unread stride",
    "eval DropPath.drop_prob",
    "train() without train-dependent modules",
    "train() of a Linear beside a DropPath",
    "extra buffer",
    "ReLU.inplace",
    "Embedding.padding_idx",
    "Embedding.scale_grad_by_freq",
    "Dropout.inplace in eval, its input read again",
    "RecordingOps",
    "DoublingReluKernel",
    "FlopCounterMode",
    "ModuleTracker",
    "after",
]


@pytest.mark.parametrize("cell", EXACT)
def test_a_change_the_graph_does_not_depend_on_is_served_exactly(served: Any, cell: str) -> None:
    _, out = served
    assert out[cell]["result"] == "exact", out[cell]


def test_an_extra_buffer_is_served_unless_the_forward_enumerates_buffers(served: Any) -> None:
    tracer, out = served
    assert out["extra buffer"]["result"] == "exact", out
    assert out["extra buffer on a BatchNorm"]["result"] == "exact", out
    # ``self.buffers()`` in forward: the new buffer changes eager's result.
    enumerated = out["extra buffer the forward enumerates"]
    assert enumerated["result"] == "refused", out
    words = {"make_fx": "unexpected ['extra']", "dynamo": "`model` does not"}[tracer]
    assert words in enumerated["message"], enumerated


def test_a_dispatch_mode_sees_the_ops_eager_runs(served: Any) -> None:
    _, out = served
    assert out["same ops"] is True, out["same ops"]
    served_flops, eager_flops = out["flops"]
    assert served_flops == eager_flops > 0


@pytest.mark.parametrize(
    ("cell", "words"),
    [
        (
            "train() with a Dropout",
            {"make_fx": "submodule 'drop'", "dynamo": "model.drop.training"},
        ),
        (
            "DropPath in training",
            {"make_fx": "submodule 'drop_path'", "dynamo": "model.drop_path.training"},
        ),
        (
            "ReLU.inplace where relu's input is read again",
            {
                "make_fx": "inplace = True but the trace read False; the traced code reads "
                "it, and the graph baked what it read (relu's input is read again after it "
                "(add): in-place relu changes eager's result)",
                "dynamo": "(relu's input is read again after it (add): in-place relu "
                "changes eager's result)",
            },
        ),
        # The proof covers the library forward's read only: user code that branches on
        # the flag baked its branch.
        (
            "ReLU.inplace that user code branches on",
            {
                "make_fx": "BranchesOnInplace.forward (noop_models.py) reads inplace too, "
                "outside the module's forward",
                "dynamo": "BranchesOnInplace.forward (noop_models.py) reads inplace too, "
                "outside the module's forward",
            },
        ),
        # timm tests drop_prob == 0. before training: the trace read the value.
        (
            "timm-order DropPath.drop_prob",
            {"make_fx": "drop_prob = 0.3", "dynamo": "model.drop_path.drop_prob"},
        ),
        (
            "DoublingRelu",
            {
                "make_fx": "DoublingRelu (a TorchFunctionMode)",
                "dynamo": "DoublingRelu (a TorchFunctionMode)",
            },
        ),
        ("global hook that changes results", {"make_fx": "global", "dynamo": "global hook"}),
    ],
)
def test_a_change_the_graph_read_stays_refused_naming_it(
    served: Any, cell: str, words: dict[str, str]
) -> None:
    tracer, out = served
    assert out[cell]["result"] == "refused", out[cell]
    assert words[tracer] in out[cell]["message"], out[cell]
    if cell == "ReLU.inplace where relu's input is read again":
        assert out["inplace changes a result"] is True
        named = {"make_fx": "submodule 'act'", "dynamo": "`model.act.inplace` is not False"}
        assert named[tracer] in out[cell]["message"], out[cell]


def test_inductor_serves_unread_changes_and_refuses_modes_it_cannot_show(
    tmp_path: Path,
) -> None:
    """Inductor's kernels dispatch no ATen operation a mode could see: a dispatch mode
    (FlopCounterMode too) is refused there, naming why; attributes and flags the trace
    did not read are served as with the eager backend."""
    pairs = _capture("make_fx", tmp_path, backend="inductor", only={"residual"})
    out = _serve(
        pairs,
        """
        attempt("eval DropPath.drop_prob", "residual",
                lambda m: setattr(m.drop_path, "drop_prob", 0.3))
        attempt("train() of a Linear", "residual", lambda m: m.fc1.train())
        attempt("ReLU.inplace", "residual", lambda m: setattr(m.act, "inplace", True))
        attempt("DropPath in training", "residual", lambda m: m.drop_path.train())
        attempt("DoublingReluKernel", "residual", mode=am.DoublingReluKernel)
        attempt("FlopCounterMode", "residual", mode=lambda: FlopCounterMode(display=False))
        """,
    )
    assert out["eval DropPath.drop_prob"]["result"] == "exact", out
    assert out["train() of a Linear"]["result"] == "exact", out
    assert out["ReLU.inplace"]["result"] == "exact", out
    assert out["DropPath in training"]["result"] == "refused", out
    assert "submodule 'drop_path'" in out["DropPath in training"]["message"], out
    for cell in ("DoublingReluKernel", "FlopCounterMode"):
        assert out[cell]["result"] == "refused", out
        assert "(a TorchDispatchMode)" in out[cell]["message"], out
        assert "compiled kernels" in out[cell]["message"], out


def test_padding_idx_stays_refused_by_a_training_artifact_saying_why(tmp_path: Path) -> None:
    """``padding_idx`` shapes only the embedding's gradient: a training artifact (its
    backward baked it) keeps refusing another value, naming it; both tracers."""
    pairs = {}
    for tracer, make in TRACERS.items():
        torch.manual_seed(0)
        model, ids = nm.Tagger().eval(), torch.tensor([[0, 1, 2, 5]])
        pairs[f"tagger-{tracer}"] = capture_pair(
            nm.train_step,
            model,
            ids,
            directory=tmp_path,
            name=f"grad-{tracer}",
            tracer=make(),
            training=True,
        )
    out = _serve(
        pairs,
        """
        for tracer in ("make_fx", "dynamo"):
            model, ids = nm.Tagger().eval(), torch.tensor([[0, 1, 2, 5]])
            model.emb.padding_idx = 3
            try:
                RUN[f"tagger-{tracer}"](model, ids)
                out[tracer] = {"result": "served", "message": ""}
            except precompile.PrecompileError as error:
                out[tracer] = {"result": "refused", "message": str(error)}
        """,
    )
    assert out["make_fx"]["result"] == out["dynamo"]["result"] == "refused", out
    assert "padding_idx = 3" in out["make_fx"]["message"], out
    assert "padding_idx shapes the gradient" in out["make_fx"]["message"], out
    assert "model.emb.padding_idx" in out["dynamo"]["message"], out


def test_dynamo_inductor_serves_a_proven_inplace_flag_and_refuses_a_reused_input(
    tmp_path: Path,
) -> None:
    """The guard on ``model.act.inplace`` goes before serialization where the frame's
    graph proves it harmless, whatever the backend: an Inductor artifact serves the
    flipped flag exactly, and keeps refusing it, saying why, where relu's input is
    read again."""
    pairs = _capture("dynamo", tmp_path, backend="inductor", only={"residual", "reused"})
    out = _serve(
        pairs,
        """
        attempt("ReLU.inplace", "residual", lambda m: setattr(m.act, "inplace", True))
        attempt("reused", "reused", lambda m: setattr(m.act, "inplace", True))
        """,
    )
    assert out["ReLU.inplace"]["result"] == "exact", out
    assert out["reused"]["result"] == "refused", out
    assert "`model.act.inplace` is not False" in out["reused"]["message"], out
    assert "relu's input is read again after it" in out["reused"]["message"], out
