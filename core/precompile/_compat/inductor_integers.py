"""Integer arithmetic that Inductor's C++ kernels may compute differently from eager,
refused at capture (both tracers: every ATen graph handed to Inductor is checked here).

Eager computes signed integer arithmetic with two's-complement wrap-around: ``x * x``
of an int64 past 2**63 wraps to a negative number, and ``(x * x) // 7`` floors that.
Inductor writes the same arithmetic as C++, where a signed overflow is undefined: the
compiler assumes it never happens (``x * x`` is never negative) and drops the work
that only a wrapped value needs -- the floor division's sign fix, a comparison with 0,
``abs``. The kernel is then off by one, or wholly different, where eager wraps
(``torch.compile`` is wrong the same way). A kernel that only wraps and stores (``x * x
+ 3``) computes eager's bits: only a consumer whose answer depends on the sign or
order of the value differs.

So the rule: an integer value that *may have wrapped* -- the result of ``+ - *``,
negation, powers, sums, cumulative sums or products, left shifts of signed integers
whose value range, as far as the graph tells, leaves the dtype's -- may flow into more
such arithmetic, views and copies, ``where``/``cat``, dtype conversions, an equality
test (``==``/``!=`` hold modulo 2**64 as in the integers), an index (an index that
wrapped is out of range in eager too) and the graph's outputs; any other consumer
(floor division, remainder, ordering comparisons, ``abs``, ``sign``, ``min``/``max``/
``clamp``, sorting, ...) is refused at capture, naming the op and the
arithmetic. Ranges are tracked so that what cannot wrap is served: a boolean mask
converted to int64 is 0 or 1, ``arange`` is bounded by its ends, a sum adds at most
its element count of such values; the data of integer inputs is unbounded.
"""

from __future__ import annotations

from typing import Any

import torch

from precompile._compat.tracing import node_sites
from precompile.errors import PrecompileError

#: No tensor has this many elements on any machine: what ``arange`` over a size that the
#: graph leaves symbolic can reach.
_SIZE_BOUND = 2**48

#: Signed integer dtypes and their ranges (unsigned ones wrap by definition in C++).
_RANGES: dict[torch.dtype, tuple[int, int]] = {
    d: (int(torch.iinfo(d).min), int(torch.iinfo(d).max))
    for d in (torch.int8, torch.int16, torch.int32, torch.int64)
}

#: Arithmetic whose result wraps in eager when it leaves the dtype's range.
_WRAPPING = {"add", "sub", "rsub", "mul", "neg", "pow", "sum", "cumsum", "prod", "cumprod"}
_WRAPPING |= {"__lshift__", "bitwise_left_shift", "square"}

#: Consumers that pass a wrapped value's bits through unchanged: views, copies,
#: selection, concatenation, conversions; and the graph's outputs.
_PASSING = {
    "view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t", "squeeze",
    "unsqueeze", "slice", "select", "alias", "clone", "contiguous", "copy", "copy_",
    "_to_copy", "to", "convert_element_type", "where", "cat", "stack", "as_strided",
    "unbind", "split", "split_with_sizes", "flatten", "unflatten", "index_put",
    "index_put_", "scatter", "slice_scatter", "select_scatter", "masked_fill",
    "constant_pad_nd", "repeat", "detach", "lift_fresh_copy", "_assert_tensor_metadata",
}  # fmt: skip

#: Consumers whose answer wrap-around does not change: equality holds modulo 2**64 as it
#: does in the integers (``x - 1 != 1``), and a compiler's rewrites of it valid in the
#: integers stay valid modulo 2**64 (a square is never -5 in either).
_EQUALITY = {"eq", "ne"}

#: Consumers that read only a tensor's shape, dtype and device, never its values.
_SHAPE_ONLY = {
    "full_like", "zeros_like", "ones_like", "empty_like", "new_zeros", "new_ones",
    "new_full", "new_empty", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
}  # fmt: skip

#: Ops that read an integer tensor as indices at these argument positions: a wrapped
#: index is out of range in eager too (eager raises), so it is not what differs here.
_INDEX_ARGS = {
    "embedding": (1,),
    "index": (1,),
    "gather": (2,),
    "index_select": (2,),
    "scatter": (2,),
    "scatter_add": (2,),
    "index_put": (1,),
    "index_put_": (1,),
    "_unsafe_index": (1,),
}


