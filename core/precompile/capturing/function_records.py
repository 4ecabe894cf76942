"""Records of the functions a capture ran through: module, qualified name, file (relative
to the artifact), first line and a digest of the function's own source.

Loading an artifact compares each with the live source, and the language server compares
them with the workspace to call an artifact stale; both use ``precompile.runtime.source_digest``,
so a change to another function in the same file is not a change to this one. Each record
also carries what the function reads from outside it (``reads``: its globals, its class's
attributes, a project module's attributes), by the digests of the statements that bind
them (``precompile.source_bindings``), which the language server compares too.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
import types
from collections.abc import Iterable, Iterator
from typing import Any

from precompile.artifact.pair import artifact_relative
from precompile.capturing.fx_watch import reinstall_profiler
from precompile.locations import is_project_file, is_project_module
from precompile.runtime.source_digest import (
    function_node,
    node_source,
    parse_module,
    source_digest,
)
from precompile.source_bindings import (
    binding_digests,
    binding_reach,
    function_reads,
    imported_names,
    local_imports,
    star_sources,
)


def _module_text(code: types.CodeType) -> tuple[str | None, str | None]:
    """The source of the module ``code`` was defined in, as this process loaded it."""
    module = inspect.getmodule(code)
    if module is None:
        return None, None
    try:
        return module.__name__, inspect.getsource(module)
    except (OSError, TypeError):
        return module.__name__, None


@functools.lru_cache(maxsize=32)
def _parsed(text: str) -> Any:
    """``parse_module(text)``, parsed once per process while the text is unchanged: a
    notebook or a language-server worker recaptures after each edit, mostly of modules
    the edit did not touch, and a long module takes tens of milliseconds to parse. The
    tree is only read (``function_node``)."""
    return parse_module(text)


@functools.lru_cache(maxsize=32)
def _imported(text: str, package: str | None) -> dict[str, tuple[str, str]]:
    """``imported_names`` of a module's text, once per process while it is unchanged."""
    return imported_names(_parsed(text), package)


def _read(module: str, path: str, text: str, scope: str, names: Any) -> dict[str, Any]:
    """One row of a record's ``reads``: ``names`` as bound in ``module`` (at its top
    level, or in the class ``scope``) now."""
    return {
        "module": module,
        "path": path,
        "scope": scope,
        "names": binding_digests(text, _parsed(text), names, scope),
        "module_sha256": source_digest(text),
    }


def _reads(code: types.CodeType, node: Any, text: str, artifact_path: str) -> list[dict[str, Any]]:
    """What the function of ``code`` (its ``node`` in the tree of its module's ``text``) reads from
    outside itself, as ``reads`` rows: the names it loads, as its module binds them (a
    name it imports, as the module it comes from binds it, hop by hop); the attributes it
    reads from its first parameter (``self.k``, ``type(self).k``), in the bodies of the
    project classes of its class's MRO and of its subclasses'; and the attributes it
    reads from a class or project module its globals hold, where that class (and its
    bases) or module binds them."""
    module = inspect.getmodule(code)
    if module is None:
        return []
    names, first, attributes, chains = function_reads(node)
    rows_local = _local_import_reads(module, node, attributes, chains, artifact_path)
    path = artifact_relative(code.co_filename, artifact_path) or code.co_filename
    rows = [_read(module.__name__, path, text, "", names)]
    qualname = getattr(code, "co_qualname", code.co_name)
    owner = qualname.rpartition(".")[0]
    if first in attributes and owner and "<locals>" not in qualname:
        cls: Any = module
        for part in owner.split("."):
            cls = getattr(cls, part, None)
        if isinstance(cls, type):
            read = sorted(attributes[first])
            rows += _class_reads(cls, read, artifact_path)
            rows += _nested_class_reads(cls, chains.get(first, set()), artifact_path)
            # The instance may be a subclass's, whose body (or __init__) shadows what
            # the method reads through self: the method runs as the base's code.
            skip = set(cls.__mro__)
            for sub in _subclasses(cls):
                rows += _class_reads(sub, read, artifact_path, skip=tuple(skip))
                skip.update(sub.__mro__)
    # Besides the names read, those their bindings read in turn: a global made from a
    # name imported from a project module (``from .config import BASE`` then ``X = BASE
    # * 2``) reads BASE as its module binds it; only a name read has its attributes read.
    for name in [*binding_reach(text, _parsed(text), names), *names]:
        value = vars(module).get(name)
        if not isinstance(value, (type, types.ModuleType)):
            rows += _imported_reads(module, text, name, artifact_path)
        read = sorted(attributes.get(name, ())) if name in names else []
        if not read:
            continue
        if isinstance(value, type):
            rows += _class_reads(value, read, artifact_path)
            rows += _nested_class_reads(value, chains.get(name, set()), artifact_path)
        elif isinstance(value, types.ModuleType):
            if value is not module:
                row = _module_read(value, read, artifact_path)
                if row is not None:
                    rows.append(row)
            rows += _chain_reads(value, chains.get(name, set()), artifact_path)
        elif is_project_module(sys.modules.get(type(value).__module__)):
            # An instance of a project class (``SETTINGS = Settings()``): what it does
            # not hold itself it reads from its class's body (a dataclass's defaults).
            rows += _class_reads(type(value), read, artifact_path)
    return rows + rows_local


