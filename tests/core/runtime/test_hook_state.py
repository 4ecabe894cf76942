"""What a global module hook reaches, changed after serving began (issue 26, round 3).

torch's global module hooks (``register_module_forward_hook``) run around every module
call, and the trace baked what they computed then. A hook's identity is its function
(code, closure, defaults) and the state its code reads: a closure's list or dict entry,
a callable object's attribute. Each cell captures ``serve`` under one global hook
(``tests/fixtures/hook_state.py``), loads it in a fresh process under an equal hook,
serves two calls (each equal to eager), changes what the hook reads and calls again:
the artifact must refuse (a PrecompileError naming the global hook) or answer as eager
does -- never the captured state's answer. An unchanged callable-object hook must be
served (its attributes, not a module-level name, tell it apart). A hook that only
stores its outputs is served by Dynamo as a module hook
(test_hook_identity.py); as a global hook it is refused at capture by both tracers
(test_global_hook_stores.py, docs/trust.md).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.modules.module as nn_module

import precompile
from tests.fixtures import hook_state
from tests.harness import capture_pair, run_json

TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}
#: Hooks reading state that ``hook_state.change`` alters.
READERS = ("closure", "object", "named", "table")

CHILD = """
import json, warnings, torch, precompile
import torch.nn.modules.module as nn_module
warnings.simplefilter("ignore")
from tests.fixtures import hook_state
out = {{}}
x = torch.randn(3, 4)
for (tracer, kind), (artifact, cache) in {pairs!r}:
    run = precompile.load(artifact, cache)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    hook = hook_state.make(kind)
    handle = nn_module.register_module_forward_hook(hook)
    calls = []
    try:
        with torch.no_grad():
            for _ in range(2):
                calls.append(bool(torch.allclose(run(model, x), model(x))))
            hook_state.change(hook)
            try:
                got = run(model, x)
                after = ["served", bool(torch.allclose(got, model(x)))]
            except precompile.PrecompileError as error:
                after = ["refused", str(error)]
    except precompile.PrecompileError as error:
        after = ["refused before the change", str(error)]
    finally:
        handle.remove()
    out[tracer + " " + kind] = [calls, after]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
    """Every cell captured here and served in one fresh process."""
    directory = tmp_path_factory.mktemp("hook_state")
    cells = [(t, k) for t in TRACERS for k in READERS]
    pairs = []
    for tracer, kind in cells:
        torch.manual_seed(0)
        handle = nn_module.register_module_forward_hook(hook_state.make(kind))
        try:
            with torch.no_grad():
                paths = capture_pair(
                    hook_state.serve,
                    torch.nn.Linear(4, 4),
                    torch.randn(3, 4),
                    directory=directory,
                    name=f"{tracer}_{kind}",
                    tracer=TRACERS[tracer](),
                )
        finally:
            handle.remove()
        pairs.append(((tracer, kind), paths))
    code = textwrap.dedent(CHILD.format(pairs=pairs))
    return run_json(code, cwd=Path(__file__).resolve().parents[3])


@pytest.mark.parametrize("kind", READERS)
@pytest.mark.parametrize("tracer", sorted(TRACERS))
def test_a_global_hooks_state_changed_after_serving_is_refused(
    outcomes: dict[str, list[Any]], tracer: str, kind: str
) -> None:
    """Served twice exactly (an unchanged callable object included: its attributes,
    not a module-level name, tell it apart), then refused once what it reads changed."""
    calls, after = outcomes[f"{tracer} {kind}"]
    assert calls == [True, True], (tracer, kind, after)
    assert after[0] == "refused", (tracer, kind, after)
    assert "every module (a global hook" in after[1] or "global module hooks" in after[1]
