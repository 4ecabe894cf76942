"""make_fx captures: what goes in and out (containers, inputs that require grad, dim
marks), training steps (a loss module in a closure, gradients that already exist,
steps that read .grad), and what the trace refuses to bake (operators without a fake
kernel, nested tensors, values of tensors that are not inputs, Python side effects)."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

import precompile
from precompile import PrecompileError
from tests.fixtures import fx_trust_models
from tests.harness import capture_pair, run_json

capture = capture_pair


def refused(fn: Any, *args: Any, directory: Path, training: bool = False) -> PrecompileError:
    with pytest.raises(PrecompileError) as info:
        capture(fn, *args, directory=directory, training=training)
    return info.value


def fresh(code: str, **env: str) -> Any:
    """Run ``code`` in a fresh process (warnings off); it prints one JSON line."""
    return run_json("import warnings; warnings.simplefilter('ignore')\n" + code, **env)


# ---------------------------------------------------------------- containers


def test_registered_containers_serve_in_a_fresh_process(tmp_path: Path) -> None:
    from tests.fixtures.fx_trust_io import containers, example

    paths = capture(containers, *example(), directory=tmp_path)
    # The serving process loads before importing the module that registers the types.
    result = fresh(
        f"""
import json, sys, torch, precompile
run = precompile.load({paths[0]!r}, {paths[1]!r})
registered = "tests.fixtures.fx_trust_io" in sys.modules
from tests.fixtures.fx_trust_io import containers, example, Pair, Result
args = example(1)
out, ref = run(*args), containers(*args)
ok = (
    type(out["ordered"]) is collections.OrderedDict and list(out["ordered"]) == ["b", "a"]
    and type(out["pair"]) is Pair and type(out["result"]) is Result
    and all(torch.allclose(o, r) for o, r in zip(
        [out["ordered"]["b"], out["pair"].right, out["result"].value],
        [ref["ordered"]["b"], ref["pair"].right, ref["result"].value]))
    and out["result"].scale == 2.0
)
print(json.dumps({{"registered_by_load": registered, "ok": ok}}))
""".replace("import json, sys", "import collections, json, sys")
    )
    assert result == {"registered_by_load": True, "ok": True}


def test_hugging_face_model_output_serves_and_config_changes_are_refused(tmp_path: Path) -> None:
    from tests.fixtures.gpt2_entry import build_model, input_ids

    paths = capture(trust_models_gpt2_fn, build_model(0).eval(), input_ids(0), directory=tmp_path)
    result = fresh(
        f"""
import json, torch, precompile
run = precompile.load({paths[0]!r}, {paths[1]!r})
from tests.fixtures.gpt2_entry import build_model, input_ids
from tests.core.capturing.test_fx_trust_io import trust_models_gpt2_fn as fn
model, ids = build_model(1).eval(), input_ids(1)
out, ref = run(model, ids), fn(model, ids)
served = type(out).__name__ == type(ref).__name__ and torch.allclose(out.logits, ref.logits, atol=1e-5)
model.config.output_hidden_states = True
try:
    run(model, ids)
    refusal = None
except precompile.PrecompileError as error:
    refusal = str(error)
