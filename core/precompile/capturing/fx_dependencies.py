"""What a single-graph trace depended on besides its tensors, recorded for the artifact.

make_fx runs the user's Python once and keeps only tensor operations, so every plain
value that Python read is baked in: a module's type and attributes (``eps``, a user's
``self.scale``), module-level values the traced functions read, the hooks around each
module call. This module watches the trace (which code ran, which globals it read) and
records fingerprints of that state (``precompile.runtime.state_checks``), which the artifact
recomputes from the live objects to refuse a call whose state differs.

Which attributes count as read is decided by name: an attribute of a module (or of an
object a module or global holds) is recorded when its name is one the traced code loads
(``co_names`` and string constants of every user function and every ``torch.nn``
function that ran). That over-approximates what was read -- a change to an attribute of
the same name that the trace did not read is refused too -- and it misses an attribute
read under a computed name (``getattr(self, f"w{i}")``).
"""

from __future__ import annotations

import _collections_abc
import builtins
import contextlib
import dataclasses
import os
import random
import sys
import types
from collections.abc import Iterator
from typing import Any, Literal

import torch

from precompile._compat import patching, tracing
from precompile._compat.prelude import global_module_hooks
from precompile.capturing import fx_process_state, library_surface, neutral_reads
from precompile.capturing.bytecode_names import builtin_loads, global_loads, global_names
from precompile.errors import PrecompileError
from precompile.locations import is_project_file, is_user_file
from precompile.runtime import state_checks

#: The events sys.setprofile hands a profile function.
ProfileEvent = Literal["call", "return", "c_call", "c_return", "c_exception"]

#: torch.is_grad_enabled and torch.is_inference_mode_enabled (torch._C's builtins): a
#: profile hook sees their calls.
_IS_GRAD_ENABLED = torch.is_grad_enabled
_IS_INFERENCE_MODE_ENABLED = torch.is_inference_mode_enabled
#: Reads of the process environment: what a call of each code object reads.
_ENVIRON_CODES = {
    os._Environ.__getitem__.__code__: "os.environ",
    os._Environ.__iter__.__code__: "os.environ",
    os.getenv.__code__: "os.getenv()",
}
#: As code objects name their files (os and _collections_abc are frozen modules).
_RANDOM_FILE = random.Random.uniform.__code__.co_filename
#: The random module's C-level draws (its other functions are Python code in random.py,
#: seen as calls). Compared by identity: Dynamo, tracing torch.cond's branches, traces
#: this hook too, and handles nothing fancier here.
_RANDOM_RANDOM = random.random
_RANDOM_GETRANDBITS = random.getrandbits
#: torch's reseeds of its default generator (Python code in torch/random.py), and the
#: methods of a ``torch.Generator`` that reseed it (C calls): the graph keeps the draws
#: that follow and drops the reseed.
_TORCH_RESEED_CODES = {
    torch.random.manual_seed.__code__: "torch.manual_seed()",
    torch.random.seed.__code__: "torch.seed()",
    torch.random.set_rng_state.__code__: "torch.set_rng_state()",
}
_GENERATOR_RESEEDS = frozenset({"manual_seed", "seed", "set_state", "set_offset"})
#: What stands between a user's reseed and the reseed: torch/random.py, and the
#: wrappers of ``torch._disable_dynamo`` that torch.manual_seed is decorated with.
_RESEED_WRAPPERS = (
    torch.random.manual_seed.__code__.co_filename,
    os.path.join(os.path.dirname(torch.__file__), "_compile.py"),
    os.path.join(os.path.dirname(torch.__file__), "_dynamo", "eval_frame.py"),
)
#: Library frames between a user's read and the code that reads.
_READ_WRAPPERS = (
    os.getenv.__code__.co_filename,
    _collections_abc.Mapping.get.__code__.co_filename,
    _RANDOM_FILE,
)
_TORCH_DIR = os.path.realpath(os.path.dirname(torch.__file__)) + os.sep
#: torch code whose attribute reads on modules count (a LayerNorm reads ``self.eps``).
_TORCH_MODULE_CODE = tuple(_TORCH_DIR + d + os.sep for d in ("nn", os.path.join("ao", "nn")))


class _Everything:
    """A name set that holds every name: fingerprints everything an object has."""

    def __contains__(self, name: object) -> bool:
        return True


