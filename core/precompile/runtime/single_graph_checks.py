"""What a single-graph artifact checks besides its inputs: the code the trace ran
through, the globals, module and class state, the captured function's defaults and
closure values, and the torch settings fn read -- each compared with what the capture
recorded, with a message that names what changed and how to fix it.

Runtime, emitted whole into single-graph artifacts before ``single_graph`` (which calls these
at load and on a call that misses its fast path); the fingerprints are
``value_fingerprints``'s, their differences ``fingerprint_differences``'s. The names read from the artifact's namespace are declared under
TYPE_CHECKING.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    MODULE_POSITIONS: list[int] = []
    TRAINING: bool = False
    MODULE_STATE: list[list[Any]] = []
    MODULE_READS: list[list[list[Any] | None]] = []
    MODULE_READ_NOTES: list[list[Any]] = []
    MODULE_TRAINING: list[list[tuple[str, bool | None]]] = []
    CLASS_STATE: list[tuple[str, Any]] = []
    READ_NAMES: list[str] = []
    GLOBAL_READS: list[dict[str, Any]] = []
    GLOBAL_HOOKS: dict[str, Any] = {}
    GLOBAL_HOOK_DICTS: tuple[str, ...] = ()
    FUNCTION_SOURCES: list[dict[str, Any]] = []
    ENTRY: dict[str, Any] | None = None

    def _global_module_hooks() -> tuple[dict[Any, Any], ...]: ...

    def refuse(message: str, invariant: int | None = None) -> NoReturn: ...

    def import_user_module(name: str) -> Any: ...

    def changed_functions(records: Any, module_text: Any) -> Any: ...

    def decode_source(data: bytes) -> str | None: ...

    def changed_function_message(record: dict[str, Any], gone: bool, consequence: str) -> str: ...

    def new_context(names: Any, training: bool = True) -> dict[str, Any]: ...

    def fingerprint(value: Any, context: dict[str, Any], depth: int = 0) -> Any: ...

    def keyed_fingerprint(value: Any, keys: list[Any], context: dict[str, Any]) -> Any: ...

    def module_fingerprint(
        module: Any,
        context: dict[str, Any],
        depth: int = 0,
        children: bool = True,
        own: Any = None,
        truth: Any = None,
    ) -> tuple[Any, ...]: ...

    def split_reads(row: Any) -> tuple[frozenset[str] | None, dict[str, bool]]: ...

    def truth_deleted_refusal(where: str, attr: str) -> str: ...

    def truth_refusal(where: str, attr: str, kind: str) -> str: ...

    def global_hooks_fingerprint(
        hooks: tuple[dict[Any, Any], ...],
        contents: bool = True,
        outer: dict[str, Any] | None = None,
        reached: list[Any] | None = None,
    ) -> dict[str, Any]: ...

    # precompile.runtime.hook_words, carried before value_fingerprints.
    def hook_change(
        captured: dict[str, Any],
        now: dict[str, Any],
        where: str,
        located: dict[str, str] | None = None,
    ) -> str: ...

    def hook_locations(modules: Any, attrs: Any) -> dict[str, str]: ...

    def reached_classes(start: Any, context: dict[str, Any]) -> list[tuple[Any, Any]]: ...

    CLASS_TRUTH: str = ""

    def class_truth_of(records: Any) -> dict[str, frozenset[str]]: ...

    def is_truth_record(fp: Any) -> bool: ...

    def type_name(cls: Any) -> str: ...

    def describe_value(fp: Any) -> str: ...

    def first_difference(old: Any, new: Any, path: str = "") -> tuple[str, Any, Any]: ...


def recorded_path(path: str | None) -> str | None:
    """A source path the capture recorded relative to the artifact, resolved against
    where this artifact is now (None when the artifact was executed without a file)."""
    import os

    here = globals().get("__file__")
    if not path:
        return None
    if os.path.isabs(path):
        return path
    if not here:
        return None
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(here)), path))


def live_module(name: str, path: str | None) -> Any:
    """The module a record names, as this process runs it (imported if it is not yet);
    None for a ``__main__`` that is another script than the one captured from."""
    import os
    import sys

    if name == "__main__":
        main = sys.modules.get("__main__")
        file = getattr(main, "__file__", None)
        recorded = recorded_path(path)
        if file and recorded and os.path.realpath(file) == os.path.realpath(recorded):
            return main
        return None
    return import_user_module(name)


def check_function_sources_once() -> None:
    """Refuse to load when a function the trace ran through changed since capture: the
    graph holds what the old code computed."""
    for record, gone in changed_functions(FUNCTION_SOURCES, module_text):
        refuse(
            changed_function_message(record, gone, "the graph was traced through the old code"),
            3,
        )


def module_text(name: str, path: str) -> str | None:
    """A module's live source; for a script that ran as ``__main__`` at capture and is
    not this process's ``__main__``, that script's file."""
    import inspect

    try:
        module = live_module(name, path)
        if module is not None:
            return inspect.getsource(module)
        recorded = recorded_path(path)
        if recorded:
            with open(recorded, "rb") as f:
                return decode_source(f.read())
    except (OSError, TypeError, UnicodeDecodeError):
        pass
    return None


def global_scopes() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each module whose globals the trace read, as (its live globals, the record)."""
    scopes = []
    for record in GLOBAL_READS:
        module = live_module(record["module"], record["path"])
        if module is None:
            names = ", ".join(name for name, _ in record["values"])
            refuse(
                f"precompile: the traced code read globals ({names}) of the script "
                f"{record['path']}, which ran as __main__ at capture; this process runs "
                f"another __main__, so they cannot be checked. Move that code into an "
                f"importable module, or serve from the same script",
                3,
            )
        scopes.append((vars(module), record))
    return scopes


