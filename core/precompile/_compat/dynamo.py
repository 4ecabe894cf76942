"""Dynamo's compile, package and guards, as the multi-graph capture uses them: what it
compiles, what it records while compiling (graph breaks, bypassed frames, traced code,
installed globals) and what it checks its variants with."""

from __future__ import annotations

import collections
import contextlib
import copyreg
import pickle
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from precompile._compat.patching import patched
from precompile.runtime.guard_text import user_path

#: Guard types whose checks compare object identities: they cannot survive a process.
UNSERIALIZABLE_GUARD_TYPES = frozenset(
    {
        "ID_MATCH",
        "CLOSURE_MATCH",
        "MODULE_MATCH",
        "FUNCTION_MATCH",
        "BUILTIN_MATCH",
        "DICT_VERSION",
        "NN_MODULE",
        "CLASS_MATCH",
        "WEAKREF_ALIVE",
    }
)


def compares_identity(entry: Any) -> bool:
    """Whether a guard entry checks an object identity, directly or through what Dynamo
    derives from it (a CONSTANT_MATCH on a function's ``__code__`` is an ID_MATCH), so it
    cannot be serialized."""
    derived = getattr(entry, "derived_guard_types", None) or ()
    return entry.guard_type in UNSERIALIZABLE_GUARD_TYPES or any(
        kind in UNSERIALIZABLE_GUARD_TYPES for kind in derived
    )


def duplicate_of(entry: Any) -> str | None:
    """The other access path of a guard that one object is found at two paths
    (``DUPLICATE_INPUT``: Dynamo met the object again at ``entry.name``), in Dynamo's
    naming; None for any other guard."""
    guard = getattr(entry, "orig_guard", None)
    create = getattr(guard, "create_fn", None)
    if getattr(getattr(create, "func", None), "__name__", "") != "DUPLICATE_INPUT":
        return None
    other = (getattr(create, "keywords", None) or {}).get("source_b")
    name = getattr(other, "name", None)
    if callable(name):
        name = name()
    if not isinstance(name, str):
        return None
    from torch._dynamo.guards import strip_local_scope

    # The entry's own name is stripped of the local scope (``L['model'].config`` ->
    # ``model.config``); the other path is named the same way.
    return str(strip_local_scope(name))


#: Guard types the artifact's driver enforces itself: GLOBAL_STATE bundles grad mode
#: (the driver sets the captured one), autocast (disabled while serving), default dtype
#: and deterministic mode (checked per call) with the thread count, which an artifact
#: must not depend on.
DRIVER_ENFORCED_GUARD_TYPES = frozenset({"GLOBAL_STATE"})


def new_package(fn: Callable[..., Any]) -> Any:
    from torch._dynamo.package import CompilePackage

    return CompilePackage(fn)


def recording_traced_code(package: Any, codes: dict[types.CodeType, None]) -> None:
    """Record in ``codes`` every code object Dynamo traced into a graph of ``package``'s
    frames: the frame's own code and every function it inlined (a module's ``forward``,
    helpers, hooks) -- what Dynamo hands the package as the frame's inlined sources."""
    original = package.add_inlined_source

    def add_inlined_source(sources: list[types.CodeType]) -> None:
        for code in sources:
            codes.setdefault(code, None)
        return original(sources)

    package.add_inlined_source = add_inlined_source


def current_package_code(package: Any) -> types.CodeType | None:
    """The code object the package is compiling right now (inside a guard filter)."""
    entry = getattr(package, "_current_entry", None)
    if entry is None:
        return None
    for code, candidate in package._codes.items():
        if candidate is entry:
            return code
    return None


def current_package_module(package: Any) -> str:
    """The module whose globals the frame being compiled runs in (inside a guard filter)."""
    entry = getattr(package, "_current_entry", None)
    return str(getattr(entry, "python_module", "") or "")


