"""Hooks in words, for both artifact kinds: a hook's name, where it is defined, and the
first difference between the hooks recorded at capture and those present now.

Both tracers identify a hook by what it is (``value_fingerprints.hooks_fingerprint``: its
code, closure, defaults and registration flags) and record it beside its name
(``hook_records.named_hooks``): hook dict -> ``(hook_name, identity)`` per hook, in
order. The name only words the message: hooks a factory makes share one name whatever
they close over. Emitted verbatim into both artifact kinds (``capturing.carried``),
each of which carries ``fingerprint_differences`` too.
"""

from __future__ import annotations

from typing import Any

# >>> not emitted: both artifact kinds carry fingerprint_differences
from precompile.runtime.fingerprint_differences import describe_value, first_difference

# <<< not emitted


def hook_name(hook: Any) -> str:
    """``module.qualname`` of a hook (of the function a partial or bound method wraps), for
    messages: a hook is identified by ``hooks_fingerprint``, since hooks a factory makes
    share one name whatever they close over."""
    target = getattr(hook, "func", hook)
    target = getattr(target, "__func__", target)
    if not hasattr(target, "__qualname__"):
        target = type(target)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}"


def hook_locations(modules: Any, attrs: Any) -> dict[str, str]:
    """Hook name -> ``file:line`` of its definition, for the hooks on ``modules``."""
    found = {}
    for module in modules:
        for attr in attrs:
            for hook in (getattr(module, attr, None) or {}).values():
                target = getattr(hook, "func", hook)
                code = getattr(getattr(target, "__func__", target), "__code__", None)
                if code is not None:
                    found[hook_name(hook)] = f"{code.co_filename}:{code.co_firstlineno}"
    return found


def hook_change(
    captured: dict[str, Any],
    now: dict[str, Any],
    where: str,
    located: dict[str, str] | None = None,
) -> str:
    """The first hook difference between two snapshots of one module (hook dict ->
    ``(hook_name, identity)`` per hook), in words (``located``: where the hooks present
    now are defined). Hooks compare by identity; a hook of a captured hook's name that
    is not that hook (another closure, defaults, code or registration flags) is named
    as replaced."""
    words = {
        "_forward_pre_hooks": "forward pre-hook",
        "_forward_hooks": "forward hook",
        "_backward_pre_hooks": "backward pre-hook",
        "_backward_hooks": "backward hook",
    }
    for attr in sorted(set(captured) | set(now)):
        kind = words.get(attr.replace("_global", ""), attr)
        before, after = list(captured.get(attr, ())), list(now.get(attr, ()))
        if before == after:
            continue
        # Literals read back from the artifact are tuples as written; compare alike.
        added = [h for h in after if h not in before]
        removed = [h for h in before if h not in after]
        replaced = [h for h in added if h[0] in {r[0] for r in removed}]
        if replaced:
            name = replaced[0][0]
            at = (located or {}).get(name)
            # What differs, where one value the hook reads does (``self.k``, a closure's
            # ``box[0]``, ``table["act"]``): the first difference of the identities.
            was = next(r for r in removed if r[0] == name)[1][0]
            path, then, live = first_difference(was, replaced[0][1][0], "the hook")
            detail = (
                f" ({path} is {describe_value(live)}; the trace read {describe_value(then)})"
                if path != "the hook"
                else ""
            )
            return (
                f"the {kind} `{name}`{f' ({at})' if at else ''} of {where} is not the one "
                f"captured: a hook of that name is registered, but its code, closure, "
                f"state, defaults or registration flags (with_kwargs, always_call) "
                f"differ{detail}, and the artifact runs the captured one as traced. "
                f"Register the captured hook again, or restore what it reads, or capture "
                f"with this one (re-emit the artifact)"
            )
        if added:
            at = (located or {}).get(added[0][0])
            return (
                f"a {kind} `{added[0][0]}`{f' ({at})' if at else ''} was added to {where} "
                f"after capture; the artifact did not trace it, so it cannot serve it. "
                f"Remove the hook, or capture with the hook registered (re-emit the "
                f"artifact)"
            )
        if removed:
            return (
                f"the {kind} `{removed[0][0]}` that {where} had at capture is gone; the "
                f"artifact runs it as traced. Register it again, or capture without it "
                f"(re-emit the artifact)"
            )
        names_now = ", ".join(h[0] for h in after)
        names_then = ", ".join(h[0] for h in before)
        return (
            f"the {kind}s of {where} run in another order than at capture "
            f"({names_now}; captured: {names_then}). Register them as at capture, or "
            f"re-emit the artifact"
        )
    return ""
