"""The grad / inference-mode class of a call's ambient context (issue 26), both tracers,
each artifact served in a fresh process and compared with eager.

One rule (docs/serving.md, "Grad mode and inference mode"): an inference artifact
computes what fn computes under ``torch.no_grad()``, so it serves a call made with grad
on, under ``no_grad`` and under ``torch.inference_mode()`` alike -- a ViT-shaped encoder
whose ``nn.MultiheadAttention`` reads the grad mode in torch's own code included -- and
serves what changes no value there: a model frozen with ``requires_grad_(False)``, an
``nn.Parameter`` or a grad-requiring tensor passed as an input (with one
InferenceGradWarning where eager's outputs would carry a gradient). Where the graph does
depend on it -- the user's own code reads the grad mode, or a training capture computes
the gradients of parameters now frozen -- the call is refused naming the change and the
fix.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
import torch

import precompile
from tests.fixtures import grad_mode_models as g
from tests.harness import capture_pair, run_json, together

TRACERS = ("make_fx", "dynamo")


def _tracer(name: str) -> Any:
    return precompile.MakeFxTracer() if name == "make_fx" else precompile.DynamoTracer()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, tuple[str, str]]]:
    """Per tracer: the ViT and a model-times-tensor fn captured for inference (under
    no_grad, as serving code captures), the user-code grad read, and a training step."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for tracer in TRACERS:
        directory = tmp_path_factory.mktemp(tracer)
        pairs: dict[str, tuple[str, str]] = {}
        vit, image = g.build("vit")
        linear, x = g.build("linear")
        with torch.no_grad():
            pairs["vit"] = capture_pair(
                g.classify, vit, image, directory=directory, name="vit", tracer=_tracer(tracer)
            )
            pairs["scaled"] = capture_pair(
                g.scaled,
                linear,
                x,
                torch.ones(4),
                directory=directory,
                name="scaled",
                tracer=_tracer(tracer),
            )
            pairs["grad_branch"] = capture_pair(
                g.grad_branch, linear, x, directory=directory, name="gb", tracer=_tracer(tracer)
            )
        pairs["train"] = capture_pair(
            g.train_step,
            linear,
            x,
            directory=directory,
            name="train",
            tracer=_tracer(tracer),
            training=True,
        )
        out[tracer] = pairs
    return out


SERVE = """
import contextlib, json, warnings
import torch, precompile
from tests.fixtures import grad_mode_models as g
warnings.simplefilter("ignore", precompile.ArtifactTrustWarning)
pairs = {pairs!r}
out = {{}}

def close(a, b):
    # Both sides take torch's fast paths where eager does: equal to float rounding.
    return bool(torch.allclose(a, b, rtol=1e-5, atol=1e-6))

def attempt(name, call, expected, context=contextlib.nullcontext):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with context():
                got = call()
        except precompile.PrecompileError as error:
            out[name] = {{"result": "refused", "message": str(error)}}
            return None
    out[name] = {{
        "result": "exact" if close(got, expected) else "wrong",
        "requires_grad": bool(got.requires_grad),
        "inference": bool(got.is_inference()),
        "warned": [str(c.message) for c in caught
                   if c.category is precompile.InferenceGradWarning],
    }}
    return got

# 1. The ViT, captured by default: grad on, no_grad, inference_mode.
vit_run = precompile.load(*pairs["vit"])
vit, image = g.build("vit")
with torch.no_grad():
    expected = vit(image)
attempt("vit grad on", lambda: vit_run(vit, image), expected)
attempt("vit grad on/warm", lambda: vit_run(vit, image), expected)
attempt("vit no_grad", lambda: vit_run(vit, image), expected, torch.no_grad)
attempt("vit inference_mode", lambda: vit_run(vit, image), expected, torch.inference_mode)
with torch.inference_mode():
    eager_inference = vit(image)
out["eager inference tensor"] = bool(eager_inference.is_inference())
with torch.inference_mode():
    made_inside = image.clone()
attempt("vit inference tensor", lambda: vit_run(vit, made_inside), expected, torch.inference_mode)
attempt("vit inference tensor outside", lambda: vit_run(vit, made_inside), expected)

# 2. model.requires_grad_(False) before serving, then back.
vit.requires_grad_(False)
attempt("vit frozen grad on", lambda: vit_run(vit, image), expected)
attempt("vit frozen grad on/warm", lambda: vit_run(vit, image), expected)
attempt("vit frozen inference_mode", lambda: vit_run(vit, image), expected, torch.inference_mode)
out["frozen flags kept"] = not any(p.requires_grad for p in vit.parameters())
vit.requires_grad_(True)
attempt("vit unfrozen again", lambda: vit_run(vit, image), expected)

# 3. An nn.Parameter, or a tensor that requires grad, passed as an input.
scaled = precompile.load(*pairs["scaled"])
linear, x = g.build("linear")
w = torch.linspace(0.5, 2.0, 4)
with torch.no_grad():
    expected = g.scaled(linear, x, w)
linear.requires_grad_(False)  # only the input requires grad: its warning names it
attempt("parameter input grad on", lambda: scaled(linear, x, torch.nn.Parameter(w.clone())), expected)
attempt("parameter input no_grad", lambda: scaled(linear, x, torch.nn.Parameter(w.clone())),
        expected, torch.no_grad)
attempt("grad input grad on", lambda: scaled(linear, x, w.clone().requires_grad_() * 1), expected)
parameter = torch.nn.Parameter(w.clone())
attempt("parameter input inference_mode", lambda: scaled(linear, x, parameter), expected,
        torch.inference_mode)
out["parameter kept"] = type(parameter) is torch.nn.Parameter and parameter.requires_grad

# 4. The user's own code reads the grad mode: served in the mode its graph ran in only.
branch = precompile.load(*pairs["grad_branch"])
linear, x = g.build("linear")
with torch.no_grad():
    expected = g.grad_branch(linear, x)
attempt("user grad read grad on", lambda: branch(linear, x), expected)
attempt("user grad read no_grad", lambda: branch(linear, x), expected, torch.no_grad)
attempt("user grad read inference_mode", lambda: branch(linear, x), expected, torch.inference_mode)

# 5. A training capture of a model frozen since: its backward computes those gradients.
train = precompile.load(*pairs["train"])
linear, x = g.build("linear")
linear.requires_grad_(False)
attempt("training frozen", lambda: train(linear, x), g.train_step(g.build("linear")[0], x))
print(json.dumps(out))
"""


