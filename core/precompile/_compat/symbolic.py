"""The integer expressions a Dynamo subgraph computes from its dynamic integer inputs,
as small trees an artifact evaluates on a call's Python ints without sympy.

Inductor's kernels compute ``4*ks0`` in int64: an input that fits 64 bits can still
make an expression of it wrap (``k = 2**61``), where eager computes with Python ints.
The capture reads each expression off the subgraph's values (``SymInt`` nodes, and the
sizes, strides and offsets of tensors whose shapes depend on an int) as sympy, over
the symbols of the graph's ``SymInt`` placeholders, and converts it to a tree of
``precompile.runtime.lowered_inputs``' operators. An integer expression it cannot convert
leaves its inputs bounded instead (``lowered_inputs.BOUND``).

Torch's sympy functions (``FloorDiv``, ``PythonMod``, ...) are told apart by class
name: they live in a private torch module.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

#: torch's sympy function class name -> the tree operator evaluating it on Python ints
_FUNCTIONS = {
    "FloorDiv": "floordiv",
    "CleanDiv": "floordiv",
    "PythonMod": "mod",
    "Mod": "mod",
    "Max": "max",
    "Min": "min",
    "Abs": "abs",
    "Identity": "identity",
}


class _Unconvertible(Exception):
    """An integer expression outside the operators an artifact evaluates."""


def _tree(expr: Any, symbols: dict[Any, int]) -> Any:
    """``expr`` (an integer sympy expression) as a tree: an int, ``("arg", i)`` for the
    graph's input ``i``, or ``(operator, *operands)``."""
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        if expr in symbols:
            return ("arg", symbols[expr])
        raise _Unconvertible(expr)
    if isinstance(expr, sympy.Add):
        return ("add", *(_tree(a, symbols) for a in expr.args))
    if isinstance(expr, sympy.Mul):
        return ("mul", *(_tree(a, symbols) for a in expr.args))
    if isinstance(expr, sympy.Pow):
        base, exponent = expr.args
        if isinstance(exponent, sympy.Integer) and exponent >= 0:
            return ("pow", _tree(base, symbols), int(exponent))
        raise _Unconvertible(expr)
    op = _FUNCTIONS.get(type(expr).__name__)  # IntTrueDiv is a float: not a tree
    if op is not None:
        return (op, *(_tree(a, symbols) for a in expr.args))
    raise _Unconvertible(expr)


def _shown(tree: Any, labels: list[str]) -> str:
    """The tree as the user would write it, inputs by their names."""
    if isinstance(tree, int):
        return str(tree)
    op, *args = tree
    if op == "arg":
        return labels[args[0]]
    inner = [_shown(a, labels) for a in args]
    if op in ("add", "mul"):
        return "(" + (" + " if op == "add" else " * ").join(inner) + ")"
    if op == "pow":
        return f"{inner[0]} ** {inner[1]}"
    if op == "floordiv":
        return f"({inner[0]} // {inner[1]})"
    if op == "mod":
        return f"({inner[0]} % {inner[1]})"
    if op == "identity":
        return inner[0]
    return f"{op}({', '.join(inner)})"


def _values(value: Any) -> list[tuple[Any, bool]]:
    """The symbolic values a graph value holds, each with whether it is an integer: a
    SymInt, SymFloat or SymBool, a tensor's sizes, strides and storage offset, or those
    of the members of a tuple or list."""
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return [(value.node.expr, isinstance(value, torch.SymInt))]
    if isinstance(value, torch.Tensor):
        ints = [*value.shape, *value.stride(), value.storage_offset()]
        return [(i.node.expr, True) for i in ints if isinstance(i, torch.SymInt)]
    if isinstance(value, tuple | list):
        return [e for v in value for e in _values(v)]
    return []


def int_expressions(
    gm: torch.fx.GraphModule, labels: list[str | None]
) -> tuple[list[tuple[Any, str]], list[tuple[int, str]]]:
    """The integer expressions ``gm`` computes from its ``SymInt`` placeholders, as
    (tree, shown) pairs for ``lowered_inputs.check_inputs``' ``int_exprs``; and, for an
    integer expression that cannot be converted, (input, shown) pairs whose input
    ``int_bounded`` keeps below ``lowered_inputs.BOUND`` instead. A placeholder's own
    symbol is left out (``ints`` checks it)."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    names = [label or f"graph input {i}" for i, label in enumerate(labels)]
    names += [f"graph input {i}" for i in range(len(names), len(placeholders))]
    symbols: dict[Any, int] = {}
    for i, node in enumerate(placeholders):
        value = node.meta.get("example_value")
        if isinstance(value, torch.SymInt) and isinstance(value.node.expr, sympy.Symbol):
            symbols.setdefault(value.node.expr, i)
    if not symbols:
        return [], []
    exprs: dict[Any, str] = {}
    bounded: dict[int, str] = {}

    def visit(expr: Any, integer: bool) -> None:
        """Record ``expr`` when it is an integer (a SymInt's, or a term sympy knows to
        be one), else the integer terms of it (the ints a float or a comparison of
        them is computed from)."""
        if not isinstance(expr, sympy.Basic) or not (expr.free_symbols & symbols.keys()):
            return
        if isinstance(expr, sympy.Symbol):
            return
        if not (integer or expr.is_integer is True):
            for arg in expr.args:
                visit(arg, False)
            return
        try:
            tree = _tree(expr, symbols)
        except _Unconvertible:
            named = {s: sympy.Symbol(names[i]) for s, i in symbols.items()}
            for symbol in expr.free_symbols & symbols.keys():
                bounded.setdefault(symbols[symbol], str(expr.xreplace(named)))
            return
        shown = _shown(tree, names)
        wrapped = tree[0] in ("add", "mul", "floordiv", "mod")  # in parentheses whole
        exprs.setdefault(tree, shown[1:-1] if wrapped else shown)

    for node in gm.graph.nodes:
        if node.op != "placeholder":
            for expr, integer in _values(node.meta.get("example_value", node.meta.get("val"))):
                visit(expr, integer)
    return list(exprs.items()), sorted(bounded.items())
