"""State Dynamo's guards read in another way than eager does, which an artifact must
serve exactly or refuse: an OrderedDict reordered with ``move_to_end`` (an argument, a
module global, one iterated only after a graph break), a dict subclass whose ``items()``
iterates in another order than it stores (its guards must compare the storage order the
capture saw, although pickle rebuilds it through ``items()``), an ``nn.Module`` instance
``__dict__`` entry shadowing a submodule or a parameter, and a builtin the trace used
shadowed by a module global or patched in ``builtins`` after load. Each is checked on
the Dynamo-free ("plain") guard path, on Dynamo's guard manager (a ``torch.device``
argument keeps it) and, for builtins, in a frame served by installing and by a make_fx
artifact. Captured here, served in one fresh process; every step after a refusal
restores the state, and the next step must be served again."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch

import precompile
from tests.fixtures import dynamo_shadowing as s
from tests.harness import capture_pair, run_job

#: The refusal of an OrderedDict reordered after capture, for the argument ``cfg``.
MOVED = ("`cfg` is an OrderedDict", "['mul', 'add']", "move_to_end")
#: The refusal of a dict subclass holding its keys in the other order than at capture.
SWAPPED = ("`cfg` does not have 'add' as its key number 0",)
#: entry -> (fn, tracer, guard path or serving mode expected, {step: words or None})
EXPECTED: dict[str, tuple[str, str, str, dict[str, tuple[str, ...] | None]]] = {
    "ordered plain": (
        "ordered",
        "dynamo",
        "plain",
        {"same": None, "moved": MOVED, "same/again": None},
    ),
    "ordered dynamo": (
        "ordered_on",
        "dynamo",
        "dynamo",
        {"same": None, "moved": MOVED, "same/again": None},
    ),
    "ordered global": (
        "ordered_global",
        "dynamo",
        "plain",
        {
            "same": None,
            "global moved": (
                "module tests.fixtures.dynamo_shadowing's global `CFG`",
                "move_to_end",
            ),
            "same/again": None,
        },
    ),
    "ordered after break": (
        "ordered_after_break",
        "dynamo",
        "plain",
        {"same": None, "moved": MOVED, "same/again": None},
    ),
    "ordered aliased": (
        "ordered_aliased",
        "dynamo",
        "plain",
        {
            "same": None,
            "moved": ("`p['cfg']` is an OrderedDict", "move_to_end"),
            "same/again": None,
        },
    ),
    "ordered built": ("ordered_built", "dynamo", "dynamo", {"same": None}),
    # A dict subclass overriding items(): its guards compare the keys in storage order.
    "reversed items plain": (
        "slotted_items",
        "dynamo",
        "plain",
        {"same": None, "moved": SWAPPED, "same/again": None},
    ),
    "reversed items dynamo": (
        "reversed_items",
        "dynamo",
        "dynamo",
        {"same": None, "moved": SWAPPED, "same/again": None},
    ),
    "reversed ordered": (
        "reversed_ordered",
        "dynamo",
        "dynamo",
        {"same": None, "moved": SWAPPED, "same/again": None},
    ),
    "net plain": (
        "net",
        "dynamo",
        "plain",
        {
            "same": None,
            "shadow act": (
                "`model.act` is shadowed",
                "holds 'act' (a Tanh)",
                "the submodule `act`",
                "del vars(model)['act']",
            ),
            "same/again": None,
            "shadow weight": ("`model.lin.weight` is shadowed", "the parameter `weight`"),
            "same/last": None,
            # After a served call: the instance dict replaced whole, not stored into.
            "dict replaced": ("`model.act` is shadowed", "the submodule `act`"),
            "same/replaced": None,
            "child dict replaced": ("`model.lin.weight` is shadowed",),
            "same/child replaced": None,
        },
    ),
    "net dynamo": (
        "net_on",
        "dynamo",
        "dynamo",
        {"same": None, "shadow act": ("`model.act` is shadowed",), "same/again": None},
    ),
    # A class forwarding __getattr__ to an inner module (its super() cell keeps Dynamo's
    # guard manager): a new instance or class attribute of a name the trace resolved
    # through it is refused; changing one held at capture is served.
    "forwarded": (
        "forwarded",
        "dynamo",
        "dynamo",
        {
            "same": None,
            "shadow forwarded": (
                "`model` has an attribute 'lin' (a Identity)",
                "did not have at capture",
                "class Forwarding defines __getattr__",
                "del vars(model)['lin']",
            ),
            "same/again": None,
            "class gain": (
                "class tests.fixtures.dynamo_shadowing.Forwarding has an attribute 'gain'",
                "defines __getattr__",
                "del Forwarding.gain",
            ),
            "same/last": None,
            "renote": None,
        },
    ),
    "counted plain": (
        "counted",
        "dynamo",
        "plain",
        {
            "same": None,
            "len shadowed": (
                "binds the global `len`",
                "builtins.len",
                "del tests.fixtures.dynamo_shadowing.len",
            ),
            "max shadowed": ("binds the global `max`", "builtins.max"),
            "abs patched": ("builtins.abs is", "Restore builtins.abs"),
            "same/again": None,
        },
    ),
    "counted dynamo": (
        "counted_on",
        "dynamo",
        "dynamo",
        {
            "same": None,
            "len shadowed": ("binds the global `len`",),
            "abs patched": ("builtins.abs is",),
            "same/again": None,
        },
    ),
    "counted installed": (
        "counted_in_helper",
        "dynamo",
        "installed",
        {
            "same": None,
            "len shadowed": ("binds the global `len`",),
            "max shadowed": ("binds the global `max`",),
            "abs patched": ("builtins.abs is",),
            "same/again": None,
        },
    ),
    "counted fx": (
        "counted_fx",
        "fx",
        "fx",
        {
            "same": None,
            "len shadowed": ("binds the global `len`", "resolved `len` to the builtin"),
            "abs patched": ("builtins.abs is", "Restore builtins.abs"),
            "same/again": None,
            # Named as the patched builtin, not as the driver's own len(args) failing.
            "len patched": ("builtins.len is", "Restore builtins.len"),
            "same/len": None,
        },
    ),
    # make_fx, each change after a served call.
    "ordered global fx": (
        "ordered_global_fx",
        "fx",
        "fx",
        {
            "same": None,
            "global moved": ("global CFG of module tests.fixtures.dynamo_shadowing",),
            "same/again": None,
        },
    ),
    "ordered attribute fx": (
        "configured_fx",
        "fx",
        "fx",
        {
            "same": None,
            "attr moved": ("has cfg = {'mul': 2.0, 'add': 1.0}", "the trace read"),
            "same/again": None,
        },
    ),
    "net fx": (
        "net_fx",
        "fx",
        "fx",
        {
            "same": None,
            "dict replaced": ("the model of module argument 0 has an attribute 'act'",),
            "same/replaced": None,
            "child dict replaced": ("submodule 'lin'", "has an attribute 'weight'"),
            "same/child replaced": None,
        },
    ),
    "library builtin fx": (
        "seq_fx",
        "fx",
        "fx",
        {
            "same": None,
            "iter patched": ("builtins.iter is", "Restore builtins.iter"),
            "same/again": None,
        },
    ),
}


def test_shadowed_state_is_served_exactly_or_refused(tmp_path: Path) -> None:
    job = {}
    for name, (fn_name, tracer, mode, steps) in EXPECTED.items():
        args = s.ARGS[fn_name](OrderedDict([("add", 1.0), ("mul", 2.0)]))
        paths = capture_pair(
            getattr(s, fn_name),
            *args,
            directory=tmp_path,
            name=name.replace(" ", "_"),
            tracer=precompile.MakeFxTracer() if tracer == "fx" else precompile.DynamoTracer(),
        )
        metadata = precompile.inspect_artifact(paths[0])
        # Not vacuous: each entry runs on the guard path (or serving mode) it names.
        if mode == "installed":
            assert metadata["SERVING_MODE"] == "installed", name
        elif mode != "fx":
            assert metadata["SERVING_MODE"] == "standalone", name
            assert metadata["GUARD_RUNTIME"]["path"] == mode, (name, metadata["GUARD_RUNTIME"])
        job[name] = (paths, fn_name, list(steps))
    results = run_job("tests.fixtures.dynamo_shadowing", job, tmp_path / "job.json")
    problems = []
    for name, (_fn, _tracer, _mode, steps) in EXPECTED.items():
        for step, words in steps.items():
            got = results[f"{name}: {step}"]
            if words is None:
                if got["result"] != "exact":
                    problems.append(f"{name} -> {step}: expected exact, got {got}")
            elif got["result"] != "refused" or not all(w in got["message"] for w in words):
                problems.append(f"{name} -> {step}: expected {words}, got {got}")
    assert not problems, "\n".join(problems)


def test_only_an_ordered_dict_iterated_is_checked(tmp_path: Path) -> None:
    """An OrderedDict is recorded for the per-call order check only where the guards
    compare its keys by position: iterated, not read by key."""
    rows = {}
    for fn in (s.ordered, s.keyed):
        paths = capture_pair(
            fn,
            OrderedDict([("add", 1.0), ("mul", 2.0)]),
            torch.ones(3),
            directory=tmp_path,
            name=fn.__name__,
            tracer=precompile.DynamoTracer(),
        )
        rows[fn.__name__] = precompile.inspect_artifact(paths[0])["ORDERED_DICTS"]
    assert rows == {"ordered": [{"path": "cfg", "shown": "cfg", "module": None}], "keyed": []}