def _serve(pairs: dict[str, tuple[str, str]]) -> dict[str, Any]:
    return dict(run_json(textwrap.dedent(SERVE.format(pairs=pairs))))


@pytest.fixture(scope="module")
def served(artifacts: dict[str, dict[str, tuple[str, str]]]) -> dict[str, dict[str, Any]]:
    results = together(*(lambda t=t: _serve(artifacts[t]) for t in TRACERS))
    return dict(zip(TRACERS, results))


def _exact(cell: dict[str, Any]) -> None:
    assert cell["result"] == "exact", cell
    assert cell["requires_grad"] is False, cell


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_vit_captured_for_inference_serves_grad_on_no_grad_and_inference_mode(
    tracer: str, served: dict[str, dict[str, Any]]
) -> None:
    cells = served[tracer]
    for name in ("vit grad on", "vit grad on/warm", "vit no_grad", "vit inference_mode"):
        _exact(cells[name])
    # Said once per artifact: eager's outputs under grad on would carry a gradient.
    assert len(cells["vit grad on"]["warned"]) == 1, cells["vit grad on"]
    assert "parameter" in cells["vit grad on"]["warned"][0]
    assert cells["vit grad on/warm"]["warned"] == [] and cells["vit no_grad"]["warned"] == []
    # Under inference mode the outputs are inference tensors, as eager's are.
    assert cells["vit inference_mode"]["inference"] is cells["eager inference tensor"] is True


