"""What a Dynamo capture refuses, beside what its records refuse when emitted: a
function an artifact could not rebuild (``check_dynamo_fn``), a call whose graph holds a
library's compile-only branch that answers differently from eager
(``compile_only_branch_check``), a project branch on a tracing probe
(``refuse_tracing_probes``), a store replayed through torch's global hook dicts
(``refuse_replayed_global_hook_stores``), and the failures met while Dynamo runs, as refusals
(``refusal_inside``, ``raised_inside_torch``).
"""

from __future__ import annotations

import collections
import importlib
import os
import types
from collections.abc import Callable
from typing import Any

import torch

from precompile._compat import dynamo
from precompile.capturing import hook_stores
from precompile.errors import Location, PrecompileError
from precompile.locations import definition_location, is_project_file


def raised_inside_torch(error: BaseException) -> str | None:
    """``file:line`` of a failed internal assertion of Dynamo or Inductor, or None. Other
    errors raised inside torch (a shape mismatch met while tracing) are the user's to fix."""
    if not isinstance(error, AssertionError):
        return None
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return None
    root = os.path.dirname(torch.__file__) + os.sep
    filename = tb.tb_frame.f_code.co_filename
    if not filename.startswith((root + "_dynamo" + os.sep, root + "_inductor" + os.sep)):
        return None
    return f"torch/{filename[len(root):]}:{tb.tb_lineno}"


def check_dynamo_fn(fn: Callable[..., Any]) -> types.FunctionType:
    """A Dynamo artifact rebuilds fn's frames inside fn's own module in another process:
    fn must be a plain module-level function of an importable module. Returns ``fn``,
    known to be one."""
    code = getattr(fn, "__code__", None)
    where = definition_location(code) if code else None
    if not isinstance(fn, types.FunctionType):
        raise PrecompileError(
            f"the Dynamo tracer captures plain functions, got {type(fn).__name__}",
            location=where,
            hint="wrap the call in a module-level function: def run(model, x): return model(x)",
        )
    code = fn.__code__
    module = fn.__module__
    if module == "__main__":
        raise PrecompileError(
            f"{fn.__qualname__} is defined in the running script (__main__), which no other "
            f"process can import, so its artifact could never be loaded",
            location=where,
            hint="move the function into an importable module and import it from the script",
        )
    if code.co_freevars and hasattr(fn, "__wrapped__"):
        context_manager = "ctx_factory" in code.co_freevars
        wrapped = getattr(fn.__wrapped__, "__code__", None)
        raise PrecompileError(
            f"{fn.__qualname__} is wrapped by a decorator"
            + (" (a context manager used as one, like @torch.no_grad())" if context_manager else "")
            + "; an artifact rebuilds the entry from its module, and the decorator's "
            "wrapper is a closure it cannot recreate",
            invariant=1,
            location=definition_location(wrapped) if wrapped else where,
            hint=(
                "remove the decorator and enter the context inside the function body "
                "(with torch.no_grad(): ...)"
                if context_manager
                else "capture the undecorated function, and apply what the decorator does "
                "inside it or around the loaded artifact"
            ),
        )
    if code.co_freevars:
        raise PrecompileError(
            f"{fn.__qualname__} closes over {list(code.co_freevars)}; an artifact rebuilds the "
            f"entry from its module and cannot recreate closure cells",
            invariant=1,
            location=where,
            hint="make it a module-level function and pass what it closes over as arguments",
        )
    try:
        imported = importlib.import_module(module)
    except ImportError as error:
        raise PrecompileError(
            f"{fn.__qualname__}'s module {module!r} is not importable ({error})",
            location=where,
            hint="capture functions from modules on sys.path",
        ) from error
    owner: Any = imported
    for part in fn.__qualname__.split("."):
        owner = getattr(owner, part, None)
    if owner is not fn:
        raise PrecompileError(
            f"{fn.__qualname__} is not reachable as {module}.{fn.__qualname__} (a nested or "
            f"decorated function); an artifact finds its entry by that name",
            location=where,
            hint="capture a module-level function",
        )
    if code in OPEN_CAPTURES:
        raise PrecompileError(
            f"{fn.__qualname__} is being captured already: another capture of it is still "
            f"open in this process",
            location=where,
            hint="finish the first capture's with-block before starting the next",
        )
    compiled, installed = dynamo.live_compiles(code)
    if installed:
        raise PrecompileError(
            f"{fn.__qualname__} serves an installed precompile artifact in this process; "
            f"a capture would run that artifact instead of capturing",
            location=where,
            hint="unload it first (runnable.unload()), or capture in another process",
        )
    if compiled:
        raise PrecompileError(
            f"{fn.__qualname__} holds live code from a torch.compile of it in this process "
            f"({compiled} compiled entries); Dynamo would reuse that code instead of "
            f"capturing",
            location=where,
            hint="capture before compiling it, in another process, or call "
            "torch._dynamo.reset() to drop that compile first",
        )
    return fn


