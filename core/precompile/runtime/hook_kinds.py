"""Which hooks change nothing a served call computes, for both artifact kinds and both
tracers: torch's module trackers' hooks only watch (``watches_only``), and a forward hook
whose whole body marks its output as requiring grad changes no value an inference
artifact returns (``marks_grad_only``). What a hook *is* is ``value_fingerprints``'
business; these predicates only decide which hooks its fingerprints leave out.

Emitted verbatim into both artifact kinds before ``value_fingerprints``
(``capturing.carried``); reads the hook dicts' names the artifact prelude binds.
"""

from __future__ import annotations

from typing import Any

# >>> not emitted: the artifact prelude binds this
from precompile._compat.prelude import GLOBAL_HOOK_DICTS

# <<< not emitted


def watches_only(hook: Any) -> bool:
    """Whether a global module hook is one of torch's module trackers' own
    (``torch.utils.module_tracker.ModuleTracker``, which ``FlopCounterMode`` enters,
    and ``torch.distributed._tools.mod_tracker.ModTracker``, under ``MemTracker`` and
    the runtime estimator): a bound method of the tracker whose function torch defines,
    which returns None and only notes which module runs, so it never changes a result.
    A graph has no module calls for it to note: during a served call it is not called
    (the tracker attributes the call to no module), and the result is eager's. A
    subclass that overrides the hook, or a patched one, is defined elsewhere and
    counts as any hook."""
    func = getattr(hook, "__func__", None)
    return (
        getattr(hook, "__self__", None) is not None
        and getattr(func, "__module__", None)
        in ("torch.utils.module_tracker", "torch.distributed._tools.mod_tracker")
        and str(getattr(func, "__qualname__", "")).split(".")[0] in ("ModuleTracker", "ModTracker")
    )


def _grad_mark(dict_name: str, hook: Any) -> bool:
    return dict_name == "_forward_hooks" and marks_grad_only(hook)


def inference_skip(training: bool) -> Any:
    """The ``skip`` of ``hooks_fingerprint`` for an artifact: an inference one leaves out
    forward hooks that only mark their output as requiring grad (``marks_grad_only``)."""
    return None if training else _grad_mark


def _marks_output(module: Any, args: Any, output: Any) -> None:
    output.requires_grad_(True)


def marks_grad_only(hook: Any) -> bool:
    """Whether a module forward hook's whole body is ``output.requires_grad_(True)`` on
    its output (``transformers``' ``enable_input_require_grads``, which
    ``gradient_checkpointing_enable()`` registers on the input embeddings): it returns
    None and changes no value, only whether autograd records what follows. An inference
    artifact computes no gradient and serves outputs without one, so for it such a hook
    changes nothing a served call returns (in eager under ``no_grad`` the outputs carry
    no grad either). Proved by the hook's instructions being those of ``_marks_output``
    (any parameter names, a docstring allowed): a hook doing anything more, a closure,
    ``*args``, or a callable that is not a plain function counts as any hook."""
    code = getattr(hook, "__code__", None)
    if code is None or getattr(hook, "__self__", None) is not None:
        return False
    # three positional parameters; no *args, **kwargs, generator or coroutine flags
    if code.co_argcount != 3 or code.co_kwonlyargcount or code.co_freevars:
        return False
    return not code.co_flags & 0x3AC and _instructions(code) == _instructions(
        _marks_output.__code__
    )


def _instructions(code: Any) -> list[tuple[str, Any]]:
    """``code``'s instructions as (operation, operand): locals by slot, so parameter
    names do not count; inline caches and no-ops left out."""
    import dis

    return [
        (i.opname, i.arg if "FAST" in i.opname else i.argval)
        for i in dis.get_instructions(code)
        if i.opname not in ("CACHE", "NOP", "RESUME", "EXTENDED_ARG")
    ]


def global_hook_holder(hooks: tuple[dict[Any, Any], ...]) -> tuple[dict[str, Any], Any]:
    """torch's global module hooks ``(forward_pre, forward, backward_pre, backward,
    forward_with_kwargs, forward_always_called)`` as a holder of hook dicts and its
    ``flags``, less those that only watch (``watches_only``)."""
    kept = tuple({k: h for k, h in d.items() if not watches_only(h)} for d in hooks[:4])

    def flags(dict_name: str) -> tuple[dict[Any, Any], ...]:
        return hooks[4:6] if dict_name == "_global_forward_hooks" else ()

    return dict(zip(GLOBAL_HOOK_DICTS, kept)), flags