def test_an_inference_tensor_input_is_served_or_refused_in_the_products_words(
    served: dict[str, dict[str, Any]],
) -> None:
    # Under torch.inference_mode() both serve it: make_fx's graph runs ATen ops on any
    # tensor, and a Dynamo artifact shows its guards an inference tensor's ordinary keys
    # there (the keys a tensor made during the call has, too).
    for tracer in TRACERS:
        _exact(served[tracer]["vit inference tensor"])
        assert served[tracer]["vit inference tensor"]["inference"] is True
    # Outside it Dynamo's guards tell an inference tensor from the ordinary one captured:
    # refused, saying so and how to fix it.
    _exact(served["make_fx"]["vit inference tensor outside"])
    cell = served["dynamo"]["vit inference tensor outside"]
    assert cell["result"] == "refused", cell
    message = cell["message"]
    assert "`x` is an inference tensor" in message and "torch.inference_mode()" in message
    assert "MakeFxTracer" in message and "DispatchKeySet" not in message, message


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_model_frozen_before_serving_is_served_and_keeps_its_flags(
    tracer: str, served: dict[str, dict[str, Any]]
) -> None:
    cells = served[tracer]
    for name in ("vit frozen grad on", "vit frozen grad on/warm", "vit frozen inference_mode"):
        _exact(cells[name])
        assert cells[name]["warned"] == [], cells[name]  # nothing requires grad
    assert cells["frozen flags kept"] is True
    _exact(cells["vit unfrozen again"])


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_parameter_or_a_grad_requiring_tensor_passed_as_an_input_is_served(
    tracer: str, served: dict[str, dict[str, Any]]
) -> None:
    cells = served[tracer]
    for name in (
        "parameter input grad on",
        "parameter input no_grad",
        "grad input grad on",
        "parameter input inference_mode",
    ):
        _exact(cells[name])
    # One rule for both tracers: served under grad on, warned once (the input named).
    warned = cells["parameter input grad on"]["warned"]
    named = {"make_fx": "input 1", "dynamo": "argument 2"}[tracer]  # each tracer's numbering
    assert len(warned) == 1 and named in warned[0], warned
    assert cells["grad input grad on"]["warned"] == []  # once per artifact
    assert cells["parameter kept"] is True


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_grad_mode_read_in_the_users_code_is_refused_only_in_the_other_mode(
    tracer: str, served: dict[str, dict[str, Any]]
) -> None:
    cells = served[tracer]
    _exact(cells["user grad read no_grad"])
    _exact(cells["user grad read inference_mode"])
    cell = cells["user grad read grad on"]
    assert cell["result"] == "refused", cell
    message = cell["message"]
    assert "torch.is_grad_enabled()" in message and "grad mode" in message, message
    assert "torch.no_grad()" in message or "set_grad_enabled(False)" in message, message


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_training_capture_of_a_model_frozen_since_is_refused_naming_requires_grad(
    tracer: str, served: dict[str, dict[str, Any]]
) -> None:
    cell = served[tracer]["training frozen"]
    assert cell["result"] == "refused", cell
    message = cell["message"]
    assert "requires_grad=False" in message and "requires_grad=True" in message, message
    for raw in ("L['", "consider using torch._dynamo", "Guard failed"):
        assert raw not in message, message


PARAMETER_INPUTS = """
import json, warnings
import torch, precompile
from tests.fixtures import grad_mode_models as g
warnings.simplefilter("ignore")
pairs = {pairs!r}
out = {{}}

linear, x = g.build("linear")
w = torch.linspace(0.5, 2.0, 4)
run = {{n: precompile.load(*p) for n, p in pairs.items()}}

def call(name, fn, *args, expected):
    try:
        got = run[fn](*args)
    except precompile.PrecompileError as error:
        out[name] = {{"result": "refused", "message": str(error)}}
        return
    out[name] = {{"result": "exact" if torch.equal(got, expected) else "wrong", "message": ""}}

# A dict argument holding nn.Parameters (one requiring grad, one not).
batch = {{"x": torch.nn.Parameter(x.clone(), requires_grad=False),
          "w": torch.nn.Parameter(w.clone())}}
with torch.no_grad():
    expected = g.keyed_scaled(linear, batch)
held = dict(batch)
call("dict of parameters", "keyed", linear, batch, expected=expected)
out["dict kept"] = all(batch[k] is held[k] for k in held) and list(batch) == ["x", "w"]
# fn reads the input's class: eager takes the other branch for a Parameter.
parameter = torch.nn.Parameter(x.clone())
with torch.no_grad():
    expected = g.class_branch(linear, parameter)
call("class read", "class_branch", linear, parameter, expected=expected)
with torch.no_grad():
    expected = g.tensor_check(linear, parameter)
call("class test both pass", "tensor_check", linear, parameter, expected=expected)
# A training capture: a Parameter that does not require grad is served (no gradient
# flows to it in eager either), with the model's gradients as eager's.
eager_model, served_model = g.build("linear")[0], g.build("linear")[0]
frozen_input = torch.nn.Parameter(x.clone(), requires_grad=False)
expected = g.train_step(eager_model, frozen_input)
call("training: a Parameter not requiring grad", "train", served_model, frozen_input,
     expected=expected)
out["training grads"] = all(
    a.grad is not None and b.grad is not None and torch.equal(a.grad, b.grad)
    for a, b in zip(eager_model.parameters(), served_model.parameters())
)
call("training: a Parameter requiring grad", "train", g.build("linear")[0],
     torch.nn.Parameter(x.clone()), expected=expected)
print(json.dumps(out))
"""


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_parameter_input_is_served_where_eager_computes_the_same(
    tracer: str, artifacts: dict[str, dict[str, tuple[str, str]]], tmp_path: Any
) -> None:
    """An ``nn.Parameter`` where a plain tensor was captured: served in a dict argument
    too (its items swapped back after the call), and by a training capture where the
    Parameter does not require grad (gradients as eager's); refused where fn reads the
    input's class (eager branches on it) or a training capture would owe the Parameter
    a gradient -- never a silently wrong answer."""
    linear, x = g.build("linear")
    pairs = {"train": artifacts[tracer]["train"]}
    with torch.no_grad():
        pairs["keyed"] = capture_pair(
            g.keyed_scaled,
            linear,
            {"x": x, "w": torch.ones(4)},
            directory=tmp_path,
            name="keyed",
            tracer=_tracer(tracer),
        )
        pairs["class_branch"] = capture_pair(
            g.class_branch, linear, x, directory=tmp_path, name="cb", tracer=_tracer(tracer)
        )
        pairs["tensor_check"] = capture_pair(
            g.tensor_check, linear, x, directory=tmp_path, name="tc", tracer=_tracer(tracer)
        )
    out = run_json(textwrap.dedent(PARAMETER_INPUTS.format(pairs=pairs)))
    assert out["dict of parameters"]["result"] == "exact" and out["dict kept"] is True, out
    assert out["training: a Parameter not requiring grad"]["result"] == "exact", out
    # isinstance(x, torch.Tensor) holds for a Parameter too: nothing to refuse.
    assert out["class test both pass"]["result"] == "exact", out
    assert out["training grads"] is True, out
    cell = "training: a Parameter requiring grad"
    assert out[cell]["result"] in ("exact", "refused"), (cell, out)
    # Both tracers record the read and refuse, naming it: Dynamo's type guard
    # (GRAD_FLAGS["read"]); make_fx the class check in STATE_READS.
    read = out["class read"]
    assert read["result"] == "refused", out
    if tracer == "dynamo":
        assert "`x` is a torch.nn.parameter.Parameter" in read["message"], out
    else:
        assert "torch.nn.parameter.Parameter" in read["message"], out
        assert "isinstance(..., nn.Parameter)" in read["message"], out