@dataclasses.dataclass
class CallLog:
    """What ran during a trace: every code object, and the globals of each user one."""

    codes: set[types.CodeType] = dataclasses.field(default_factory=set)
    scopes: dict[types.CodeType, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: Process state user code read that no graph input carries: kind ->
    #: "what at FILE:LINE" (the first read).
    reads: dict[str, str] = dataclasses.field(default_factory=dict)
    #: torch settings user code read (``fx_process_state``) -> "FILE:LINE" of the first.
    state: dict[fx_process_state.StateRead, str] = dataclasses.field(default_factory=dict)
    #: Reads capture refuses: a probe that was true in the trace, a torch.backends
    #: query an artifact cannot repeat -> "FILE:LINE".
    refused: dict[str, str] = dataclasses.field(default_factory=dict)
    #: The library surface eager code went through (``precompile.capturing.library_surface``):
    #: builtins it called (by id), the names of Tensor methods it called, and the
    #: functions it entered (their code).
    called: dict[int, Any] = dataclasses.field(default_factory=dict)
    tensor_methods: set[str] = dataclasses.field(default_factory=set)
    entered: set[types.CodeType] = dataclasses.field(default_factory=set)

    def project_codes(self) -> list[types.CodeType]:
        return sorted(
            (c for c in self.codes if is_project_file(c.co_filename)),
            key=lambda c: (c.co_filename, c.co_firstlineno),
        )


def _past(frame: types.FrameType | None, files: tuple[str, ...]) -> types.FrameType | None:
    """The first frame at or above ``frame`` whose code is not in ``files``."""
    while frame is not None and frame.f_code.co_filename in files:
        frame = frame.f_back
    return frame


@contextlib.contextmanager
def recording_calls() -> Iterator[CallLog]:
    """Every function entered on this thread while active (a profile hook that chains
    to any profiler already installed), with the module globals of the user ones."""
    log = CallLog()
    previous = sys.getprofile()
    codes, scopes, reads = log.codes, log.scopes, log.reads
    state, refused = log.state, log.refused
    tables = fx_process_state.tables()
    getter_codes, probe_codes = tables.getter_codes, tables.probe_codes
    getter_builtins, backends_dir = tables.getter_builtins, tables.backends_dir
    called, tensor_methods, entered = log.called, log.tensor_methods, log.entered
    eager_file = library_surface.is_eager_file
    tensor_type, module_type = torch.Tensor, types.ModuleType
    importing: list[types.FrameType] = []  # the import machinery's outermost frame

    def note(kind: str, what: str, frame: types.FrameType | None) -> None:
        # Attributed to the first frame outside the library code that does the read.
        while frame is not None and frame.f_code.co_filename in _READ_WRAPPERS:
            frame = frame.f_back
        # Project code only: installed libraries (sympy, under torch's shape
        # reasoning) draw and read for their own bookkeeping.
        if frame is not None and is_project_file(frame.f_code.co_filename):
            reads[kind] = f"{what} at {frame.f_code.co_filename}:{frame.f_lineno}"

    def hook(frame: types.FrameType, event: ProfileEvent, arg: object) -> object:
        code = frame.f_code
        if importing:
            pass
        elif event == "call" and code in _ENVIRON_CODES and "environ" not in reads:
            note("environ", _ENVIRON_CODES[code], frame.f_back)
        elif event == "call" and code.co_filename == _RANDOM_FILE and "random" not in reads:
            note("random", f"random.{code.co_name}()", frame.f_back)
        elif event == "c_call" and (arg is _RANDOM_RANDOM or arg is _RANDOM_GETRANDBITS):
            if "random" not in reads:
                note("random", f"random.{getattr(arg, '__name__', '?')}()", frame)
        elif event == "call" and code in _TORCH_RESEED_CODES and "reseed" not in reads:
            note("reseed", _TORCH_RESEED_CODES[code], _past(frame.f_back, _RESEED_WRAPPERS))
        elif (
            event == "c_call"
            and "reseed" not in reads
            and type(getattr(arg, "__self__", None)) is torch.Generator
            and getattr(arg, "__name__", "") in _GENERATOR_RESEEDS
        ):
            what = f"torch.Generator.{getattr(arg, '__name__', '?')}()"
            note("reseed", what, _past(frame, _RESEED_WRAPPERS))
        if importing:
            # An import during the trace (a lazy one in torch, say) runs the import
            # system's hooks (pytest's rewriter, editable-install finders): what the
            # trace read does not depend on them, and the artifact must not either.
            if event == "return" and frame is importing[0]:
                importing.clear()
        elif event == "call" and code.co_filename.startswith("<frozen importlib"):
            importing.append(frame)
        elif event == "call" and code not in codes:
            codes.add(code)
            scopes[code] = frame.f_globals
        elif event == "c_call" and arg is _IS_GRAD_ENABLED and "grad_mode" not in reads:
            if is_user_file(code.co_filename):
                reads["grad_mode"] = (
                    f"torch.is_grad_enabled() at {code.co_filename}:{frame.f_lineno}"
                )
        elif event == "c_call" and arg is _IS_INFERENCE_MODE_ENABLED:
            if "inference_mode" not in reads and is_user_file(code.co_filename):
                reads["inference_mode"] = (
                    f"torch.is_inference_mode_enabled() at {code.co_filename}:{frame.f_lineno}"
                )
        if importing:
            pass
        elif event == "call" and code in getter_codes:
            site = fx_process_state.read_site(frame.f_back)
            if site:
                state.setdefault(getter_codes[code], site)
        elif event == "call" and code.co_filename.startswith(backends_dir):
            site = fx_process_state.read_site(frame.f_back)
            read = fx_process_state.backends_read(frame) if site else None
            if isinstance(read, fx_process_state.StateRead):
                state.setdefault(read, str(site))
            elif read:
                refused.setdefault(read, str(site))
        elif event == "c_call" and id(arg) in getter_builtins:
            getter, read = getter_builtins[id(arg)]
            site = fx_process_state.read_site(frame) if arg is getter else None
            if site:
                state.setdefault(read, site)
        elif event == "return" and code in probe_codes and arg is True:
            site = fx_process_state.read_site(frame.f_back)
            if site:
                refused.setdefault(probe_codes[code], site)
        if importing:
            pass
        elif event == "c_call" and eager_file(code.co_filename):
            # A builtin eager code called (``torch.relu``, ``x.softmax``): where it was
            # resolved from is recorded after the trace (``library_surface``).
            held = getattr(arg, "__self__", None)
            if isinstance(held, tensor_type):
                tensor_methods.add(getattr(arg, "__name__", ""))
            elif held is None or isinstance(held, (type, module_type)):
                called.setdefault(id(arg), arg)
        elif event == "call" and frame.f_back is not None:
            if eager_file(frame.f_back.f_code.co_filename):
                entered.add(code)
        if previous is not None:
            return previous(frame, event, arg)
        return None

    sys.setprofile(hook)
    try:
        yield log
    finally:
        sys.setprofile(previous)


#: ``nn.Module.__getattr__`` reads ``self.__dict__`` to find a parameter, buffer or
#: child: that read is the lookup's own, not a read of the whole instance dict.
_MODULE_GETATTR_CODE = torch.nn.Module.__getattr__.__code__


#: Nonzero while the capture's own machinery touches the modules (swapping the traced
#: tensors in and out): those reads are not the traced code's.
_PAUSED = [0]


@contextlib.contextmanager
def unrecorded(manager: Any) -> Iterator[Any]:
    """Enter and exit ``manager`` without recording its module reads (the body's are
    recorded): how the capture swaps fake tensors into the model (which reads each
    module's ``_parameters`` and ``_buffers``) is not what the traced code read."""
    _PAUSED[0] += 1
    try:
        value = manager.__enter__()
    finally:
        _PAUSED[0] -= 1
    try:
        yield value
    except BaseException:
        _PAUSED[0] += 1
        try:
            if not manager.__exit__(*sys.exc_info()):
                raise
        finally:
            _PAUSED[0] -= 1
    else:
        _PAUSED[0] += 1
        try:
            manager.__exit__(None, None, None)
        finally:
            _PAUSED[0] -= 1


@contextlib.contextmanager
def recording_module_reads(
    modules: list[torch.nn.Module],
    positions: dict[tuple[int, str], list[tuple[Any, types.CodeType]]] | None = None,
) -> Iterator[dict[int, set[str] | None]]:
    """The attribute names read on each submodule of ``modules`` while active, by
    ``id``: what the trace actually read, not every name its code could load (a
    ``BasicBlock.stride`` its forward never reads, the ``drop_prob`` of a ``DropPath``
    that returned early in eval, the ``training`` flag of a ``Linear``). A submodule
    whose reads cannot be seen -- its class has its own ``__getattribute__``, or code
    read its whole ``__dict__`` (``vars(self)``) -- maps to None: every attribute of
    it that the traced code names counts as read (``read_names``).

    Every read of an attribute of an ``nn.Module`` goes through its type's
    ``__getattribute__`` (plain attributes, properties, and, on a miss, ``__getattr__``
    for parameters, buffers and children), so a recorder installed on ``nn.Module``
    sees them all, for the duration of the trace only.

    ``positions`` receives, for each read of an attribute ``neutral_reads`` has a rule
    for, the graph's last node at that moment (the operator that used the value is the
    next one: ``neutral_reads.prove_in_graph``) and the code that read it (a read by
    other code than the library's forward may branch on it); a module called twice
    reads it twice."""
    reads: dict[int, set[str] | None] = {}
    for m in modules:
        for sub in m.modules():
            own = type(sub).__getattribute__ is object.__getattribute__
            reads[id(sub)] = set() if own else None
    get = object.__getattribute__
    getframe = sys._getframe

    def recorder(self: torch.nn.Module, name: str) -> Any:
        seen = reads.get(id(self), None)
        if seen is not None and not _PAUSED[0]:
            if name != "__dict__":
                seen.add(name)
                if positions is not None and name in neutral_reads.NAMES:
                    positions.setdefault((id(self), name), []).append(
                        (tracing.graph_tail(), getframe(1).f_code)
                    )
            elif getframe(1).f_code is not _MODULE_GETATTR_CODE:
                reads[id(self)] = None
        return get(self, name)

    if "__getattribute__" in vars(torch.nn.Module):
        # Another recorder is active (a nested capture): let that one see the reads,
        # and count every name as read here.
        yield dict.fromkeys(reads)
        return
    with patching.patched(torch.nn.Module, "__getattribute__", recorder):
        yield reads


def read_names(log: CallLog) -> frozenset[str]:
    """Attribute names the traced code may read: the names and string constants of
    every user function and every torch.nn function that ran."""
    names: set[str] = set()
    for code in log.codes:
        path = os.path.realpath(code.co_filename) if code.co_filename else ""
        if is_user_file(code.co_filename) or path.startswith(_TORCH_MODULE_CODE):
            names.update(code.co_names)
            names.update(c for c in code.co_consts if isinstance(c, str) and c.isidentifier())
    return frozenset(names)


#: torch's Python code that eager runs inside a model's forward as the trace does: its
#: module library (``torch.nn``: containers, functional) and Tensor's Python methods.
_TORCH_DIR = os.path.dirname(torch.__file__)  # as code objects name their files
_EAGER_LIBRARY = (
    os.path.join(_TORCH_DIR, "nn") + os.sep,
    os.path.join(_TORCH_DIR, "functional.py"),
    os.path.join(_TORCH_DIR, "_tensor.py"),
)


def _library_builtin_loads(log: CallLog) -> list[str]:
    """The builtins' names that torch's module library loads as globals, in every
    function of it the trace entered: it resolves builtins too (``nn.Sequential``
    iterates with ``iter``), and the graph baked what they did. Which of them a library
    module shadows with a global of its own is not looked up: each is recorded as the
    builtin, so a patched builtin such code may have used is refused, never served.

    torch's tracing machinery (fx, fake tensors, decompositions), precompile's own code
    and the standard library it runs are left out: eager never runs them in a served
    call, and which of them a trace enters differs between a process's first capture and
    its next (lazy set-up), which would make the emitted artifact differ too."""
    names: dict[str, None] = {}
    for code in log.codes:
        if not code.co_filename.startswith(_EAGER_LIBRARY):
            continue
        names.update(dict.fromkeys(builtin_loads(code)))
    return sorted(names)


@dataclasses.dataclass
class GlobalRead:
    """The module-level values one user module's traced functions read."""

    module: str
    file: str | None
    values: dict[str, Any]


@dataclasses.dataclass
class Dependencies:
    """The recorded state: per module argument and submodule (in ``named_modules``
    order) its fingerprint; per distinct submodule class its class-level values; the
    globals read per module; torch's global hooks; the attribute names that count as
    read."""

    names: frozenset[str]
    modules: list[list[Any]]
    classes: list[tuple[str, Any]]
    globals: list[GlobalRead]
    global_hooks: Any
    #: The captured function itself when it holds values the trace baked (defaults,
    #: keyword defaults, closure cells): its module, file, qualname and fingerprint.
    entry: dict[str, Any] | None = None
    #: The torch settings user code read: [module, path, called, "what at FILE:LINE",
    #: fingerprint of the value], by expression.
    process_state: list[list[Any]] = dataclasses.field(default_factory=list)
    #: The library paths the trace resolved (``LIBRARY_SURFACE``).
    surface: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: Per module argument, per submodule: the attribute names the trace read on it,
    #: or None where every name in ``names`` counts (``MODULE_READS``).
    module_reads: list[list[list[str] | None]] = dataclasses.field(default_factory=list)
    #: Ruled reads the graph could not show harmless, with why (``MODULE_READ_NOTES``):
    #: ``[module argument index, submodule path, attribute, why]``.
    read_notes: list[list[Any]] = dataclasses.field(default_factory=list)


def _context(
    names: Any, training: bool, near: tuple[str, ...], classes: dict[Any, None] | None = None
) -> dict[str, Any]:
    """A fingerprinting context that looks for the names of identity-only objects in
    the traced code's modules first (``near``), collecting the user classes it reaches
    into ``classes`` (shared by the contexts of one capture)."""
    context = state_checks.new_context(names, training)
    context["near"] = near
    if classes is not None:
        context["classes"] = classes
    return context


def _near_modules(log: CallLog) -> tuple[str, ...]:
    """The modules of the project code the trace ran, by name: where a sentinel the
    code compares against is most likely bound."""
    return tuple(
        sorted({str(log.scopes[c].get("__name__")) for c in log.project_codes() if c in log.scopes})
    )


def module_reads(
    modules: list[torch.nn.Module], reads: dict[int, set[str] | None]
) -> list[list[list[str] | None]]:
    """``MODULE_READS``: per module argument, per submodule (``named_modules`` order),
    the attribute names the trace read on it, sorted; None where its reads were not
    seen (``recording_module_reads``)."""
    out: list[list[list[str] | None]] = []
    for m in modules:
        row: list[list[str] | None] = []
        for _, sub in m.named_modules():
            seen = reads.get(id(sub))
            row.append(None if seen is None else sorted(seen))
        out.append(row)
    return out


def _module_records(
    modules: list[torch.nn.Module],
    names: Any,
    training: bool,
    near: tuple[str, ...],
    classes: dict[Any, None],
    reads: list[list[list[str] | None]],
) -> list[list[Any]]:
    context = _context(names, training, near, classes)
    return [
        [
            state_checks.module_fingerprint(
                sub, context, children=False, own=None if own is None else frozenset(own)
            )
            for (_, sub), own in zip(m.named_modules(), row)
        ]
        for m, row in zip(modules, reads)
    ]


def _class_records(
    modules: list[torch.nn.Module],
    names: Any,
    training: bool,
    near: tuple[str, ...],
    classes: dict[Any, None],
) -> list[tuple[str, Any]]:
    """Per submodule class, and per user class the other records reached (a global
    class, the class of a config object), its class-level values."""
    context = _context(names, training, near, classes)
    subs = dict.fromkeys(type(sub) for m in modules for sub in m.modules())
    return [
        (state_checks.type_name(c), record)
        for c, record in state_checks.reached_classes(subs, context)
    ]


def _global_values(
    log: CallLog, names: Any, training: bool, classes: dict[Any, None] | None = None
) -> list[GlobalRead]:
    """Per user module, the values its traced functions loaded as globals; a name that
    resolved through the builtins is recorded as absent from the module, and the
    builtin itself under a ``builtins`` record (both are checked). An imported project module (``import cfgmod``
    then ``cfgmod.SCALE``) is read like the code's own globals: its values under the
    names the traced code reads, and its dict is watched the same way."""
    by_module: dict[str, GlobalRead] = {}
    context = _context(names, training, _near_modules(log), classes)
    pending: list[types.ModuleType] = []
    for code in log.project_codes():
        scope = log.scopes.get(code)
        if scope is None:
            continue
        module = str(scope.get("__name__"))
        read = by_module.setdefault(module, GlobalRead(module, scope.get("__file__"), {}))
        held = scope.get("__builtins__", builtins)
        table = held if isinstance(held, dict) else vars(held)
        for name in global_loads(code):
            if name not in scope:
                if name in table:
                    # Resolved through the builtins, whose result the graph baked
                    # (``len(xs)``): the module must not bind the name later, and the
                    # builtin must stay what it was (``builtins.abs`` patched).
                    read.values[name] = ("absent",)
                    shared = by_module.setdefault("builtins", GlobalRead("builtins", None, {}))
                    shared.values[name] = state_checks.fingerprint(table[name], context)
                continue
            if isinstance(scope[name], types.ModuleType):
                pending.append(scope[name])
            else:
                read.values[name] = state_checks.fingerprint(scope[name], context)
    table = vars(builtins)
    library = [n for n in _library_builtin_loads(log) if n in table]
    if library:
        shared = by_module.setdefault("builtins", GlobalRead("builtins", None, {}))
        for name in library:
            if name not in shared.values:
                shared.values[name] = state_checks.fingerprint(table[name], context)
    seen: set[str] = set()
    while pending:
        module_value = pending.pop()
        module = module_value.__name__
        file = getattr(module_value, "__file__", None)
        if module in seen or module == "__main__" or not (file and is_project_file(file)):
            continue
        seen.add(module)
        read = by_module.setdefault(module, GlobalRead(module, file, {}))
        for name, value in list(vars(module_value).items()):
            if name not in names or name.startswith("__"):
                continue
            if isinstance(value, types.ModuleType):
                pending.append(value)  # ``pkg.cfgmod.SCALE``
            elif name not in read.values:
                read.values[name] = state_checks.fingerprint(value, context)
    return [r for _, r in sorted(by_module.items()) if r.values]


class Snapshot:
    """The state before a trace, to tell what the trace itself changed: Python side
    effects that an artifact, which runs no Python, would not repeat -- module
    attributes and training flags, and the globals of the project's modules (the ones
    the traced code read or wrote are compared afterwards, with the objects they hold)."""

    def __init__(self, modules: list[torch.nn.Module]) -> None:
        self.modules = [
            [(name, _attr_fps(sub)) for name, sub in m.named_modules()] for m in modules
        ]
        self.training = [[(n, sub.training) for n, sub in m.named_modules()] for m in modules]
        self.scopes = {
            id(vars(module)): (name, _scope_contents(vars(module)))
            for name, module in list(sys.modules.items())
            if _is_project_module(module)
        }

    def changed_during(
        self, modules: list[torch.nn.Module], names: frozenset[str], log: CallLog | None = None
    ) -> list[str]:
        changes = []
        multi = len(modules) > 1
        for mi, (m, before) in enumerate(zip(modules, self.modules)):
            prefix = f"m{mi}." if multi else ""
            after = [(name, _attr_fps(sub)) for name, sub in m.named_modules()]
            for (name, old), (_, new) in zip(before, after):
                for attr in sorted((old.keys() | new.keys()) & names):
                    if old.get(attr) != new.get(attr):
                        owner = prefix + name
                        changes.append(f"{owner + '.' if owner else ''}{attr}")
            for (name, flag), (_, sub) in zip(self.training[mi], m.named_modules()):
                owner = prefix + name
                where = f"{owner + '.' if owner else ''}training"
                if sub.training != flag and where not in changes:
                    changes.append(where)
        if log is not None:
            changes += self._globals_changed(log)
        return changes

    def _globals_changed(self, log: CallLog) -> list[str]:
        """The module globals the traced project code named that the trace rebound, or
        whose list, dict, set or plain object it changed in place."""
        changes: list[str] = []
        for code in log.project_codes():
            scope = log.scopes.get(code)
            recorded = self.scopes.get(id(scope)) if scope is not None else None
            if scope is None or recorded is None:
                continue
            module, before = recorded
            for name in global_names(code):
                where = f"global {name} of module {module}"
                if where in changes or (name not in before and name not in scope):
                    continue
                if name not in before or name not in scope:
                    changes.append(where)
                elif _contents(scope[name], _DEPTH) != before[name]:
                    changes.append(where)
        return changes


#: How deep a global's contents are compared (CALLS[0], CFG.stats["n"]).
_DEPTH = 3
#: Containers longer than this are compared by identity and length only.
_WIDTH = 10_000


def _is_project_module(module: object) -> bool:
    file = getattr(module, "__file__", None)
    return isinstance(module, types.ModuleType) and isinstance(file, str) and is_project_file(file)


def _scope_contents(scope: dict[str, Any]) -> dict[str, Any]:
    return {
        name: _contents(value, _DEPTH)
        for name, value in list(scope.items())
        if not name.startswith("__")
    }


def _contents(value: Any, depth: int) -> Any:
    """What a global holds, by identity: the object, and for a list, tuple, dict, set,
    bytearray or plain object (its ``__dict__``) the objects inside, ``depth`` levels
    down. Equal results mean no rebinding and no in-place change the trace could make
    through Python (a tensor's data is not Python state: it is read as a constant)."""
    if depth <= 0 or isinstance(value, (types.ModuleType, type, types.FunctionType, torch.Tensor)):
        return id(value)
    if isinstance(value, (list, tuple)):
        if len(value) > _WIDTH:
            return (id(value), len(value))
        return (id(value), tuple(_contents(v, depth - 1) for v in value))
    if isinstance(value, dict):
        if len(value) > _WIDTH:
            return (id(value), len(value))
        return (id(value), tuple((k, _contents(v, depth - 1)) for k, v in list(value.items())))
    if isinstance(value, (set, frozenset)):
        return (
            (id(value), len(value))
            if len(value) > _WIDTH
            else (id(value), frozenset(map(id, value)))
        )
    if isinstance(value, bytearray):
        return (id(value), bytes(value))
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict) and not isinstance(value, torch.nn.Module):
        return (id(value), _contents(attrs, depth - 1))
    return id(value)