def optimize(
    fn: Callable[..., Any],
    backend: Any,
    *,
    package: Any,
    guard_filter_fn: Callable[[list[Any]], list[bool]],
    guard_fail_fn: Callable[[Any], None],
    dynamic: bool | None,
    touched: dict[types.CodeType, bool],
) -> Callable[..., Any]:
    """``fn`` under Dynamo with our package. Every code object the frame evaluator hands
    this capture is recorded in ``touched`` (True when it held no compiled code before:
    what is on it then is the capture's alone), so the capture can remove what it
    compiled when it ends (``forget_compiled``)."""
    from torch._dynamo.eval_frame import OptimizeContext

    context = torch._dynamo.optimize(
        backend,
        package=package,
        guard_filter_fn=guard_filter_fn,
        guard_fail_fn=guard_fail_fn,
        dynamic=dynamic,
    )
    if not isinstance(context, OptimizeContext) or not callable(context.callback):
        # optimize() hands back a do-nothing decorator when Dynamo is switched off.
        raise RuntimeError(
            "precompile: Dynamo is disabled in this process (TORCHDYNAMO_DISABLE=1 or the "
            "enable_dynamo killswitch); a Dynamo capture needs it: unset it, or capture "
            "with tracer=precompile.MakeFxTracer()"
        )
    inner = context.callback

    def callback(frame: Any, cache_entry: Any, *args: Any, **kwargs: Any) -> Any:
        code = frame.f_code
        if code not in touched:
            touched[code] = cache_entry is None and not _precompile_entries(code)
        return inner(frame, cache_entry, *args, **kwargs)

    # Dynamo keys cache entries by the innermost backend: keep it ours.
    callback._torchdynamo_orig_backend = getattr(inner, "_torchdynamo_orig_backend", inner)  # type: ignore[attr-defined]  # Dynamo reads it off the callback function
    context.callback = callback
    return context(fn)


def _precompile_entries(code: types.CodeType) -> list[Any]:
    from torch._C._dynamo.eval_frame import _debug_get_precompile_entries

    return list(_debug_get_precompile_entries(code))


def forget_compiled(touched: dict[types.CodeType, bool]) -> None:
    """Remove what a capture compiled from the code objects it alone compiled (cache
    entries, skip marks, frame state, Dynamo's per-code context), so the process's
    Dynamo state is as the capture found it: a later capture or torch.compile of the
    same function compiles afresh. Code that held someone else's compiled code when the
    capture met it is left alone (Dynamo offers no way to remove one entry)."""
    from torch._C._dynamo.eval_frame import reset_code
    from torch._dynamo import pgo
    from torch._dynamo.code_context import code_context

    for code, alone in touched.items():
        if alone:
            reset_code(code)
            if code_context.has_context(code):
                code_context.pop_context(code)
    ours = {(c.co_filename, c.co_firstlineno, c.co_name) for c, alone in touched.items() if alone}
    # Automatic dynamic: the sizes each frame was compiled for, by CodeId. Left in place,
    # a later capture of the same function with other sizes would come out dynamic --
    # not the artifact a fresh process captures.
    states = pgo._CODE_STATE
    if states:
        for key in [k for k in states if (k.filename, k.firstlineno, k.name) in ours]:
            del states[key]


def dynamo_config(recompile_limit: int) -> Any:
    """Capture-time Dynamo settings: our recompile limit, and the default
    (non-nested) graph breaks, whose continuations the standalone driver understands."""
    return torch._dynamo.config.patch(
        recompile_limit=recompile_limit,
        accumulated_recompile_limit=max(recompile_limit * 4, 256),
        nested_graph_breaks=False,
        caching_precompile=False,
    )


def live_compiles(code: types.CodeType) -> tuple[int, int]:
    """What ``code`` holds in this process: (Dynamo cache entries, as torch.compile
    leaves them; entries an installed artifact put there)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(code)), len(_precompile_entries(code))


def graph_break_link(gb_type: str) -> tuple[str | None, str | None]:
    """Dynamo's graph-break id (e.g. ``GB0124``) and documentation link for a break type."""
    from torch._dynamo.exc import _load_gb_type_to_gb_id_map, get_gbid_documentation_link

    gb_id = _load_gb_type_to_gb_id_map().get(gb_type)
    return gb_id, get_gbid_documentation_link(gb_type)


