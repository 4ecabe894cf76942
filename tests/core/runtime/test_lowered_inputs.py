"""``precompile.runtime.lowered_inputs.aliased_mutation`` against a brute-force reference.

The per-call check sorts the inputs' memory spans and sweeps them (with a C-level fast
path for the usual call) instead of comparing each written input with every other one.
It must refuse exactly the calls the pairwise comparison refuses -- an input the graph
writes whose elements' bytes meet another tensor input's -- on randomized mixes of
views, slices, interleaved strides, ``from_numpy`` of one array, zero-element tensors,
non-tensors and disjoint tensors. The pair it names may differ; None vs a pair may not.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch

from precompile.runtime.lowered_inputs import aliased_mutation


def _element_bytes(t: torch.Tensor) -> tuple[int, int]:
    """``[first, end)`` of the bytes ``t``'s elements occupy, from sizes and strides."""
    low = high = 0
    for size, stride in zip(t.shape, t.stride()):
        if stride >= 0:
            high += (size - 1) * stride
        else:
            low += (size - 1) * stride
    item = t.element_size()
    return t.data_ptr() + low * item, t.data_ptr() + (high + 1) * item


def reference(inputs: list[Any], mutated: list[int]) -> tuple[int, int] | None:
    """The pairwise check as first written: each written tensor input with elements
    against every other one, refused where both storages' and elements' spans meet."""
    for m in mutated:
        a = inputs[m]
        if not isinstance(a, torch.Tensor) or not a.numel():
            continue
        for j, b in enumerate(inputs):
            if j == m or not isinstance(b, torch.Tensor) or not b.numel():
                continue
            sa, sb = a.untyped_storage(), b.untyped_storage()
            if sa.data_ptr() >= sb.data_ptr() + sb.nbytes():
                continue
            if sb.data_ptr() >= sa.data_ptr() + sa.nbytes():
                continue
            ea, eb = _element_bytes(a), _element_bytes(b)
            if ea[0] < eb[1] and eb[0] < ea[1]:
                return m, j
    return None


def _pieces(rng: random.Random) -> list[Any]:
    """A few inputs drawn from one source: a fresh tensor, views and slices of one base
    (overlapping or not), interleaved strided views, two tensors over one numpy array,
    a transpose, zero-element views, or a non-tensor."""
    kind = rng.randrange(8)
    base = torch.arange(24, dtype=torch.float32)
    if kind == 0:
        return [torch.randn(rng.randrange(1, 6))]
    if kind == 1:
        a, b = sorted(rng.sample(range(25), 2))
        c, d = sorted(rng.sample(range(25), 2))
        return [base[a:b], base[c:d]]
    if kind == 2:
        return [base[::2], base[1::2]] if rng.random() < 0.5 else [base[::2], base[::3]]
    if kind == 3:
        array = np.zeros(12, dtype=np.float32)
        a, b = sorted(rng.sample(range(13), 2))
        return [torch.from_numpy(array)[a:b], torch.from_numpy(array[rng.randrange(12) :])]
    if kind == 4:
        grid = torch.zeros(4, 6)
        return [grid.t(), grid[rng.randrange(4)], grid[:, rng.randrange(6)]]
    if kind == 5:
        return [base[5:5], base[3:9]]
    if kind == 6:
        return [rng.choice([3, None, 2.5, "x"])]
    shared = torch.ones(6)
    return [shared, shared] if rng.random() < 0.5 else [shared, shared.view(2, 3)]