class ArgumentWatch:
    """fn's arguments as the trace passed them, to tell what fn's Python did to them: a
    list appended to or a dict stored into (the trace passes containers rebuilt from
    the caller's, so the caller's are never changed at capture, and an artifact would
    not change them either), a tensor's ``requires_grad`` flipped (a parameter's, an
    input's: the trace flips its stand-in)."""

    def __init__(
        self,
        tensors: list[tuple[str, torch.Tensor]],
        arguments: list[tuple[int, Any]],
    ) -> None:
        self.tensors = tensors
        self.flags = [bool(t.requires_grad) for _, t in tensors]
        self.arguments = arguments
        self.before = [tracing.pytree.tree_flatten(value) for _, value in arguments]

    def changes(self) -> list[str]:
        found = [
            f"{label}.requires_grad"
            for (label, t), flag in zip(self.tensors, self.flags)
            if bool(t.requires_grad) != flag
        ]
        for (position, value), (leaves, spec) in zip(self.arguments, self.before):
            now, now_spec = tracing.pytree.tree_flatten(value)
            if now_spec != spec or len(now) != len(leaves) or any(map(_is_not, now, leaves)):
                found.append(f"the {type(value).__name__} passed as fn's argument {position}")
        return found


def _is_not(a: object, b: object) -> bool:
    return a is not b