#: Entry code objects with a capture open in this process.
OPEN_CAPTURES: set[types.CodeType] = set()


def input_versions(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int]:
    """The version counters of the tensors among fn's arguments (an in-place write
    bumps one)."""
    from precompile._compat.tracing import pytree

    leaves = pytree.tree_leaves((args, kwargs))
    return [t._version for t in leaves if isinstance(t, torch.Tensor)]


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal up to the rounding of another kernel (an Inductor one, a fused fast path):
    what a compile-only branch changes (padded rows, a skipped step) is far outside."""
    if not (got.is_floating_point() or got.is_complex()):
        return bool(torch.equal(got, want))
    scale = float(want.detach().abs().nan_to_num(0.0, 0.0, 0.0).max()) if want.numel() else 0.0
    return torch.allclose(got, want, rtol=1e-3, atol=1e-3 * max(1.0, scale), equal_nan=True)


def compile_only_branch_check(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    result: Any,
    rng: torch.Tensor,
    sites: list[dict[str, Any]],
) -> None:
    """Library code branched on an "am I being traced?" probe that Dynamo answers True
    and eager False (``nn.TransformerEncoder`` skips its nested-tensor fast path under
    ``torch.compiler.is_compiling()``): the graph holds the compile-only branch. Most
    such branches skip a check or pick an equivalent kernel; to tell, fn runs once more
    eagerly on the same inputs (same RNG state), and a result that differs is refused
    at capture, naming the branch. An inference capture only: a training step run twice
    would step twice."""

    after = torch.random.get_rng_state()
    expected = _eager_rerun(fn, args, kwargs, rng, after)
    difference = _difference(result, expected)
    if difference is None:
        return
    # fn run eagerly once more, from the same RNG state: an answer that differs again
    # is fn's own (state it changes and reads on the next call), not the branch's.
    holders = _stateful_hooks(args, kwargs)
    before = [_sizes(held) for _hook, _where, held in holders]
    again = _eager_rerun(fn, args, kwargs, rng, after)
    changing = _difference(again, expected)
    if changing is not None:
        _refuse_per_call_state(holders, before, changing)
    site = sites[0]
    through = f" (through {', '.join(site['returned'])})" if site["returned"] else ""
    raise PrecompileError(
        f"{site['code']} ({site['file']}:{site['line']}) branches on {site['probe']}"
        f"{through}, which is True while Dynamo captures and False in eager: the graph "
        f"holds the library's compile-only branch, and on the capture's own inputs it "
        f"answers differently from eager ({difference}), so the artifact would serve "
        f"what eager never computes",
        invariant=3,
        location=Location(site["file"], site["line"], 0),
        hint="configure the library so that it does not reach that test (for "
        "nn.TransformerEncoder: enable_nested_tensor=False), or call that part of "
        "the model outside fn",
    )


#: What user code turns grad mode on or off with, as a name its bytecode reads.
_GRAD_SWITCHES = frozenset({"set_grad_enabled", "_set_grad_enabled"})


def names_grad_switch(codes: Any) -> bool:
    """Whether project code among ``codes`` names a grad-mode switch."""
    return any(
        is_project_file(code.co_filename) and _GRAD_SWITCHES & set(code.co_names) for code in codes
    )


def refuse_grad_mode_left_off(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    rng: torch.Tensor,
) -> None:
    """An inference capture runs fn with grad off, so a fn that turns grad off and
    leaves it so (``torch.set_grad_enabled(False)``, no with-block) returns looking
    unchanged, and Dynamo's compiled code sets nothing it finds set already. Eager
    leaves its caller without grad; an artifact puts the caller's mode back. Called
    where the project code the trace went through names a grad switch
    (``names_grad_switch``): fn runs once more eagerly under grad on (from the
    capture's RNG state; the caller puts the user's state back) and is refused where it
    returns with grad off. A fn that fails under grad on is left served: nothing
    tells."""
    from precompile.capturing.call_context import refuse_left_changed, snapshot

    with torch.enable_grad():
        entered = snapshot()
        try:
            _eager_rerun(fn, args, kwargs, rng, torch.random.get_rng_state())
        except Exception:
            return
        refuse_left_changed(entered, fn)


def _eager_rerun(
    fn: Callable[..., Any], args: Any, kwargs: dict[str, Any], rng: Any, after: Any
) -> Any:
    """fn run eagerly from the RNG state ``rng`` (the capture's), the generator left at
    ``after`` (where the capture left it) whatever happens."""
    torch.random.set_rng_state(rng)
    try:
        return torch.compiler.disable(fn)(*args, **kwargs)
    finally:
        torch.random.set_rng_state(after)


def _difference(result: Any, expected: Any) -> str | None:
    """How two results of fn differ beyond another kernel's rounding (``_close``), or
    None when they do not."""
    from precompile._compat.tracing import pytree

    got_leaves, got_spec = pytree.tree_flatten(result)
    want_leaves, want_spec = pytree.tree_flatten(expected)
    if got_spec != want_spec:
        return "another output structure"
    for got, want in zip(got_leaves, want_leaves):
        if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
            got, want = got.detach(), want.detach()
            if got.is_nested or want.is_nested:
                return "a nested tensor where the other has none"
            if got.shape != want.shape or got.dtype != want.dtype:
                return f"shape {tuple(got.shape)} vs {tuple(want.shape)}"
            if not _close(got, want):
                gap = (got.double() - want.double()).abs().nan_to_num(float("inf")).max()
                return f"values up to {float(gap):.3g} apart"
        elif type(got) is not type(want) or (not isinstance(got, torch.Tensor) and got != want):
            return f"{got!r} vs {want!r}"
    return None


#: The containers a hook may fill and read (``feats.append(out)``, ``cache[k] = v``).
_CONTAINERS = (list, dict, set, collections.deque)


def _stateful_hooks(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[tuple[Any, str, dict[str, Any]]]:
    """The project's module hooks a call of fn runs (those on the modules among its
    arguments and their submodules, and torch's global ones), each with where it is
    registered and the containers it reaches by name (``name`` -> the list, dict, set
    or deque): its globals, its closure cells, its bound instance's attributes."""
    from torch.nn.modules import module as module_module

    from precompile._compat.prelude import MODULE_HOOK_DICTS as kinds

    found: list[tuple[Any, str, dict[str, Any]]] = []
    for name in kinds:
        for hook in list(getattr(module_module, "_global" + name, {}).values()):
            found.append((hook, f"a global {name[1:-6].replace('_', ' ')} hook", {}))
    roots = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.nn.Module)]
    for root in roots:
        for path, sub in root.named_modules():
            for name in kinds:
                for hook in list(getattr(sub, name, {}).values()):
                    shown = f"`{path}` ({type(sub).__name__})" if path else "the model"
                    kind = name[1:-6].replace("_", " ")
                    found.append((hook, f"a {kind} hook on {shown}", {}))
    kept = []
    for hook, where, held in found:
        target = getattr(hook, "__func__", hook)
        code = getattr(target, "__code__", None)
        if not isinstance(code, types.CodeType) or not is_project_file(code.co_filename):
            continue
        scope = getattr(target, "__globals__", {})
        for name in code.co_names:
            if isinstance(scope.get(name), _CONTAINERS):
                held[f"global `{name}`"] = scope[name]
        for name, cell in zip(code.co_freevars, getattr(target, "__closure__", None) or ()):
            try:
                if isinstance(cell.cell_contents, _CONTAINERS):
                    held[f"`{name}` (a closure cell)"] = cell.cell_contents
            except ValueError:
                continue
        owner = getattr(hook, "__self__", None)
        for name, value in list(getattr(owner, "__dict__", {}).items()):
            if isinstance(value, _CONTAINERS) and name in code.co_names:
                held[f"`self.{name}`"] = value
        kept.append((hook, where, held))
    return kept


