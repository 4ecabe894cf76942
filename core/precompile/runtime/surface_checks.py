"""The per-call check of the library surface a trace went through, authored as code and
emitted verbatim into every artifact (make_fx and Dynamo alike).

A trace bakes the operations a library function lowered to: ``F.gelu`` became
``aten.gelu``, ``nn.LayerNorm.forward`` became ``aten.native_layer_norm``. Serving code
swaps such functions for other kernels (``F.scaled_dot_product_attention =
sage_attention``, ``nn.LayerNorm.forward = fused_forward``, ``torch.Tensor.softmax =
...``), at import -- before the artifact is loaded -- or later; eager then runs the new
kernel while the graph runs the old one. ``precompile.capturing.library_surface`` records, at
capture, every torch (or installed library) function, method and module-class attribute
the trace called, by where it was resolved (``LIBRARY_SURFACE``: a module attribute, a
class attribute looked up along the class's MRO, or an entry of a library registry --
``ALL_ATTENTION_FUNCTIONS["sdpa"]`` -- looked up by the registry's own lookup), with a key another process computes
alike (``surface_key``: module, qualified name and a digest of the code; of a builtin,
its owner and name). Here:

- at load, each path is resolved and its key compared with the capture's: a function
  replaced before load (the common patch, applied at import) is refused;
- per call, the version tags of the dicts those paths resolve through (module
  ``__dict__``s, the class dicts along the MROs, a registry's dicts and its classes')
  are compared with those at load -- one
  C-level ``map`` -- and only when one changed are the paths resolved again and compared
  by identity with the objects found at load.

A mismatch raises PrecompileError naming the function as the user wrote it
(``torch.nn.functional.gelu``). Nothing here imports precompile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

# >>> not emitted: both artifact kinds carry state_checks.code_fingerprint, the one code digest
from precompile.runtime.state_checks import code_fingerprint

# <<< not emitted

if TYPE_CHECKING:
    # Bound by the artifact prelude (precompile._compat.prelude) and its metadata.
    LIBRARY_SURFACE: list[dict[str, Any]] = []
    _torch: Any = None
    _python_kernels: set[str] = set()

    def _dispatch_dump(name: str) -> str: ...

    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...

    # precompile.runtime.version_watch, emitted before this module.
    def watch_dicts(
        watched: Callable[[], list[Any]],
        recheck: Callable[[], None],
        checked: bool = True,
        key: Callable[[Any], Any] | None = None,
        keyed: Callable[[list[Any]], Any] | None = None,
    ) -> Callable[[], None]: ...


def _torch_wrapper(code: Any) -> bool:
    """torch's own wrappers that it applies to its functions lazily (importing Dynamo
    wraps ``torch.manual_seed`` in ``torch._disable_dynamo``): seen through, so a process
    that has not imported Dynamo yet names the same function."""
    path = code.co_filename.replace("\\", "/")
    return path.endswith("/torch/_compile.py") or "/torch/_dynamo/" in path


def surface_key(value: Any) -> list[str]:
    """What tells the object at a library path from a replacement, in any process: its
    kind, ``module.qualname`` and, of Python code, a digest of the code (a replacement
    that copies the name still differs); of a builtin, the module, type or class that
    owns it; of a module, its name and whether it is the module imported under it."""
    import sys
    import types

    if isinstance(value, types.ModuleType):  # a name a library's code reaches a module by
        # By name, and as the module imported under that name: a stand-in that copies
        # the name (``types.ModuleType("torch.nn.functional")``) is another module.
        name = str(value.__name__)
        return ["module", name, "" if sys.modules.get(name) is value else "not imported"]
    target: Any = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    if isinstance(target, property):
        target = target.fget
    code = getattr(target, "__code__", None)
    while code is not None and _torch_wrapper(code) and hasattr(target, "__wrapped__"):
        target = target.__wrapped__
        code = getattr(target, "__code__", None)
    name = str(getattr(target, "__qualname__", None) or getattr(target, "__name__", "?"))
    if code is not None:
        return [
            type(value).__name__,
            f"{getattr(target, '__module__', '?')}.{name}",
            code_fingerprint(code),
        ]
    owner = getattr(target, "__objclass__", None)
    if owner is None:
        held = getattr(target, "__self__", None)
        owner = held if isinstance(held, type) else None
        if owner is None:
            module = getattr(held, "__name__", None) or getattr(target, "__module__", None)
            return [type(value).__name__, f"{module}.{name}", ""]
    if f"{owner.__qualname__}." in f"{name}.":
        name = name.rpartition(".")[2]
    return [type(value).__name__, f"{owner.__module__}.{owner.__qualname__}.{name}", ""]


def surface_shown(value: Any) -> str:
    """What is at a library path, in words: a function by its name and definition."""
    import sys
    import types

    if isinstance(value, types.ModuleType):
        if sys.modules.get(value.__name__) is not value:
            return f"a module named {value.__name__}, not the one imported under that name"
        return f"the module {value.__name__}"
    target = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    code = getattr(target, "__code__", None)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if name is None:
        return f"a {type(value).__module__}.{type(value).__qualname__} object"
    where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
    return f"{type(value).__name__} {getattr(target, '__module__', None) or '?'}.{name}{where}"


def python_kernels(registered: Any) -> list[str]:
    """The kernels registered from Python (``torch.library``) for aten operators, but
    meta kernels (shape functions, never run on data): ``"aten/relu/CPU"``. The library
    surface records those present at capture (``{"kernels": [...]}``): one registered
    since overrides what an operator runs in eager, where a graph lowered (Inductor) or
    decomposed (make_fx: ``aten::linear`` is ``t`` and ``addmm`` in its graph) runs
    what it baked."""
    return sorted(e for e in registered if e.startswith("aten/") and not e.endswith("/Meta"))


def _registered_at(entry: str) -> str | None:
    """Where the kernel ``entry`` names was registered (a file and line), or None where
    torch registered it itself (a lazily imported part of torch, never a change). A
    kernel the dispatcher's account does not show counts as registered elsewhere."""
    import os

    _namespace, op, key = entry.split("/")
    torch_dir = os.path.dirname(_torch.__file__) + os.sep
    for line in _dispatch_dump(f"aten::{op}").splitlines():
        head, _, rest = line.partition(" registered at ")  # "CPU: registered at f.py:3 :: ..."
        if head in (f"{key}:", f"{key}[alias]:"):
            where = rest.partition(" :: ")[0]
            return None if where.startswith(torch_dir) else where
    return "a place the dispatcher does not name"  # never passed over unread


