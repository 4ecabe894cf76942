"""Process-wide torch settings a make_fx trace read, told from the profile events of the read.

make_fx runs fn's Python once: a branch on a torch setting -- deterministic algorithms,
the float32 matmul precision, the thread count, a ``torch.backends`` flag -- bakes the
branch of the value the capture saw. ``fx_watch.recording_calls`` hands this module
each profile event of the trace; it keeps the reads user code made, each named as a public
expression another process evaluates again (``state_checks.state_getter``), so an
artifact compares the live value per call, only for what fn read.

Two kinds of read are refused at capture instead: a read that is true only while a
trace runs (``is_fx_tracing()``: eager never takes that branch), and a ``torch.backends``
query that takes arguments (it cannot be re-asked without them).
"""

from __future__ import annotations

import dataclasses
import functools
import getpass
import glob
import importlib
import linecache
import locale
import os
import pathlib
import platform
import secrets
import shutil
import sys
import tokenize
import types
import uuid
from collections.abc import Iterable
from typing import Any

import torch

from precompile._compat import tracing
from precompile._compat.kernel_settings import graph_kernel_settings, kernel_settings
from precompile.locations import is_user_file
from precompile.runtime import state_checks, value_fingerprints


@dataclasses.dataclass(frozen=True)
class StateRead:
    """A read as another process repeats it: ``module``'s attribute ``path``, called
    when ``call``. ``through``: the torch operation whose kernel read it, where fn did
    not read it itself (``_compat.kernel_settings``)."""

    module: str
    path: str
    call: bool
    through: str = ""

    @property
    def expression(self) -> str:
        return f"{self.module}.{self.path}" + ("()" if self.call else "")

    @property
    def shown(self) -> str:
        """The read as a refusal names it."""
        if not self.through:
            return self.expression
        return f"{self.through}'s kernel switch {self.expression}"


#: Public zero-argument getters of process state outside torch.backends (grad mode,
#: inference mode, autocast and the default dtype have their own checks), and the
#: interpreter's and torch's process-wide settings a forward may branch on: re-read
#: and compared per call (a setting changes rarely; the clock and the like, which
#: change between calls, are refused at capture: ``process_sources``).
_TORCH_GETTERS = {
    "sys": ("getswitchinterval",),
    "gc": ("get_threshold",),
    "torch.distributed": ("is_available", "is_initialized"),
    "torch": (
        "are_deterministic_algorithms_enabled",
        "is_deterministic_algorithms_warn_only_enabled",
        "get_deterministic_debug_mode",
        "get_float32_matmul_precision",
        "get_num_threads",
        "get_num_interop_threads",
        "is_warn_always_enabled",
        "is_anomaly_enabled",
        "is_anomaly_check_nan_enabled",
        "get_default_device",
        "initial_seed",
    ),
    "torch.cuda": ("is_available", "device_count"),
}


def source_key(builtin: Any) -> tuple[str, str] | None:
    """A C function by what defines it: (its module's or class's name, its name). Bound
    afresh on each attribute read (``datetime.datetime.now``), so not by identity; a
    method of an instance (``f.read``) is none."""
    owner = getattr(builtin, "__self__", None)
    if isinstance(owner, types.ModuleType):
        return owner.__name__, builtin.__name__
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}", builtin.__name__
    return None


#: The standard library's Python wrappers over ``process_sources``: a process source
#: called from one of these files counts as asked by the project code that called the
#: wrapper (os.path, pathlib, uuid4's os.urandom, glob's scandir, shutil.which's PATH,
#: getpass's environment, linecache's file, the locale module's).
SOURCE_WRAPPERS = tuple(
    f.__code__.co_filename
    for f in (
        os.path.exists,  # genericpath
        os.path.realpath,
        pathlib.Path.read_text,
        uuid.uuid4,
        secrets.token_bytes,
        platform.node,
        glob.glob,
        shutil.which,
        getpass.getuser,
        linecache.getline,
        tokenize.open,
        locale.getlocale,
    )
)