def _sizes(held: dict[str, Any]) -> dict[str, int]:
    return {name: len(value) for name, value in held.items()}


def _refuse_per_call_state(
    holders: list[tuple[Any, str, dict[str, Any]]], before: list[dict[str, int]], changing: str
) -> None:
    """Refuse fn, which answered differently on two eager calls with the same inputs:
    naming the hook that changed state it reaches during the second (it fills a list and
    reads it: ``out * len(feats)``), else fn as a whole."""
    for (hook, where, held), sizes in zip(holders, before):
        grown = [name for name, value in held.items() if len(value) != sizes[name]]
        if not grown:
            continue
        target = getattr(hook, "__func__", hook)
        code = target.__code__
        raise PrecompileError(
            f"the hook {target.__qualname__} ({code.co_filename}:{code.co_firstlineno}), "
            f"{where}, changes {', '.join(grown)} on every call and answers from what it "
            f"holds: fn answers differently on each call with the same inputs (two eager "
            f"calls on the capture's inputs are {changing}), so no captured graph can "
            f"answer as eager's next call would",
            invariant=4,
            location=Location(code.co_filename, code.co_firstlineno, 0),
            hint="let the hook store what it collects and return what it was given (read "
            "the collected values after the call), or compute its answer from the tensors "
            "alone",
        )
    raise PrecompileError(
        f"fn answers differently on each call with the same inputs (two eager calls on the "
        f"capture's inputs are {changing}): Python state it changes is read by its next "
        f"call, and no captured graph can answer as eager's next call would",
        invariant=4,
        hint="keep per-call state out of what fn computes (return it, or hold it in "
        "tensors passed as inputs)",
    )


