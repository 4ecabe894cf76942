"""What a capture records does not depend on what ran before it in the process (the
language server's warm workers capture many targets in one process).

Dynamo binds the method that traces a builtin call (``isinstance``, ``type()``) once per
(builtin, argument types) into a process-wide handler cache, at its first use. A Dynamo
capture records the user's class reads of its inputs there (``GRAD_FLAGS["read"]``: an
``nn.Parameter`` passed where a plain tensor was captured takes the other branch in
eager). Before, a handler bound earlier in the process ran instead of the capture's
recorder: after an earlier capture of a module that stores a tensor attribute
(``nn.Module.__setattr__`` asks ``isinstance(value, Parameter)``) the read went to that
capture's dead list, and after any plain ``torch.compile`` to nobody; the artifact then
served a Parameter input with the plain tensor's branch -- a silent wrong answer.

Here, in one process: a Dynamo capture of such a module, then the class-reading
captures; a ``torch.compile`` outside any capture, then the same captures again. Every
artifact, loaded in a fresh process, serves the plain tensor exactly and refuses the
Parameter naming the read (both tracers).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import Any

import torch
from torch import nn

import precompile
from tests.fixtures import grad_mode_models as g
from tests.fixtures import user_state_stores as u
from tests.harness import capture_pair, run_json

READERS = ("class_branch", "type_branch")
TRACERS = {"make_fx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}


def _compiled_reader(x: torch.Tensor) -> torch.Tensor:
    """A class read compiled by ``torch.compile`` outside any capture."""
    scale = 2.0 if isinstance(x, nn.Parameter) else 1.0
    return x * (scale + (1.0 if type(x) is nn.Parameter else 0.0))


def _capture_readers(directory: Path, step: str) -> dict[str, tuple[str, str]]:
    linear, x = g.build("linear")
    pairs = {}
    with torch.no_grad():
        for tracer, make in TRACERS.items():
            for name in READERS:
                key = f"{step} {tracer} {name}"
                pairs[key] = capture_pair(
                    getattr(g, name),
                    linear,
                    x,
                    directory=directory,
                    name=key.replace(" ", "-"),
                    tracer=make(),
                )
    return pairs


def _grad_flags(artifact: str) -> dict[str, Any]:
    """The artifact's ``GRAD_FLAGS`` literal: what the capture recorded."""
    for node in ast.parse(Path(artifact).read_text()).body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [
            "GRAD_FLAGS"
        ]:
            return dict(ast.literal_eval(node.value))
    raise AssertionError(f"no GRAD_FLAGS in {artifact}")


SERVE = """
import json, warnings
warnings.simplefilter("ignore")
from tests.fixtures import grad_mode_models as g
print(json.dumps(g.serve_tensor_and_parameter({pairs!r}, {functions!r})))
"""


def test_a_class_read_is_recorded_whatever_was_compiled_before_in_the_process(
    tmp_path: Path,
) -> None:
    # An earlier Dynamo capture whose trace asks isinstance(tensor, Parameter) itself
    # (the model stores a tensor attribute): it binds the handler first, in this order.
    try:
        model, x, _, _ = u.setup("attribute", seed=0)
        with torch.no_grad():
            capture_pair(
                u.FUNCTIONS["attribute"],
                model,
                x,
                directory=tmp_path,
                name="earlier",
                tracer=precompile.DynamoTracer(),
            )
    finally:
        u.reset()
    pairs = _capture_readers(tmp_path, "after a capture")
    # torch.compile outside any capture: binds torch's own handlers.
    compiled: Any = torch.compile(_compiled_reader, backend="eager")
    parameter = nn.Parameter(torch.ones(3))
    with torch.no_grad():
        assert torch.equal(compiled(parameter), _compiled_reader(parameter))
        assert torch.equal(compiled(torch.ones(3)), torch.ones(3))
    pairs |= _capture_readers(tmp_path, "after torch.compile")

    # Every Dynamo artifact recorded its class read (type() included).
    for key, (artifact, _) in pairs.items():
        if " dynamo " in key:
            how = "isinstance" if key.endswith("class_branch") else "type()"
            assert f"the class of `x` ({how})" in _grad_flags(artifact)["read"], key
    # A Dynamo artifact of type_branch is refused even for a plain tensor when served
    # (it reads a global Dynamo installed: a separate needless refusal), so only
    # class_branch's are served for Dynamo.
    served = {k: p for k, p in pairs.items() if not k.endswith("dynamo type_branch")}
    functions = {key: key.rsplit(" ", 1)[1] for key in served}
    out = run_json(textwrap.dedent(SERVE.format(pairs=served, functions=functions)))
    assert len(out) == 2 * len(served) == 12, out
    for key in served:
        assert out[f"{key} tensor"]["result"] == "exact", (key, out)
        refusal = out[f"{key} parameter"]
        assert refusal["result"] == "refused", (key, out)
        message = refusal["message"]
        assert "torch.nn.parameter.Parameter" in message, (key, message)
        if " dynamo " in key:
            assert "`x` is a torch.nn.parameter.Parameter" in message, (key, message)