@pytest.mark.parametrize("seed", range(40))
def test_the_sweep_refuses_exactly_what_the_pairwise_check_refuses(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(50):
        inputs: list[Any] = []
        for _ in range(rng.randrange(1, 6)):
            inputs += _pieces(rng)
        rng.shuffle(inputs)
        mutated = sorted(rng.sample(range(len(inputs)), rng.randrange(len(inputs) + 1)))
        expected = reference(inputs, mutated)
        found = aliased_mutation(inputs, mutated)
        assert (found is None) == (expected is None), (inputs, mutated, expected, found)
        if found is not None:
            m, j = found
            assert m != j and m in mutated, found
            assert reference([inputs[m], inputs[j]], [0]) is not None, found


def test_disjoint_contiguous_inputs_and_one_shared_tensor() -> None:
    weights = [torch.randn(8) for _ in range(200)]
    assert aliased_mutation(weights, range(200)) is None
    assert aliased_mutation([*weights, 4, None], [0]) is None
    x = torch.ones(4)
    assert aliased_mutation([*weights, x, x[2:]], [200]) == (200, 201)
    assert aliased_mutation([*weights, x, x[2:]], [201]) == (201, 200)
    # Two unwritten inputs sharing memory (tied weights) leave written ones served.
    assert aliased_mutation([x, x, *weights], [5]) is None


def _dynamo_graph(fn: Any, *calls: tuple[Any, ...]) -> torch.fx.GraphModule:
    """The last subgraph Dynamo hands a backend for ``fn`` called with ``calls`` (the
    second call makes the ints dynamic); no Inductor."""
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(fn, backend=backend)
    for args in calls:
        compiled(*args)
    torch.compiler.reset()
    return graphs[-1]


def _arithmetic(x: torch.Tensor, k: int) -> Any:
    return (
        x + k * 4,
        torch.full((2,), k // 3 + 1) * max(k, 5),
        x.new_zeros(k % 5 + 1).sum() + (k**2) / 3,
        x - (min(k, 2) - 7) ** 3,
    )


def test_the_expressions_a_graph_computes_from_an_int_evaluate_as_python_ints() -> None:
    from precompile._compat.symbolic import int_expressions
    from precompile.runtime.lowered_inputs import _int_value

    gm = _dynamo_graph(_arithmetic, (torch.ones(3), 3), (torch.ones(3), 4))
    labels = ["k" if "k" in str(p.target) else "x" for p in gm.graph.find_nodes(op="placeholder")]
    exprs, bounded = int_expressions(gm, labels)
    assert not bounded, bounded
    shown = {text for _, text in exprs}
    assert {"4 * k", "k ** 2", "max(5, k)"} <= shown, shown
    position = labels.index("k")
    for k in (3, 11, -9, 2**31, -(2**40), 2**61, 2**62 + 1, -(2**63)):
        args: list[Any] = [None] * len(labels)
        args[position] = k
        for tree, text in exprs:
            exact = eval(text, {"max": max, "min": min, "abs": abs}, {"k": k})
            fits = -(2**63) <= exact < 2**63
            value = _int_value(tree, args)
            if value is not None:
                assert value == exact, (text, k)
            elif fits:  # refused only where a term of it leaves int64
                assert abs(k) >= 2**31, (text, k)


def test_an_expression_it_cannot_convert_bounds_the_int_instead() -> None:
    from precompile._compat.symbolic import int_expressions

    def shifted(x: torch.Tensor, k: int) -> torch.Tensor:
        return x + (k | 1)

    gm = _dynamo_graph(shifted, (torch.ones(3), 3), (torch.ones(3), 4))
    labels = ["k" if "k" in str(p.target) else "x" for p in gm.graph.find_nodes(op="placeholder")]
    exprs, bounded = int_expressions(gm, labels)
    assert [i for i, _ in bounded] == [labels.index("k")], (exprs, bounded)
    assert "k" in bounded[0][1], bounded


def test_memory_that_cannot_be_read_is_refused_not_escaped() -> None:
    """A written input whose memory the check cannot read (a tensor without ordinary
    storage) is a PrecompileError, never the check's own RuntimeError."""
    from precompile.errors import PrecompileError
    from precompile.runtime.lowered_inputs import check_written_inputs

    sparse = torch.eye(3).to_sparse()
    with pytest.raises(PrecompileError, match="cannot be read"):
        check_written_inputs([sparse, torch.ones(3)], [0], ["a", "b"])
    check_written_inputs([torch.ones(3), torch.ones(3)], [0], ["a", "b"])
