"""Dynamo's compile, package and guards, as the multi-graph capture uses them: what it
compiles, the traced code it records, how its guards pickle, and what it checks its
variants with. What the capture records while Dynamo compiles (graph breaks, bypassed
frames, grad-dependent reads, installed globals) is ``dynamo_recording``; the guards it
relaxes before they are serialized, ``dynamo_guard_relaxing``."""

from __future__ import annotations

import collections
import contextlib
import copyreg
import pickle
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from precompile._compat.patching import patched
from precompile._compat.prelude import GLOBAL_MODULE_HOOK_NAMES
from precompile.errors import PrecompileError
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


def self_deleting_globals() -> set[tuple[int, str]]:
    """The globals Dynamo has bound in modules for code it compiled (``_<id>_c<n>``,
    ``__compiled_fn_<n>``), each as (the id of the globals dict, the name): Dynamo's own
    bookkeeping, which its cleanup hook deletes when that code dies -- whenever the
    garbage collector frees it, in the middle of anything. Read from Dynamo's registry
    of those hooks; empty where Dynamo was never imported (then nothing bound them)."""
    utils = sys.modules.get("torch._dynamo.utils")
    instance = getattr(getattr(utils, "CleanupManager", None), "instance", None)
    found: set[tuple[int, str]] = set()
    for hooks in list(getattr(instance, "values", {}).values()):
        for hook in hooks if isinstance(hooks, list) else ():
            scope, name = getattr(hook, "scope", None), getattr(hook, "name", None)
            if isinstance(scope, dict) and isinstance(name, str):
                found.add((id(scope), name))
    return found


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


def on_global_hooks(entry: Any) -> bool:
    """Whether a guard entry reads torch's global module hook dicts
    (``torch.nn.modules.module._global_forward_hooks`` and friends, reached through the
    alias Dynamo binds for that module, or by attribute). Dynamo guards them by handle id
    (``DICT_KEYS_MATCH``, ``[11].__closure__...``), which comes from a per-process
    counter: such a guard cannot be rebuilt in another process. The driver checks these
    hooks itself (``MODULE_HOOKS["global"]``, by what each hook is), so they are driver
    enforced."""
    return global_hooks_path(str(getattr(entry, "name", ""))) is not None


def global_hooks_path(name: str) -> str | None:
    """The part of a Dynamo source name from torch's global module hook dicts on
    (``_global_forward_hooks[11].__closure__[0].cell_contents``), or None when the name
    does not go through them. What follows the dict is keyed by handle id, a per-process
    counter: no other process can follow such a path to the same object."""
    for holder in ("torch_dot_nn_dot_modules_dot_module']", "torch.nn.modules.module"):
        at = name.find(holder + "._global_")
        if at >= 0:
            attr = name[at + len(holder) + 1 :]
            if any(
                attr == hooks or attr.startswith((hooks + "[", hooks + "."))
                for hooks in GLOBAL_MODULE_HOOK_NAMES
            ):
                return attr
    return None


def global_hook_at(path: str) -> Any:
    """The hook a ``global_hooks_path`` names in this process (``_global_forward_hooks[11]``
    -> the hook registered under handle id 11), or None when it names no single hook."""
    dict_name, _, rest = path.partition("[")
    key, _, _ = rest.partition("]")
    if not key.isdigit():
        return None
    import torch.nn.modules.module as nn_module

    return (getattr(nn_module, dict_name, None) or {}).get(int(key))


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


def _cell_reduce(cell: Any, reduced: tuple[Any, ...]) -> tuple[Any, ...]:
    """A closure cell pickled as an empty-looking cell whose contents are set after it is
    memoized (pickle's ``BUILD`` with a slot state: ``setattr(cell, "cell_contents",
    value)``), not passed to its constructor: a cell whose contents reach the cell again
    (a recursive inner function: ``def act(x): ... act.scale``, its closure holds
    itself) is then met in the memo the second time instead of pickled forever. The
    unpickled cell holds the same value as before; only torch's own unpickler and
    pickle's standard ``BUILD`` run at load."""
    return (reduced[0], (None,), (None, {"cell_contents": cell.cell_contents}))