#: The modules that define those functions, as users import them.
_IMPORTED_AS = {
    "posix": "os",
    "nt": "os",
    "_thread": "threading",
    "_socket": "socket",
    "_locale": "locale",
}


def source_call(key: tuple[str, str]) -> str:
    """A process source's call as the user wrote it: ``os.getpid()``, ``open()``."""
    owner, name = key
    owner = _IMPORTED_AS.get(owner, owner)
    return f"{name}()" if owner in ("builtins", "io") else f"{owner}.{name}()"


@functools.cache
def process_sources() -> dict[tuple[str, str], str]:
    """The C functions whose answer comes from outside every object a trace can watch,
    by ``source_key``: what each reads. A make_fx trace bakes the answer into the graph,
    and a served call never asks again: another time, process, thread, machine, file
    or hash seed gets the capture's answer. (The environment and Python's random module
    are read through Python code, and ``fx_watch`` sees those calls.) Dynamo graph-breaks
    on these and guards the value it resumes with, except ``hash()``, whose answer for
    a string it folds unguarded (``dynamo_recording.refusing_process_hashes``)."""
    import _locale
    import datetime
    import gc
    import socket
    import threading
    import time

    kinds: dict[str, tuple[Any, ...]] = {
        "the clock": (
            *(getattr(time, n) for n in dir(time) if n.endswith(("time", "time_ns"))),
            time.monotonic,
            time.monotonic_ns,
            time.perf_counter,
            time.perf_counter_ns,
            time.localtime,
            time.gmtime,
            time.ctime,
            time.asctime,
            time.strftime,
            datetime.datetime.now,
            datetime.datetime.utcnow,
            datetime.datetime.today,
            datetime.date.today,
            # By the local time zone (the TZ variable, time.tzset()).
            datetime.datetime.fromtimestamp,
            datetime.date.fromtimestamp,
        ),
        "the process or its machine": (
            *(
                getattr(os, n)
                for n in (
                    "getpid",
                    "getppid",
                    "getuid",
                    "geteuid",
                    "getgid",
                    "getlogin",
                    "uname",
                    "cpu_count",
                    "getloadavg",
                    "times",
                    "sched_getaffinity",
                    "get_terminal_size",
                )
                if hasattr(os, n)
            ),
            threading.get_ident,
            threading.get_native_id,
            socket.gethostname,
        ),
        "the file system": (
            open,
            os.getcwd,
            os.listdir,
            os.scandir,
            os.stat,
            os.lstat,
            os.access,
            os.readlink,
        ),
        "the operating system's randomness": tuple(
            getattr(os, n) for n in ("urandom", "getrandom") if hasattr(os, n)
        ),
        "a per-process hash or an object's address": (hash, id),
        "the locale": (_locale.setlocale, _locale.localeconv),
        # Set by the capture itself while it traces (torch raises the recursion limit,
        # the capture pauses the collector): the trace reads the capture's, not the
        # caller's.
        "what the capture sets while it traces": (sys.getrecursionlimit, gc.isenabled),
    }
    table: dict[tuple[str, str], str] = {}
    for kind, builtins in kinds.items():
        for builtin in builtins:
            key = source_key(builtin)
            if isinstance(builtin, types.BuiltinFunctionType) and key is not None:
                table[key] = kind
    return table


#: The decimal module's current context: read by every ``Decimal`` operation, so a call
#: under another precision or rounding computes another number. Compared per call
#: (``PROCESS_STATE``: a context's fingerprint is its settings, not its flags) wherever
#: the trace ran project code naming the module or its types.
DECIMAL_READ = StateRead("decimal", "getcontext", True)
DECIMAL_NAMES = frozenset({"decimal", "Decimal", "getcontext", "localcontext", "setcontext"})


def decimal_reads(codes: Iterable[types.CodeType]) -> dict[StateRead, str]:
    """The decimal context as a setting the trace read, at the first project code that
    names the module or its types (``DECIMAL_NAMES``), if any."""
    for code in codes:
        if DECIMAL_NAMES.intersection(code.co_names):
            return {DECIMAL_READ: f"{code.co_filename}:{code.co_firstlineno}"}
    return {}