def known_identities() -> dict[str, Any]:
    """What serving contexts know of the objects the capture told apart by identity
    only (sentinels): each recorded module-level name resolved here, as ``known``
    (id -> (name, object)), whether this ``__main__`` is the capture's (``main``), and
    the recorded names' modules, where another such object's name is looked for (for
    the message; it matches no recorded one). A name that resolves to nothing here is
    absent, and a live object then matches no recorded one."""
    found: set[tuple[str, str]] = set()

    def walk(fp: Any) -> None:
        if isinstance(fp, (tuple, list)):
            if len(fp) == 3 and fp[0] == "sentinel" and isinstance(fp[2], (tuple, list)):
                found.update((str(m), str(n)) for m, n in fp[2])
                return
            for part in fp:
                walk(part)
        elif isinstance(fp, dict):
            for part in fp.values():
                walk(part)

    walk([MODULE_STATE, CLASS_STATE, GLOBAL_READS, ENTRY, GLOBAL_HOOKS])
    main_paths = [r["path"] for r in GLOBAL_READS if r["module"] == "__main__"]
    if ENTRY is not None and ENTRY["module"] == "__main__":
        main_paths.append(ENTRY["file"])
    main = any(live_module("__main__", path) is not None for path in main_paths)
    known: dict[int, Any] = {}
    for module_name, name in sorted(found):
        if module_name == "__main__" and not main:
            continue
        module = live_module(module_name, main_paths[0] if main_paths else None)
        namespace = getattr(module, "__dict__", None) or {}
        if name in namespace:
            known[id(namespace[name])] = ((module_name, name), namespace[name])
    near = tuple(sorted({module_name for module_name, _ in found} - {"__main__"}))
    return {"known": known, "main": main, "near": near, "everywhere": False}


def serving_context(identities: dict[str, Any]) -> dict[str, Any]:
    """A fingerprinting context as serving uses it: the capture's read names, with
    the recorded names of identity-only objects resolved here."""
    context = new_context(frozenset(READ_NAMES), TRAINING)
    context.update(identities)
    return context


