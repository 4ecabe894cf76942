"""What the multi-graph capture records while Dynamo compiles, as context managers over
Dynamo's private compile machinery: the graph breaks it took, the reads of grad-dependent
tensor attributes and of the grad mode it baked, the branches it took only because it
was compiling, the frames it bypassed, the globals it installed, and the stores its
bytecode replays."""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Iterator
from typing import Any

import torch

from precompile._compat.patching import patched
from precompile.runtime.guard_text import user_path


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
        patched_builtin_handler(isinstance, call_isinstance),
        patched_builtin_handler(type, call_type),
    ):
        yield


#: Standard-library modules whose globals hold state a process changes as it runs:
#: ``os.environ`` (``os.getenv``, and getpass's ``os``), ``tempfile.tempdir``. Dynamo
#: skips every guard on a global a standard-library function reads ("users don't
#: mutate a stdlib attribute"): ``os.getenv("X")``, ``getpass.getuser()`` and
#: ``tempfile.gettempdir()``, inlined, were guarded by nothing, and served the capture's
#: answer in any process. Not every module: guarding all of them puts guards on what
#: torch's own code reads through the standard library, which the artifact's guard
#: records do not name (logging's level names are such a case, still open).
MUTABLE_STDLIB_MODULES = frozenset({"os", "getpass", "tempfile"})


@contextlib.contextmanager
def guarding_mutable_stdlib_globals() -> Iterator[None]:
    """Dynamo guards what the functions of ``MUTABLE_STDLIB_MODULES`` read from their
    module's globals, as it guards what user code reads."""
    from torch._dynamo import symbolic_convert

    original = symbolic_convert.is_stdlib

    def is_stdlib(module: object) -> bool:
        name = getattr(module, "__name__", "")
        return bool(original(module)) and name not in MUTABLE_STDLIB_MODULES

    with patched(symbolic_convert, "is_stdlib", is_stdlib):
        yield


@contextlib.contextmanager
def guarding_module_attribute_lookups() -> Iterator[None]:
    """A module's attribute looked up and not found (``getattr(cfgmod, "K", d)``), or
    asked for (``hasattr(cfgmod, "K")``), is guarded as ``hasattr`` is on an object. In
    torch 2.13 Dynamo guarded neither on a module: a process that later bound ``K`` was
    served the branch of its absence (and one that deleted it, of its presence)."""
    from torch._dynamo.guards import GuardBuilder, install_guard
    from torch._dynamo.variables.misc import PythonModuleVariable

    original_hasattr = PythonModuleVariable.call_obj_hasattr
    original_getattr = PythonModuleVariable.var_getattr

    def guard(self: Any, name: str) -> None:
        if self.source is not None and not getattr(self, "is_torch", False):
            install_guard(
                self.source.make_guard(functools.partial(GuardBuilder.HASATTR, attr=name))
            )

    def call_obj_hasattr(self: Any, tx: Any, name: str) -> Any:
        guard(self, name)
        return original_hasattr(self, tx, name)

    def var_getattr(self: Any, tx: Any, name: str) -> Any:
        if name not in self.value.__dict__:
            guard(self, name)
        return original_getattr(self, tx, name)

    with (
        patched(PythonModuleVariable, "call_obj_hasattr", call_obj_hasattr),
        patched(PythonModuleVariable, "var_getattr", var_getattr),
    ):
        yield


@contextlib.contextmanager
def recording_process_hashes(sites: list[str]) -> Iterator[None]:
    """Record (``hash() of 'text' at FILE:LINE``) each call project code makes whose answer
    Dynamo folds into a constant guarded by nothing, though another process computes
    another: ``hash()`` of a constant holding a string or bytes (Python seeds their
    hashes per process), ``hash()`` of an object hashed by its address, and ``id()``
    (``fx_process_state.process_sources``, make_fx's side)."""
    from torch._dynamo.variables.builtin import BuiltinVariable

    from precompile.locations import is_project_file

    original_hash, original_id = BuiltinVariable.call_hash, BuiltinVariable.call_id

    def seeded(value: Any) -> bool:
        if isinstance(value, (str, bytes)):
            return True
        return isinstance(value, (tuple, frozenset)) and any(seeded(v) for v in value)

    def per_process(arg: Any) -> str | None:
        if arg.is_python_constant():
            value = arg.as_python_constant()
            return f"of {value!r:.40}" if seeded(value) else None
        try:
            kind = arg.python_type()
        except Exception:
            return None
        return f"of a {kind.__name__}" if kind.__hash__ is object.__hash__ else None

    def note(tx: Any, what: str) -> None:
        code = getattr(tx, "f_code", None)
        if code is not None and is_project_file(code.co_filename):
            sites.append(f"{what} at {code.co_filename}:{getattr(tx, 'lineno', '?')}")

    def call_hash(self: Any, tx: Any, arg: Any, *rest: Any) -> Any:
        what = per_process(arg)
        if what is not None:
            note(tx, f"hash() {what}")
        return original_hash(self, tx, arg, *rest)

    def call_id(self: Any, tx: Any, *args: Any) -> Any:
        note(tx, "id()")
        return original_id(self, tx, *args)

    with patched_builtin_handler(hash, call_hash), patched_builtin_handler(id, call_id):
        yield