print(json.dumps({{"served": served, "refusal": refusal}}))
""",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    assert result["served"]
    assert "config.output_hidden_states = True" in result["refusal"]


def trust_models_gpt2_fn(model: nn.Module, ids: torch.Tensor) -> Any:
    return model(ids, use_cache=False)


class Point(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


def test_containers_another_process_cannot_rebuild_are_refused_at_capture(tmp_path: Path) -> None:
    error = refused(lambda p: p.x + p.y, Point(torch.ones(2), torch.ones(2)), directory=tmp_path)
    assert "test_fx_trust_io.Point" in str(error) and "_register_namedtuple" in (error.hint or "")
    error = refused(lambda x: Point(x, x), torch.ones(2), directory=tmp_path)
    assert "outputs" in str(error) and "_register_namedtuple" in (error.hint or "")

    class Bag:
        def __init__(self, items: list[torch.Tensor], tags: set[str]) -> None:
            self.items, self.tags = items, tags

    torch.utils._pytree.register_pytree_node(
        Bag, lambda b: (b.items, b.tags), lambda items, tags: Bag(list(items), tags)
    )
    try:
        error = refused(lambda b: b.items[0] * 2, Bag([torch.ones(2)], {"a"}), directory=tmp_path)
        assert "Bag" in str(error) and "to_dumpable_context" in (error.hint or "")
    finally:
        torch.utils._pytree._deregister_pytree_node(Bag)

    import dataclasses

    @dataclasses.dataclass
    class Out:
        value: torch.Tensor

    error = refused(lambda x: Out(x * 2), torch.ones(2), directory=tmp_path)
    assert "register_dataclass" in (error.hint or "")


# ---------------------------------------------------------------- gradients


def test_an_input_that_requires_grad_serves_with_grad_or_without(tmp_path: Path) -> None:
    model, x = nn.Linear(3, 2), torch.randn(4, 3, requires_grad=True)
    # Captured under grad mode, the artifact carries the backward: its outputs carry
    # grad like eager's (tests/core/capturing/test_fx_grad_inputs.py serves the gradients).
    (tmp_path / "grad").mkdir()
    paths = capture(lambda m, x: m(x), model, x, directory=tmp_path / "grad")
    with_grad = fresh(
        f"""
import json, torch, precompile
model = torch.nn.Linear(3, 2)
x = torch.randn(4, 3, requires_grad=True)
out = precompile.load({paths[0]!r}, {paths[1]!r})(model, x)
out.sum().backward()
print(json.dumps([out.requires_grad, x.grad is not None, model.weight.grad is not None]))
"""
    )
    assert with_grad == [True, True, True]
    (tmp_path / "no_grad").mkdir()
    with torch.no_grad():  # captured and served without grad: the outputs carry none
        paths = capture(lambda m, x: m(x), model, x, directory=tmp_path / "no_grad")
    run = precompile.load(*paths)
    with torch.no_grad():
        torch.testing.assert_close(run(model, x), model(x))
    # That artifact has no backward: under grad mode it serves the input as it serves
    # parameters that require grad (Dynamo's do the same), with outputs that carry no
    # gradient, said once (InferenceGradWarning).
    with pytest.warns(precompile.InferenceGradWarning, match="input 0 requires grad"):
        out = run(model, x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))
    assert out.requires_grad is False
    torch.testing.assert_close(run(model, x.detach()).requires_grad, False)


def test_training_step_with_a_loss_module_in_a_closure_and_existing_grads(tmp_path: Path) -> None:
    model, (x, y) = fx_trust_models.build("train_step")
    reference, _ = fx_trust_models.build("train_step")
    for m in (model, reference):  # a previous step left gradients on every parameter
        fx_trust_models.train_step(m, x * 0.5, y)
    paths = capture(fx_trust_models.train_step, model, x, y, directory=tmp_path, training=True)
    expected_loss = fx_trust_models.train_step(reference, x, y)
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, r.grad)  # the capture's own call accumulated
    result = fresh(
        f"""
import json, torch, precompile
from tests.fixtures import fx_trust_models
run = precompile.load({paths[0]!r}, {paths[1]!r})
served, (x, y) = fx_trust_models.build("train_step", seed=3)
eager, _ = fx_trust_models.build("train_step", seed=3)
for m in (served, eager):
    fx_trust_models.train_step(m, x * 0.5, y)  # existing grads
same = []
for _ in range(2):  # accumulating twice, like eager
    same.append(torch.allclose(run(served, x, y), fx_trust_models.train_step(eager, x, y)))
    same += [torch.allclose(p.grad, q.grad) for p, q in zip(served.parameters(), eager.parameters())]