def _nested_function_reduce(
    pickler: Any, fn: types.FunctionType, reduced: tuple[Any, ...]
) -> tuple[Any, ...]:
    """A function defined in a local scope pickled as torch does (code, module, qualified
    name, closure), with what is not its identity set after it is memoized (``BUILD``):
    its defaults (torch passes them to the constructor, so a default holding the
    function recursed), its keyword-only defaults (torch drops them: the rebuilt guard
    on ``__kwdefaults__['k']`` found None), and the attributes of its ``__dict__`` (torch
    drops the ``__dict__``: ``act.scale``). Defaults no guard reads (neither the
    container nor the value is one of the guard tree's example values) are pickled as
    None: the unpickled function is only the example Dynamo rebuilds the guards from, so
    an unread default that cannot be pickled (a lock, an open file) does not fail the
    capture. A container a guard reads is kept whole, as the guard saw it."""
    code, module, qualname, defaults, closure = reduced[1]
    tree = getattr(pickler, "guard_tree_values", {})

    def read(value: Any) -> Any:
        return value if id(value) in tree else None

    slots: dict[str, Any] = {}
    if defaults is not None:
        kept = id(defaults) in tree or id(fn.__defaults__) in tree
        slots["__defaults__"] = defaults if kept else tuple(read(v) for v in defaults)
    kwdefaults = fn.__kwdefaults__
    if kwdefaults is not None:
        slots["__kwdefaults__"] = (
            kwdefaults if id(kwdefaults) in tree else {k: read(v) for k, v in kwdefaults.items()}
        )
    attributes = {k: v for k, v in vars(fn).items() if id(v) in tree}
    args = (code, module, qualname, None, closure)
    if not (attributes or slots):
        return (reduced[0], args)
    # A slot state must be a dict (the C unpickler refuses None there).
    return (reduced[0], args, (attributes or None, slots))


def _unread_attributes_missing(pickler: Any, obj: Any) -> None:
    """Torch's own rule for a module's attributes, applied to a plain object (an
    instance of a class outside torch pickled by the default protocol: its ``__dict__``
    as its state): an attribute no guard reads (its value is none of the guard tree's example
    values) that is not a tensor, module or callable is pickled as torch's missing
    placeholder. A config object a guard reads one flag of (``CFG.flag``) that also holds
    a lock, a file or a client then captures, as ``torch.compile`` runs it, instead of
    failing with "cannot pickle"."""
    import torch

    cls = type(obj)
    if (
        # torch's own state (the guards' state object) goes through this pickler too
        cls.__module__.partition(".")[0] == "torch"
        or isinstance(obj, (type, types.ModuleType, torch.Tensor, torch.nn.Module))
        or callable(obj)
        or cls.__reduce_ex__ is not object.__reduce_ex__
        or cls.__reduce__ is not object.__reduce__
        or getattr(cls, "__getstate__", object.__getstate__) is not object.__getstate__
        or hasattr(cls, "__setstate__")
    ):
        return
    state = getattr(obj, "__dict__", None)
    if type(state) is not dict:
        return
    tree = pickler.guard_tree_values
    for value in state.values():
        if id(value) in tree or callable(value):
            continue
        if isinstance(value, (torch.Tensor, torch.nn.Module)):
            continue
        pickler.missing_values[id(value)] = value


def _unnamed_module_function(obj: Any) -> bool:
    """Whether ``obj`` is a function of an imported module that its qualified name does
    not find there (a module-level lambda, a function bound under another name than its
    own); a local function (``<locals>``) is torch's own case."""
    if not isinstance(obj, types.FunctionType) or "<locals>" in obj.__qualname__:
        return False
    found: Any = sys.modules.get(obj.__module__)
    if found is None:
        return False
    for name in obj.__qualname__.split("."):
        found = getattr(found, name, None)
    return found is not obj


def _builtin(obj: Any) -> bool:
    """Whether ``obj`` is a member of the ``builtins`` module (``getattr``, ``dict``),
    which pickles by name. Torch marks as missing every leaf of a frame's locals no guard
    reads; a module's ``globals()`` held across a graph break has the builtins dict among
    them, and pickle calls ``getattr`` to rebuild every bound method it saves (the
    tensors' own reducer): saved as missing, the frame's tensors came back as torch's
    placeholder and its guards could not be rebuilt."""
    import builtins

    name = getattr(obj, "__name__", None)
    return isinstance(name, str) and getattr(builtins, name, None) is obj