def live_entry(identities: dict[str, Any]) -> Any:
    """The captured function as this process defines it, found by its module and
    qualname (a closure a factory made, by the module-level name bound to it), to check
    the defaults and closure values the graph baked. None when it holds none."""
    import types

    if ENTRY is None:
        return None
    name, qualname = ENTRY["module"], ENTRY["qualname"]
    module = live_module(name, ENTRY["file"])
    found: list[Any] = []
    if module is not None:
        holder: Any = module
        for part in qualname.split("."):
            holder = getattr(holder, part, None)
        found = [holder] if holder is not None else []
        if not found:
            for value in vars(module).values():
                if isinstance(value, (types.MethodType, staticmethod, classmethod)):
                    value = value.__func__
                if (
                    isinstance(value, types.FunctionType)
                    and value.__qualname__ == qualname
                    and value not in found
                ):
                    found.append(value)
    context = serving_context(identities)
    matching = [f for f in found if fingerprint(f, context) == ENTRY["fingerprint"]]
    if len(found) == 1 or (found and len(matching) == len(found)):
        return getattr(found[0], "__func__", found[0])
    shown = describe_value(ENTRY["fingerprint"])
    if module is None:
        refuse(
            f"precompile: the captured {shown} holds values the graph baked (its defaults "
            f"or closure variables) and was defined in the script {ENTRY['file']}, which "
            f"ran as __main__ at capture; this process runs another __main__, so they "
            f"cannot be checked. Move the function into an importable module, or pass "
            f"those values to it as arguments",
            3,
        )
    if not found:
        refuse(
            f"precompile: the captured {shown} holds values the graph baked (its "
            f"defaults or closure variables), and module {name} binds no module-level "
            f"name to a function {qualname} to check them against. Bind it to a "
            f"module-level name, or pass those values to it as arguments",
            3,
        )
    refuse(
        f"precompile: module {name} binds {len(found)} functions {qualname} with other "
        f"defaults or closure values than each other, so which one is served cannot be "
        f"told; the graph baked those of one of them. Capture a function that takes "
        f"those values as arguments",
        3,
    )


def check_entry(entry: Any, context: dict[str, Any]) -> None:
    """Raise when the captured function's defaults or closure values differ from what
    the graph baked (fingerprinting it also watches it per call)."""
    if entry is None or ENTRY is None:
        return
    live = fingerprint(entry, context)
    if live != ENTRY["fingerprint"]:
        path, then, now = first_difference(ENTRY["fingerprint"], live, ENTRY["qualname"])
        refuse(
            f"precompile: the captured function {path} is {describe_value(now)} but "
            f"the trace read {describe_value(then)}; the graph baked it. Restore it, "
            f"pass the value as an argument, or capture again (re-emit the artifact)",
            3,
        )


def check_globals(scopes: list[Any], context: dict[str, Any]) -> None:
    """Raise for a module-level value the traced code read that is not what it was."""
    for scope, record in scopes:
        # The module's file as this process imported it (absolute, as every other
        # message names a file); the record keeps it relative to the artifact.
        file = scope.get("__file__") if isinstance(scope, dict) else None
        where = file if isinstance(file, str) else record["path"]
        at = f" ({where})" if where else ""  # a built-in module (sys, time) has no file
        keyed = record.get("keyed") or {}
        for name, recorded in record["values"]:
            if name not in scope:
                live: Any = ("absent",)
            elif name in keyed:
                # A dict the traced code read only by these keys: the others and the
                # order reach nothing the graph computes.
                live = keyed_fingerprint(scope[name], keyed[name], context)
            else:
                live = fingerprint(scope[name], context)
            if live != recorded and recorded == ("absent",):
                refuse(
                    f"precompile: module {record['module']}{at} binds the "
                    f"global `{name}` to {describe_value(live)}; its traced code resolved "
                    f"`{name}` to the builtin, or found no such name (a lookup by string "
                    f"that took its default), and the graph baked what that did. Remove the "
                    f"global (del {record['module']}.{name}), or capture again with it "
                    f"bound (re-emit the artifact)",
                    3,
                )
            if live != recorded and record["module"] == "builtins":
                shown = "not defined" if name not in scope else describe_value(live)
                refuse(
                    f"precompile: builtins.{name} is {shown} in this process, but the traced "
                    f"code called {describe_value(recorded)} and the graph baked what it "
                    f"did. Restore builtins.{name}, or capture again with the new one "
                    f"(re-emit the artifact)",
                    3,
                )
            if live != recorded:
                path, then, now = first_difference(recorded, live, name)
                shown = "no longer defined" if name not in scope else f"{describe_value(now)}"
                read = describe_value(then)
                if name in keyed and name in scope:
                    # A key of a dict read by key: its presence is what was read.
                    shown = "no longer a key" if now == ("absent",) else shown
                    read = "no such key" if then == ("absent",) else read
                refuse(
                    f"precompile: global {path} of module {record['module']}{at} "
                    f"is {shown}, but the traced code read {read} and the graph "
                    f"baked it. Restore it, or capture again (re-emit the artifact)",
                    3,
                )
    # In the caller's pass: the objects the hooks reach (a closure's list, a callable
    # object's state) join what the model-state fast path watches per call.
    live_hooks = global_hooks_fingerprint(_global_module_hooks(), outer=context)
    if live_hooks != GLOBAL_HOOKS:
        # Compared as Dynamo artifacts compare them, and worded alike (hook_words).
        import torch.nn.modules.module as nn_module

        change = hook_change(
            GLOBAL_HOOKS,
            live_hooks,
            "every module (a global hook, torch.nn.modules.module.register_module_*)",
            hook_locations([nn_module], GLOBAL_HOOK_DICTS),
        )
        refuse(
            "precompile: torch's global module hooks (register_module_forward_hook and "
            f"friends) differ from those registered at capture, and the trace baked the "
            f"hooks present then: {change}",
            2,
        )


