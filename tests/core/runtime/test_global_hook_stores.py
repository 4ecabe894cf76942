"""A global module hook that stores into what it reaches (issue 26, round 3).

torch's global module hooks (``register_module_forward_hook`` and friends) are keyed by
handle id, a per-process counter. Dynamo replays a hook's store (``seen.append(out)``,
``table["out"] = out``, ``self.count += 1``) through ``_global_forward_hooks[<id>]``,
which a fresh process numbers differently: served, it failed with ``KeyError`` or left
the list holding the replayed contents instead of eager's. make_fx runs no Python at
serve time and cannot store at all. Both tracers now refuse such a capture, naming the
hook, where it is defined and the fix (``hook_stores``); a global hook that only reads
its state is still served in a fresh process whose hook ids differ from the capture's.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.modules.module as nn_module

import precompile
from tests.fixtures import global_hook_stores, hook_state
from tests.harness import capture_pair, run_json

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}
WHERE = {"append": "record", "setitem": "keep", "attribute": "Counter", "pre": "note"}


@pytest.mark.parametrize("kind", global_hook_stores.KINDS)
@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_a_global_hook_storing_into_what_it_reaches_is_refused_at_capture(
    tmp_path: Path, tracer: str, kind: str
) -> None:
    """Closure list, closure dict, a callable object's attribute, a pre-hook: refused
    at capture, naming the hook (its qualname and file:line), what it does and the fix,
    by one rule (the store's target is reached through the global hook dicts), never
    served to crash or store wrongly in another process."""
    torch.manual_seed(0)
    hook = global_hook_stores.make(kind)
    handle = global_hook_stores.register(kind, hook)
    try:
        with torch.no_grad(), pytest.raises(precompile.PrecompileError) as refused:
            capture_pair(
                global_hook_stores.serve,
                torch.nn.Linear(4, 4),
                torch.randn(3, 4),
                directory=tmp_path,
                tracer=TRACERS[tracer](),
            )
    finally:
        handle.remove()
    message = str(refused.value)
    assert "the global module hook `tests.fixtures.global_hook_stores." in message
    assert WHERE[kind] in message and "global_hook_stores.py:" in message, message
    assert "stores into what it reaches" in message, message
    assert "model.register_forward_hook" in message and "remove it during capture" in message
    assert ("handle id" in message) == (tracer == "dynamo"), message


CHILD = """
import json, warnings, torch, precompile
import torch.nn.modules.module as nn_module
warnings.simplefilter("ignore")
from tests.fixtures import hook_state
# Hook ids in this process differ from the capture's.
for _ in range(3):
    nn_module.register_module_forward_hook(lambda m, a, o: None).remove()
out = {{}}
for tracer, (artifact, cache) in {pairs!r}:
    run = precompile.load(artifact, cache)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    handle = nn_module.register_module_forward_hook(hook_state.make("closure"))
    try:
        with torch.no_grad():
            x = torch.randn(3, 4)
            out[tracer] = [bool(torch.allclose(run(model, x), hook_state.serve(model, x)))
                           for _ in range(2)]
    except Exception as error:
        out[tracer] = type(error).__name__ + ": " + str(error)
    finally:
        handle.remove()
print(json.dumps(out))
"""


def test_a_global_hook_that_only_reads_is_served_where_hook_ids_differ(tmp_path: Path) -> None:
    """The rule refuses stores only: a global hook reading its closure, captured by
    both tracers, is served exactly (compared with eager) in a fresh process that
    numbered its hooks differently."""
    pairs: list[Any] = []
    for tracer in sorted(TRACERS):
        torch.manual_seed(0)
        handle = nn_module.register_module_forward_hook(hook_state.make("closure"))
        try:
            with torch.no_grad():
                paths = capture_pair(
                    hook_state.serve,
                    torch.nn.Linear(4, 4),
                    torch.randn(3, 4),
                    directory=tmp_path,
                    name=tracer,
                    tracer=TRACERS[tracer](),
                )
        finally:
            handle.remove()
        pairs.append((tracer, paths))
    out = run_json(
        textwrap.dedent(CHILD.format(pairs=pairs)), cwd=Path(__file__).resolve().parents[3]
    )
    assert out == {"dynamo": [True, True], "make_fx": [True, True]}, out