def raised_pickling_guards(error: BaseException) -> bool:
    """Whether ``error`` (or what it was raised from) came out of Dynamo's guard pickler
    (``pickle_guards_state``): a value a guard checks could not be saved, which is not a
    failure of the user's code at the line Dynamo was tracing."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        tb = current.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_name == "pickle_guards_state":
                return True
            tb = tb.tb_next
        current = current.__cause__ or current.__context__
    return False


@contextlib.contextmanager
def guard_examples_pickled_as_read() -> Iterator[None]:
    """While capturing: Dynamo pickles the guards' example values (a registry dict read
    by a guard is pickled with every function it holds, an object with every attribute)
    and rebuilds the guards from the unpickled ones, at capture and at load.

    - Its pickler passes a local function's closure cells and defaults to their
      constructors, so a function reachable from its own closure (any recursive inner
      function) recursed until ``RecursionError``; and it drops a function's keyword-only
      defaults and attributes, so a guard reading one (``__kwdefaults__['k']``,
      ``act.scale``) could not be rebuilt. Cells and local functions are pickled with
      those parts set after the object is memoized instead (``_cell_reduce``,
      ``_nested_function_reduce``): any cycle through a function unpickles, and every
      part a guard reads is there.
    - It pickles a plain object whole, so one unpicklable attribute no guard reads
      failed the capture: such attributes are left out as torch leaves a module's out
      (``_unread_attributes_missing``).
    - It marks ``getattr`` missing where a frame's locals hold the builtins dict (a
      module's ``globals()`` across a graph break), and every bound method it pickles
      (the tensors' reducer) is rebuilt through ``getattr``: builtins are pickled by
      name (``_builtin``)."""
    from torch._dynamo.guards import GuardsStatePickler

    original = GuardsStatePickler.reducer_override

    def reducer_override(self: Any, obj: Any) -> Any:
        _unread_attributes_missing(self, obj)
        if id(obj) in self.missing_values and _builtin(obj):
            del self.missing_values[id(obj)]
        if _unnamed_module_function(obj) and id(obj) not in self.missing_values:
            # ``lam = lambda x, k=2.0: ...`` at module level: its qualified name
            # (``<lambda>``) finds nothing in its module, and torch saved it as missing
            # (a guard on ``lam.__defaults__`` then never rebuilt). Saved as torch saves
            # a local function: its code in its module's globals.
            unpickle = type(self)._unpickle_nested_function
            parts = (obj.__code__, obj.__module__, obj.__qualname__, obj.__defaults__)
            return _nested_function_reduce(self, obj, (unpickle, (*parts, obj.__closure__)))
        reduced = original(self, obj)
        if isinstance(reduced, tuple) and len(reduced) == 2:
            if reduced[0] == type(self)._unpickle_cell:
                return _cell_reduce(obj, reduced)
            if reduced[0] == type(self)._unpickle_nested_function and isinstance(
                obj, types.FunctionType
            ):
                return _nested_function_reduce(self, obj, reduced)
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


def serialize_code(code: types.CodeType) -> Any:
    from torch._dynamo.package import SerializedCode

    return SerializedCode.from_code_object(code)


def builtins_key_of(guards_state: bytes) -> str | None:
    """The globals key Dynamo minted (from a counter) for the builtins dict a variant's
    guards and bytecode read through."""
    from torch._dynamo.package import load_guards_state

    try:
        state = load_guards_state(guards_state)
    except Exception as error:
        # The first load of what Dynamo saved: a value in it that pickles but does not
        # unpickle (a torch.Generator a module holds) raised out of the capture raw.
        raise PrecompileError(
            f"the guards Dynamo saved for this capture cannot be loaded back "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
            f"an artifact could not check its calls",
            hint="keep objects that do not survive pickling (a torch.Generator, an open "
            "file, a lock) out of what fn reads: seed the default generator, or draw random "
            "tensors outside fn and pass them in",
        ) from error
    return state.output_graph.name_of_builtins_dict_key_in_fglobals


def captured_guard_values(
    guards_state: bytes, code: types.CodeType, scope: dict[str, Any]
) -> dict[str, Any]:
    """Source name -> value, for each plain value (a number, string, None, a tuple of
    them) Dynamo's guard builder reads while rebuilding a variant's guards in this
    process, the capturing one: what each guard expects, as the capture saw it. A load
    rebuilds with these (``_compat.runtime.dynamo_serving_runtime``), not with what its
    own process reads there. Empty where the guards do not rebuild here (the load then
    refuses as well)."""
    from torch._dynamo import guards
    from torch._dynamo.package import load_guard_manager, load_guards_state

    found: dict[str, Any] = {}
    read = guards.GuardBuilder.get

    def plain(value: Any) -> bool:
        if hasattr(type(value), "n_sequence_fields"):
            # A struct sequence (``sys.flags``): no pickle names its class, and Dynamo
            # guards the fields read (plain values, kept) and its type, not the whole.
            return False
        if isinstance(value, (tuple, frozenset)):
            return all(map(plain, value))
        return value is None or type(value) in (bool, int, float, complex, str, bytes)

    def get(self: Any, guard_or_source: Any, closure_vars: Any = None) -> Any:
        value = read(self, guard_or_source, closure_vars)
        source = getattr(guard_or_source, "originating_source", guard_or_source)
        name = getattr(source, "name", None)
        if isinstance(name, str) and plain(value):
            found[name] = value
        return value

    try:
        with patched(guards.GuardBuilder, "get", get):
            load_guard_manager(load_guards_state(guards_state), code, scope)
    except Exception:
        return {}
    return found


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


def source_name(source: Any) -> str | None:
    """A Dynamo source's name in Dynamo's words (``L['x']``): the name its guards use."""
    name = getattr(source, "name", None)
    if callable(name):  # a method in some torch versions, a property in 2.13
        name = name()
    return name if isinstance(name, str) else None


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