def _local_import_reads(
    module: types.ModuleType,
    node: Any,
    attributes: dict[str, set[str]],
    chains: dict[str, set[tuple[str, ...]]],
    artifact_path: str,
) -> list[dict[str, Any]]:
    """``reads`` rows of what the function imports itself (``from .helper import K``
    inside it): K as the project module it comes from binds it, or, for a module it
    imports (``from . import helper as h``, ``import pkg.helper``), the attributes it
    reads from that module, as a module global's would be."""
    import importlib.util

    rows: list[dict[str, Any]] = []
    for name, (written, attr) in sorted(local_imports(node).items()):
        try:
            absolute = importlib.util.resolve_name(written, module.__package__)
        except (ImportError, ValueError):
            continue
        source_module = sys.modules.get(absolute)
        value: Any = source_module if attr is None else getattr(source_module, attr, None)
        if isinstance(value, types.ModuleType):
            read = sorted(attributes.get(name, ()))
            row = _module_read(value, read, artifact_path) if read else None
            rows += [row] if row is not None else []
            rows += _chain_reads(value, chains.get(name, set()), artifact_path)
        elif attr is not None:
            row = _module_read(source_module, [attr], artifact_path)
            rows += [row] if row is not None else []
    return rows


def _chain_reads(
    module: types.ModuleType, chains: set[tuple[str, ...]], artifact_path: str
) -> list[dict[str, Any]]:
    """``reads`` rows of attribute chains read from ``module`` through its submodules
    (``pkg.helper.K`` after ``import pkg.helper``): the first attribute along a chain
    that is not a module, in the module that holds it; where that is a class, the
    attribute read from it (and through the classes nested in it), in its body."""
    rows = []
    for chain in sorted(chains):
        holder: Any = module
        depth = 0  # the chain's parts that are modules
        while depth < len(chain) - 1:
            inner = getattr(holder, chain[depth], None)
            if not isinstance(inner, types.ModuleType):
                break
            holder, depth = inner, depth + 1
        if depth:
            row = _module_read(holder, [chain[depth]], artifact_path)
            if row is not None:
                rows.append(row)
        value = getattr(holder, chain[depth], None)
        if isinstance(value, type) and depth + 1 < len(chain):
            # ``config.Holder.K``, ``config.Holder.Sub.K``: where the class binds it.
            rows += _class_reads(value, [chain[depth + 1]], artifact_path)
            rows += _nested_class_reads(value, {chain[depth + 1 :]}, artifact_path)
    return rows


