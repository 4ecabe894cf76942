"""What a single-graph capture takes: ``fn`` and the arguments of its example call.

Checked before the trace starts, each refusal naming the invariant it breaks: ``fn``
holds no module or tensor of its own (invariant 1), every input is a tensor the artifact
can check and reproduce, a module at the top level, or a Python literal (invariants 1, 3
and 4), and the containers that hold them are pytree nodes another process can rebuild.
Also how a capture names ``fn`` and each input leaf for reports and refusals.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from precompile._compat import tracing
from precompile._compat.tracing import pytree
from precompile.capturing.fx_dependencies import param_free
from precompile.errors import Location, PrecompileError, generator_input_refusal
from precompile.locations import definition_location

#: Non-tensor example values the artifact can bake and re-check on every call.
LITERAL_TYPES = (type(None), bool, int, float, complex, str)


def fn_location(fn: Callable[..., Any]) -> Location | None:
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:
        return None
    return definition_location(code)


def _holds_state(value: Any) -> bool:
    """A tensor, or a module with parameters or buffers: state the artifact would bake.
    A module without either (a loss, an activation) is code and configuration, baked
    like any other value fn closes over."""
    if isinstance(value, torch.nn.Module):
        return not param_free(value)
    return isinstance(value, torch.Tensor)


def check_fn_holds_no_state(fn: Callable[..., Any]) -> None:
    """Invariant 1: modules and tensors reach fn as arguments, never through fn itself."""
    where = fn_location(fn)
    hint = "pass the module or tensor as an argument of fn instead"
    if isinstance(fn, torch.nn.Module) and not param_free(fn):
        raise PrecompileError(
            f"fn is itself an nn.Module ({type(fn).__name__}); its parameters would be "
            f"baked into the artifact",
            invariant=1,
            location=where,
            hint="capture a function that takes the module: "
            "capture(lambda model, x: model(x), ...) and call cap(model, x)",
        )
    if not callable(fn):
        raise TypeError(f"precompile.capture: fn must be callable, got {type(fn).__name__}")
    held: list[str] = []
    if isinstance(fn, functools.partial):
        held += [f"partial argument {i}" for i, a in enumerate(fn.args) if _holds_state(a)]
        held += [f"partial keyword {k!r}" for k, a in fn.keywords.items() if _holds_state(a)]
    owner = getattr(fn, "__self__", None)
    if _holds_state(owner):
        held.append(f"the bound object {type(owner).__name__} (fn is a method)")
    func = getattr(fn, "__func__", fn)
    code = getattr(func, "__code__", None)
    for name, cell in zip(
        getattr(code, "co_freevars", ()), getattr(func, "__closure__", None) or ()
    ):
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if _holds_state(value):
            held.append(f"closure variable {name!r} ({type(value).__name__})")
    for i, value in enumerate(getattr(func, "__defaults__", None) or ()):
        if _holds_state(value):
            held.append(f"default argument {i} ({type(value).__name__})")
    for name, value in (getattr(func, "__kwdefaults__", None) or {}).items():
        if _holds_state(value):
            held.append(f"keyword default {name!r} ({type(value).__name__})")
    if held:
        raise PrecompileError(
            f"fn holds a module or tensor through {', '.join(held)}; the artifact would "
            f"bake it in as a constant instead of taking it at run time",
            invariant=1,
            location=where,
            hint=hint,
        )


def check_tensor(t: torch.Tensor, what: str, where: Location | None) -> None:
    """Refuse tensor kinds the artifact cannot check or reproduce yet (invariant 4)."""
    inner = tracing.active_trace()
    if isinstance(t, tracing.FakeTensor) or inner:
        raise PrecompileError(
            f"capture was called inside another trace ({inner or 'fake tensor inputs'}); "
            f"{what} is not a real tensor",
            invariant=None,
            location=where,
            hint="call precompile.capture at top level, outside torch.compile, make_fx "
            "and fake-tensor modes",
        )
    problem = None
    if t.is_nested:
        problem = f"is a nested tensor (layout {t.layout})"
        fix = "pass padded dense tensors (.to_padded_tensor(0.0))"
    elif t.layout != torch.strided:
        kind = "mkldnn" if "mkldnn" in str(t.layout) else "sparse"
        problem = f"has layout {t.layout} (a {kind} tensor)"
        fix = "pass a dense tensor (.to_dense())"
    elif t.is_quantized:
        problem = "is quantized"
        fix = "pass the dequantized tensor (.dequantize())"
    elif t.is_pinned():
        problem = "is in pinned memory"
        fix = "pass an unpinned copy"
    elif t.is_conj():
        # A lazy view: eager resolves the bit where an op needs it, the ops of the graph
        # as traced (``z.real`` is ``view_as_real``) would not.
        problem = "has its conjugate bit set (a lazy z.conj() view)"
        fix = "pass z.resolve_conj()"
    elif type(t) not in (torch.Tensor, torch.nn.Parameter, torch.nn.Buffer):
        problem = f"is a tensor subclass ({type(t).__name__})"
        fix = "pass a plain torch.Tensor"
    else:
        return
    raise PrecompileError(
        f"{what} {problem}, which precompile does not support yet",
        invariant=4,
        location=where,
        hint=fix,
    )


def split_args(
    args: Sequence[Any], where: Location | None
) -> tuple[list[int], list[torch.nn.Module], list[Any], Any]:
    module_positions = [i for i, a in enumerate(args) if isinstance(a, torch.nn.Module)]
    modules = [args[i] for i in module_positions]
    user = tuple(a for i, a in enumerate(args) if i not in module_positions)
    leaves, in_spec = pytree.tree_flatten(user)
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.nn.Module):
            raise PrecompileError(
                f"input value {i} is an nn.Module nested inside a container; modules are "
                f"lifted only as top-level positional arguments",
                invariant=1,
                location=where,
                hint="pass each module as its own positional argument of fn",
            )
        if isinstance(leaf, torch.Tensor):
            check_tensor(leaf, f"input value {i}", where)
            _check_dim_marks(leaf, i, where)
        elif isinstance(leaf, LITERAL_TYPES) and type(leaf) not in LITERAL_TYPES:
            base = next(t for t in LITERAL_TYPES if isinstance(leaf, t))
            raise PrecompileError(
                f"input value {i} is a {type(leaf).__name__}, a subclass of "
                f"{base.__name__}; the artifact bakes each Python value and re-checks its "
                f"exact type and value on every call, so it would refuse this one",
                invariant=3,
                location=where,
                hint=f"pass {base.__name__}(value) instead, or read the value inside fn",
            )
        elif isinstance(leaf, torch.Generator):
            raise generator_input_refusal(f"input value {i}", where)
        elif not isinstance(leaf, LITERAL_TYPES):
            raise PrecompileError(
                f"input value {i} is a {type(leaf).__name__}; besides tensors and modules "
                f"a captured call takes only Python literals (None, bool, int, float, "
                f"complex, str), which the artifact bakes and re-checks on every call",
                invariant=3,
                location=where,
                hint="pass tensors and literals only; read other configuration inside fn"
                + registration_hint(type(leaf)),
            )
    check_spec_serializable(in_spec, "the call's inputs", where)
    return module_positions, modules, leaves, in_spec


def registration_hint(cls: type) -> str:
    """How to make ``cls`` a container pytree flattens, with a name another process can
    find it by (``serialized_type_name``)."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    if dataclasses.is_dataclass(cls):
        return (
            f"; or register the dataclass: torch.utils._pytree.register_dataclass("
            f"{cls.__qualname__}, serialized_type_name={name!r})"
        )
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return (
            f"; or register the namedtuple: torch.utils._pytree._register_namedtuple("
            f"{cls.__qualname__}, serialized_type_name={name!r})"
        )
    return (
        f"; or register it: torch.utils._pytree.register_pytree_node({cls.__qualname__}, "
        f"flatten_fn, unflatten_fn, serialized_type_name={name!r}), with "
        f"to_dumpable_context / from_dumpable_context when its context is not JSON"
    )


