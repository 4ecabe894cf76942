"""What the library or the compiler, not the user's code, could make an artifact answer
differently from eager (issue 26), for both tracers:

- a library path chosen by an "am I being traced?" probe: ``nn.TransformerEncoder``
  with a padding mask skips its nested-tensor fast path when
  ``torch.compiler.is_compiling()`` (padded rows: 0 in eager, up to 1.8 from the
  traced branch) -- refused at capture, naming the branch and the fix; a compile-only
  branch that computes what eager does (``nn.MultiheadAttention``'s fast path) and the
  fixed encoder serve exactly;
- Inductor's integer arithmetic: int64 ``(x * x) // 7`` where ``x * x`` overflows is
  off by one in Inductor's C++ kernels (a signed overflow is undefined there) --
  refused at capture, naming the op; arithmetic that only wraps and stores, and
  bounded arithmetic (RoBERTa's mask positions), serve exactly;
- make_fx + Inductor over max-pool, amax and clamp with NaN inputs captures (its
  decompositions reach ``torch._inductor.lowering``) and serves eager's values, NaN
  positions included.

Served artifacts are loaded in one fresh process (``tests/fixtures/library_branches``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import precompile
from tests.fixtures import library_branches
from tests.harness import capture_pair, run_job

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}

#: (case, tracer, backend) -> what the refusal at capture must say (None: served).
CELLS: dict[tuple[str, str, str], list[str] | None] = {
    ("pool", "make_fx", "inductor"): None,
    ("pool", "dynamo", "inductor"): None,
    ("square_floor", "make_fx", "inductor"): ["aten.div(rounding_mode='floor')", "overflow"],
    ("square_floor", "dynamo", "inductor"): [
        "aten.div(rounding_mode='floor')",
        "overflow",
        "library_branches.py:",
    ],
    ("square_sign", "make_fx", "inductor"): ["aten.lt", "overflow"],
    ("square_sign", "dynamo", "inductor"): ["aten.lt", "overflow", "library_branches.py:"],
    ("square_plus", "make_fx", "inductor"): None,
    ("square_plus", "dynamo", "inductor"): None,
    ("mask_positions", "make_fx", "inductor"): None,
    ("mask_positions", "dynamo", "inductor"): None,
    ("causal_mask", "make_fx", "inductor"): None,
    ("causal_mask", "dynamo", "inductor"): None,
    (
        "encoder",
        "dynamo",
        "eager",
    ): [
        "TransformerEncoder.forward",
        "torch.compiler.is_compiling()",
        "compile-only branch",
        "enable_nested_tensor=False",
    ],
    # make_fx reaches the fast path's data-dependent mask test, and refuses it.
    ("encoder", "make_fx", "eager"): ["_nested_tensor_from_mask_left_aligned"],
    ("encoder_flat", "dynamo", "eager"): None,
    ("encoder_flat", "make_fx", "eager"): None,
    ("mha", "dynamo", "eager"): None,
    ("mha", "make_fx", "eager"): None,
}


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Each cell captured once: its pair's paths and case, or the refusal's text."""
    directory = tmp_path_factory.mktemp("branches")
    results: dict[str, Any] = {}
    for case, tracer, backend in CELLS:
        name = f"{case}-{tracer}-{backend}"
        try:
            paths = capture_pair(
                library_branches.FUNCTIONS[case],
                *library_branches.inputs(case),
                directory=directory,
                name=name,
                tracer=TRACERS[tracer](),
                backend=backend,
            )
        except precompile.PrecompileError as e:
            results[name] = str(e)
        else:
            results[name] = (list(paths), case)
    return directory, results


def test_what_could_differ_from_eager_is_refused_at_capture_naming_it(
    captured: tuple[Path, dict[str, Any]],
) -> None:
    problems = []
    for (case, tracer, backend), wanted in CELLS.items():
        got = captured[1][f"{case}-{tracer}-{backend}"]
        if wanted is None:
            continue
        if not isinstance(got, str):
            problems.append(f"{case} ({tracer}, {backend}) was captured, not refused")
            continue
        missing = [w for w in wanted if w not in got]
        if missing:
            problems.append(f"{case} ({tracer}, {backend}): {missing} not in {got!r}")
    assert not problems, "\n".join(problems)


def test_what_cannot_differ_serves_exactly_in_a_fresh_process(
    captured: tuple[Path, dict[str, Any]],
) -> None:
    directory, results = captured
    job = {}
    problems = []
    for (case, tracer, backend), wanted in CELLS.items():
        name = f"{case}-{tracer}-{backend}"
        if wanted is not None:
            continue
        if isinstance(results[name], str):
            problems.append(f"{name} was refused at capture: {results[name]}")
        else:
            job[name] = results[name]
    served = run_job("tests.fixtures.library_branches", job, directory / "serve.json")
    problems += [f"{name}: {got}" for name, got in served.items() if got["result"] != "exact"]
    assert not problems, "\n".join(problems)