@contextlib.contextmanager
def recording_graph_breaks() -> Iterator[list[dict[str, Any]]]:
    """Record every graph break Dynamo logs while active: its type, full message, the
    code being translated, and the user stack (FrameSummaries with 3.11 columns)."""
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase

    events: list[dict[str, Any]] = []
    original = InstructionTranslatorBase.log_graph_break

    def log_graph_break(self: Any, code_options: Any, reason: str, exc: Any) -> None:
        if not getattr(exc, "logged", False):
            events.append(
                {
                    "gb_type": getattr(exc, "gb_type", None),
                    "message": str(exc),
                    "reason": reason,
                    "code": self.f_code,
                    "stack": list(getattr(exc, "real_stack", None) or []),
                }
            )
        return original(self, code_options, reason, exc)

    with patched(InstructionTranslatorBase, "log_graph_break", log_graph_break):
        yield events


def reentered_contexts(code: types.CodeType | None) -> frozenset[str]:
    """The locals of a Dynamo continuation that hold a context manager *class* its
    prologue calls to re-enter a ``with`` block the graph break interrupted
    (``torch.no_grad()`` is carried as ``set_grad_enabled`` and called with the
    captured mode): what Dynamo's own resume code passes there, never a value the
    user's code computed. Empty for any other code."""
    from torch._dynamo.resume_execution import ContinueExecutionCache

    if code is None:
        return frozenset()
    meta = ContinueExecutionCache.generated_code_metadata.get(code)
    if meta is None or meta.code not in ContinueExecutionCache.cache:
        return frozenset()
    for key, generated in ContinueExecutionCache.cache[meta.code].items():
        if generated is code and len(key) > 8:
            # lookup(code, lineno, offset, resume_offset, setup_fn_target_offsets,
            # nstack, argnames, argnames_null, setup_fns, handle_inactive_ctx,
            # stack_ctx_vars, argnames_ctx_vars, ...)
            # A ``with`` block active at the break is re-entered by a ReenterWith
            # (setup_fns) on the stack slot holding its class; an inactive one
            # (stack_ctx_vars, argnames_ctx_vars) is rebuilt the same way.
            reenter, stack_ctx, locals_ctx = key[5], key[7], key[8]
            return frozenset(
                [
                    *(f"___stack{f.stack_index}" for f in reenter if hasattr(f, "stack_index")),
                    *(f"___stack{i}" for i, _ in stack_ctx),
                    *(name for name, _ in locals_ctx),
                ]
            )
    return frozenset()


def resumed_code(code: types.CodeType) -> types.CodeType:
    """The user code a Dynamo continuation (resume function) resumes, followed through
    continuations of continuations; ``code`` itself for any other code."""
    from torch._dynamo.resume_execution import ContinueExecutionCache

    seen: set[int] = set()
    while id(code) not in seen:
        seen.add(id(code))
        meta = ContinueExecutionCache.generated_code_metadata.get(code)
        if meta is None:
            break
        code = meta.code
    return code


#: Tensor attributes whose value for a tensor the trace computed (one with no source)
#: depends on the grad mode the trace ran in: Dynamo bakes them as constants, guarded
#: by nothing.
GRAD_DEPENDENT_TENSOR_ATTRS = frozenset({"requires_grad", "grad_fn", "is_leaf"})


