"""What a single-graph trace depended on besides its tensors, recorded for the artifact.

make_fx runs the user's Python once and keeps only tensor operations, so every plain
value that Python read is baked in: a module's type and attributes (``eps``, a user's
``self.scale``), module-level values the traced functions read, the hooks around each
module call. ``fx_watch`` watches the trace (which code ran, which globals it read);
this module records fingerprints of that state (``precompile.runtime.value_fingerprints``),
which the artifact recomputes from the live objects to refuse a call whose state
differs (``fx_side_effects`` refuses what the trace itself changed).

Which attributes count as read is decided by name: an attribute of a module (or of an
object a module or global holds) is recorded when its name is one the traced code loads
(``co_names`` and string constants of every user function and every ``torch.nn``
function that ran). That over-approximates what was read -- a change to an attribute of
the same name that the trace did not read is refused too -- and it misses an attribute
read under a computed name (``getattr(self, f"w{i}")``).
"""

from __future__ import annotations

import builtins
import dataclasses
import io
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch

from precompile._compat.prelude import global_module_hooks
from precompile.capturing import fx_process_state, library_surface, live_functions, neutral_reads
from precompile.capturing.bytecode_names import (
    attribute_chains,
    builtin_loads,
    global_loads,
    keyed_uses,
    reaches_globals,
)
from precompile.capturing.fx_watch import CallLog, read_names
from precompile.errors import PrecompileError
from precompile.locations import is_project_file
from precompile.runtime import class_fingerprints, hook_records, state_checks, value_fingerprints

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
    #: The global dicts the traced code read only by constant keys, with those keys
    #: (sorted): their ``values`` are fingerprints of those keys alone
    #: (``value_fingerprints.keyed_fingerprint``).
    keyed: dict[str, list[Any]] = dataclasses.field(default_factory=dict)


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
    #: or None where every name in ``names`` counts (``MODULE_READS``); a name read only
    #: for its truth test is ``[TRUTH_ONLY, name]`` (``value_fingerprints.split_reads``).
    module_reads: list[list[list[Any] | None]] = dataclasses.field(default_factory=list)
    #: Ruled reads the graph could not show harmless, with why (``MODULE_READ_NOTES``):
    #: ``[module argument index, submodule path, attribute, why]``.
    read_notes: list[list[Any]] = dataclasses.field(default_factory=list)