def _op_name(target: Any) -> str:
    name = getattr(target, "__name__", "") or str(target)
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return str(schema.name).split("::")[-1]
    return name.split(".")[0]


def _dtype(node: Any) -> torch.dtype | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return getattr(value, "dtype", None)


def _numel(node: Any, dims: Any = None) -> int | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    shape = getattr(value, "shape", None)
    if shape is None:
        return None
    sizes = list(shape)
    if dims is not None:
        dims = [dims] if isinstance(dims, int) else list(dims)
        sizes = [sizes[d] for d in dims] if dims else sizes
    total = 1
    for size in sizes:
        if not isinstance(size, int):
            return None  # symbolic: unbounded
        total *= size
    return total


def _range_of(value: Any, ranges: dict[torch.fx.Node, tuple[int, int]]) -> tuple[int, int] | None:
    """What an argument's values lie in: an integer node's recorded range, a boolean
    tensor's 0 or 1, a Python int itself; None when unknown (a float, a symbol)."""
    if isinstance(value, torch.fx.Node):
        if _dtype(value) == torch.bool:
            return 0, 1
        symbol = value.meta.get("val")
        if isinstance(symbol, torch.SymInt):
            return _symbol_range(symbol)
        return ranges.get(value)
    if isinstance(value, bool):
        return int(value), int(value)
    if isinstance(value, int):
        return value, value
    return None


def _symbol_range(symbol: torch.SymInt) -> tuple[int, int] | None:
    """The range the shape environment proves for a symbolic int; None when unbounded."""
    try:
        bounds = symbol.node.shape_env.bound_sympy(symbol.node.expr)
        low, high = int(bounds.lower), int(bounds.upper)
    except Exception:  # an unbounded end (int_oo) or no shape environment
        return None
    return low, high


