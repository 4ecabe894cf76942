"""Hooks as both tracers record them: each hook dict's hooks by name (for messages) and
identity (``value_fingerprints.hooks_fingerprint``), torch's global module hooks the same
way (``global_hooks_fingerprint``), and what the hooks reach, for a driver to watch per
call (``reached_state``, ``reached_key``): a store into a dict a hook reads changes its
version tag, a list or an object's state changes what ``reached_key`` holds.

Emitted verbatim into both artifact kinds after ``value_fingerprints``
(``capturing.carried``); reads the hook dicts' names the artifact prelude binds.
"""

from __future__ import annotations

from typing import Any

# >>> not emitted: artifacts carry hook_kinds, hook_words and value_fingerprints before
# this module, and their prelude binds the hook dicts' names
from precompile._compat.prelude import GLOBAL_HOOK_DICTS
from precompile.runtime.hook_kinds import global_hook_holder
from precompile.runtime.hook_words import hook_name
from precompile.runtime.value_fingerprints import (
    hook_dict,
    hook_read_names,
    hooks_fingerprint,
    new_context,
    shallow_contents,
)

# <<< not emitted


def named_hooks(
    holder: Any,
    dict_names: tuple[str, ...],
    flags: Any,
    contents: bool = True,
    skip: Any = None,
    outer: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Non-empty hook dict -> ``(hook_name, identity)`` per hook, in order: identities by
    ``hooks_fingerprint``, names for messages (``hook_words``); ``skip`` and ``outer``
    as there."""
    found = {}
    identified = hooks_fingerprint(holder, dict_names, flags, (), contents, skip, outer)
    for dict_name, identities in zip(dict_names, identified):
        if identities:
            hooks = [
                h
                for h in hook_dict(holder, dict_name).values()
                if skip is None or not skip(dict_name, h)
            ]
            found[dict_name] = tuple(zip(map(hook_name, hooks), identities))
    return found


def global_hooks_fingerprint(
    hooks: tuple[dict[Any, Any], ...],
    contents: bool = True,
    outer: dict[str, Any] | None = None,
    reached: list[Any] | None = None,
) -> dict[str, Any]:
    """torch's global module hooks (``register_module_forward_hook`` and friends), which
    run around every module call, as ``named_hooks`` gives a module's, less torch's
    module trackers' (``global_hook_holder``); what both tracers record and compare
    (make_fx's ``GLOBAL_HOOKS``, Dynamo's ``MODULE_HOOKS["global"]``). ``outer``: the
    fingerprinting pass to do it in (its read names count, and the objects the hooks
    reach join those it watches); without one, a pass of its own by the names the
    hooks' code reads (``hook_read_names``), appended to ``reached`` (for a driver to
    watch what the hooks reach: ``reached_state``)."""
    holder, flags = global_hook_holder(hooks)
    if outer is None:
        outer = new_context(hook_read_names(holder, GLOBAL_HOOK_DICTS))
        outer["contents"] = contents
        if reached is not None:
            reached.append(outer)
    return named_hooks(holder, GLOBAL_HOOK_DICTS, flags, contents, None, outer)


def reached_state(contexts: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """What the fingerprinting passes ``contexts`` found a hook to reach, for a driver
    that watches it per call: the dicts (by version tag) and the other objects (by
    ``reached_key``: lists, sets, functions, objects whose instance dict or slots hold
    state), each once."""
    dicts = {id(d): d for c in contexts for d in c["dicts"]}
    objects = {id(o): o for c in contexts for o in [*c["shallow"], *c["holders"]]}
    return list(dicts.values()), list(objects.values())


def reached_key(value: Any) -> tuple[Any, Any]:
    """What no version tag sees of ``value``: a function's code, defaults and closure
    cells' contents; another object's instance dict (``o.__dict__ = d`` replaces it
    whole) and direct contents (``shallow_contents``). As ``(ids, objects)``: two keys
    compare by identity (the ids differ first, or the objects, kept alive by the key,
    are the very same), never by a tensor's ``==``."""
    if hasattr(value, "__closure__"):
        held = [value.__code__, value.__defaults__, value.__kwdefaults__]
        for cell in value.__closure__ or ():
            try:
                held.append(cell.cell_contents)
            except ValueError:
                held.append(cell)  # an emptied cell: never what it held
    else:
        held = [getattr(value, "__dict__", None), *shallow_contents(value)]
    items = tuple(held)
    return tuple(map(id, items)), items
