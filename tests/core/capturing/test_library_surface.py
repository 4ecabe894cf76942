"""The library surface a trace went through (issue 26): a torch Python API replaced
before or after ``load`` -- ``F.scaled_dot_product_attention``, ``F.gelu`` under
``nn.GELU``, the module ``F`` names in ``torch.nn.modules.activation``, ``torch.relu``, a
kernel of ``aten::relu`` registered from Python (``torch.library``; eager and Inductor), ``torch.Tensor.softmax``, ``nn.LayerNorm.forward``, ``Tensor.__add__`` under
``+``, ``Tensor.__getitem__``, the ``Tensor.mT`` property, and a library
registry's entry (``AttentionInterface.register("sdpa", kernel)`` or
``ALL_ATTENTION_FUNCTIONS["sdpa"] = kernel`` under a tiny ``transformers`` BertModel) --
is refused naming the replaced function, never served as the graph baked it; served
unchanged (and after a no-op ``eval()``, or the same kernel registered again), every
artifact is exact. Both tracers, the eager backend, and ``Tensor.softmax`` under Inductor; each cell
kind in one fresh process (``tests/fixtures/library_surface.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import precompile
from tests.fixtures import library_surface
from tests.harness import capture_pair, run_job

#: case -> what its refusal must name, in the user's words.
NAMES = {
    "sdpa": "torch.nn.functional.scaled_dot_product_attention",
    "gelu": "torch.nn.functional.gelu",
    # The module name a library's code reached that function by, rebound.
    "module_alias": "torch.nn.modules.activation.F",
    # A stand-in module named as the original (helper-83: served wrong by make_fx).
    "module_same_name": "torch.nn.modules.activation.F",
    # A module global that holds no recorded function (helper-83).
    "module_global": "torch.nn.functional._VF",
    # Reached behind F.max_pool1d's boolean_dispatch (helper-83: served wrong by make_fx
    # after the module rule was narrowed to names the running code spells).
    "dispatch_module": "torch.nn.functional.torch",
    # A builtin reached through a chain of modules (helper-83: served wrong by make_fx).
    "module_chain": "torch._C._nn.hardtanh",
    "call_impl": "torch.nn.GELU._call_impl",
    "relu": "torch.relu",
    # torch's registry of kernels: one registered from Python for an aten operator.
    "aten_kernel": "aten::relu",
    "softmax": "torch.Tensor.softmax",
    "layernorm": "torch.nn.LayerNorm.forward",
    # Reached with no call the tracers see: ``+`` runs Tensor.__add__ through the type's
    # slot, ``abs(y)`` Tensor.__abs__, ``y[..., :4]`` Tensor.__getitem__, ``y.mT`` a property.
    "add_operator": "torch.Tensor.__add__",
    "abs_builtin": "torch.Tensor.__abs__",
    "parameter_operator": "torch.nn.Parameter.__mul__",
    "getitem": "torch.Tensor.__getitem__",
    "property": "torch.Tensor.mT",
    # A library registry's entry, by the mapping the library looks it up in.
    "registry": "transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS['sdpa']",
    "registry_local": "transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS['sdpa']",
}
#: Artifacts whose graph calls the replaced path's caller per call, as eager does: exact
#: (eager's answer in the changed process) is right there too. Dynamo's eager graph
#: calls ``F.max_pool1d`` itself, which reaches ``torch`` per call, and ``F.hardtanh``,
#: which reaches ``torch._C._nn`` per call.
SERVED_AS_EAGER = {"dispatch_module-dynamo-eager", "module_chain-dynamo-eager"}
#: case -> what its refusal must say happened, where not "was replaced".
HAPPENED = {"aten_kernel": "registered from Python"}
TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    directory = tmp_path_factory.mktemp("surface")
    captured: dict[str, Any] = {}
    cells = [(case, tracer, "eager") for case in NAMES for tracer in TRACERS]
    cells += [
        (case, tracer, "inductor") for case in ("softmax", "aten_kernel") for tracer in TRACERS
    ]
    for case, tracer, backend in cells:
        name = f"{case}-{tracer}-{backend}"
        model, x = library_surface.build(case)
        paths = capture_pair(
            library_surface.call,
            model,
            x,
            directory=directory,
            name=name,
            tracer=TRACERS[tracer](),
            backend=backend,
        )
        captured[name] = (list(paths), case)
    return directory, captured


def serve(cell: str, artifacts: tuple[Path, dict[str, Any]]) -> dict[str, Any]:
    directory, captured = artifacts
    job = {"cell": cell, "artifacts": captured}
    return run_job("tests.fixtures.library_surface", job, directory / f"{cell}.json")


@pytest.mark.parametrize("cell", ["before", "after"])
def test_a_replaced_library_function_is_refused_naming_it(
    cell: str, artifacts: tuple[Path, dict[str, Any]]
) -> None:
    results = serve(cell, artifacts)
    problems = []
    for name, (_paths, case) in artifacts[1].items():
        got = results[name]
        if name in SERVED_AS_EAGER and got["result"] == "exact":
            continue
        if got["result"] != "refused" or f"`{NAMES[case]}`" not in got["message"]:
            problems.append(f"{name} ({cell}): expected a refusal naming {NAMES[case]}, got {got}")
        elif HAPPENED.get(case, "was replaced") not in got["message"]:
            problems.append(f"{name} ({cell}): the refusal does not say what happened: {got}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("cell", ["unchanged", "noop"])
def test_an_unpatched_library_serves_exactly(
    cell: str, artifacts: tuple[Path, dict[str, Any]]
) -> None:
    results = serve(cell, artifacts)
    problems = [f"{name}: {got}" for name, got in results.items() if got["result"] != "exact"]
    assert not problems, "\n".join(problems)
