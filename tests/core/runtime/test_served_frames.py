"""Issue 29: the Python frames of a served make_fx call.

A served call of a single-graph artifact whose checks pass on their fast path (ordinary
ambient state, the per-call epoch holding) runs few Python frames; each one more costs
tens of nanoseconds on a call whose whole budget past the graph is a few microseconds.
The loaded runnable's ``__call__`` calls the driver's ``forward.packed`` with the
arguments as it holds them (no ``Serving.serve`` frame, no second packing into
``forward(*args, **kwargs)``), which runs the epoch-pass checks inline (no
``checked_inputs`` or ``ambient_now`` frame) and calls the input check, the model
state check past the epoch and the graph. Counted here in a fresh process with a
profile hook, both grad modes, beside what the call must still do: answer as eager,
and refuse (counted by ``stats()``) or fall back as before.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import precompile
from tests.harness import attack_in_child


def serve(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()


#: The frames a fast-path served call runs up to the graph, in order: the runnable, the
#: driver, the input check, the model state past the epoch, the graph's ``call`` (past
#: it the graph's own frames: the eager graph's body, ``_graph``).
FRAMES = ["__call__", "forward_packed", "checked_call", "_model_rest", "call"]

CHILD = """
import json, warnings
warnings.simplefilter("ignore")
from tests.core.runtime.test_served_frames import frames_of_served_calls
print(json.dumps(frames_of_served_calls({artifact!r}, {cache!r})))
"""


def frames_of_served_calls(artifact: str, cache: str) -> dict[str, Any]:
    """Per grad mode: the Python frames one served call ran after two calls, and
    whether it answered as eager; then a refused call and ``stats()``."""
    import sys

    run = precompile.load(artifact, cache)
    torch.manual_seed(1)
    model = _mlp()
    x = torch.randn(3, 8)
    out: dict[str, Any] = {}
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            for _ in range(2):
                torch.testing.assert_close(run(model, x), model(x))
            frames: list[str] = []

            def profile(frame: Any, event: str, arg: Any, frames: list[str] = frames) -> None:
                if event == "call":
                    frames.append(frame.f_code.co_name)

            sys.setprofile(profile)
            try:
                got = run(model, x)
            finally:
                sys.setprofile(None)
            out[f"grad {grad}"] = {
                # The profile hook's own removal is the last call it sees.
                "frames": frames[:-1] if frames[-1:] == ["setprofile"] else frames,
                "as eager": bool(torch.allclose(got, model(x))),
            }
    try:
        run(model, torch.randn(3, 9))
        out["refused"] = None
    except precompile.PrecompileError as error:
        out["refused"] = str(error)
    stats = run.stats()
    out["stats"] = {k: stats[k] for k in ("calls", "served", "refused", "fallback")}
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return attack_in_child(
        CHILD,
        serve,
        _mlp,
        lambda: torch.randn(3, 8),
        directory=tmp_path_factory.mktemp("frames"),
    )


@pytest.mark.parametrize("grad", [False, True])
def test_a_fast_path_served_call_runs_only_the_driver_frames(served: Any, grad: bool) -> None:
    call = served[f"grad {grad}"]
    assert call["as eager"] is True
    frames = call["frames"]
    assert frames[: frames.index("call") + 1] == FRAMES, frames
    assert frames[frames.index("call") + 1 :] == ["_graph"], frames


def test_refusals_through_the_runnable_are_still_counted(served: Any) -> None:
    assert served["refused"] is not None and "shape" in served["refused"], served["refused"]
    # 2 + 1 calls per grad mode served, one refused.
    assert served["stats"] == {"calls": 7, "served": 6, "refused": 1, "fallback": 0}
