"""Hooks are identified one way by both tracers: by the function a hook is (its code,
closure and defaults) and its registration flags, in order -- not by its name.

A hook made by a factory keeps its qualified name whatever it closes over, so a hook
replaced by one of the same name that computes something else (``make_hook(3)`` for
``make_hook(2)``, ``flex`` registered with kwargs, two hooks swapped, a global module
hook from a factory) must be refused naming the hook, or served with eager's numbers,
by make_fx and Dynamo artifacts alike, in a fresh process, the change made before
``load`` and after a first served call. A hook made again equal to the captured one is
served (tests/fixtures/hook_identity.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from tests.fixtures import hook_identity
from tests.harness import capture_pair, run_json, together

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


def _capture(tmp_path: Path, tracer: str) -> dict[str, tuple[str, str]]:
    import torch.nn.modules.module as nn_module

    model, x, _handles = hook_identity.build(seed=0)
    pairs = {
        "module": capture_pair(
            hook_identity.step,
            model,
            x,
            directory=tmp_path,
            name=f"{tracer}_module",
            tracer=TRACERS[tracer](),
        )
    }
    plain, x, _ = hook_identity.build(seed=0, hooks=False)
    handle = nn_module.register_module_forward_hook(hook_identity.make_global_hook(2.0))
    try:
        pairs["global"] = capture_pair(
            hook_identity.step,
            plain,
            x,
            directory=tmp_path,
            name=f"{tracer}_global",
            tracer=TRACERS[tracer](),
        )
    finally:
        handle.remove()
    return pairs


def _serve(pairs: dict[str, tuple[str, str]]) -> dict[str, Any]:
    code = f"""
import json, warnings, precompile
warnings.simplefilter("ignore")
from tests.fixtures import hook_identity
print(json.dumps(hook_identity.serve_cells({pairs!r})))
"""
    return dict(run_json(code))


def test_a_hook_replaced_by_one_of_the_same_name_is_refused_by_both_tracers(
    tmp_path: Path,
) -> None:
    captured = {tracer: _capture(tmp_path, tracer) for tracer in TRACERS}
    results = together(*(lambda p=pairs: _serve(p) for pairs in captured.values()))
    problems = []
    for tracer, cells in zip(captured, results):
        for cell, (_kind, _change, words) in hook_identity.CHANGES.items():
            for when in ("before load", "after load"):
                got = cells[f"{cell} {when}"]
                ok = got == "exact" if words is None else got.startswith("refused: ")
                if ok and words is not None:
                    ok = words in got and "hook" in got
                if not ok:
                    wanted = "exact" if words is None else f"a refusal naming {words}"
                    problems.append(f"{tracer} {cell} {when}: expected {wanted}, got {got}")
        for cell, (_kind, _change, words) in hook_identity.FLAG_ONLY.items():
            for when in ("before load", "after load"):
                got = cells[f"{cell} {when}"]
                if got != "exact" and not (got.startswith("refused: ") and words in got):
                    problems.append(f"{tracer} {cell} {when}: expected exact or refused, {got}")
    assert not problems, "\n".join(problems)
    assert torch.nn.modules.module._global_forward_hooks == {}


def test_a_hook_bound_to_its_own_module_is_served_by_both_tracers(tmp_path: Path) -> None:
    """A module whose hook is a bound method of itself: identifying the hook reaches the
    module, whose hooks hold that method again -- captured and served exactly by both
    tracers in a fresh process (make_fx's capture recursed without end), and a changed
    value the hook reads is refused."""
    torch.manual_seed(0)
    gate, x = hook_identity.Gate(), torch.randn(2, 4)
    pairs = {
        tracer: capture_pair(
            hook_identity.step, gate, x, directory=tmp_path, name=f"gate_{tracer}", tracer=make()
        )
        for tracer, make in TRACERS.items()
    }
    code = f"""
import json, warnings, torch, precompile
warnings.simplefilter("ignore")
from tests.fixtures import hook_identity
out = {{}}
for tracer, pair in {pairs!r}.items():
    torch.manual_seed(0)
    gate, x = hook_identity.Gate(), torch.randn(2, 4)
    run = precompile.load(*pair)
    with torch.no_grad():
        out[tracer] = torch.equal(run(gate, x), hook_identity.step(gate, x))
        gate.k = 5.0
        try:
            run(gate, x)
            out[tracer + " k"] = "served"
        except precompile.PrecompileError as error:
            out[tracer + " k"] = str(error)
    run.unload()
print(json.dumps(out))
"""
    out = run_json(code)
    for tracer in TRACERS:
        assert out[tracer] is True, out
        assert "k" in out[tracer + " k"] and "3.0" in out[tracer + " k"], out


def test_a_hook_storing_activations_in_its_closure_is_served_by_dynamo(tmp_path: Path) -> None:
    """A hook that stores each output into a dict it closes over, captured by Dynamo at
    two shapes: the dict's contents change with every call (Dynamo guards what the hook
    reads of it, and replays the store), so the hook stays the one captured -- served
    exactly in a fresh process, the dict holding eager's output after each call. make_fx
    cannot replay the store (an artifact runs no Python): it refuses the capture, naming
    the hook's closure cell the store went into (its artifact used to refuse the call)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    hook, _seen = hook_identity.make_recorder()
    model.register_forward_hook(hook)
    paths = str(tmp_path / "rec.py"), str(tmp_path / "rec.cache")
    with precompile.capture(
        hook_identity.step,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.DynamoTracer(),
        backend="eager",
    ) as cap:
        cap(model, torch.randn(2, 4))
        cap(model, torch.randn(3, 4))
    with pytest.raises(precompile.PrecompileError) as refused:
        capture_pair(hook_identity.step, model, torch.randn(2, 4), directory=tmp_path, name="fx")
    assert "._forward_hooks[" in str(refused.value), refused.value
    assert "(closure cell seen)['out']" in str(refused.value), refused.value
    code = f"""
import json, warnings, torch, precompile
warnings.simplefilter("ignore")
from tests.fixtures import hook_identity
out = {{}}
for tracer, paths in (("dynamo", {paths!r}),):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    hook, seen = hook_identity.make_recorder()
    model.register_forward_hook(hook)
    run = precompile.load(*paths)
    out[tracer] = []
    try:
        with torch.no_grad():
            for n in (2, 3, 2):
                x = torch.randn(n, 4)
                got = run(model, x)
                stored = seen["out"]
                exact = torch.equal(got, hook_identity.step(model, x))
                out[tracer].append(exact and torch.equal(stored, got))
    except precompile.PrecompileError as error:
        out[tracer].append(str(error))
print(json.dumps(out))
"""
    out = run_json(code)
    assert out == {"dynamo": [True, True, True]}, out