print(json.dumps(all(same)))
"""
    )
    assert result is True
    assert float(expected_loss) > 0


def test_a_step_that_reads_grad_is_served_only_onto_cleared_grads(tmp_path: Path) -> None:
    model, (x, y) = fx_trust_models.build("train_step")
    reference, _ = fx_trust_models.build("train_step")
    paths = capture(
        fx_trust_models.clipped_train_step, model, x, y, directory=tmp_path, training=True
    )
    fx_trust_models.clipped_train_step(reference, x, y)
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, r.grad)
    run = precompile.load(*paths)
    with pytest.raises(
        PrecompileError, match="already has a .grad.*reads or writes .grad.*zero_grad"
    ):
        run(model, x, y)
    model.zero_grad(set_to_none=True)
    reference.zero_grad(set_to_none=True)
    torch.testing.assert_close(
        run(model, x, y), fx_trust_models.clipped_train_step(reference, x, y)
    )
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, r.grad)


# ---------------------------------------------------------------- dim marks


def test_dim_marks_are_honoured_or_refused(tmp_path: Path) -> None:
    from torch._dynamo.decorators import mark_unbacked

    x = torch.randn(4, 3)
    torch._dynamo.mark_dynamic(x, 0)
    error = refused(lambda x: x * 2, x, directory=tmp_path)
    assert "mark_dynamic" in str(error) and "mark_unbacked" in (error.hint or "")

    x = torch.randn(4, 3)
    mark_unbacked(x, 0, specialize_on=[lambda s: s == 1])
    error = refused(lambda x: x * 2, x, directory=tmp_path)
    assert "specialize_on" in str(error)

    x = torch.randn(4, 3)
    mark_unbacked(x, 0, strict=True)
    run = precompile.load(*capture(lambda x: x.sin() * 2, x, directory=tmp_path))
    wider = torch.randn(7, 3)
    torch.testing.assert_close(run(wider), wider.sin() * 2)


# ---------------------------------------------------------------- refused at capture


def test_an_operator_without_a_fake_kernel_is_refused(tmp_path: Path) -> None:
    error = refused(
        lambda w: torch.ops.quantized.embedding_bag_4bit_prepack(w),
        torch.randn(4, 8),
        directory=tmp_path,
    )
    assert "quantized.embedding_bag_4bit_prepack" in str(error) and "fake" in str(error)
    assert "register_fake" in (error.hint or "")


def test_a_jagged_nested_tensor_is_named_as_nested(tmp_path: Path) -> None:
    nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged)
    error = refused(lambda x: x.sin(), nt, directory=tmp_path)
    assert "nested tensor (layout torch.jagged)" in str(error) and "sparse" not in str(error)


class HoldsATensor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.factor = torch.tensor([3.0])  # not registered: its value would be baked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.factor.item()


class CountsCalls(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x)


def test_values_and_side_effects_an_artifact_cannot_reproduce_are_refused(tmp_path: Path) -> None:
    error = refused(lambda m, x: m(x), HoldsATensor(), torch.randn(2, 3), directory=tmp_path)
    assert (
        error.invariant == 1 and ".item()" in str(error) and "register_buffer" in (error.hint or "")
    )
    error = refused(lambda m, x: m(x), CountsCalls(), torch.randn(2, 3), directory=tmp_path)
    assert error.invariant == 4 and "calls" in str(error)


def test_a_parameter_free_module_as_an_argument_is_checked(tmp_path: Path) -> None:
    run = precompile.load(
        *capture(lambda act, x: act(x), nn.LeakyReLU(0.1), torch.randn(3), directory=tmp_path)
    )
    x = torch.randn(3)
    torch.testing.assert_close(run(nn.LeakyReLU(0.1), x), nn.functional.leaky_relu(x, 0.1))
    with pytest.raises(PrecompileError, match="negative_slope = 0.2 but the trace read 0.1"):
        run(nn.LeakyReLU(0.2), x)


def test_an_ordered_dict_input_serves(tmp_path: Path) -> None:
    d = collections.OrderedDict(a=torch.ones(2))
    run = precompile.load(*capture(lambda d: d["a"] * 2, d, directory=tmp_path))
    torch.testing.assert_close(
        run(collections.OrderedDict(a=torch.full((2,), 3.0))), torch.full((2,), 6.0)
    )