@dataclasses.dataclass(frozen=True)
class Tables:
    """What the profile hook looks events up in: Python getters by code object (a
    "call" event), C ones by id (a "c_call"; the getter is kept alive, so the id is its),
    the builtins whose kernels read settings in C++, by id, the code of
    the probes true only in a trace (a "return" event), torch.backends' directory."""

    getter_codes: dict[types.CodeType, StateRead]
    getter_builtins: dict[int, tuple[Any, StateRead]]
    kernel_builtins: dict[int, tuple[Any, tuple[StateRead, ...]]]
    probe_codes: dict[types.CodeType, str]
    backends_dir: str


@functools.cache
def tables() -> Tables:
    codes: dict[types.CodeType, StateRead] = {}
    builtins: dict[int, tuple[Any, StateRead]] = {}
    for module_name, names in _TORCH_GETTERS.items():
        module = importlib.import_module(module_name)
        for name in names:
            getter = getattr(module, name, None)
            read = StateRead(module_name, name, True)
            if isinstance(getter, types.FunctionType):
                codes[getter.__code__] = read
            elif isinstance(getter, types.BuiltinFunctionType):
                builtins[id(getter)] = (getter, read)
    return Tables(
        getter_codes=codes,
        getter_builtins=builtins,
        kernel_builtins={
            key: (builtin, tuple(StateRead(m, p, c, name) for m, p, c in reads))
            for key, (builtin, name, reads) in kernel_settings().items()
        },
        probe_codes={f.__code__: name for name, f in tracing.tracing_probes().items()},
        backends_dir=os.path.join(os.path.dirname(torch.backends.__file__), ""),
    )


def _holder(obj: object) -> tuple[str, str] | None:
    """The torch.backends module and attribute that hold ``obj`` (the object behind
    ``torch.backends.cuda.matmul``, ``torch.backends.mkldnn.matmul``)."""
    for name in sorted(n for n in list(sys.modules) if n.startswith("torch.backends")):
        module = sys.modules[name]
        for namespace in (vars(module), *(vars(k) for k in type(module).__mro__)):
            for attr, value in list(namespace.items()):
                if value is obj and not attr.startswith("_"):
                    return name, attr
    return None


def _descriptor_name(owner: object, descriptor: object) -> str | None:
    for klass in type(owner).__mro__:
        for attr, value in vars(klass).items():
            if value is descriptor:
                return attr
    return None


def backends_read(frame: types.FrameType) -> StateRead | str | None:
    """What a call of torch.backends code (``frame``, called from user code) reads: a
    ``StateRead``; a description of a read an artifact cannot repeat (a query taking
    arguments), to refuse; or None (a setter, a module's plain attribute)."""
    code = frame.f_code
    local = frame.f_locals
    name = code.co_name
    first = code.co_varnames[0] if code.co_argcount else None
    owner = local.get(first) if first else None
    module = str(frame.f_globals.get("__name__"))
    if name == "__get__":  # a flag such as torch.backends.mkldnn.enabled
        obj = local.get("obj")
        attr = _descriptor_name(obj, owner) if obj is not None else None
        if isinstance(obj, types.ModuleType) and attr:
            return StateRead(obj.__name__, attr, False)
        return None if obj is None else f"a {module} setting read through {type(obj).__name__}"
    if name == "__getattr__":  # torch.backends.cuda.matmul.allow_tf32 and the like
        if isinstance(owner, types.ModuleType):
            return None  # a module's plain attribute (a constant, a function)
        held = _holder(owner)
        attr = local.get("name", local.get("attr"))
        if held and isinstance(attr, str):
            return StateRead(held[0], f"{held[1]}.{attr}", False)
        return f"a {module} setting {attr!r}"
    if not name.startswith(("is_", "get_", "version")):
        return None  # setters and the rest: not a query
    shown = f"{module}.{name}()"
    target: types.ModuleType | None
    if isinstance(owner, types.ModuleType) and code.co_argcount == 1:
        target, path = owner, name  # a method of torch.backends.mkldnn's module class
    elif code.co_argcount == 0:
        target, path = sys.modules.get(module), name
    elif owner is not None and code.co_argcount == 1 and first == "self":
        # A method of an object a torch.backends module holds.
        held = _holder(owner)
        if held is None or getattr(getattr(owner, name, None), "__code__", None) is not code:
            return f"{shown} of a {type(owner).__name__}"
        return StateRead(held[0], f"{held[1]}.{name}", True)
    else:
        return f"{shown} with arguments"
    found = getattr(getattr(target, path, None), "__code__", None)
    if found is code and isinstance(target, types.ModuleType):
        return StateRead(target.__name__, path, True)
    return shown