#: The dicts of a module whose order is the order ``children()``, ``parameters()``,
#: ``buffers()``, ``state_dict()``, ``Sequential`` and ``ModuleList`` iterate in: a
#: trace that read one of them (or whose reads were not seen) may have computed in
#: that order.
WALK_ORDER_DICTS = frozenset({"_modules", "_parameters", "_buffers"})


def walk_order_readers() -> list[str]:
    """The submodules (``m{i}:path``) whose child, parameter or buffer dicts the trace
    read, or whose reads it could not see: where the model's walk order may have
    decided what the graph computes. Empty when the graph depends on no order: every
    submodule and tensor is then reached by its name (``self.fc1``), so a model whose
    ``_modules`` holds the same entries in another order (``del m.fc1; m.fc1 = fc``)
    computes the same, and is served with its tensors keyed by name."""
    if not MODULE_READS:
        return ["every submodule (its reads were not recorded)"]
    readers: list[str] = []
    for mi, (rows, flags) in enumerate(zip(MODULE_READS, MODULE_TRAINING)):
        for row, (path, _) in zip(rows, flags):
            if row is None or WALK_ORDER_DICTS & set(row):
                what = "unseen reads" if row is None else sorted(WALK_ORDER_DICTS & set(row))
                readers.append(
                    f"{path or 'the model'} of module argument {MODULE_POSITIONS[mi]} ({what})"
                )
    return readers


def captured_walk(mi: int, module: Any) -> list[tuple[str, Any]]:
    """``module.named_modules()`` (module argument ``mi``), in the capture's order
    where the live walk holds the same paths in another order and no order decided
    what the trace computed (``walk_order_readers``); otherwise as it is, and the
    checks that zip it with the records refuse what differs."""
    live = list(module.named_modules())
    captured = [path for path, _ in MODULE_TRAINING[mi]] if mi < len(MODULE_TRAINING) else []
    paths = [path for path, _ in live]
    if paths == captured or sorted(paths) != sorted(captured) or walk_order_readers():
        return live
    by_path = dict(live)
    return [(path, by_path[path]) for path in captured]