@contextlib.contextmanager
def recording_grad_dependent_reads(
    reads: list[str], library_reads: list[str] | None = None, flag_reads: list[str] | None = None
) -> Iterator[None]:
    """Record (as ``what at file:line``) each read of the grad mode the trace made: a
    ``torch.is_grad_enabled()`` call, and each read of a GRAD_DEPENDENT_TENSOR_ATTRS
    attribute of a tensor the trace computed (an input's are checked by its guards; an
    intermediate's were baked from the capture's grad mode). Reads made in torch's own
    code go to ``library_reads``: they pick how to compute (a fast path, whether to
    record autograd), not what, and the artifact evaluates them against the grad mode
    its graphs run under (docs/serving.md, "Grad mode and inference mode"). The user's
    reads of those attributes of a tensor fn was passed (an input, a parameter: its
    guards fix them) go to ``flag_reads``: they make the flags part of what fn computes."""
    from torch._dynamo.variables.builtin import BuiltinVariable
    from torch._dynamo.variables.tensor import TensorVariable
    from torch._dynamo.variables.torch import TorchInGraphFunctionVariable

    from precompile.locations import is_user_file

    def note(tx: Any, what: str) -> None:
        code = getattr(tx, "f_code", None)
        line = getattr(tx, "lineno", None)
        filename = code.co_filename if code is not None else ""
        where = f"{filename.rsplit('/', 1)[-1]}:{line}" if code is not None else "?"
        if is_user_file(filename) or code is None:
            reads.append(f"{what}, at {where}")
        elif library_reads is not None:
            library_reads.append(f"{what}, at {where}")

    original = TensorVariable.var_getattr
    original_call = TorchInGraphFunctionVariable.call_function

    def var_getattr(self: Any, tx: Any, name: str) -> Any:
        if name in GRAD_DEPENDENT_TENSOR_ATTRS:
            source = getattr(self, "source", None)
            if source is None:
                note(tx, f"`.{name}` of a tensor fn computes")
            elif flag_reads is not None:
                code = getattr(tx, "f_code", None)
                if code is None or is_user_file(code.co_filename):
                    where = code.co_filename.rsplit("/", 1)[-1] if code is not None else "?"
                    name_of = user_path(source.name) if hasattr(source, "name") else "a tensor"
                    flag_reads.append(
                        f"`{name_of}.{name}`, at {where}:{getattr(tx, 'lineno', '?')}"
                    )
        return original(self, tx, name)

    def call_function(self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "value", None) is torch.is_grad_enabled:
            note(tx, "torch.is_grad_enabled()")
        return original_call(self, tx, *args, **kwargs)

    def class_read(tx: Any, value: Any, how: str) -> None:
        # The class of a tensor fn was passed, read (isinstance, type()): an
        # nn.Parameter passed where a plain tensor was captured then takes the other
        # branch in eager, so serving must not pass it as a plain stand-in. Any code's
        # read counts (torch's too); a parameter's class is the same at every call.
        source = getattr(value, "source", None)
        if (
            flag_reads is None
            or source is None
            or not isinstance(value, TensorVariable)
            or value.python_type() is torch.nn.Parameter
        ):
            return
        code = getattr(tx, "f_code", None)
        where = code.co_filename.rsplit("/", 1)[-1] if code is not None else "?"
        name_of = user_path(source.name) if hasattr(source, "name") else "a tensor"
        flag_reads.append(
            f"the class of `{name_of}` ({how}), at {where}:{getattr(tx, 'lineno', '?')}"
        )

    original_isinstance = BuiltinVariable.call_isinstance
    original_type = BuiltinVariable.call_type

    def call_isinstance(self: Any, tx: Any, arg: Any, *rest: Any) -> Any:
        # Only a test whose answer a Parameter changes (isinstance(x, torch.Tensor),
        # the common one in library code, holds for both).
        try:
            classes = rest[0].as_python_constant()
            differs = issubclass(torch.nn.Parameter, classes) != issubclass(torch.Tensor, classes)
        except Exception:
            differs = True
        if differs:
            class_read(tx, arg, "isinstance")
        return original_isinstance(self, tx, arg, *rest)

    def call_type(self: Any, tx: Any, obj: Any, *rest: Any) -> Any:
        class_read(tx, obj, "type()")
        return original_type(self, tx, obj, *rest)

    def var_getattr_or_class(self: Any, tx: Any, name: str) -> Any:
        if name == "__class__":
            class_read(tx, self, "__class__")
        return var_getattr(self, tx, name)

    with (
        patched(TensorVariable, "var_getattr", var_getattr_or_class),
        patched(TorchInGraphFunctionVariable, "call_function", call_function),
        patched(BuiltinVariable, "call_isinstance", call_isinstance),
        patched(BuiltinVariable, "call_type", call_type),
    ):
        yield


