"""A global module hook that stores into what it reaches, refused at capture (both tracers).

torch's global module hooks (``register_module_forward_hook`` and friends) live in dicts
keyed by handle id, a per-process counter. A hook that stores into state it reaches (a
closure's list or dict, its own attribute) cannot be served from another process:

- Dynamo replays the store in the frame's bytecode through the hook's source,
  ``_global_forward_hooks[<id>]...``, which another process numbers differently (a
  ``KeyError``, or another hook's state), and the guards that made the replay right
  (the list's length, the attribute's value) are on that same per-process path;
- make_fx runs no Python at serve time: the store is not in the graph at all.

One rule for both: a store the trace made into what a global hook reaches is refused at
capture, naming the hook and where it is defined. A module's own hook
(``model.register_forward_hook``) is reached from fn's arguments, and is served.
"""

from __future__ import annotations

from typing import Any

from precompile._compat.prelude import global_module_hooks
from precompile.errors import Location, PrecompileError
from precompile.locations import definition_location
from precompile.runtime import hook_records
from precompile.runtime.hook_kinds import watches_only
from precompile.runtime.hook_words import hook_name


def hook_location(hook: Any) -> Location | None:
    """Where ``hook`` is defined: its function's ``def`` (a partial's or bound method's
    function), or a callable object's ``__call__``."""
    target = getattr(hook, "func", hook)
    target = getattr(target, "__func__", target)
    code = getattr(target, "__code__", None)
    if code is None:
        code = getattr(vars(type(target)).get("__call__"), "__code__", None)
    return definition_location(code) if code is not None else None


def global_hook_store_refusal(hook: Any, stored: str, tracer: str) -> PrecompileError:
    """The refusal of a capture whose trace stored into what the global module hook
    ``hook`` reaches (``stored``: what it stored into, in words)."""
    where = hook_location(hook)
    at = f" ({where.file}:{where.line})" if where is not None else ""
    why = (
        "Dynamo replays the store through the hook's handle id in torch's global hook "
        "dict, a per-process number another process does not share"
        if tracer == "dynamo"
        else "make_fx cannot replay a store (the artifact runs no Python)"
    )
    return PrecompileError(
        f"the global module hook `{hook_name(hook)}`{at} stores into what it reaches "
        f"({stored}) during the captured call; {why}, so no served call can store as "
        f"eager does",
        invariant=4,
        location=where,
        hint="register it on the module instead (model.register_forward_hook(hook), "
        "served with its stores), or remove it during capture",
    )


def _state_key(hook: Any, position: int, key: Any, hooks: tuple[dict[Any, Any], ...]) -> Any:
    """What ``hook`` (registered at ``key`` of global hook dict ``position``) reaches, by
    identity: each reached dict's items and each other object's ``reached_key``, the
    objects kept alive so that equal ids mean the very same objects."""
    alone = tuple({key: hook} if i == position else {} for i in range(4)) + hooks[4:6]
    reached: list[Any] = []
    hook_records.global_hooks_fingerprint(alone, reached=reached)
    dicts, objects = hook_records.reached_state(reached)
    held = [tuple(d.items()) for d in dicts] + [hook_records.reached_key(o) for o in objects]
    ids = tuple(tuple(id(v) for pair in items for v in pair) for items in held[: len(dicts)])
    return (ids, tuple(k for k, _ in held[len(dicts) :])), held


def global_hook_states() -> list[tuple[Any, Any]]:
    """Each global module hook (less torch's module trackers') with what it reaches, by
    identity, for ``refuse_global_hook_stores`` after a make_fx trace."""
    hooks = global_module_hooks()
    states = []
    for position, hook_dict in enumerate(hooks[:4]):
        for key, hook in hook_dict.items():
            if not watches_only(hook):
                states.append((hook, _state_key(hook, position, key, hooks)))
    return states


def refuse_global_hook_stores(before: list[tuple[Any, Any]]) -> None:
    """Refuse a make_fx capture whose trace stored into what a global module hook
    reaches (``before``: ``global_hook_states()`` taken before the trace)."""
    after = {id(hook): state for hook, state in global_hook_states()}
    for hook, (key, _held) in before:
        now = after.get(id(hook))
        if now is not None and now[0] != key:
            raise global_hook_store_refusal(hook, "its closure or its own state", "make_fx")