def _spec_types(spec: Any) -> list[type]:
    """The container classes in a spec, outermost first (a namedtuple's node names
    ``collections.namedtuple`` and keeps its class as the context)."""
    found: list[type] = []
    stack = [spec]
    while stack:
        node = stack.pop(0)
        kind = node.type
        if kind is collections.namedtuple:
            kind = node.context
        if isinstance(kind, type) and kind not in found:
            found.append(kind)
        stack.extend(node.children())
    return found


def check_spec_serializable(spec: Any, what: str, where: Location | None) -> None:
    """The artifact records the nesting of inputs and outputs as JSON and rebuilds it in
    another process: every container type in it must be registered with pytree under a
    ``serialized_type_name``, with a JSON context."""
    try:
        same = pytree.treespec_loads(pytree.treespec_dumps(spec)) == spec
        error: Exception | None = None
    except Exception as exc:  # pytree raises NotImplementedError, TypeError, KeyError...
        same, error = False, exc
    if same:
        return
    plain = (list, tuple, dict, type(None))
    odd = [t for t in _spec_types(spec) if t not in plain]
    culprit = odd[-1] if odd else None
    shown = f"a {culprit.__module__}.{culprit.__qualname__}" if culprit else "a container"
    detail = f": {type(error).__name__}: {str(error)[:300]}" if error else ""
    raise PrecompileError(
        f"{what} hold {shown}, which the artifact cannot record as a pytree node it can "
        f"rebuild in another process{detail}",
        invariant=3,
        location=where,
        hint=(
            "use lists, tuples and dicts" + registration_hint(culprit)
            if culprit
            else "use lists, tuples and dicts"
        ),
    )


