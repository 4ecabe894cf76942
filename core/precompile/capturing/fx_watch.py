"""What a single-graph trace ran and read, watched while ``make_fx`` runs the user's Python.

A profile hook (``recording_calls``) records every code object the trace entered, with
the module globals of the user's, and the reads of process state no graph input
carries: the environment, Python's ``random``, torch reseeds, the grad and inference
modes, torch settings (``fx_process_state``), and the library surface eager code went
through (``library_surface``). A recorder on ``nn.Module.__getattribute__``
(``recording_module_reads``) sees which attributes the trace read on each submodule.
``fx_dependencies`` turns the ``CallLog`` into the fingerprints an artifact checks.
"""

from __future__ import annotations

import _collections_abc
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
from precompile.capturing import call_context, fx_process_state, library_surface, neutral_reads
from precompile.locations import is_project_file, is_user_file, real_path
from precompile.runtime.class_fingerprints import ENTERED_ONLY_DUNDERS, ENTERED_RECORDED

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
    *fx_process_state.SOURCE_WRAPPERS,
    _collections_abc.Mapping.get.__code__.co_filename,
    _RANDOM_FILE,
)
_TORCH_DIR = os.path.realpath(os.path.dirname(torch.__file__)) + os.sep
#: torch code whose attribute reads on modules count (a LayerNorm reads ``self.eps``).
_TORCH_MODULE_CODE = tuple(_TORCH_DIR + d + os.sep for d in ("nn", os.path.join("ao", "nn")))


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
    #: What fn did to grad mode (``call_context.GradModeTrail``).
    grad_trail: call_context.GradModeTrail = dataclasses.field(
        default_factory=call_context.GradModeTrail
    )
    #: The library surface eager code went through (``precompile.capturing.library_surface``):
    #: builtins it called (by id), the names of Tensor methods it called, and the
    #: functions it entered (their code).
    called: dict[int, Any] = dataclasses.field(default_factory=dict)
    tensor_methods: set[str] = dataclasses.field(default_factory=set)
    entered: set[types.CodeType] = dataclasses.field(default_factory=set)
    #: The code entered within the call of the traced function (``traced_call``): what
    #: eager serving runs. The rest is the capture's own machinery (make_fx building
    #: its graph module, the tensors swapped into the modules), which reads library
    #: functions -- ``Module.__setattr__``, ``named_modules``, ``register_buffer`` --
    #: that a served call never runs.
    reached: set[types.CodeType] = dataclasses.field(default_factory=set)

    def project_codes(self) -> list[types.CodeType]:
        return sorted(
            (c for c in self.codes if is_project_file(c.co_filename)),
            key=lambda c: (c.co_filename, c.co_firstlineno),
        )


def traced_call(fn: Any, args: Any) -> Any:
    """Call the traced function: ``recording_calls`` counts what runs under this frame
    as reached from the user's code (``CallLog.reached``)."""
    return fn(*args)


_TRACED_CALL_CODE = traced_call.__code__


def _past(frame: types.FrameType | None, files: tuple[str, ...]) -> types.FrameType | None:
    """The first frame at or above ``frame`` whose code is not in ``files``."""
    while frame is not None and frame.f_code.co_filename in files:
        frame = frame.f_back
    return frame