CLASS_READS = """
import json, warnings
warnings.simplefilter("ignore")
from tests.fixtures import grad_mode_models as g
print(json.dumps(g.serve_tensor_and_parameter({pairs!r}, {functions!r})))
"""


def test_make_fx_refuses_a_parameter_where_fn_reads_its_inputs_classes(tmp_path: Any) -> None:
    """make_fx traces every input as a plain tensor (a fake tensor is never an
    ``nn.Parameter``): where fn reads an input's class -- ``isinstance``, ``type()``,
    ``.__class__`` -- a Parameter input would take another branch in eager, so it is
    refused when served (it was served with the plain tensor's branch: a silent wrong
    answer), and refused at capture where the example input is one (the trace took the
    plain tensor's branch there too). A plain tensor is still served exactly."""
    linear, x = g.build("linear")
    pairs = {}
    with torch.no_grad():
        for name in ("class_branch", "type_branch", "dunder_class_branch", "state_class_check"):
            pairs[name] = capture_pair(
                getattr(g, name),
                linear,
                x,
                directory=tmp_path,
                name=name,
                tracer=precompile.MakeFxTracer(),
            )
        with pytest.raises(precompile.PrecompileError) as refused:
            capture_pair(
                g.class_branch,
                linear,
                torch.nn.Parameter(x.clone()),
                directory=tmp_path,
                name="at_capture",
                tracer=precompile.MakeFxTracer(),
            )
    assert "reads the class of its inputs" in str(refused.value)
    assert "nn.Parameter" in str(refused.value) and "DynamoTracer" in str(refused.value)
    functions = {name: name for name in pairs}
    out = run_json(textwrap.dedent(CLASS_READS.format(pairs=pairs, functions=functions)))
    for name, what in (
        ("class_branch", "isinstance(..., nn.Parameter)"),
        ("type_branch", "type()"),
        ("dunder_class_branch", ".__class__"),
    ):
        assert out[f"{name} tensor"]["result"] == "exact", out
        refusal = out[f"{name} parameter"]
        assert refusal["result"] == "refused" and what in refusal["message"], (name, out)
        assert "torch.nn.parameter.Parameter" in refusal["message"], (name, out)
    # A class read of the model's own parameter is no read of an input's class: a
    # Parameter input is served (the isinstance hook counts fn's tensor arguments only).
    assert out["state_class_check tensor"]["result"] == "exact", out
    assert out["state_class_check parameter"]["result"] == "exact", out