def _products(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    corners = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
    return min(corners), max(corners)


def _arithmetic_range(
    name: str, node: torch.fx.Node, ranges: dict[torch.fx.Node, tuple[int, int]]
) -> tuple[int, int] | None:
    """The exact range of a wrapping op's result (not clipped to the dtype), or None
    when the graph does not tell it."""
    args = [_range_of(a, ranges) for a in node.args[:2]]
    first = args[0] if args else None
    if first is None:
        return None
    second = args[1] if len(args) > 1 else None
    if name in ("add", "sub", "rsub") and second is not None:
        alpha = _range_of(node.kwargs.get("alpha", 1), ranges)
        if alpha is None:
            return None
        second = _products(second, alpha)
        if name == "add":
            return first[0] + second[0], first[1] + second[1]
        if name == "sub":
            return first[0] - second[1], first[1] - second[0]
        return second[0] - first[1], second[1] - first[0]
    if name == "mul" and second is not None:
        return _products(first, second)
    if name == "square":
        return _products(first, first)
    if name == "neg":
        return -first[1], -first[0]
    if name in ("sum", "cumsum"):
        dims = node.args[1] if len(node.args) > 1 else None
        if name == "cumsum":
            dims = [dims] if isinstance(dims, int) else None
        count = _numel(node.args[0], dims) if dims is not None or name == "sum" else None
        if count is None:
            return None
        return min(first[0] * count, first[0]), max(first[1] * count, first[1])
    return None


def _source_range(name: str, node: torch.fx.Node) -> tuple[int, int] | None:
    """The range of an integer tensor the graph makes itself from Python numbers."""
    if name == "arange":
        # Its values lie between its ends, which are sizes when symbolic.
        ends: list[int] = []
        for arg in node.args:
            if isinstance(arg, int):
                ends.append(arg)
            elif isinstance(arg, torch.fx.Node) and isinstance(arg.meta.get("val"), torch.SymInt):
                found = _symbol_range(arg.meta["val"])
                ends += list(found) if found else [-_SIZE_BOUND, _SIZE_BOUND]
            else:
                return None
        return (min(0, *ends), max(0, *ends)) if ends else None
    if name == "iota":
        # prims.iota(length, start=, step=): what Inductor's decompositions build
        # arange from (tril's causal mask): start + step * [0, length).
        length, start, step = node.args[0], node.kwargs.get("start", 0), node.kwargs.get("step", 1)
        if not (isinstance(start, int) and isinstance(step, int)):
            return None
        if isinstance(length, torch.fx.Node) and isinstance(length.meta.get("val"), torch.SymInt):
            found = _symbol_range(length.meta["val"])
            length = found[1] if found else _SIZE_BOUND
        if not isinstance(length, int):
            return None
        last = start + step * max(length - 1, 0)
        return min(start, last), max(start, last)
    if name in ("full", "scalar_tensor"):
        value = node.args[1] if name == "full" and len(node.args) > 1 else node.args[0]
        return (value, value) if isinstance(value, int) else None
    if name in ("zeros", "ones", "zeros_like", "ones_like"):
        return 0, 1
    return None


def _index_inputs(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The inputs ``node`` reads as indices (not as data)."""
    if node.op != "call_function":
        return []
    positions = _INDEX_ARGS.get(_op_name(node.target), ())
    found: list[torch.fx.Node] = []
    for i, arg in enumerate(node.args):
        if i in positions:
            items = arg if isinstance(arg, (list, tuple)) else [arg]
            found += [a for a in items if isinstance(a, torch.fx.Node)]
    return found


def _where(node: torch.fx.Node) -> str:
    """`` at FILE:LINE`` of the innermost frame that made ``node``, when the trace kept it."""
    sites = node_sites(node)
    return f" at {sites[-1][0]}:{sites[-1][1]}" if sites else ""


def refuse_wrapping_integer_ops(gm: torch.fx.GraphModule) -> None:
    """Refuse ``gm`` (an ATen graph about to be lowered by Inductor) when an integer
    value that may have wrapped reaches an op whose C++ kernel may answer differently
    from eager's (see the module's docstring)."""
    ranges: dict[torch.fx.Node, tuple[int, int]] = {}
    wrapped: dict[torch.fx.Node, str] = {}  # node -> the arithmetic that may have wrapped
    for node in gm.graph.nodes:
        if node.op not in ("placeholder", "call_function"):
            continue
        name = _op_name(node.target) if node.op == "call_function" else "placeholder"
        indices = _index_inputs(node)
        data = [a for a in node.all_input_nodes if a not in indices]
        hit = [a for a in data if a in wrapped]
        if hit and name not in (_WRAPPING | _PASSING | _SHAPE_ONLY | _EQUALITY):
            mode = node.kwargs.get("rounding_mode")
            name = f"{name}(rounding_mode={mode!r})" if mode else name
            raise PrecompileError(
                f"the graph applies aten.{name}{_where(node)} to an integer value that may "
                f"have overflowed ({wrapped[hit[0]]}): eager wraps it around (two's "
                f"complement), and Inductor's C++ kernels assume a signed overflow never "
                f"happens, so for such inputs the artifact would answer differently from "
                f"eager (torch.compile does too)",
                invariant=3,
                hint=f"capture with backend='eager', or keep the integer arithmetic from "
                f"overflowing before aten.{name.partition('(')[0]} (compute it in floating point, or on "
                f"values the graph bounds, such as a mask converted to int)",
            )
        dtype = _dtype(node)
        if dtype not in _RANGES:
            continue
        bounds = _RANGES[dtype]
        if name in _WRAPPING:
            exact = None if hit else _arithmetic_range(name, node, ranges)
            if exact is None or exact[0] < bounds[0] or exact[1] > bounds[1]:
                wrapped[node] = wrapped[hit[0]] if hit else f"aten.{name}{_where(node)}"
                ranges[node] = bounds
            else:
                ranges[node] = exact
        elif name in _PASSING:
            if hit:
                wrapped[node] = wrapped[hit[0]]
            known = [_range_of(a, ranges) for a in data]
            if known and all(k is not None for k in known):
                ranges[node] = (min(k[0] for k in known if k), max(k[1] for k in known if k))
            else:
                ranges[node] = _source_range(name, node) or bounds
        else:
            ranges[node] = _source_range(name, node) or bounds