def _attr_fps(module: torch.nn.Module) -> dict[str, Any]:
    context = state_checks.new_context(_Everything())
    record = state_checks.module_fingerprint(module, context, children=False)
    return dict(record[1]) | {"<hooks>": record[2], "<type>": record[0]}


def entry_record(
    fn: Any,
    names: Any,
    training: bool,
    near: tuple[str, ...] = (),
    where: Any = None,
    classes: dict[Any, None] | None = None,
) -> dict[str, Any] | None:
    """The captured function's own baked values: a call of it passes every positional
    argument, so its defaults, keyword defaults and closure cells are read as they were
    at capture -- and a ``functools.partial``'s arguments and keywords. None for a
    function that holds none."""
    import functools

    if isinstance(fn, functools.partial):
        return _partial_entry_record(fn, names, training, near, where, classes)
    func = getattr(fn, "__func__", fn)
    if not isinstance(func, types.FunctionType):
        return None
    if not (func.__defaults__ or func.__kwdefaults__ or func.__closure__):
        return None
    context = _context(names, training, near, classes)
    return {
        "module": str(func.__module__),
        "file": func.__globals__.get("__file__"),
        "qualname": func.__qualname__,
        "fingerprint": state_checks.fingerprint(func, context),
    }


def _partial_entry_record(
    fn: Any,
    names: Any,
    training: bool,
    near: tuple[str, ...],
    where: Any,
    classes: dict[Any, None] | None,
) -> dict[str, Any]:
    """A partial has no name of its own: it is found again by the module-level name
    bound to it (the module of the function it wraps first), and checked whole."""
    inner = getattr(fn.func, "__func__", fn.func)
    home = str(getattr(inner, "__module__", None) or "")
    context = _context(names, training, (home, *near), classes)
    named = state_checks.identity_name(fn, context)
    if not named:
        raise PrecompileError(
            f"the captured function is a functools.partial of {getattr(inner, '__qualname__', inner)!r} "
            f"that no module-level name holds; the graph baked its arguments and "
            f"keywords, and another process could build it with other ones unnoticed",
            invariant=3,
            location=where,
            hint="bind the partial to a module-level name, or capture the function "
            "itself and pass those values as arguments",
        )
    ((module_name, name),) = named
    module = sys.modules.get(module_name)
    return {
        "module": module_name,
        "file": getattr(module, "__file__", None),
        "qualname": name,
        "fingerprint": state_checks.fingerprint(fn, context),
    }