@contextlib.contextmanager
def recording_calls() -> Iterator[CallLog]:
    """Every function entered on this thread while active (a profile hook that chains
    to any profiler already installed), with the module globals of the user ones.

    A Python profile function already installed is called on, event by event. A C-level
    profiler (``cProfile``: ``sys.getprofile()`` is then its ``Profiler`` object, not a
    callable) cannot be chained from Python: it is paused for the trace and enabled
    again after it, keeping what it had recorded (a capture run under ``cProfile`` used
    to fail calling the object, and would have left it broken)."""
    log = CallLog()
    installed = sys.getprofile()
    previous = installed if callable(installed) else None
    codes, scopes, reads = log.codes, log.scopes, log.reads
    state, refused = log.state, log.refused
    tables = fx_process_state.tables()
    sources, source_key = fx_process_state.process_sources(), fx_process_state.source_key
    source_names = frozenset(name for _, name in sources)
    getter_codes, probe_codes = tables.getter_codes, tables.probe_codes
    getter_builtins, backends_dir = tables.getter_builtins, tables.backends_dir
    kernel_builtins = tables.kernel_builtins
    # Closure cells, not module globals: torch.cond's tracing runs Dynamo over the
    # frames it enters, this hook's among them, and Dynamo cannot name a global dict
    # keyed by code objects in a guard.
    grad_codes, set_grad, grad_trail = _GRAD_MODE_CODES, _SET_GRAD_ENABLED, log.grad_trail
    called, tensor_methods, entered = log.called, log.tensor_methods, log.entered
    eager_file = library_surface.is_eager_file
    tensor_type, module_type = torch.Tensor, types.ModuleType
    importing: list[types.FrameType] = []  # the import machinery's outermost frame
    reached, traced_code = log.reached, _TRACED_CALL_CODE
    inside = [0]  # traced_call frames on this thread's stack

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
        # Half the events a trace makes are returns, a quarter C returns: each is
        # settled here in a few comparisons (what a return tells: the traced call or
        # an import left, a probe answered True), not through the chains below.
        if event == "return":
            if code is traced_code:
                inside[0] -= 1  # also where it exits by an exception
            if importing:
                if frame is importing[0]:
                    importing.clear()
            elif code in probe_codes and arg is True:
                site = fx_process_state.read_site(frame.f_back)
                if site:
                    refused.setdefault(probe_codes[code], site)
            return None if previous is None else previous(frame, event, arg)
        if event == "c_return" or event == "c_exception":
            return None if previous is None else previous(frame, event, arg)
        if inside[0] and (code in grad_codes if event == "call" else arg is set_grad):
            _follow_grad_mode(grad_trail, frame, event, arg)
        if event == "call":
            if code is traced_code:
                inside[0] += 1
            elif inside[0]:
                reached.add(code)
        if importing:
            pass
        elif event == "call" and code in _ENVIRON_CODES and "environ" not in reads:
            note("environ", _ENVIRON_CODES[code], frame.f_back)
        elif event == "call" and code.co_filename == _RANDOM_FILE and "random" not in reads:
            note("random", f"random.{code.co_name}()", frame.f_back)
        elif event == "c_call" and (arg is _RANDOM_RANDOM or arg is _RANDOM_GETRANDBITS):
            if "random" not in reads:
                note("random", f"random.{getattr(arg, '__name__', '?')}()", frame)
        elif (
            event == "c_call"
            and inside[0]
            and "process" not in reads
            and getattr(arg, "__name__", None) in source_names
            and (key := source_key(arg)) in sources
        ):
            note("process", f"{fx_process_state.source_call(key)} reads {sources[key]}", frame)
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
            # (It ends at the return of its outermost frame, above.)
            pass
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
        elif event == "c_call" and inside[0] and id(arg) in kernel_builtins:
            # A torch operation whose kernel chooses by settings read in C++: the
            # graph holds the choice (``_compat.kernel_settings``).
            builtin, kernel_reads = kernel_builtins[id(arg)]
            if arg is builtin:
                site = fx_process_state.call_site(frame)
                for read in kernel_reads:
                    state.setdefault(read, site)
        if importing or not inside[0]:
            # Only what the traced call reached: the capture's machinery calls library
            # code a served call never runs.
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
        reinstall_profiler(installed)


_GRAD_MODE = torch.autograd.grad_mode
#: The grad-mode switches fn may call, by code: what each does to the mode.
_GRAD_MODE_CODES = {
    _GRAD_MODE.set_grad_enabled.__init__.__code__: "set",
    _GRAD_MODE.set_grad_enabled.__call__.__code__: "restore",
    _GRAD_MODE.set_grad_enabled.__exit__.__code__: "restore",
    _GRAD_MODE.no_grad.__enter__.__code__: "off",
    _GRAD_MODE.no_grad.__exit__.__code__: "restore",
    _GRAD_MODE.enable_grad.__enter__.__code__: "on",
    _GRAD_MODE.enable_grad.__exit__.__code__: "restore",
}
_GRAD_MODE_FILE = _GRAD_MODE.set_grad_enabled.__init__.__code__.co_filename
_SET_GRAD_ENABLED = tracing.SET_GRAD_ENABLED