@contextlib.contextmanager
def recording_compile_only_branches(sites: list[dict[str, Any]]) -> Iterator[None]:
    """Record each "am I being traced?" probe (``torch.compiler.is_compiling()``,
    ``nn.MultiheadAttention``'s ``_is_make_fx_tracing()``, ...) that Dynamo answered
    differently from eager, where the traced code then
    kept the answer (a conditional jump on it, or a store: anything but returning it
    from a helper, which is followed to the helper's caller): ``{"probe", "code", "file", "line", "returned"}``
    -- the function that branched, and the library helpers the answer came through."""
    from torch._dynamo.variables import torch as dynamo_torch

    cls = dynamo_torch.TorchInGraphFunctionVariable
    original = cls.call_function
    answers = dynamo_torch.tracing_state_functions()
    differ = {
        f
        for f, answer in answers.items()
        if answer and f is not torch.compiler.is_exporting  # read from a flag: eager's
    }

    def branch_site(tx: Any) -> tuple[Any, list[str]] | None:
        returned: list[str] = []
        while tx is not None:
            instructions = getattr(tx, "instructions", None)
            at = getattr(tx, "instruction_pointer", None)
            if instructions is None or at is None or at >= len(instructions):
                return None
            op = instructions[at].opname
            while op in ("UNARY_NOT", "NOP", "COPY", "TO_BOOL") and at + 1 < len(instructions):
                at += 1
                op = instructions[at].opname
            if op in ("RETURN_VALUE", "RETURN_CONST"):
                returned.append(tx.f_code.co_qualname)
                tx = getattr(tx, "parent", None)
                continue
            # A jump on it; or kept (stored, combined): it may be branched on later.
            return tx, returned
        return None

    def call_function(self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
        if self.value in differ and not args and not kwargs:
            found = branch_site(tx)
            if found is not None:
                where, returned = found
                code = where.f_code
                name = getattr(self.value, "__qualname__", None) or repr(self.value)
                module = getattr(self.value, "__module__", None) or "?"
                sites.append(
                    {
                        "probe": f"{module}.{name}()",
                        "code": code.co_qualname,
                        "file": code.co_filename,
                        "line": int(getattr(where, "lineno", 0) or 0),
                        "returned": returned,
                    }
                )
        return original(self, tx, args, kwargs)

    with patched(cls, "call_function", call_function):
        yield


@contextlib.contextmanager
def recording_bypasses(reasons: dict[str, str]) -> Iterator[None]:
    """Record why Dynamo left a frame out of the package (frame name -> reason)."""
    from torch._dynamo.output_graph import OutputGraph

    original = OutputGraph.bypass_package

    def bypass_package(self: Any, reason: str = "", **kwargs: Any) -> None:
        code = getattr(getattr(self, "root_tx", None), "f_code", None)
        if code is not None and self.package is not None:
            reasons[code.co_name] = reason
        return original(self, reason, **kwargs)

    with patched(OutputGraph, "bypass_package", bypass_package):
        yield


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
    attribute as the user says it, why]``) for the refusal to say."""
    from torch._dynamo import guards
    from torch._dynamo.output_graph import OutputGraph
    from torch._dynamo.source import AttrSource
    from torch._dynamo.variables import nn_module

    original_init = guards.CheckFunctionManager.__init__

    def reading(original: Callable[..., Any]) -> Callable[..., Any]:
        def var_getattr(self: Any, tx: Any, name: str) -> Any:
            source = getattr(self, "source", None)
            output = getattr(tx, "output", None)
            if name in names and source is not None and output is not None:
                kind = getattr(self, "module_type", None) or type(getattr(self, "value", None))
                output.__dict__.setdefault(_NEUTRAL_READERS, {}).setdefault(
                    (source.name, name), []
                ).append((kind, getattr(tx, "f_code", None)))
            return original(self, tx, name)

        return var_getattr

    def init(self: Any, f_code: Any, output_graph: Any = None, *args: Any, **kwargs: Any) -> None:
        notes: dict[str, str] = {}
        if isinstance(output_graph, OutputGraph):  # a frame just traced, not a load
            kept = output_graph.guards
            for guard in list(kept):
                source = guard.originating_source
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

#: The reduce methods of the builtin dict types: an instance whose type keeps one of them
#: pickles its items as a separate iterator, which can be replaced by the storage order.
_BUILTIN_DICT_REDUCES = frozenset(
    {
        (object.__reduce_ex__, object.__reduce__),
        (collections.OrderedDict.__reduce_ex__, collections.OrderedDict.__reduce__),
        (collections.defaultdict.__reduce_ex__, collections.defaultdict.__reduce__),
    }
)


def storage_order_reduce(value: dict[Any, Any], protocol: int) -> tuple[Any, ...]:
    """How a dict subclass instance is pickled so that it unpickles with its keys in the
    order the dict stores them (``dict.keys``), the order Dynamo's guards compare by
    position. Pickle's default goes through ``items()``: a subclass that overrides it
    (returning the items reversed, say) would unpickle reordered. A type with its own
    ``__reduce__``/``__reduce_ex__`` is rebuilt without them: the unpickled object is only
    the example Dynamo builds the guards from (its type, keys, values and ``__dict__``)."""
    kind = type(value)
    items = iter(list(dict.items(value)))
    if (kind.__reduce_ex__, kind.__reduce__) in _BUILTIN_DICT_REDUCES:
        reduced = value.__reduce_ex__(protocol)
        if isinstance(reduced, tuple) and len(reduced) >= 5 and reduced[4] is not None:
            return (*reduced[:4], items, *reduced[5:])
    state = getattr(value, "__dict__", None) or None
    newobj = copyreg.__newobj__  # type: ignore[attr-defined]  # what pickle saves as NEWOBJ
    return (newobj, (kind,), state, None, items)


@contextlib.contextmanager
def dict_subclasses_pickled_in_storage_order() -> Iterator[None]:
    """While capturing: Dynamo pickles the guards' example values with the values
    themselves, and rebuilds the guards from the unpickled ones at load. A dict subclass
    overriding ``items()`` unpickled in another key order than it had, so the rebuilt
    guards compared its keys by the wrong positions (refusing the captured order and
    serving the other with the captured code). Pickle every dict subclass in its storage
    order instead (``storage_order_reduce``), so the rebuilt guards are live Dynamo's."""
    from torch._dynamo.guards import GuardsStatePickler

    original = GuardsStatePickler.reducer_override

    def reducer_override(self: Any, obj: Any) -> Any:
        reduced = original(self, obj)
        if reduced is NotImplemented and isinstance(obj, dict) and type(obj) is not dict:
            if type(obj) not in (collections.OrderedDict, collections.defaultdict):
                return storage_order_reduce(obj, pickle.DEFAULT_PROTOCOL)
        return reduced

    with patched(GuardsStatePickler, "reducer_override", reducer_override):
        yield