def _unnamed_sentinels(fingerprint: Any, path: str) -> Iterator[str]:
    """Where a recorded fingerprint holds an object with no state that no module-level
    name is bound to (its identity is all that tells it apart)."""
    if isinstance(fingerprint, tuple):
        if len(fingerprint) == 3 and fingerprint[0] == "sentinel" and fingerprint[2] == ():
            yield f"{path} (a {fingerprint[1]})"
            return
        for part in fingerprint:
            yield from _unnamed_sentinels(part, path)


def refuse_unnamed_sentinels(deps: Dependencies, where: Any) -> None:
    """An object with no state is told from another one only by the module-level name
    bound to it: one that no global holds cannot be checked in another process."""
    places: list[str] = []
    for m, records in enumerate(deps.modules):
        for record in records:
            places += _unnamed_sentinels(record[1], f"an attribute of module argument {m}")
    for cls, record in deps.classes:
        places += _unnamed_sentinels(record, f"a class attribute of {cls}")
    for read in deps.globals:
        for name, record in read.values.items():
            places += _unnamed_sentinels(record, f"global {name} of module {read.module}")
    if deps.entry is not None:
        places += _unnamed_sentinels(deps.entry["fingerprint"], "the captured function")
    if places:
        raise PrecompileError(
            f"the traced code reads an object with no attributes (a sentinel such as "
            f"object()) through {places[0]}, and no module-level name is bound to it; "
            f"the trace took the branch of that very object, and an artifact can tell it "
            f"from another one only by the global it is bound to",
            invariant=3,
            location=where,
            hint="bind it to a module-level name (FAST = object()), or use an enum.Enum "
            "member or a string instead",
        )