def _context(
    names: Any,
    training: bool,
    near: tuple[str, ...],
    classes: dict[Any, None] | None = None,
    made: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A fingerprinting context that looks for the names of identity-only objects in
    the traced code's modules first (``near``), collecting the user classes it reaches
    into ``classes`` (shared by the contexts of one capture), listed in ``made``: the
    functions the contexts watch are what ``refuse_unwatched_functions`` holds the
    trace's code against."""
    context = value_fingerprints.new_context(names, training)
    context["near"] = near
    if classes is not None:
        context["classes"] = classes
    if made is not None:
        made.append(context)
    return context


def _near_modules(log: CallLog) -> tuple[str, ...]:
    """The modules of the project code the trace ran, by name: where a sentinel the
    code compares against is most likely bound."""
    return tuple(
        sorted({str(log.scopes[c].get("__name__")) for c in log.project_codes() if c in log.scopes})
    )


def module_reads(
    modules: list[torch.nn.Module],
    reads: dict[int, set[str] | None],
    truths: dict[int, dict[str, bool]] | None = None,
) -> list[list[list[Any] | None]]:
    """``MODULE_READS``: per module argument, per submodule (``named_modules`` order),
    the attribute names the trace read on it, sorted; None where its reads were not
    seen (``recording_module_reads``). After them, ``[TRUTH_ONLY, name]`` for each
    name read only for its truth test, ``[TRUTH_ONLY, name, True]`` where the module or
    its class held it at capture, whose deletion is refused (``truths``:
    ``neutral_reads.settle_training_only_reads``)."""
    out: list[list[list[Any] | None]] = []
    for m in modules:
        row: list[list[Any] | None] = []
        for _, sub in m.named_modules():
            seen = reads.get(id(sub))
            held = (truths or {}).get(id(sub), {})
            row.append(
                None
                if seen is None
                else [
                    *sorted(seen),
                    *(
                        [value_fingerprints.TRUTH_ONLY, n, True]
                        if held[n]
                        else [value_fingerprints.TRUTH_ONLY, n]
                        for n in sorted(held)
                    ),
                ]
            )
        out.append(row)
    return out


def _module_records(
    modules: list[torch.nn.Module],
    names: Any,
    training: bool,
    near: tuple[str, ...],
    classes: dict[Any, None],
    reads: list[list[list[Any] | None]],
    made: list[dict[str, Any]] | None = None,
) -> list[list[Any]]:
    context = _context(names, training, near, classes, made)
    return [
        [
            value_fingerprints.module_fingerprint(
                sub, context, children=False, own=own, truth=truth
            )
            for (_, sub), (own, truth) in zip(
                m.named_modules(), map(value_fingerprints.split_reads, row)
            )
        ]
        for m, row in zip(modules, reads)
    ]


def _class_records(
    modules: list[torch.nn.Module],
    names: Any,
    training: bool,
    near: tuple[str, ...],
    classes: dict[Any, None],
    made: list[dict[str, Any]] | None = None,
    truth: dict[Any, frozenset[str]] | None = None,
) -> list[tuple[str, Any]]:
    """Per submodule class, and per user class the other records reached (a global
    class, the class of a config object), its class-level values; ``truth``: per
    class, the names read only for their truth test (``neutral_reads.class_truth_names``),
    recorded by their truth kind."""
    context = _context(names, training, near, classes, made)
    context[class_fingerprints.CLASS_TRUTH] = {
        state_checks.type_name(c): read for c, read in (truth or {}).items()
    }
    subs = dict.fromkeys(type(sub) for m in modules for sub in m.modules())
    return [
        (state_checks.type_name(c), record)
        for c, record in class_fingerprints.reached_classes(subs, context)
    ]


def _read_through_globals(
    code: types.CodeType, loaded: tuple[str, ...], scope: dict[str, Any], table: dict[str, Any]
) -> list[str]:
    """The globals ``code`` reads through its module's own dict (``globals()["K"]``,
    ``globals().get("K", d)``, ``"K" in globals()``), read as a load of each such
    name is: a name absent at capture must stay absent (``loaded``: the names ``code``
    loads as globals, ``global_loads``). Refused where ``code`` uses
    ``globals()`` any other way (its length, its items, bound to a local): what that
    depends on is the whole namespace, which no record follows."""
    if "globals" in scope or table.get("globals") is not builtins.globals:
        return []
    if "globals" not in loaded:
        return []
    keys = keyed_uses(code, "globals", scope, called=True)
    if keys is None:
        from precompile.locations import definition_location

        raise PrecompileError(
            f"{code.co_qualname} reads its module's namespace through globals() other "
            f"than by constant names (globals()['K'], globals().get('K')): what it "
            f"computes may depend on every global of the module, which a single graph "
            f"cannot follow",
            invariant=1,
            location=definition_location(code),
            hint="read the globals by name, or pass what fn needs as an argument; "
            "precompile.DynamoTracer() guards what such code reads",
        )
    return [k for k in sorted(keys, key=repr) if isinstance(k, str)]


def _global_values(
    log: CallLog,
    names: Any,
    training: bool,
    classes: dict[Any, None] | None = None,
    made: list[dict[str, Any]] | None = None,
) -> list[GlobalRead]:
    """Per user module, the values its traced functions loaded as globals; a name that
    resolved through the builtins is recorded as absent from the module, and the
    builtin itself under a ``builtins`` record (both are checked). An imported project module (``import cfgmod``
    then ``cfgmod.SCALE``) is read like the code's own globals: its values under the
    names the traced code reads, and its dict is watched the same way."""
    by_module: dict[str, GlobalRead] = {}
    context = _context(names, training, _near_modules(log), classes, made)
    pending: list[types.ModuleType] = []
    # Per (module, global name): the traced codes that load it; and each module's scope.
    loads: dict[tuple[str, str], list[types.CodeType]] = {}
    read_scopes: dict[str, dict[str, Any]] = {}
    for code in log.project_codes():
        scope = log.scopes.get(code)
        if scope is None:
            continue
        module = str(scope.get("__name__"))
        read_scopes[module] = scope
        read = by_module.setdefault(module, GlobalRead(module, scope.get("__file__"), {}))
        held = scope.get("__builtins__", builtins)
        table = held if isinstance(held, dict) else vars(held)
        loaded = global_loads(code)
        through = _read_through_globals(code, loaded, scope, table)
        for name in [*loaded, *through]:
            if name not in scope:
                if name in through:  # ``globals().get("K", d)`` of a K not bound
                    read.values[name] = ("absent",)
                elif name in table:
                    # Resolved through the builtins, whose result the graph baked
                    # (``len(xs)``): the module must not bind the name later, and the
                    # builtin must stay what it was (``builtins.abs`` patched).
                    read.values[name] = ("absent",)
                    shared = by_module.setdefault("builtins", GlobalRead("builtins", None, {}))
                    shared.values[name] = value_fingerprints.fingerprint(table[name], context)
                continue
            if isinstance(scope[name], types.ModuleType):
                pending.append(scope[name])
            else:
                read.values[name] = None  # fingerprinted below, once every load is seen
                loads.setdefault((module, name), []).append(code)
    # The keyed rule below holds only where a global load is the one way traced code
    # reaches the dict: none that may reach a module's globals otherwise (``globals()``,
    # ``vars(mod)``, ``mod.__dict__``, ``sys.modules``, ``getattr(mod, name)``).
    keyed_ok = not any(reaches_globals(code) for code in log.project_codes())
    for (module, name), codes in loads.items():
        read = by_module[module]
        value = read_scopes[module][name]
        # A plain dict (exactly ``dict``: a subclass's lookups run its own code, and it
        # is recorded whole with its class) every traced load of which reads constant
        # keys (``CFG["a"]``, ``"b" in CFG``): the graph depends on those keys alone, so
        # a key added that no traced code looks up changes nothing served (Dynamo
        # guards the same).
        keys: set[Any] | None = set() if type(value) is dict and keyed_ok else None
        for code in codes:
            # A key held by a module global (``CFG[K]``) is looked up in the code's own
            # globals; ``K`` is itself a load of that code, so recorded above.
            used = keyed_uses(code, name, log.scopes.get(code)) if keys is not None else None
            keys = None if used is None or keys is None else keys | used
        if keys is None:
            read.values[name] = value_fingerprints.fingerprint(value, context)
        else:
            read.keyed[name] = sorted(keys, key=repr)
            read.values[name] = value_fingerprints.keyed_fingerprint(
                value, read.keyed[name], context
            )
    table = vars(builtins)
    library = [n for n in _library_builtin_loads(log) if n in table]
    if library:
        shared = by_module.setdefault("builtins", GlobalRead("builtins", None, {}))
        for name in library:
            if name not in shared.values:
                shared.values[name] = value_fingerprints.fingerprint(table[name], context)
    seen: set[str] = set()
    asked = _names_asked_by_string(log)
    while pending:
        module_value = pending.pop()
        module = module_value.__name__
        file = getattr(module_value, "__file__", None)
        if module in seen or module == "__main__" or not (file and is_project_file(file)):
            continue
        seen.add(module)
        read = by_module.setdefault(module, GlobalRead(module, file, {}))
        state = vars(module_value)
        for name, value in list(state.items()):
            if name not in names or name.startswith("__"):
                continue
            if isinstance(value, types.ModuleType):
                pending.append(value)  # ``pkg.cfgmod.SCALE``
            elif name not in read.values or name in read.keyed:
                # Read through the module as well (``cfgmod.CFG``): whole, not keyed.
                read.keyed.pop(name, None)
                read.values[name] = value_fingerprints.fingerprint(value, context)
        for name in asked - state.keys() - read.values.keys():
            # ``getattr(cfgmod, "SCALE", 1.0)``, ``hasattr(cfgmod, "FAST")`` of a name
            # the module did not bind: the graph baked its absence.
            read.values[name] = ("absent",)
    for module_value, names_read in _standard_library_reads(log).items():
        _standard_library_values(module_value, names_read, by_module, context)
    return [r for _, r in sorted(by_module.items()) if r.values]


#: Values of standard-library modules that other records check, or that no per-call
#: check could hold: ``os.environ`` is read key by key (the environment reads of
#: ``fx_watch``), and ``sys.modules`` changes with every import anywhere in the process.
_CHECKED_ELSEWHERE = {("os", "environ"), ("sys", "modules")}


def _is_standard_library(module: types.ModuleType) -> bool:
    """Whether ``module`` is Python's own: a top-level name of the standard library, and
    not a project file that happens to bear one (``trace.py``, ``types.py``)."""
    file = getattr(module, "__file__", None)
    if file and is_project_file(file):
        return False
    return module.__name__.partition(".")[0] in sys.stdlib_module_names


def _standard_library_reads(log: CallLog) -> dict[types.ModuleType, set[str]]:
    """Per standard-library module, the names traced project code reads off it: the
    attribute chains of its code (``sys.argv``, ``os.path.sep``, through an alias or an
    import inside the function, ``from sys import argv``), and where the code looks names
    up by string (``getattr(sys, "frozen", False)``), its identifier constants. Read off
    the module itself, not by name anywhere: ``os.path.join`` is no read of ``sys.path``."""
    reads: dict[types.ModuleType, set[str]] = {}
    for code in log.project_codes():
        scope = log.scopes.get(code) or {}
        by_string = "getattr" in code.co_names or "hasattr" in code.co_names
        asked = (
            {c for c in code.co_consts if isinstance(c, str) and c.isidentifier()}
            if by_string
            else set()
        )
        for kind, root, attributes in attribute_chains(code):
            value = scope.get(root) if kind == "global" else sys.modules.get(root)
            while isinstance(value, types.ModuleType) and _is_standard_library(value):
                names = reads.setdefault(value, set())
                names |= {name for name in asked if not name.startswith("__")}
                if not attributes:
                    break
                names.add(attributes[0])
                value, attributes = vars(value).get(attributes[0]), attributes[1:]
    return reads


def _standard_library_values(
    module_value: types.ModuleType,
    names: set[str],
    by_module: dict[str, GlobalRead],
    context: dict[str, Any],
) -> None:
    """The data a standard-library module holds under ``names`` (``sys.argv``,
    ``time.timezone``, ``tempfile.tempdir``, ``sys.flags``): process state the graph
    baked like a global of the user's own, so checked per call the same way, as are the
    functions it holds (one replaced, as ``mock.patch`` does, is not what the graph
    baked); a name it does not bind, looked up by string, as absent. Not recorded: its
    submodules (each read off is its own record) and its streams (``sys.stdout``: where
    output goes, whose buffer every write changes; a forward that prints must stay
    served)."""
    module = module_value.__name__
    state = vars(module_value)
    # No file: the module is the interpreter's, found by name wherever it is installed.
    read = by_module.setdefault(module, GlobalRead(module, None, {}))
    for name in sorted(names):
        if name.startswith("__") or (module, name) in _CHECKED_ELSEWHERE:
            continue
        if name not in state:
            read.values[name] = ("absent",)
            continue
        value = state[name]
        if isinstance(value, (types.ModuleType, io.IOBase)):
            continue
        read.values[name] = value_fingerprints.fingerprint(value, context)


def _names_asked_by_string(log: CallLog) -> set[str]:
    """The names traced project code may look up by string (``getattr(m, "K", d)``,
    ``hasattr(m, "K")``): the identifier constants of the codes that load ``getattr``
    or ``hasattr``. By name, so conservative, as ``names`` is."""
    asked: set[str] = set()
    for code in log.project_codes():
        if "getattr" in code.co_names or "hasattr" in code.co_names:
            asked.update(c for c in code.co_consts if isinstance(c, str) and c.isidentifier())
    return {name for name in asked if not name.startswith("__")}


def entry_record(
    fn: Any,
    names: Any,
    training: bool,
    near: tuple[str, ...] = (),
    where: Any = None,
    classes: dict[Any, None] | None = None,
    made: list[dict[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """The captured function's own baked values: a call of it passes every positional
    argument, so its defaults, keyword defaults and closure cells are read as they were
    at capture -- and a ``functools.partial``'s arguments and keywords. None for a
    function that holds none."""
    import functools

    if isinstance(fn, functools.partial):
        return _partial_entry_record(fn, names, training, near, where, classes, made)
    func = getattr(fn, "__func__", fn)
    if not isinstance(func, types.FunctionType):
        return None
    if not (func.__defaults__ or func.__kwdefaults__ or func.__closure__):
        return None
    context = _context(names, training, near, classes, made)
    return {
        "module": str(func.__module__),
        "file": func.__globals__.get("__file__"),
        "qualname": func.__qualname__,
        "fingerprint": value_fingerprints.fingerprint(func, context),
    }


def _partial_entry_record(
    fn: Any,
    names: Any,
    training: bool,
    near: tuple[str, ...],
    where: Any,
    classes: dict[Any, None] | None,
    made: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A partial has no name of its own: it is found again by the module-level name
    bound to it (the module of the function it wraps first), and checked whole."""
    inner = getattr(fn.func, "__func__", fn.func)
    home = str(getattr(inner, "__module__", None) or "")
    context = _context(names, training, (home, *near), classes, made)
    named = value_fingerprints.identity_name(fn, context)
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
        "fingerprint": value_fingerprints.fingerprint(fn, context),
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
    truths: dict[int, dict[str, bool]] | None = None,
    outside: set[type] | None = None,
) -> Dependencies:
    """What the trace depended on; ``reads`` (``recording_module_reads``) narrows each
    submodule's recorded attributes to those the trace read on it, ``truths`` names
    those it read only for their truth test (``module_reads``); ``outside``: the classes
    of modules read that are not the arguments' submodules (None: not known)."""
    refuse_trace_only_reads(log, where)
    names = read_names(log)
    near = _near_modules(log)
    # The user classes every record reaches, whose class-level values are recorded last.
    classes: dict[Any, None] = {}
    made: list[dict[str, Any]] = []
    entry = entry_record(fn, names, training, near, where, classes, made)
    read_rows = module_reads(modules, reads or {}, truths)
    module_records = _module_records(modules, names, training, near, classes, read_rows, made)
    global_records = _global_values(log, names, training, classes, made)
    # In a pass by the trace's read names, as serving's check_globals does it: a
    # callable object hook's ``self.k`` is part of its identity, and its class's
    # values are recorded with the other classes reached (computed after this).
    global_hooks = hook_records.global_hooks_fingerprint(
        global_module_hooks(), outer=_context(names, training, near, classes, made)
    )
    class_truth = neutral_reads.class_truth_names(
        modules, reads or {}, truths or {}, log.codes, outside
    )
    class_records = _class_records(modules, names, training, near, classes, made, class_truth)
    refuse_unwatched_functions(log, made, fn, modules, classes, where)
    return Dependencies(
        entry=entry,
        names=names,
        modules=module_records,
        classes=class_records,
        globals=global_records,
        global_hooks=global_hooks,
        process_state=_process_state_records(log),
        surface=surface_record(modules, log),
        module_reads=read_rows,
    )


def refuse_unwatched_functions(
    log: CallLog,
    made: list[dict[str, Any]],
    fn: Any,
    modules: list[torch.nn.Module],
    classes: dict[Any, None],
    where: Any,
) -> None:
    """Refuse a trace that ran a project function object nothing here watches
    (``live_functions``): make_fx compares per call the functions its fingerprints hold
    (``made``'s contexts), fn itself, the functions of the classes they reached and of
    the modules' classes (their class records), and what those hold in closure cells;
    a function held only by C state (an lru_cache's results, a WeakValueDictionary's
    weak reference) would be served stale once its code or its holder's entry
    changed."""
    watched: list[Any] = [fn, getattr(fn, "__func__", None), getattr(fn, "func", None)]
    for context in made:
        watched += context["shallow"]
    owners = {
        base
        for cls in [*classes, *(type(sub) for m in modules for sub in m.modules())]
        if isinstance(cls, type)
        for base in cls.__mro__
    }
    for owner in owners:
        for value in list(vars(owner).values()):
            target = value.fget if isinstance(value, property) else value
            watched += [target, getattr(target, "__func__", None)]
    # Module and global hooks: the hook checks watch each (one an inference artifact
    # leaves out, a forward hook that only marks its output as requiring grad, changes
    # no value it computes).
    hook_dicts = [*global_module_hooks()]
    for m in modules:
        for sub in m.modules():
            hook_dicts += [
                d
                for n, d in list(vars(sub).items())
                if n.endswith("_hooks") and isinstance(d, dict)
            ]
    for hooks in hook_dicts:
        for hook in list(hooks.values()):
            watched += [hook, getattr(hook, "__func__", None), getattr(hook, "func", None)]
            watched += [vars(c).get("__call__") for c in type(hook).__mro__]
    codes = log.project_codes()
    watched = live_functions.closure_functions(watched)
    # A function an lru_cache holds is what eager calls next time: one running a code
    # made under a cached maker the trace called must be watched itself, by identity.
    # The trace ran the maker for real: a code no cache holds a function of came by
    # another way, and is ruled as any other.
    by_cache = live_functions.unwatched_cached(
        codes, live_functions.cached_makers(codes, log.scopes), watched
    )
    live_functions.refuse_unwatched(
        by_cache or live_functions.unwatched_live(codes, watched), where
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
    """Each torch setting user code (or a kernel the graph bakes the choice of) read."""
    decimal = fx_process_state.decimal_reads(log.project_codes())
    return fx_process_state.state_records({**decimal, **log.state})


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


def param_free(module: object) -> bool:
    """A module with no parameters and no buffers bakes no tensor into a trace."""
    return (
        isinstance(module, torch.nn.Module)
        and next(module.parameters(), None) is None
        and next(module.buffers(), None) is None
    )