@contextlib.contextmanager
def without_guard_latency_profiling() -> Iterator[None]:
    """While capturing: Dynamo times every new guard set once, for a log line and a
    compile metric, after flushing the CPU caches -- about 50 ms per compiled frame
    variant, a third of a warm editor re-check of a small target. Nothing a capture
    reads or emits depends on it."""
    import torch._dynamo.guards as guards

    with patched(guards, "profile_guard_manager", lambda *args, **kwargs: 0.0):
        yield


@contextlib.contextmanager
def recording_installed_globals(
    installed: dict[types.CodeType, dict[str, Any]],
) -> Iterator[None]:
    """Record every global Dynamo binds into a compiled frame's module while active
    (frame code -> {name: value}): besides compiled subgraphs, resume functions and
    import aliases, which the package records, Dynamo binds helpers its bytecode and
    guards read -- a module it imports under ``___module_<name>_<id>_c<n>`` (e.g. to
    build an ``OrderedDict``), the globals dict of a function it inlined that has no
    module (a namedtuple's ``__new__``) -- and the package records none of them."""
    from torch._dynamo.output_graph import OutputGraph

    original = OutputGraph.install_global_unsafe

    def install_global_unsafe(self: Any, name: str, value: Any) -> None:
        code = getattr(getattr(self, "root_tx", None), "f_code", None)
        if code is not None:
            installed.setdefault(code, {})[name] = value
        return original(self, name, value)

    with patched(OutputGraph, "install_global_unsafe", install_global_unsafe):
        yield