def _nested_class_reads(
    cls: type, chains: set[tuple[str, ...]], artifact_path: str
) -> list[dict[str, Any]]:
    """``reads`` rows of attribute chains through classes nested in ``cls``
    (``Holder.Sub.K``, ``self.Cfg.K``): each attribute read from a nested class, in the
    bodies of its project classes. A class statement's own row digests its header, not
    its body, so without these an edit of ``K = 2.0`` inside ``class Sub`` went unseen."""
    rows = []
    for chain in sorted(chains):
        holder: Any = cls
        for depth, part in enumerate(chain[:-1]):
            inner = inspect.getattr_static(holder, part, None)
            if not isinstance(inner, type):
                break
            rows += _class_reads(inner, [chain[depth + 1]], artifact_path)
            holder = inner
    return rows


def _subclasses(cls: type) -> list[type]:
    """Every subclass of ``cls`` alive now, depth first, each once."""
    found: dict[type, None] = {}
    stack: list[type] = list(type.__subclasses__(cls))
    while stack:
        sub = stack.pop()
        if sub not in found:
            found[sub] = None
            stack.extend(type.__subclasses__(sub))
    return list(found)


def _class_reads(
    cls: type, names: list[str], artifact_path: str, skip: tuple[type, ...] = ()
) -> list[dict[str, Any]]:
    """``reads`` rows of ``names`` in the body of each project class of ``cls``'s MRO but
    ``skip`` (a value inherited from a base, or shadowed in a subclass later, changes
    what the read finds)."""
    rows = []
    for klass in cls.__mro__:
        if klass in skip:
            continue
        owner = sys.modules.get(klass.__module__)
        if "<locals>" in klass.__qualname__ or owner is None:
            continue
        row = _module_read(owner, names, artifact_path, klass.__qualname__)
        if row is not None:
            rows.append(row)
    return rows


def _imported_reads(
    module: types.ModuleType, text: str, name: str, artifact_path: str
) -> list[dict[str, Any]]:
    """``reads`` rows of a name a module imports from a project module (``from .helper
    import K``, or ``import *`` from one that has it): K as that module binds it,
    following each module that imports it in turn (a re-export from ``__init__``, a
    constants module), up to ten hops."""
    rows: list[dict[str, Any]] = []
    current, source_text = module, text
    for _hop in range(10):
        imported = _imported(source_text, current.__package__)
        if name in imported:
            source, name = imported[name]
        else:  # ``from .consts import *``: the last such module that has it
            held = [
                m
                for m in star_sources(_parsed(source_text), current.__package__)
                if (held_by := sys.modules.get(m)) is not None and name in vars(held_by)
            ]
            if not held:
                return rows
            source = held[-1]
        following = sys.modules.get(source)
        row = _module_read(following, [name], artifact_path)
        if row is None or following is None or following is current:
            return rows
        rows.append(row)
        try:
            current, source_text = following, inspect.getsource(following)
        except (OSError, TypeError):
            return rows
    return rows


def _module_read(
    value: Any, names: list[str], artifact_path: str, scope: str = ""
) -> dict[str, Any] | None:
    """The ``reads`` row of ``names`` bound at the top level of ``value`` (or in its class
    ``scope``), where it is a project module whose source can be read; else None."""
    if not isinstance(value, types.ModuleType) or not is_project_module(value):
        return None
    file = value.__file__
    try:
        other = inspect.getsource(value)
    except (OSError, TypeError):
        return None
    if file is None or _parsed(other) is None:
        return None
    where = artifact_relative(file, artifact_path) or file
    return _read(value.__name__, where, other, scope, names)