def _check_dim_marks(t: torch.Tensor, i: int, where: Location | None) -> None:
    """Dynamo's dim marks mean something under make_fx only as mark_unbacked dims; any
    other mark would be dropped silently, so it is refused."""
    marks = tracing.dim_marks(t)
    if marks["dynamic"]:
        raise PrecompileError(
            f"input value {i} has dims {marks['dynamic']} marked with "
            f"torch._dynamo.mark_dynamic, which the make_fx tracer does not honour (it "
            f"would trace them static)",
            invariant=3,
            location=where,
            hint="mark them with torch._dynamo.decorators.mark_unbacked(t, dim) (served at "
            "any size; refused at capture where the graph must specialize on them), or "
            "use precompile.DynamoTracer()",
        )
    if marks["specialize_on"]:
        raise PrecompileError(
            f"input value {i} dims {sorted(marks['specialize_on'])} carry "
            f"mark_unbacked(..., specialize_on=...), which the make_fx tracer does not "
            f"support (it traces one graph, not one per criterion)",
            invariant=3,
            location=where,
            hint="drop specialize_on, or use precompile.DynamoTracer()",
        )


def leaf_names(
    fn: Callable[..., Any], num_args: int, module_positions: list[int], in_spec: Any
) -> list[str]:
    """Each input leaf as the user would name it: fn's parameter name (``args[2]`` past
    the named ones, ``argument 2`` without a signature), then the path into the
    container that held it."""
    import inspect

    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
    except (TypeError, ValueError):
        params = []

    def arg_name(position: int) -> str:
        for i, p in enumerate(params):
            if p.kind == p.VAR_POSITIONAL:
                return f"{p.name}[{position - i}]"
            if i == position:
                return p.name
        return f"argument {position}"

    user_positions = [i for i in range(num_args) if i not in module_positions]
    shaped = pytree.tree_unflatten(list(range(in_spec.num_leaves)), in_spec)
    names = []
    for path, _ in pytree.tree_flatten_with_path(shaped)[0]:
        head, rest = path[0], path[1:]
        # The user's arguments are a tuple: the first key is a position in it.
        position = user_positions[getattr(head, "idx", 0)]
        names.append(arg_name(position) + pytree.keystr(rest))
    return names


def describe_fn(fn: Callable[..., Any]) -> dict[str, Any]:
    """Name, module and definition site of the captured function, for reports."""
    func = getattr(fn, "__func__", fn)
    if isinstance(func, functools.partial):
        func = func.func
    code = getattr(func, "__code__", None)
    return {
        "name": getattr(func, "__qualname__", type(func).__name__),
        "module": getattr(func, "__module__", None),
        "file": getattr(code, "co_filename", None),
        "line": getattr(code, "co_firstlineno", None),
    }