#: Process settings Dynamo folds into constants with no guard, asked with no argument:
#: (module, name). ``torch.distributed.is_initialized()`` captured in one process and
#: served under a process group answered as traced.
FOLDED_SETTINGS = (("torch.distributed", "is_initialized"),)


@contextlib.contextmanager
def recording_folded_settings(reads: dict[tuple[str, str], str]) -> Iterator[None]:
    """Record each ``FOLDED_SETTINGS`` call project code makes, with ``FILE:LINE``: the
    artifact re-reads and compares it per call (``PROCESS_STATE``), as make_fx's does."""
    import importlib

    from torch._dynamo.variables.torch import TorchInGraphFunctionVariable

    from precompile.locations import is_project_file

    folded: dict[int, tuple[str, str]] = {}
    for module, name in FOLDED_SETTINGS:
        with contextlib.suppress(ImportError, AttributeError):
            folded[id(getattr(importlib.import_module(module), name))] = (module, name)
    original = TorchInGraphFunctionVariable.call_function

    def call_function(self: Any, tx: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        read = folded.get(id(getattr(self, "value", None)))
        code = getattr(tx, "f_code", None)
        asked = read is not None and not args and not kwargs
        if asked and code is not None and is_project_file(code.co_filename):
            assert read is not None
            reads.setdefault(read, f"{code.co_filename}:{getattr(tx, 'lineno', '?')}")
        return original(self, tx, args, kwargs)

    with patched(TorchInGraphFunctionVariable, "call_function", call_function):
        yield


@contextlib.contextmanager
def guarding_what_fn_asks(
    hash_sites: list[str], settings: dict[tuple[str, str], str]
) -> Iterator[None]:
    """While capturing: the guards torch 2.13's Dynamo leaves out on what fn asks of the
    process and of modules (``guarding_mutable_stdlib_globals``,
    ``guarding_module_attribute_lookups``), the hashes and addresses it folds
    unguarded, recorded to refuse (``recording_process_hashes``), and the settings it
    folds, recorded to check per call (``recording_folded_settings``)."""
    with (
        recording_process_hashes(hash_sites),
        recording_folded_settings(settings),
        guarding_mutable_stdlib_globals(),
        guarding_module_attribute_lookups(),
    ):
        yield


@contextlib.contextmanager
def patched_builtin_handler(builtin: Any, value: Any) -> Iterator[None]:
    """``BuiltinVariable.call_<builtin>`` is ``value`` inside the block, and Dynamo calls
    it there. Patching the method alone is not enough: Dynamo binds it once per
    (builtin, argument types) into a process-wide handler cache
    (``BuiltinVariable.call_function_handler_cache``) at its first use and never looks
    it up again, so a handler made before the block -- torch's own method, bound by
    any earlier compile, or an earlier capture's recorder, appending to that capture's
    lists -- would run instead of ``value``, and the capture would miss what it records
    depending on what ran before in the process (a class read unrecorded: a Parameter
    input served the plain tensor's branch). The builtin's cached handlers are dropped
    on entry, so they are rebound to ``value``, and on exit, so no later compile runs
    this capture's recorder."""
    from torch._dynamo.variables.builtin import BuiltinVariable

    def drop() -> None:
        cache = getattr(BuiltinVariable, "call_function_handler_cache", {})
        for key in [k for k in list(cache) if k and k[0] is builtin]:
            cache.pop(key, None)

    drop()
    try:
        with patched(BuiltinVariable, f"call_{builtin.__name__}", value):
            yield
    finally:
        drop()


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


@contextlib.contextmanager
def recording_replayed_stores(stores: list[dict[str, Any]]) -> Iterator[None]:
    """Record every store Dynamo replays in a compiled frame's bytecode after its graph
    (a list, dict, cell or object attribute the traced code changed, which the bytecode
    writes again through the object's source): the frame's code, the target's source
    name, and the kind of object. Dynamo reaches an existing object only through its
    source, so where that source goes is where the served call writes."""
    from torch._dynamo.side_effects import SideEffects

    original = SideEffects.codegen_update_mutated

    def codegen_update_mutated(self: Any, cg: Any, *args: Any, **kwargs: Any) -> Any:
        code = getattr(getattr(cg, "tx", None), "f_code", None)
        for var in self._get_modified_vars():
            try:
                name = getattr(getattr(var, "source", None), "name", None)
                name = name() if callable(name) else name  # a property in torch 2.13
            except NotImplementedError:
                continue  # a new object's temporary (TempLocalSource) has no name
            if isinstance(name, str):
                stores.append({"code": code, "source": name, "kind": type(var).__name__})
        return original(self, cg, *args, **kwargs)

    with patched(SideEffects, "codegen_update_mutated", codegen_update_mutated):
        yield