def function_records(codes: list[types.CodeType], artifact_path: str) -> list[dict[str, Any]]:
    """One record per distinct project function among ``codes`` (torch is pinned by its
    version check; installed libraries change by version, not by edit)."""
    records: dict[tuple[str, str], dict[str, Any]] = {}
    trees: dict[str, Any] = {}  # per module: parsed once for all its functions
    for code in codes:
        if not is_project_file(code.co_filename):
            continue
        qualname = getattr(code, "co_qualname", code.co_name)
        key = (code.co_filename, qualname)
        if key in records:
            continue
        module, text = _module_text(code)
        if module is None or text is None:
            continue
        if module not in trees:
            trees[module] = _parsed(text)
        tree = trees[module]
        node = None if tree is None else function_node(tree, qualname, code.co_firstlineno)
        if node is None:
            continue
        source = node_source(text, node)
        records[key] = {
            "module": module,
            "function": qualname,
            "path": artifact_relative(code.co_filename, artifact_path),
            "line": code.co_firstlineno,
            "sha256": source_digest(source),
            # The whole module's: while it is unchanged, no function in it changed, and a
            # load need not parse it (``source_digest.changed_functions``).
            "module_sha256": source_digest(text or ""),
            "reads": _reads(code, node, text, artifact_path),
        }
    return sorted(records.values(), key=lambda r: (r["path"], r["line"]))


@contextlib.contextmanager
def codes_run() -> Iterator[list[types.CodeType]]:
    """The project code objects called inside the block, on this thread and on threads
    it starts, in order of first call: what made a capture's example inputs
    (``examples()``, the helpers it calls, the ``__init__`` of the models it builds) is
    recorded the way a trace's functions are, though no trace ran through it. A profiler
    already installed is chained and put back as ``fx_watch.recording_calls`` does; one
    the block installs itself is left in place (and what runs after it unrecorded)."""
    seen: dict[types.CodeType, None] = {}
    installed, threads = sys.getprofile(), threading.getprofile()

    def chaining(after: Any) -> Any:
        """A hook that records a call, then calls ``after`` when it is a Python profile
        function (a C-level one, cProfile's, is not callable: it is put back after)."""
        previous = after if callable(after) else None

        def hook(frame: types.FrameType, event: Any, arg: object) -> object:
            if event == "call" and frame.f_code not in seen:
                seen[frame.f_code] = None
            return None if previous is None else previous(frame, event, arg)

        return hook

    hook = chaining(installed)
    sys.setprofile(hook)
    # A thread starts with threading's own profiler, not this thread's: chain that one.
    threading.setprofile(chaining(threads))
    ran: list[types.CodeType] = []
    try:
        yield ran
    finally:
        threading.setprofile(threads)
        if sys.getprofile() is hook:
            reinstall_profiler(installed)
        ran.extend(code for code in list(seen) if is_project_file(code.co_filename))


def input_records(inputs_from: Any, artifact_path: str) -> list[dict[str, Any]]:
    """The records of the functions that made a capture's example inputs, in
    ``function_records``' shape: ``inputs_from`` is one function (a target's
    ``examples``) or several functions and code objects (``codes_run``'s). What they
    built (``Net(k=2.0)``) became part of the artifact, yet no trace ran through them:
    without these records an edit to them (``Net(k=3.0)``) leaves ``precompile check``
    calling the old artifact current. A function records itself only (``codes_run``
    finds what it calls); a ``functools.partial``, bound method or callable instance
    by its function (the instance's ``__call__``); a builtin by nothing."""
    if inputs_from is None:
        return []
    one = callable(inputs_from) or not isinstance(inputs_from, Iterable)
    codes = []
    for item in [inputs_from] if one else inputs_from:
        if not callable(item) and not isinstance(item, types.CodeType):
            raise TypeError(
                f"precompile: inputs_from must be the Python function that makes the "
                f"example inputs (a target's examples), or those functions' code objects; "
                f"got {type(item).__name__}"
            )
        while isinstance(item, functools.partial):
            item = item.func
        if not isinstance(item, (types.CodeType, types.FunctionType, types.MethodType, type)):
            item = type(item).__call__  # an instance (or builtin): its class's
        function = getattr(item, "__func__", item)
        code = item if isinstance(item, types.CodeType) else getattr(function, "__code__", None)
        if isinstance(code, types.CodeType):
            codes.append(code)
    return function_records(codes, artifact_path)


__all__ = ["codes_run", "function_records", "input_records"]