def record_dependencies(
    modules: list[torch.nn.Module],
    log: CallLog,
    training: bool,
    fn: Any = None,
    where: Any = None,
    reads: dict[int, set[str] | None] | None = None,
) -> Dependencies:
    """What the trace depended on; ``reads`` (``recording_module_reads``) narrows each
    submodule's recorded attributes to those the trace read on it."""
    refuse_trace_only_reads(log, where)
    names = read_names(log)
    near = _near_modules(log)
    # The user classes every record reaches, whose class-level values are recorded last.
    classes: dict[Any, None] = {}
    entry = entry_record(fn, names, training, near, where, classes)
    read_rows = module_reads(modules, reads or {})
    module_records = _module_records(modules, names, training, near, classes, read_rows)
    global_records = _global_values(log, names, training, classes)
    return Dependencies(
        entry=entry,
        names=names,
        modules=module_records,
        classes=_class_records(modules, names, training, near, classes),
        globals=global_records,
        global_hooks=state_checks.global_hooks_fingerprint(global_module_hooks()),
        process_state=_process_state_records(log),
        surface=surface_record(modules, log),
        module_reads=read_rows,
    )


def surface_record(modules: list[torch.nn.Module], log: CallLog) -> list[dict[str, Any]]:
    """``LIBRARY_SURFACE`` of a make_fx trace: what eager code called and entered,
    resolved among the library modules the globals of eager code hold and the classes of
    the modules the trace reached."""
    eager_scopes = {
        id(scope): scope
        for code, scope in log.scopes.items()
        if library_surface.is_eager_file(code.co_filename)
    }
    return library_surface.record_surface(
        log.called.values(),
        log.entered,
        eager_scopes.values(),
        dict.fromkeys(type(sub) for m in modules for sub in m.modules()),
        log.tensor_methods,
    )


