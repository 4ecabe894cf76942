"""What a captured ATen graph assumes about its inputs' memory layout (capture side).

A make_fx trace runs torch's composite operators on the capture's fake inputs, so a
layout-dependent choice is decided then and baked: ``x.reshape(n, -1)`` (``flatten``,
``matmul``'s folding, ...) becomes ``aten.view`` when the capture's strides allow a view
and ``clone`` + ``_unsafe_view`` otherwise. ``aten.view`` then fails on an input whose
strides do not allow it (a channels_last image, an NHWC buffer permuted to NCHW), though
eager's ``reshape`` would copy. ``free_views`` rewrites every such view whose aliasing no
one can observe into ``aten.reshape``, which decides again per call exactly as eager's
does; ``copy_blockers`` says which inputs cannot be handed to a graph as a copy in another
layout (Inductor bakes strides; the driver serves other layouts through a copy).

Both rest on one alias analysis: operator schemas say which results share storage with
which arguments (a view, an in-place op's result), and which arguments an op writes.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from precompile._compat import tracing

#: Views whose success depends on the input's strides (``tracing.LAYOUT_VIEWS``).
_LAYOUT_VIEWS = tracing.LAYOUT_VIEWS


class _Aliases:
    """Union-find over FX nodes: one class per storage, with what touches it."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.parent: dict[torch.fx.Node, torch.fx.Node] = {}
        #: node -> the nodes that are views (or in-place results) of it.
        self.derived: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        self.written: set[torch.fx.Node] = set()
        self.unknown: set[torch.fx.Node] = set()
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            if node.target is operator.getitem:
                # An item of a multi-result view op (split, unbind) views its source.
                source = node.args[0]
                if isinstance(source, torch.fx.Node):
                    self._link(source, node)
                continue
            schema = getattr(node.target, "_schema", None)
            if schema is None:
                # Not an ATen overload: assume it may alias and write what it reads.
                for arg in node.all_input_nodes:
                    self.unknown.add(arg)
                    self._link(arg, node)
                continue
            returns_alias = {
                alias_set
                for ret in schema.returns
                if ret.alias_info is not None
                for alias_set in ret.alias_info.before_set
            }
            for i, arg_schema in enumerate(schema.arguments):
                info = arg_schema.alias_info
                if info is None:
                    continue
                value = node.args[i] if i < len(node.args) else node.kwargs.get(arg_schema.name)
                for arg in _nodes_in(value):
                    if info.is_write:
                        self.written.add(arg)
                    if set(info.before_set) & returns_alias:
                        self._link(arg, node)

    def _find(self, node: torch.fx.Node) -> torch.fx.Node:
        root = node
        while self.parent.get(root, root) is not root:
            root = self.parent[root]
        return root

    def _link(self, base: torch.fx.Node, view: torch.fx.Node) -> None:
        self.derived.setdefault(base, []).append(view)
        a, b = self._find(base), self._find(view)
        if a is not b:
            self.parent[b] = a

    def same_storage(self, a: torch.fx.Node, b: torch.fx.Node) -> bool:
        return self._find(a) is self._find(b)

    def class_written(self, node: torch.fx.Node) -> bool:
        root = self._find(node)
        return any(self._find(n) is root for n in self.written | self.unknown)

    def views_of(self, node: torch.fx.Node) -> set[torch.fx.Node]:
        """``node`` and everything that views it, transitively."""
        seen, stack = {node}, [node]
        while stack:
            for view in self.derived.get(stack.pop(), ()):
                if view not in seen:
                    seen.add(view)
                    stack.append(view)
        return seen


def _nodes_in(value: Any) -> list[torch.fx.Node]:
    if isinstance(value, torch.fx.Node):
        return [value]
    if isinstance(value, (list, tuple)):
        return [n for item in value for n in _nodes_in(item)]
    return []


def _output_nodes(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    return set(_nodes_in(gm.graph.output_node().args[0]))


def free_views(gm: torch.fx.GraphModule) -> int:
    """Rewrite each layout-dependent view into ``aten.reshape`` where no one can tell a
    copy from a view: nothing in its storage class is written in place, and neither it
    nor any view of it is an output. ``reshape`` returns a view whenever the call's
    strides allow one (what the capture saw) and copies otherwise, as eager's reshape
    does, so the graph runs on any layout. Views that must alias are kept (a call whose
    layout they cannot view fails, and is refused by the driver). Returns how many."""
    aliases = _Aliases(gm)
    outputs = _output_nodes(gm)
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _LAYOUT_VIEWS:
            continue
        if aliases.class_written(node) or aliases.views_of(node) & outputs:
            continue
        node.target = torch.ops.aten.reshape.default
        node.args = node.args[:2]
        rewritten += 1
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten


def kept_views(gm: torch.fx.GraphModule) -> int:
    """How many layout-dependent views the graph still holds (after ``free_views``)."""
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target in _LAYOUT_VIEWS)


def copy_blockers(gm: torch.fx.GraphModule, first_input: int) -> list[str | None]:
    """Per graph input from placeholder ``first_input`` on, why a copy of it in another
    layout would not serve the call exactly (None: it would): the graph writes it in
    place (the caller's tensor would not see the write), or an output is it or a view
    of it (the caller would get a view of the copy)."""
    aliases = _Aliases(gm)
    outputs = _output_nodes(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"][first_input:]
    reasons: list[str | None] = []
    for node in placeholders:
        if node in aliases.written or node in aliases.unknown or aliases.class_written(node):
            reasons.append("the graph writes it in place, and a copy would take the write")
        elif aliases.views_of(node) & outputs:
            reasons.append("an output is it or a view of it, and would view the copy")
        else:
            reasons.append(None)
    return reasons