def _follow_grad_mode(
    trail: call_context.GradModeTrail, frame: types.FrameType, event: str, arg: object
) -> None:
    """Hand ``trail`` a grad-mode switch the traced call made: a switch's own code
    entered ("call"), or a direct ``torch._C._set_grad_enabled`` from user code
    ("c_call"). The switches' calls of each other (``no_grad.__enter__`` sets the mode
    through ``set_grad_enabled``) are their caller's one step; only user code's sets
    count (torch's own are paired, or restore what they saved)."""
    caller = frame.f_back
    if event == "c_call":
        if is_user_file(frame.f_code.co_filename):
            trail.set(None, None, fx_process_state.call_site(frame))
        return
    if event != "call" or caller is None or caller.f_code.co_filename == _GRAD_MODE_FILE:
        return
    what = _GRAD_MODE_CODES[frame.f_code]
    owner = frame.f_locals.get("self")
    if what == "restore":
        trail.restore(owner)
        return
    if not is_user_file(caller.f_code.co_filename):
        # torch's own code: its switches come in pairs, and a bare set there puts back
        # a mode it saved (Dynamo's global-state restore under torch.cond).
        return
    mode = frame.f_locals.get("mode") if what == "set" else what == "on"
    trail.set(owner, mode, fx_process_state.call_site(caller))


def reinstall_profiler(installed: object) -> None:
    """Put back the profiler ``sys.getprofile()`` returned before a recording (a trace,
    ``function_records.codes_run``): a Python function as it was; a C-level profiler
    (``_lsprof.Profiler``) by enabling it again, which reinstalls its C hook; anything
    else (a C hook no Python call can reinstall) by removing the recording's own hook,
    since setting the object would have Python call it on every event."""
    if installed is None or callable(installed):
        sys.setprofile(installed)
        return
    enable = getattr(installed, "enable", None)
    if callable(enable):
        enable()
    else:
        sys.setprofile(None)


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
    readers: dict[tuple[int, str], set[tuple[types.CodeType, int]]] | None = None,
    outside: set[type] | None = None,
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
    reads it twice. ``readers`` receives the code and instruction offset of every read of
    every name (a flag read only as ``x.flag and x.training`` decides nothing in eval:
    ``neutral_reads.settle_training_only_reads``). ``outside`` receives the class of
    every other module an attribute of which was read (one not among ``modules``'
    submodules, whose reads are not recorded: a class-level flag it reads stays
    compared by value, ``neutral_reads.class_truth_names``)."""
    reads: dict[int, set[str] | None] = {}
    for m in modules:
        for sub in m.modules():
            own = type(sub).__getattribute__ is object.__getattribute__
            reads[id(sub)] = set() if own else None
    get = object.__getattribute__
    getframe = sys._getframe

    def recorder(self: torch.nn.Module, name: str) -> Any:
        seen = reads.get(id(self), _UNKNOWN)
        if seen is _UNKNOWN:
            if outside is not None and not _PAUSED[0]:
                outside.add(type(self))
            seen = None
        if seen is not None and not _PAUSED[0]:
            if name != "__dict__":
                seen.add(name)
                if readers is not None:
                    frame = getframe(1)
                    readers.setdefault((id(self), name), set()).add((frame.f_code, frame.f_lasti))
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


#: What ``recording_module_reads`` finds for a module that is none of its submodules.
_UNKNOWN: Any = object()


def read_names(log: CallLog) -> frozenset[str]:
    """Attribute names the traced code may read: the names and string constants of
    every user function that ran, and of every torch.nn function reached from the
    traced call (``CallLog.reached``: not those only the capture's machinery ran, which
    a served call never runs; a forward that calls ``self.register_buffer`` itself
    reaches it). With them ``ENTERED_RECORDED`` and the store/delete dunders the traced
    call entered, where it is known what it entered."""
    names: set[str] = set()
    for code in log.codes:
        path = real_path(code.co_filename) if code.co_filename else ""
        if is_user_file(code.co_filename) or (
            path.startswith(_TORCH_MODULE_CODE) and code in log.reached
        ):
            names.update(code.co_names)
            names.update(c for c in code.co_consts if isinstance(c, str) and c.isidentifier())
    if log.reached:
        # Which store/delete dunders the traced call entered, so that the class records
        # leave out the others (class_fingerprints.ENTERED_ONLY_DUNDERS): any file's but
        # torch's outside torch.nn, which is the tracer's own machinery (an FX Node's
        # __setattr__ as make_fx records the graph), never run by an eager call.
        for code in log.reached:
            if code.co_name in ENTERED_ONLY_DUNDERS:
                path = real_path(code.co_filename) if code.co_filename else ""
                if not path.startswith(_TORCH_DIR) or path.startswith(_TORCH_MODULE_CODE):
                    names.add(code.co_name)
        names.add(ENTERED_RECORDED)
    return frozenset(names)