def check_module_state(mods: list[Any], context: dict[str, Any]) -> None:
    """Raise the precise message for a submodule whose type, read attributes or hooks
    differ from what the trace saw (names, order and count were checked already)."""
    hook_kinds = ("forward pre-hooks", "forward hooks", "backward pre-hooks", "backward hooks")
    reads = MODULE_READS or [[None] * len(records) for records in MODULE_STATE]
    for mi, (m, records, row) in enumerate(zip(mods, MODULE_STATE, reads)):
        for (name, sub), record, own in zip(captured_walk(mi, m), records, row):
            # The attributes the trace read on this submodule (None: unseen, so those
            # its code names): an attribute it never read changes nothing served. Those
            # read only for their truth test, under training, by the kind of value.
            own_names, truth = split_reads(own)
            live = module_fingerprint(sub, context, children=False, own=own_names, truth=truth)
            if live == record:
                continue
            where = f"submodule {name!r}" if name else "the model"
            where += f" of module argument {MODULE_POSITIONS[mi]}"
            if live[0] != record[0]:
                refuse(
                    f"precompile: {where} is a {live[0]} but was captured as a {record[0]}; "
                    f"the trace baked the captured type's code. Pass a model of the "
                    f"captured structure, or capture again (re-emit the artifact)",
                    2,
                )
            old, new = dict(record[1]), dict(live[1])
            for attr in sorted(old.keys() | new.keys()):
                if old.get(attr) == new.get(attr):
                    continue
                if attr in truth and new.get(attr) == ("truth test", "absent"):
                    refuse(truth_deleted_refusal(where, attr), 2)
                if attr in truth:
                    refuse(truth_refusal(where, attr, new[attr][1]), 2)
                fix = "Restore it"
                if attr not in old:
                    state = f"has an attribute {attr!r} ({describe_value(new[attr])})"
                    state += " that it did not have at capture"
                    if hasattr(type(sub), attr):
                        # model.forward = ...: the instance's __dict__ shadows the method
                        # the trace ran.
                        owner = f"{type(sub).__name__}.{attr}"
                        state += (
                            f", set on the instance: it shadows the class's {owner}, "
                            f"which the capture ran"
                        )
                        # As Python spells it: a Sequential's child "0" is model[0].
                        dotted = "".join(
                            f"[{part}]" if part.isdigit() else f".{part}"
                            for part in [*name.split("."), attr]
                            if part
                        )
                        fix = (
                            f"Delete it from the instance (del model{dotted}, model being "
                            f"module argument {MODULE_POSITIONS[mi]}) so {owner} runs again"
                        )
                elif attr not in new:
                    state = f"no longer has the attribute {attr!r}"
                else:
                    path, then, now = first_difference(old[attr], new[attr], attr)
                    state = f"has {path} = {describe_value(now)}"
                    state += f" but the trace read {describe_value(then)}"
                # A library value other values of which could have been served, had
                # the graph allowed it: why it did not (``neutral_reads`` at capture).
                why = "".join(
                    f" ({note[3]})"
                    for note in MODULE_READ_NOTES
                    if note[0] == mi and note[1] == name and note[2] == attr
                )
                refuse(
                    f"precompile: {where} {state}; the traced code reads it, and the graph "
                    f"baked what it read{why}. {fix}, or capture again (re-emit the "
                    f"artifact)",
                    2,
                )
            for kind, now, then in zip(hook_kinds, live[2], record[2]):
                if now == then:
                    continue
                if len(now) == len(then):
                    i = next(i for i, (a, b) in enumerate(zip(now, then)) if a != b)
                    state = (
                        f"has {kind} {i} = {describe_value(now[i][0])}, which differs from "
                        f"the one captured ({describe_value(then[i][0])}) in its code, "
                        f"defaults, closure values or registration flags"
                    )
                else:
                    state = (
                        f"has {len(now)} {kind} "
                        f"({', '.join(describe_value(h[0]) for h in now) or 'none'}) but "
                        f"was captured with {len(then)} "
                        f"({', '.join(describe_value(h[0]) for h in then) or 'none'})"
                    )
                refuse(
                    f"precompile: {where} {state}; the trace baked the hooks present at "
                    f"capture. Register the same hooks, or capture again with these "
                    f"(re-emit the artifact)",
                    2,
                )


def check_class_state(subs: list[Any], context: dict[str, Any]) -> None:
    """Raise for a class whose methods, class attributes or special methods that the
    traced code reads differ from what the trace saw (a method monkeypatched,
    ``Net.scale = 2.0``, ``Net.__call__`` replaced, a property swapped): each submodule
    class, and each user class the other checks reached (a global ``Settings``, the
    class of a config object), so this runs after them."""
    recorded = dict(CLASS_STATE)
    # Class-level flags read only for their truth test are compared by truth kind.
    context[CLASS_TRUTH] = class_truth_of(CLASS_STATE)
    for cls, live in reached_classes(dict.fromkeys(map(type, subs)), context):
        then = recorded.get(type_name(cls))
        if then is None or live == then:
            continue  # a type not captured was refused already
        old, new = dict(then), dict(live)
        for name in sorted(old.keys() | new.keys()):
            if old.get(name) != new.get(name) and is_truth_record(old.get(name)):
                if name not in new:
                    refuse(truth_deleted_refusal(f"class {type_name(cls)}", name), 2)
                refuse(truth_refusal(f"class {type_name(cls)}", name, new[name][1]), 2)
            if old.get(name) != new.get(name):
                path, was, now = first_difference(
                    old.get(name, ("absent",)), new.get(name, ("absent",)), name
                )
                if name not in new:
                    state = f"is gone but the trace read {describe_value(was)}"
                elif name not in old:
                    state = (
                        f"is {describe_value(now)}, which no class along its MRO "
                        f"defined when the trace ran"
                    )
                else:
                    state = f"is {describe_value(now)} but the trace read {describe_value(was)}"
                refuse(
                    f"precompile: {type_name(cls)}.{path} {state} (a class attribute or "
                    f"method the traced code reads, or a special method Python calls on "
                    f"it); the graph baked it. Restore it, or capture again (re-emit the "
                    f"artifact)",
                    2,
                )
