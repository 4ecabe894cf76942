"""Served calls said in the user's words, both tracers, in a fresh process (issue 24):

- an inference artifact called with grad on while parameters require grad gives outputs
  without the gradient eager's carry: said once per artifact (InferenceGradWarning,
  naming training=True), never silently;
- a Python value of another type than the captured one (2.0 where the int 2 was
  captured: ``2.0 == 2``) is refused naming both types;
- a ``forward`` set on a module instance after capture (``model.forward = ...``, on the
  model or a submodule) is refused in words, not Dynamo's ``___dict_contains``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from tests.fixtures import serving_words as w
from tests.harness import run_json, together

SERVE = """
import json, warnings, torch, precompile
from tests.fixtures import serving_words as w
warnings.simplefilter("ignore", precompile.ArtifactTrustWarning)
out = {{}}

def grad_warnings(caught):
    return [str(c.message) for c in caught if c.category is precompile.InferenceGradWarning]

head = precompile.load({head!r}, {head_cache!r})
torch.manual_seed(1)
model, x = w.make_model(), torch.randn(4, 3)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.no_grad():
        quiet = head(model, x)
    out["warned_under_no_grad"] = grad_warnings(caught)
    first = head(model, x)
    second = head(model, x)
    out["warned"] = grad_warnings(caught)
eager = w.head(model, x)
out["eager_requires_grad"] = eager.requires_grad
out["served_requires_grad"] = first.requires_grad
out["exact"] = all(torch.allclose(t, eager.detach()) for t in (quiet, first, second))

scaled = precompile.load({scaled!r}, {scaled_cache!r})
out["int served"] = torch.allclose(scaled(model, x, 2), w.scaled(model, x, 2))
for value in (2.0, None, True, "2"):
    try:
        scaled(model, x, value)
        out[repr(value)] = "served"
    except precompile.PrecompileError as e:
        out[repr(value)] = str(e)

for where in ("model", "model[0]"):
    replaced = w.make_model()
    target = replaced if where == "model" else replaced[0]
    target.forward = lambda x, t=target: type(t).forward(t, x) * 2
    try:
        head(replaced, x)
        out[where] = "served"
    except precompile.PrecompileError as e:
        out[where] = str(e)
print(json.dumps(out))
"""


def _capture(fn: Any, args: tuple[Any, ...], tracer: str, path: Path) -> tuple[str, str]:
    pair = str(path.with_suffix(".py")), str(path.with_suffix(".cache"))
    with (
        torch.no_grad(),
        precompile.capture(
            fn,
            artifact_path=pair[0],
            cache_path=pair[1],
            tracer=precompile.MakeFxTracer() if tracer == "make_fx" else precompile.DynamoTracer(),
            backend="eager",
        ) as cap,
    ):
        cap(*args)
    return pair


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each tracer's artifacts, captured here and served in one fresh process each."""
    torch._dynamo.reset()
    scripts = {}
    for tracer in ("make_fx", "dynamo"):
        root = tmp_path_factory.mktemp(tracer)
        model, x = w.make_model(), torch.randn(4, 3)
        head, head_cache = _capture(w.head, (model, x), tracer, root / "head")
        scaled, scaled_cache = _capture(w.scaled, (model, x, 2), tracer, root / "scaled")
        scripts[tracer] = SERVE.format(
            head=head, head_cache=head_cache, scaled=scaled, scaled_cache=scaled_cache
        )

    def serve(code: str) -> dict[str, Any]:
        return dict(run_json(code))

    results = together(*(lambda c=code: serve(c) for code in scripts.values()))
    return dict(zip(scripts, results))


@pytest.mark.parametrize("tracer", ["make_fx", "dynamo"])
def test_an_inference_artifact_called_with_grad_on_says_once_that_outputs_carry_no_grad(
    served: dict[str, dict[str, Any]], tracer: str
) -> None:
    out = served[tracer]
    assert out["exact"]
    assert out["eager_requires_grad"] and not out["served_requires_grad"]
    assert out["warned_under_no_grad"] == []
    (message,) = out["warned"]  # two calls with grad on, one warning
    for words in ("captured for inference", "carry no gradient", "training=True", "no_grad"):
        assert words in message, message
    assert "parameter '0.weight'" in message, message


@pytest.mark.parametrize("tracer", ["make_fx", "dynamo"])
@pytest.mark.parametrize(
    "value, said",
    [
        ("2.0", "the float 2.0"),
        ("None", "None"),
        ("True", "the bool True"),
        ("'2'", "the str '2'"),
    ],
)
def test_a_python_value_of_another_type_is_refused_naming_both_types(
    served: dict[str, dict[str, Any]], tracer: str, value: str, said: str
) -> None:
    out = served[tracer]
    assert out["int served"]
    message = out[value]
    assert f"is {said};" in message, message
    assert "the int 2" in message and "specialized by type and value" in message, message


@pytest.mark.parametrize("tracer", ["make_fx", "dynamo"])
@pytest.mark.parametrize("where", ["model", "model[0]"])
def test_a_forward_set_on_the_instance_is_refused_in_words(
    served: dict[str, dict[str, Any]], tracer: str, where: str
) -> None:
    message = served[tracer][where]
    assert message != "served"
    owner = "Sequential.forward" if where == "model" else "Linear.forward"
    assert "forward" in message and "shadows" in message and owner in message, message
    assert f"del {where}.forward" in message, message
    for raw in ("___dict_contains", "__dict__)", "L["):
        assert raw not in message, message


TRACED_ELSEWHERE = """
import os

import torch

if os.environ.get("PRECOMPILE_TEST_BREAK_IMPORT"):
    raise ImportError("broken on purpose")


def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2
"""


def test_a_traced_module_not_importable_is_refused_in_one_set_of_words(tmp_path: Path) -> None:
    """Both tracers reach the user's modules through one import-or-refuse
    (``runtime.refusal.import_user_module``): a module the trace went through that does
    not import where the artifact is served is refused naming it, in the same words."""
    import importlib
    import sys

    (tmp_path / "traced_elsewhere.py").write_text(TRACED_ELSEWHERE)
    sys.path.insert(0, str(tmp_path))
    try:
        fn = importlib.import_module("traced_elsewhere").double
        tracers = {"make_fx": precompile.MakeFxTracer(), "dynamo": precompile.DynamoTracer()}
        pairs = {}
        for name, tracer in tracers.items():
            pairs[name] = str(tmp_path / f"{name}.py"), str(tmp_path / f"{name}.cache")
            with precompile.capture(
                fn, artifact_path=pairs[name][0], cache_path=pairs[name][1], tracer=tracer
            ) as cap:
                cap(torch.ones(3))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("traced_elsewhere", None)
    code = """
import json, sys, torch, precompile
sys.path.insert(0, {directory!r})
try:
    precompile.load({artifact!r}, {cache!r})(torch.ones(3))
    print(json.dumps({{"result": "exact", "message": ""}}))
except precompile.PrecompileError as error:
    print(json.dumps({{"result": "refused", "message": str(error)}}))
"""
    results = together(
        *(
            lambda pair=pair: run_json(
                code.format(directory=str(tmp_path), artifact=pair[0], cache=pair[1]),
                PRECOMPILE_TEST_BREAK_IMPORT="1",
            )
            for pair in pairs.values()
        )
    )
    said = {}
    for name, cell in zip(pairs, results):
        assert cell["result"] == "refused", (name, cell)
        said[name] = cell["message"].strip()
    assert said["make_fx"] == said["dynamo"], said
    assert (
        "traced through module 'traced_elsewhere', which is not importable here "
        "(ImportError: broken on purpose)" in said["make_fx"]
    ), said