def _build_surface_check() -> Any:
    """``check()`` for ``LIBRARY_SURFACE``, or None when there is none: each library path
    the trace resolved must still hold the object it ran. Refuses at once (at load) a
    path that holds another object than the capture's (by ``surface_key``)."""
    import gc
    import importlib
    import operator

    if not LIBRARY_SURFACE:
        return None
    missing = object()

    def class_dict(cls: Any) -> dict[str, Any]:
        # A type's __dict__ is a read-only proxy of the dict whose version tag any
        # assignment to a class attribute changes.
        held = [d for d in gc.get_referents(vars(cls)) if isinstance(d, dict)]
        return held[0] if len(held) == 1 else dict(vars(cls))

    def resolve(dicts: list[dict[str, Any]], name: str) -> Any:
        for d in dicts:
            if name in d:
                return d[name]
        return missing

    def watched_of(row: dict[str, Any], owner: Any) -> tuple[list[dict[str, Any]], Any]:
        """The dicts whose version tags tell that ``row``'s path may resolve to
        another object, and what it resolves to now."""
        if row["class"]:
            # The class dicts along the MRO down to the one that holds the name: only
            # those can change what the name resolves to.
            dicts = []
            for c in owner.__mro__:
                if c.__module__ != "builtins":
                    dicts.append(class_dict(c))
                    if row["name"] in dicts[-1]:
                        break
            return dicts, resolve(dicts, row["name"])
        dicts = [vars(owner)]
        if "entry" not in row:
            return dicts, resolve(dicts, row["name"])
        # A registry entry: the mapping's own lookup decides, and any dict of the
        # mapping or of its classes may hold the entry (a local override, a
        # registration on the class).
        holder = resolve(dicts, row["name"])
        if isinstance(holder, dict):
            dicts.append(holder)
        elif holder is not missing:
            spaces = [getattr(holder, "__dict__", {})]
            spaces += [class_dict(c) for c in type(holder).__mro__ if c.__module__ != "builtins"]
            dicts += [s for s in spaces if isinstance(s, dict)]
            dicts += [v for s in spaces for v in list(s.values()) if isinstance(v, dict)]
        try:
            return dicts, holder[row["entry"]]
        except Exception:  # an entry gone is a change like any other
            return dicts, missing

    captured_kernels = next((set(r["kernels"]) for r in LIBRARY_SURFACE if "kernels" in r), None)

    def kernels_hold(when: str) -> None:
        """Refuse an aten kernel registered from Python that the capture did not have."""
        if captured_kernels is None:
            return
        for entry in python_kernels(_python_kernels):
            if entry in captured_kernels:
                continue
            where = _registered_at(entry)
            if where is None:
                continue
            _namespace, op, key = entry.split("/")
            refuse(
                f"precompile: `aten::{op}` has a kernel for {key} registered from Python "
                f"{when} (at {where}, through torch.library) that the capture did not "
                f"have: eager runs it, while the artifact runs the operations its graph "
                f"baked. Serve the artifact where that kernel is not registered, or "
                f"capture again with it registered (re-emit the artifact)",
                2,
            )

    kernels_hold("since capture")
    rows: list[tuple[dict[str, Any], Any, Any]] = []
    watched_by_row: list[list[dict[str, Any]]] = []
    for row in LIBRARY_SURFACE:
        if "kernels" in row:
            continue
        try:
            owner = importlib.import_module(row["module"])
            if row["class"]:
                owner = operator.attrgetter(row["class"])(owner)
        except (ImportError, AttributeError):
            refuse(
                f"precompile: `{row['shown']}`, which the trace ran, cannot be found in this "
                f"process ({row['module']} {row['class'] or ''} is gone). Install the "
                f"library the artifact was captured with, or capture again (re-emit the "
                f"artifact)",
                2,
            )
        dicts, now = watched_of(row, owner)
        if now is missing or surface_key(now) != row["key"]:
            shown = "not defined" if now is missing else surface_shown(now)
            refuse(
                f"precompile: `{row['shown']}` was replaced since capture: it is {shown} "
                f"in this process, and the trace ran {row['traced']} there. The graph "
                f"baked the operations that one ran, so the artifact would not run the "
                f"replacement that eager runs. Load the artifact where `{row['shown']}` is "
                f"the original, or capture again with the replacement in place (re-emit "
                f"the artifact)",
                2,
            )
        rows.append((row, owner, now))
        watched_by_row.append(dicts)

    def watch() -> list[dict[str, Any]]:
        return list({id(d): d for dicts in watched_by_row for d in dicts}.values())

    def recheck() -> None:
        kernels_hold("after this artifact was loaded")
        for i, (row, owner, loaded) in enumerate(rows):
            dicts, now = watched_of(row, owner)
            watched_by_row[i] = dicts
            if now is loaded:
                continue
            if now is not missing and surface_key(now) == row["key"]:
                rows[i] = (row, owner, now)  # the same function again (a reload)
                continue
            shown = "not defined" if now is missing else surface_shown(now)
            refuse(
                f"precompile: `{row['shown']}` was replaced after this artifact was loaded: "
                f"it is {shown} now, and the trace ran {row['traced']} there. The graph "
                f"baked the operations that one ran, so the artifact would not run the "
                f"replacement that eager runs. Restore `{row['shown']}`, or capture again "
                f"with the replacement in place (re-emit the artifact)",
                2,
            )

    if captured_kernels is None:
        return watch_dicts(watch, recheck)
    # A registration adds to torch.library's set: its size, compared per call with the
    # dicts' tags, tells when to look again.
    return watch_dicts(watch, recheck, key=len, keyed=lambda _dicts: [_python_kernels])