def serialize_code(code: types.CodeType) -> Any:
    from torch._dynamo.package import SerializedCode

    return SerializedCode.from_code_object(code)


def builtins_key_of(guards_state: bytes) -> str | None:
    """The globals key Dynamo minted (from a counter) for the builtins dict a variant's
    guards and bytecode read through."""
    from torch._dynamo.package import load_guards_state

    return load_guards_state(guards_state).output_graph.name_of_builtins_dict_key_in_fglobals


def variant_guard_managers(
    variants: list[tuple[bytes, Any]], code: types.CodeType, scope: dict[str, Any]
) -> list[Any]:
    """Each variant's serialized guards rebuilt as the guard manager an artifact checks
    (``runtime.multigraph_variants.variant_coverage`` chooses among them, as the artifact does)."""
    from torch._dynamo.package import load_guard_manager, load_guards_state

    return [
        load_guard_manager(load_guards_state(guards_state), code, scope)
        for guards_state, _code in variants
    ]


def global_state() -> dict[str, Any]:
    """The global state a Dynamo artifact depends on besides grad mode and autocast."""
    return {
        "default_dtype": str(torch.get_default_dtype()),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
    }


def autocast_enabled() -> bool:
    return bool(torch._C._is_any_autocast_enabled())


def source_path(source: Any) -> str | None:
    """A Dynamo source as the user would say it (``model.buf``, ``x``)."""
    name = getattr(source, "name", None)
    if callable(name):  # a method in some torch versions, a property in 2.13
        name = name()
    return user_path(name) if isinstance(name, str) else None


def placeholder_source_objects(gm: torch.fx.GraphModule) -> list[Any]:
    """Each of a Dynamo subgraph's inputs' source (the key of its tensor guard), or None."""
    return [
        getattr(node.meta.get("grapharg"), "source", None)
        for node in gm.graph.find_nodes(op="placeholder")
    ]


def aliasing_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A Dynamo subgraph as ATen operators, not functionalized (an in-place op stays one,
    a view stays a view), traced on the fake values Dynamo recorded for its inputs: what
    ``graph_layouts`` reads aliasing from (one placeholder per subgraph input)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    fakes = [n.meta["example_value"] for n in gm.graph.find_nodes(op="placeholder")]
    mode = next((f.fake_mode for f in fakes if hasattr(f, "fake_mode")), None)
    with torch._guards.tracing(None), mode or contextlib.nullcontext(), torch.no_grad():
        return make_fx(gm)(*fakes)


def placeholder_sources(gm: torch.fx.GraphModule) -> list[str | None]:
    """Where each of a Dynamo subgraph's inputs came from, as the user would say it
    (``model.buf``, ``x``; ``L['x']`` in Dynamo's words), None where Dynamo recorded no
    source (a value carried across a graph break has one: the stack slot)."""
    return [source_path(source) for source in placeholder_source_objects(gm)]


def int_placeholders(gm: torch.fx.GraphModule) -> list[int]:
    """The positions of a Dynamo subgraph's dynamic integer inputs (a ``SymInt`` where
    the trace saw a Python int argument)."""
    return [
        i
        for i, node in enumerate(gm.graph.find_nodes(op="placeholder"))
        if isinstance(node.meta.get("example_value"), torch.SymInt)
    ]