def refusal_inside(error: BaseException) -> PrecompileError | None:
    """A PrecompileError that a backend raised and Dynamo wrapped (its cause chain or
    ``inner_exception``)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, PrecompileError):
            return current
        seen.add(id(current))
        current = getattr(current, "inner_exception", None) or current.__cause__
    return None


#: The names of torch's "is a trace or compile running?" probes. Dynamo answers True for
#: the compiling ones while it traces (as torch.compile does), eager answers False.
_PROBE_NAMES = frozenset({"is_compiling", "is_dynamo_compiling", "is_exporting"})


def refuse_tracing_probes(codes: list[types.CodeType]) -> None:
    """A branch on ``torch.compiler.is_compiling()`` in project code is traced as True,
    so an artifact would serve the branch eager never takes: refused at capture. Told by
    the name the code loads (an over-approximation: any use of the name counts)."""
    for code in codes:
        if not is_project_file(code.co_filename):
            continue
        probe = next((n for n in code.co_names if n in _PROBE_NAMES), None)
        if probe is not None:
            raise PrecompileError(
                f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno}) calls "
                f"{probe}(), which answers True while Dynamo captures and False in eager: "
                f"the artifact would serve the branch eager never takes",
                invariant=3,
                hint="remove the branch, or make both branches compute the same thing",
            )


def refuse_replayed_global_hook_stores(stores: list[dict[str, Any]]) -> None:
    """A store Dynamo replays through torch's global module hook dicts (the source of a
    list, dict, cell or object the trace changed goes through ``_global_*_hooks[<id>]``,
    keyed by a per-process handle id): refused at capture, naming the hook
    (``hook_stores``). The rule is the replay target's path, not the kind of store."""
    for store in stores:
        path = dynamo.global_hooks_path(store["source"])
        if path is None:
            continue
        hook = dynamo.global_hook_at(path)
        rest = path.partition("]")[2]
        kind = store["kind"]
        what = "a list" if "List" in kind else "a dict" if "Dict" in kind else "attributes"
        where = "its closure" if "__closure__" in rest else "the hook object" if not rest else rest
        raise hook_stores.global_hook_store_refusal(
            hook if hook is not None else path, f"{what} of {where}", "dynamo"
        )


def refuse_process_hashes(sites: list[str], fn: Any) -> None:
    """Refuse a capture whose traced code asked for a hash or an address
    (``recording_process_hashes``): Dynamo folded the answer into the graph, and another
    process seeds string hashes anew and places objects elsewhere."""
    if sites:
        raise PrecompileError(
            f"fn asks the process for a value no argument carries ({sites[0]}): Python "
            f"seeds the hashes of strings and bytes per process (PYTHONHASHSEED) and an "
            f"object's id and default hash are its address; Dynamo folded the capture's "
            f"answer into the graph, and another process would get the capture's",
            invariant=3,
            location=definition_location(fn.__code__) if hasattr(fn, "__code__") else None,
            hint="compute it outside fn and pass the number as an argument, or use a stable "
            "hash (zlib.crc32, hashlib)",
        )
