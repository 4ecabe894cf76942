"""Guards the multi-graph capture relaxes before Dynamo serializes them, as context
managers over Dynamo's private guard builder: the strides of a tensor whose layout the
traced Python never read (``relaxing_unread_strides``), and value guards on a library
module's attribute the graph shows harmless (``relaxing_neutral_guards``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from precompile._compat.dynamo import source_path
from precompile._compat.patching import patched

#: Tensor methods whose answer Dynamo folds into a constant at trace time and that depends
#: on where the elements lie (strides, offset, storage): a branch on one is a branch on
#: the capture's layout. Any other method whose answer is folded into a value that holds
#: no tensor counts too (Dynamo evaluates an unknown method on the fake tensor and keeps
#: the answer: ``dim_order()``), unless it is one of ``LAYOUT_FREE_METHODS``.
LAYOUT_METHODS = frozenset(
    {
        "stride",
        "is_contiguous",
        "storage_offset",
        "data_ptr",
        "const_data_ptr",
        "untyped_storage",
        "is_non_overlapping_and_dense",
        "is_set_to",
    }
)

#: Tensor methods answered with a value (not a tensor) that no layout changes: the
#: shape, the dtype, the device, autograd's bookkeeping, and the protocol methods whose
#: answer is None or an iterator of tensors (``y[0] = 1``, ``for row in x``). (Element
#: values, ``item()``, ``tolist()``, are data, not layout.)
LAYOUT_FREE_METHODS = frozenset(
    {
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "element_size",
        "is_floating_point",
        "is_complex",
        "is_signed",
        "is_inference",
        "get_device",
        "type",
        "item",
        "tolist",
        "__len__",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "__contains__",
        "__complex__",
        "__setitem__",
        "__delitem__",
        "__iter__",
        "__repr__",
        "__str__",
        "__format__",
        "__hash__",
        "is_same_size",
        "backward",
        "retain_grad",
        "register_hook",
        "register_post_accumulate_grad_hook",
    }
)

_LAYOUT_READS = "_precompile_layout_reads"


def _holds_tensor(value: Any) -> bool:
    """Whether a traced value is (or holds) a tensor: a result computed in the graph,
    not an answer folded at trace time."""
    from torch._dynamo.variables.lists import BaseListVariable
    from torch._dynamo.variables.tensor import TensorVariable
    from torch._dynamo.variables.user_defined import UserDefinedTupleVariable

    if isinstance(value, TensorVariable):
        return True
    if isinstance(value, UserDefinedTupleVariable):  # torch.return_types, namedtuples
        value = getattr(value, "_base_vt", None)
    if isinstance(value, BaseListVariable):
        return any(_holds_tensor(item) for item in value.items)
    return False


@contextlib.contextmanager
def relaxing_unread_strides(
    relax: Callable[[list[str]], dict[Any, str] | None],
    notes_by_state: dict[bytes, list[list[str | None]]],
) -> Iterator[None]:
    """While capturing: record each layout query Dynamo answered for the traced Python
    (a ``LAYOUT_METHODS`` call on any tensor, or another method but the
    ``LAYOUT_FREE_METHODS`` folded into a value that holds no tensor; as ``.stride() at
    file:line``) on the frame being traced; when that frame's guards are built, ``relax(reads)`` decides whether the
    tensors' stride guards go (their sizes, dtype, device and the rest stay): None keeps
    them all, else a dict of the sources whose strides stay, with why; the other
    entries of ``input_source_to_sizes_strides`` become ``None`` strides, what Dynamo's
    TENSOR_MATCH reads as "not checked" (as for a dynamic stride). The serialized guard
    state is written from that table, so the artifact, its Dynamo-free guard program and
    an installed package all check the same. ``notes_by_state`` maps each variant's
    serialized guard state to why its strides stay: ``[path or None (every tensor),
    why]`` (for the refusal's text)."""
    from torch._dynamo import guards
    from torch._dynamo.output_graph import OutputGraph
    from torch._dynamo.variables.tensor import TensorVariable

    original_call = TensorVariable.call_method
    original_init = guards.CheckFunctionManager.__init__

    def record(tx: Any, name: str) -> None:
        code = getattr(tx, "f_code", None)
        line = getattr(tx, "lineno", None)
        where = f"{code.co_filename.rsplit('/', 1)[-1]}:{line}" if code is not None else "?"
        output = getattr(tx, "output", None)
        if output is not None:
            output.__dict__.setdefault(_LAYOUT_READS, []).append(f".{name}() at {where}")

    def call_method(self: Any, tx: Any, name: str, args: Any, kwargs: Any) -> Any:
        if name in LAYOUT_METHODS:
            record(tx, name)  # before the call: also when it breaks the graph
        result = original_call(self, tx, name, args, kwargs)
        if name not in LAYOUT_METHODS | LAYOUT_FREE_METHODS and not _holds_tensor(result):
            record(tx, name)
        return result

    def init(self: Any, f_code: Any, output_graph: Any = None, *args: Any, **kwargs: Any) -> None:
        notes: list[list[str | None]] | None = None
        if isinstance(output_graph, OutputGraph):  # a frame just traced, not a load
            reads = list(dict.fromkeys(output_graph.__dict__.get(_LAYOUT_READS, ())))
            kept = relax(reads)
            notes = (
                [
                    [
                        None,
                        f"the traced code reads memory layout ({reads[0]}), so eager may take "
                        f"another branch on this layout",
                    ]
                ]
                if reads
                else []
            )
            if kept is not None:
                table = output_graph.input_source_to_sizes_strides
                for source, meta in list(table.items()):
                    if source in kept:
                        notes.append([source_path(source), kept[source]])
                    elif "stride" in meta:
                        table[source] = {**meta, "stride": [None] * len(meta["stride"])}
        original_init(self, f_code, output_graph, *args, **kwargs)
        state = getattr(self, "guards_state", None)
        if notes is not None and state is not None:
            notes_by_state[state] = notes

    with (
        patched(TensorVariable, "call_method", call_method),
        patched(guards.CheckFunctionManager, "__init__", init),
    ):
        yield


#: The guards Dynamo puts on a constant's value (and its type, for ``EQUALS_MATCH``).
_VALUE_GUARDS = frozenset({"CONSTANT_MATCH", "EQUALS_MATCH", "TYPE_MATCH", "ID_MATCH"})


@contextlib.contextmanager
def relaxing_neutral_guards(
    names: frozenset[str],
    prove: Callable[[Any, str, str, list[tuple[type, Any]]], str | None],
    notes_by_state: dict[bytes, list[list[str | None]]],
    under_training: Callable[[Any, str, Any], bool] | None = None,
    truth_types: frozenset[type] = frozenset(),
    relaxed: list[tuple[Any, str, bool]] | None = None,
    forwarded: Callable[[type, Any, str, list[Any]], list[str]] | None = None,
) -> Iterator[None]:
    """While capturing: when a frame's guards are built, each guard on a constant
    attribute of a module named in ``names`` (``L['model']._modules['act'].inplace``,
    Dynamo's ``CONSTANT_MATCH``, ``EQUALS_MATCH`` and the type guard beside it)
    goes where ``prove(graph, module source, name, readers)`` returns None; ``readers``
    are the (module class, code) of every traced read of it, noted as Dynamo reads a
    module's attribute (other code than the library's forward may branch on it) goes where ``prove(graph, module source, name)``
    returns None -- the frame's graph shows that other values of it compute the same
    values (``capturing.neutral_reads``) -- so the serialized guard state, the
    Dynamo-free guard program and an installed package all accept them. The other
    guards stay as Dynamo built them, and why they stay is added to the variant's
    notes (``notes_by_state``, as ``relaxing_unread_strides`` keeps them: ``[the
    attribute as the user says it, why]``) for the refusal to say.

    A value guard on any other module attribute goes too where every traced read of it
    was made, on a module in eval, by code that ``under_training(code, name, position)``
    shows reads it there (the read's source position) only as ``x.name and x.training`` (a flag that decides nothing in eval:
    ``neutral_reads.read_only_under_training``); a guard that the module's ``training``
    is still False takes its place, so a call in training is refused. Eager still runs
    the flag's truth test first: the flag must have held a value of a ``truth_types``
    type at every read (or be absent: ``getattr(x, "name", default)``), and each flag
    relaxed is appended to ``relaxed`` as (the module object, the name, whether every
    read found it: one that did is read plainly, or by a ``getattr`` with a default that
    no read proved, so its deletion later is refused, as eager may raise): the capture
    records it, and the artifact's per-call module check keeps the kind of its truth
    test checked (``value_fingerprints.truth_kind``, as make_fx does: another type's
    truth test may store, raise or be ambiguous). No Dynamo guard kind can do it: a
    type guard accepts one type only, and none checks what ``getattr`` with a default
    finds. A flag of another type at capture, or with no ``relaxed`` to record it in,
    keeps its guards.

    A read made by a property's getter that only returns the attribute
    (``def flag(self): return self.mode``) counts as made under training where
    ``forwarded(module class, getter code, name, the codes Dynamo traced)`` names the
    properties it stands for and every read of each of them on that module was (the
    capture side decides what else may call the getter: ``neutral_reads.forwarded_truth``)."""
    from torch._dynamo import guards
    from torch._dynamo.guards import GuardBuilder
    from torch._dynamo.output_graph import OutputGraph
    from torch._dynamo.source import (
        AttrSource,
        DictGetItemSource,
        GetItemSource,
        TypeDictSource,
        TypeMROSource,
        TypeSource,
    )
    from torch._dynamo.variables import nn_module

    original_init = guards.CheckFunctionManager.__init__

    def _flag_guarded(guard: Any) -> tuple[Any, str] | None:
        """(module source, attribute) of a guard on what reading an attribute of a
        module saw: its value on the instance (``M.name``, a value guard), its absence
        from the instance's ``__dict__`` or from the instance (``getattr(M, "name",
        default)``), and its value on a class of the MRO
        (``dict(type(M).__mro__[i].__dict__)['name']``, or ``dict(type(M).__dict__)``
        for the module's own class) when the class holds it."""
        source = guard.originating_source
        kind = guard.create_fn_name()
        if isinstance(source, AttrSource) and kind in _VALUE_GUARDS:
            return source.base, source.member
        if kind in ("NOT_PRESENT_IN_GENERIC_DICT", "HASATTR"):
            attr = getattr(guard.create_fn, "keywords", {}).get("attr")
            return (source, attr) if isinstance(attr, str) else None
        if isinstance(source, DictGetItemSource) and kind in _VALUE_GUARDS:
            # dict(type(M).__mro__[i].__dict__)['name'], or dict(type(M).__dict__)['name']
            # where the module's own class holds it.
            chain = source.base
            if not isinstance(chain, TypeDictSource):
                return None
            chain = chain.base
            if isinstance(chain, GetItemSource) and isinstance(chain.base, TypeMROSource):
                chain = chain.base.base
            if not isinstance(chain, TypeSource):
                return None
            return (chain.base, source.index) if isinstance(source.index, str) else None
        return None

    def _covered(output_graph: Any, guard: Any, module: Any, name: str) -> list[Any]:
        """The module sources whose reads of ``name`` the flag guard ``guard`` (on
        ``module``) answers for: ``module``'s own, and for a guard on a class's value
        (``dict(type(M).__dict__)['name']``) every module's that read ``name``: Dynamo
        reads a class attribute once per class and answers every other instance's read
        of it from that one guarded value (another instance, in training, may branch on
        it), so the guard stands for all of them."""
        if not isinstance(guard.originating_source, DictGetItemSource):
            return [module]
        sources = output_graph.__dict__.get(_FLAG_SOURCES, {})
        return [module] + [
            sources[key] for key in sources if key[1] == name and key[0] != module.name
        ]

    def _training_only(output_graph: Any, module: Any, name: str, depth: int = 0) -> bool:
        """Whether every traced read of ``module``'s attribute ``name`` was a flag read
        only under ``training`` on a module in eval, holding a value whose truth test
        is pure (``truth_types``) or absent; or a read by the getter of properties
        whose every read was (``forwarded``; the property itself holds a ``property``:
        its truth test is the attribute's, whose value is the one checked)."""
        if under_training is None or depth > 4:
            return False
        readers = output_graph.__dict__.get(_FLAG_READERS, {}).get((module.name, name), [])

        def proved(code: Any, at: Any) -> bool:
            if under_training(code, name, at):
                return True
            owner = _flag_module(output_graph, module, name)
            props = (
                forwarded(type(owner), code, name, list(getattr(output_graph, "traced_code", ())))
                if forwarded is not None and owner is not None
                else []
            )
            return bool(props) and all(
                _training_only(output_graph, module, p, depth + 1) for p in props
            )

        return bool(readers) and all(
            training is False
            and code is not None
            and (held is None or held in truth_types or (depth and held is property))
            and proved(code, at)
            for code, at, training, held in readers
        )

    def _always_held(output_graph: Any, module: Any, name: str) -> bool:
        """Whether every traced read of ``module.name`` found it (none was absent)."""
        readers = output_graph.__dict__.get(_FLAG_READERS, {}).get((module.name, name), [])
        return all(held is not None for *_rest, held in readers)

    def _flag_module(output_graph: Any, module: Any, name: str) -> Any:
        """The module object the traced reads of ``module.name`` were made on."""
        return output_graph.__dict__.get(_FLAG_MODULES, {}).get((module.name, name))

    def reading(original: Callable[..., Any]) -> Callable[..., Any]:
        def var_getattr(self: Any, tx: Any, name: str) -> Any:
            source = getattr(self, "source", None)
            output = getattr(tx, "output", None)
            if name in names and source is not None and output is not None:
                kind = getattr(self, "module_type", None) or type(getattr(self, "value", None))
                output.__dict__.setdefault(_NEUTRAL_READERS, {}).setdefault(
                    (source.name, name), []
                ).append((kind, getattr(tx, "f_code", None)))
            if under_training is not None and source is not None and output is not None:
                module = getattr(self, "value", None)
                output.__dict__.setdefault(_FLAG_READERS, {}).setdefault(
                    (source.name, name), []
                ).append(
                    (
                        getattr(tx, "f_code", None),
                        getattr(getattr(tx, "current_instruction", None), "positions", None),
                        getattr(module, "training", None),
                        _held(module, name),
                    )
                )
                output.__dict__.setdefault(_FLAG_MODULES, {})[source.name, name] = module
                output.__dict__.setdefault(_FLAG_SOURCES, {})[source.name, name] = source
            return original(self, tx, name)

        return var_getattr

    def init(self: Any, f_code: Any, output_graph: Any = None, *args: Any, **kwargs: Any) -> None:
        notes: dict[str, str] = {}
        if isinstance(output_graph, OutputGraph):  # a frame just traced, not a load
            kept = output_graph.guards
            for guard in list(kept):
                source = guard.originating_source
                flag = _flag_guarded(guard)
                covered = [] if flag is None else _covered(output_graph, guard, *flag)
                if (
                    flag is not None
                    and flag[1] not in names
                    and relaxed is not None
                    and all(_flag_module(output_graph, m, flag[1]) is not None for m in covered)
                    and all(_training_only(output_graph, m, flag[1]) for m in covered)
                ):
                    kept.inner.discard(guard)
                    kept.source_to_guards[source].remove(guard)
                    for module in covered:
                        training = AttrSource(module, "training")
                        if not kept.source_to_guards.get(training):
                            kept.add(training.make_guard(GuardBuilder.CONSTANT_MATCH))
                        relaxed.append(
                            (
                                _flag_module(output_graph, module, flag[1]),
                                flag[1],
                                _always_held(output_graph, module, flag[1]),
                            )
                        )
                    continue
                if not (
                    isinstance(source, AttrSource)
                    and source.member in names
                    and guard.create_fn_name() in _VALUE_GUARDS
                ):
                    continue
                readers = output_graph.__dict__.get(_NEUTRAL_READERS, {}).get(
                    (source.base.name, source.member), []
                )
                why = prove(output_graph.graph, source.base.name, source.member, readers)
                if why is None:
                    kept.inner.discard(guard)
                    kept.source_to_guards[source].remove(guard)
                else:
                    notes[source_path(source) or source.member] = why
        original_init(self, f_code, output_graph, *args, **kwargs)
        state = getattr(self, "guards_state", None)
        if notes and state is not None:
            notes_by_state.setdefault(state, []).extend([p, w] for p, w in notes.items())

    with (
        patched(guards.CheckFunctionManager, "__init__", init),
        patched(
            nn_module.NNModuleVariable,
            "var_getattr",
            reading(nn_module.NNModuleVariable.var_getattr),
        ),
        patched(
            nn_module.UnspecializedNNModuleVariable,
            "var_getattr",
            reading(nn_module.UnspecializedNNModuleVariable.var_getattr),
        ),
    ):
        yield


_NEUTRAL_READERS = "_precompile_neutral_readers"
_FLAG_READERS = "_precompile_flag_readers"
_FLAG_MODULES = "_precompile_flag_modules"
_FLAG_SOURCES = "_precompile_flag_sources"


def _held(module: Any, name: str) -> type | None:
    """The type of what reading ``module.name`` finds, looked up without running code:
    the instance's ``__dict__``, its parameters, buffers and children, then the
    classes of its MRO (a property is a ``property``); None where it is absent."""
    state = getattr(module, "__dict__", {})
    if name in state:
        return type(state[name])
    for table in ("_parameters", "_buffers", "_modules"):
        if name in state.get(table, ()):
            return type(state[table][name])
    for cls in type(module).__mro__:
        if name in vars(cls):
            return type(vars(cls)[name])
    return None