def _process_state_records(log: CallLog) -> list[list[Any]]:
    """Each torch setting user code read, with its value as the artifact's per-call
    check reads it again (``state_checks.state_getter``)."""
    context = state_checks.new_context(frozenset())
    records = []
    for read, site in sorted(log.state.items(), key=lambda item: item[0].expression):
        value = state_checks.state_getter(read.module, read.path, read.call)()
        records.append(
            [
                read.module,
                read.path,
                read.call,
                f"{read.expression} at {site}",
                state_checks.fingerprint(value, context),
            ]
        )
    return records


def refuse_trace_only_reads(log: CallLog, where: Any) -> None:
    """Refuse reads whose answer in the trace is not what a served call would get."""
    for what, site in log.refused.items():
        if what in fx_process_state.tables().probe_codes.values():
            raise PrecompileError(
                f"fn branches on {what} at {site}, which is true while make_fx traces fn "
                f"but false when fn runs eagerly; the graph holds the branch eager never "
                f"takes, and every served call would run it",
                invariant=3,
                location=where,
                hint="remove the branch, or make both branches compute the same thing",
            )
        raise PrecompileError(
            f"fn reads torch backend state ({what} at {site}) that an artifact cannot ask "
            f"again on each call; the graph baked the answer the trace got",
            invariant=3,
            location=where,
            hint="read it outside fn and pass the result as an argument (checked per call)",
        )


def refuse_trace_side_effects(changes: list[str], where: Any) -> None:
    if changes:
        raise PrecompileError(
            f"fn changed state in Python while it was traced ({', '.join(changes)}); an "
            f"artifact runs no Python, so served calls would not repeat that change",
            invariant=4,
            location=where,
            hint="return the value from fn instead of storing it (into an argument or a "
            "global), keep per-call state in tensors (a registered buffer updated in "
            "place), or make the change outside fn",
        )


def param_free(module: object) -> bool:
    """A module with no parameters and no buffers bakes no tensor into a trace."""
    return (
        isinstance(module, torch.nn.Module)
        and next(module.parameters(), None) is None
        and next(module.buffers(), None) is None
    )