def read_site(frame: types.FrameType | None) -> str | None:
    """``FILE:LINE`` of the user frame that made a read; None for library code."""
    if frame is None or not is_user_file(frame.f_code.co_filename):
        return None
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def call_site(frame: types.FrameType) -> str:
    """``FILE:LINE`` of the innermost user frame at or above ``frame`` (the user's line
    that led to a call in torch.nn's code), or of ``frame`` where no user frame is."""
    found: types.FrameType | None = frame
    while found is not None and not is_user_file(found.f_code.co_filename):
        found = found.f_back
    at = found or frame
    return f"{at.f_code.co_filename}:{at.f_lineno}"


def state_records(reads: dict[StateRead, str]) -> list[list[Any]]:
    """``PROCESS_STATE``: each setting read (with ``FILE:LINE`` of the read), with its
    value as the artifact's per-call check reads it again (``state_checks.state_getter``,
    ``runtime.setting_checks``)."""
    context = value_fingerprints.new_context(frozenset())
    records = []
    # Public settings first, each kind in the order it was read (a kernel's in its
    # table's: the fused kernels' flags before cuDNN's): a refusal names the first that
    # changed.
    for read, site in sorted(reads.items(), key=lambda item: item[0].module.startswith("torch._")):
        value = state_checks.state_getter(read.module, read.path, read.call)()
        records.append(
            [
                read.module,
                read.path,
                read.call,
                f"{read.shown} at {site}",
                value_fingerprints.fingerprint(value, context),
            ]
        )
    return records


def lowered_graph_reads(graphs: list[torch.fx.GraphModule], where: str) -> dict[StateRead, str]:
    """The settings the kernels of ``graphs`` chose by, where a lowering (Inductor's, in a
    Dynamo capture) baked the choice, each with ``FILE:LINE`` of the user's call (from
    the node's stack trace; ``where``, fn's definition, where it names none). A node
    calling a torch Python function (``F.multi_head_attention_forward``) counts what its
    body calls, as the library surface does (``library_surface.body_calls``)."""
    from precompile.capturing.library_surface import body_calls

    found: dict[StateRead, str] = {}
    # Per target, once: a graph calls one operator at many nodes (a ResNet's convolutions).
    # Keyed by identity (a target need not be hashable); the graphs hold every target.
    by_target: dict[int, list[tuple[str, tuple[tuple[str, str, bool], ...]] | None]] = {}
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            kernels = by_target.get(id(node.target))
            if kernels is None:
                targets = (node.target, *body_calls(node.target))
                kernels = by_target[id(node.target)] = [graph_kernel_settings(t) for t in targets]
            for kernel in kernels:
                if kernel is not None:
                    _note_kernel(found, node, kernel, where)
    return found


def _note_kernel(
    found: dict[StateRead, str],
    node: torch.fx.Node,
    kernel: tuple[str, tuple[tuple[str, str, bool], ...]],
    where: str,
) -> None:
    """Each setting of ``kernel`` (name, reads), at the user's line of ``node``."""
    name, reads = kernel
    user = [f"{file}:{line}" for file, line in tracing.node_sites(node) if is_user_file(file)]
    for module, path, call in reads:
        found.setdefault(StateRead(module, path, call, name), user[-1] if user else where)
