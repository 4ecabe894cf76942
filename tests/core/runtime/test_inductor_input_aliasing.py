"""Inductor artifacts and inputs that share memory, served in a fresh process.

Inductor lowers a functional graph that writes an input assuming no other input shares
its memory: ``a.mul_(2); return a + b`` served with ``b = a[:]`` read the old ``a``
(3s where eager gives 4s). Every such call must now be refused with a PrecompileError
naming both inputs, while calls with disjoint memory -- distinct tensors, non-overlapping
slices of one base -- and graphs that write no input are still served exactly. Both
tracers: make_fx (one graph) and Dynamo (a graph break between the write and the read
included). Also: a dynamic int past int64 is refused, not failed inside the kernel, and
so is one that fits but makes an integer expression the kernels compute (``4 * k``) wrap.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import precompile
from tests.fixtures import aliasing_models as models
from tests.harness import run_job

#: artifact name -> (function, tracer, how its arguments are built, capture arguments)
ARTIFACTS: dict[str, tuple[str, str, str, list[tuple[Any, ...]]]] = {
    "fx write": ("write_then_read", "make_fx", "pair", [(torch.ones(3), torch.ones(3))]),
    "fx setitem": ("set_then_read", "make_fx", "pair", [(torch.ones(3), torch.ones(3))]),
    "dynamo write": ("write_then_read", "dynamo", "pair", [(torch.ones(3), torch.ones(3))]),
    "dynamo break": ("write_across_break", "dynamo", "pair", [(torch.ones(3), torch.ones(3))]),
    "fx read-only": ("read_only", "make_fx", "pair", [(torch.ones(3), torch.ones(3))]),
    "dynamo read-only": ("read_only", "dynamo", "pair", [(torch.ones(3), torch.ones(3))]),
    "fx buffer": ("accumulate", "make_fx", "module", [(models.Accumulator(), torch.ones(3))]),
    "dynamo buffer": ("accumulate", "dynamo", "module", [(models.Accumulator(), torch.ones(3))]),
    "fx grid": ("bump_grid", "make_fx", "grid", [(models.Grid(), torch.ones(3, 4))]),
    "dynamo grid": ("bump_grid", "dynamo", "grid", [(models.Grid(), torch.ones(3, 4))]),
    "dynamo int": (
        "scale_shift",
        "dynamo",
        "int",
        [(torch.tensor(2.0), torch.ones(3), 3), (torch.tensor(2.0), torch.ones(3), 4)],
    ),
    "dynamo int expression": (
        "scaled_k",
        "dynamo",
        "int expression",
        [(torch.ones(3), 3), (torch.ones(3), 4)],
    ),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict[str, str]]]:
    """Every artifact captured here (Inductor), then served in one fresh process."""
    import os

    directory = tmp_path_factory.mktemp("aliasing")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(directory / "inductor"))
    job: dict[str, Any] = {}
    for i, (name, (function, tracer, cases, calls)) in enumerate(ARTIFACTS.items()):
        paths = directory / f"a{i}.py", directory / f"a{i}.cache"
        with precompile.capture(
            getattr(models, function),
            artifact_path=paths[0],
            cache_path=paths[1],
            tracer=precompile.DynamoTracer() if tracer == "dynamo" else precompile.MakeFxTracer(),
            backend="inductor",
        ) as cap:
            for args in calls:
                cap(*args)
        job[name] = {
            "artifact": str(paths[0]),
            "cache": str(paths[1]),
            "function": function,
            "cases": cases,
        }
    return run_job("tests.fixtures.aliasing_cells", job, directory / "job.json", timeout=600)


#: A cell served exactly (the harness's cell format: docs/architecture.md, "Tests").
EXACT = {"result": "exact", "message": ""}

WRITES = {
    "fx write": ("argument 'a'", "argument 'b'"),
    "fx setitem": ("argument 'a'", "argument 'b'"),
    "dynamo write": ("a", "b"),
    "dynamo break": ("a", "b"),
}


@pytest.mark.parametrize("artifact", sorted(WRITES))
@pytest.mark.parametrize("case", ["same", "sliced", "viewed", "overlapping"])
def test_an_input_sharing_memory_with_a_written_one_is_refused(
    served: dict[str, dict[str, dict[str, str]]], artifact: str, case: str
) -> None:
    cell = served[artifact][case]
    written, other = WRITES[artifact]
    assert cell["result"] == "refused", cell
    result = cell["message"]
    if case == "same" and artifact.startswith("dynamo"):
        # Dynamo's own guard tells one object passed twice from two objects.
        assert "are one tensor" in result, result
        return
    assert f"writes {written} in place, and {other} shares memory with it" in result
    assert ".clone()" in result and "backend='eager'" in result


@pytest.mark.parametrize("artifact", sorted(WRITES))
@pytest.mark.parametrize("case", ["distinct", "disjoint"])
def test_inputs_in_disjoint_memory_are_served_exactly(
    served: dict[str, dict[str, dict[str, str]]], artifact: str, case: str
) -> None:
    assert served[artifact][case] == EXACT


@pytest.mark.parametrize("artifact", ["fx read-only", "dynamo read-only"])
def test_a_graph_writing_no_input_serves_aliased_inputs(
    served: dict[str, dict[str, dict[str, str]]], artifact: str
) -> None:
    results = dict(served[artifact])
    if artifact.startswith("dynamo"):
        # One object passed twice is a different call to Dynamo (its guards refuse it),
        # and so is an inference tensor where an ordinary one was captured (its
        # tensor guard compares the dispatch keys): refused, though eager reads it.
        assert "are one tensor" in results.pop("same")["message"]
        assert results.pop("inference")["result"] == "refused"
    assert {cell["result"] for cell in results.values()} == {"exact"}, results


@pytest.mark.parametrize(
    ("artifact", "names"),
    [
        ("fx buffer", ("buffer 'total'", "argument 'x'")),
        ("dynamo buffer", ("model.total", "x")),
    ],
)
def test_an_input_sharing_memory_with_a_written_buffer_is_refused(
    served: dict[str, dict[str, dict[str, str]]], artifact: str, names: tuple[str, str]
) -> None:
    results = served[artifact]
    assert results["distinct"] == EXACT
    for case in ("the buffer", "a view of the buffer"):
        assert results[case]["result"] == "refused", results[case]
        message = results[case]["message"]
        if case == "the buffer" and artifact.startswith("dynamo"):
            assert "are one tensor" in message, message  # Dynamo's guard
            continue
        assert f"writes {names[0]} in place, and {names[1]} shares memory" in message


@pytest.mark.parametrize(
    ("artifact", "names"),
    [
        ("fx grid", ("buffer 'grid'", "argument 'x'")),
        ("dynamo grid", ("model.grid", "x")),
    ],
)
def test_an_input_copied_into_the_captured_layout_is_checked_before_the_copy(
    served: dict[str, dict[str, dict[str, str]]], artifact: str, names: tuple[str, str]
) -> None:
    """helper-87: make_fx with Inductor copied an input in another layout (or a negative
    view, resolved) into the captured one before it checked what the input shares with
    the buffer the graph writes; the copy shares nothing, so a transposed view of that
    buffer was served with its values from before the write, where eager reads them
    after. An input in another layout that shares nothing is still served."""
    results = served[artifact]
    assert results["distinct"] == EXACT
    assert results["another layout"] == EXACT
    cell = results["a view of the buffer in another layout"]
    assert cell["result"] == "refused", cell
    assert f"writes {names[0]} in place, and {names[1]} shares memory" in cell["message"]
    assert results["a negative view of the buffer"]["result"] == "refused", results


@pytest.mark.parametrize(
    ("artifact", "case", "written"),
    [
        *((name, "inference", names[0]) for name, names in sorted(WRITES.items())),
        ("fx buffer", "an inference-mode model", "buffer 'total'"),
        ("dynamo buffer", "an inference-mode model", "model.total"),
    ],
)
def test_an_inference_tensor_written_outside_inference_mode_is_refused(
    served: dict[str, dict[str, dict[str, str]]], artifact: str, case: str, written: str
) -> None:
    """Eager raises "Inplace update to inference tensor outside InferenceMode"; make_fx's
    Inductor kernels wrote the tensor and answered (helper-79). Dynamo's guards tell an
    inference tensor from the captured one."""
    cell = served[artifact][case]
    assert cell["result"] == "refused", cell  # and nothing written (the cell's check)
    if artifact.startswith("fx"):
        assert f"writes {written} in place, and it is an inference tensor" in cell["message"]
        assert "torch.inference_mode()" in cell["message"], cell


def test_a_dynamic_int_past_int64_is_refused(served: dict[str, dict[str, dict[str, str]]]) -> None:
    results = served["dynamo int"]
    assert results["k=7"] == EXACT
    assert results["k=2**62"] == EXACT
    for case in ("k=2**63", "k=-2**63-1"):
        assert results[case]["result"] == "refused", results[case]
        assert results[case]["message"].startswith("precompile: k is "), results[case]
        assert "signed 64-bit range" in results[case]["message"]


def test_an_int_expression_past_int64_is_refused(
    served: dict[str, dict[str, dict[str, str]]],
) -> None:
    """``x + k * 4`` with k dynamic: the kernel computes ``4*k`` in int64, which wraps
    for k = 2**61 (served -9.2e18 where eager gives +9.2e18) though k itself fits."""
    results = served["dynamo int expression"]
    for case in ("k=7", "k=2**40", "k=2**60", "k=-2**61"):
        assert results[case] == EXACT, (case, results[case])
    for case in ("k=2**61", "k=-2**61-1", "k=2**62"):
        assert results[case]["result"] == "refused", (case, results[case])
        message = results[case]["message"]
        assert message.startswith("precompile: the captured graph computes 4 * k"), (case, message)
        assert "signed 64-bit range" in message, message
