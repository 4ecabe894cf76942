"""A capture runs under the profiler a user already has on, and leaves it on.

make_fx's trace installs a profile hook of its own (``fx_watch.recording_calls``) and
hands each event on to the one installed before. ``cProfile`` installs a C-level hook:
``sys.getprofile()`` is then its ``Profiler`` object, which Python cannot call, and the
capture failed with "fn raised TypeError ... 'Profile' object is not callable" (and would
have set the object back as a Python profile function, breaking the profiler after it).
Now the C profiler is paused for the trace and enabled again after it; a Python profile
function is chained, and both keep recording after the capture. Each capture runs in a
fresh process (a profiler is process state), both tracers; its artifact is then loaded in
another fresh process and compared with eager.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.harness import run_json

_CAPTURE = """
import cProfile, io, json, pstats, sys
import torch, precompile
from tests.fixtures.models import MLP, mlp_fn

torch.manual_seed(0)
model, x = MLP().eval(), torch.randn(3, 8)
events = []

def python_profiler(frame, event, arg):
    events.append(frame.f_code.co_name)

def after_capture():
    return 1

found = {{}}
for kind, (artifact, cache) in {pairs!r}.items():
    events.clear()
    if kind == "cProfile":
        profiler = cProfile.Profile()
        profiler.enable()
    else:
        sys.setprofile(python_profiler)
    with precompile.capture(mlp_fn, artifact_path=artifact, cache_path=cache,
                            tracer=precompile.{tracer}(), backend="eager") as cap:
        with torch.no_grad():
            out = cap(model, x)
    after_capture()
    still_installed = sys.getprofile()
    if kind == "cProfile":
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).print_stats("after_capture")
        recorded_after = "after_capture" in text.getvalue()
        same_profiler = still_installed is profiler
    else:
        sys.setprofile(None)
        recorded_after = "after_capture" in events
        same_profiler = still_installed is python_profiler
    found[kind] = {{
        "equal": bool(torch.equal(out, mlp_fn(model, x))),
        "recorded_after": recorded_after,
        "same_profiler": same_profiler,
        "chained_during": "forward" in events,
    }}
print(json.dumps(found))
"""

_LOAD = """
import json
import torch, precompile
from tests.fixtures.models import MLP, mlp_fn
torch.manual_seed(0)
model, x = MLP().eval(), torch.randn(3, 8)
with torch.no_grad():
    print(json.dumps({{
        kind: bool(torch.equal(precompile.load(*pair)(model, x), mlp_fn(model, x)))
        for kind, pair in {pairs!r}.items()
    }}))
"""


@pytest.mark.parametrize("tracer", ["MakeFxTracer", "DynamoTracer"])
def test_a_capture_runs_under_a_profiler_and_leaves_it_recording(
    tracer: str, tmp_path: Path
) -> None:
    pairs = {
        kind: (str(tmp_path / f"{kind}.py"), str(tmp_path / f"{kind}.cache"))
        for kind in ("cProfile", "python")
    }
    found = run_json(textwrap.dedent(_CAPTURE.format(tracer=tracer, pairs=pairs)))
    for kind, got in found.items():
        assert got["equal"], (kind, got)
        assert got["recorded_after"], f"the {kind} profiler stopped recording after the capture"
        assert got["same_profiler"], f"the {kind} profiler was not put back"
    if tracer == "MakeFxTracer":
        assert found["python"]["chained_during"], "the trace's hook did not hand events on"
    assert run_json(textwrap.dedent(_LOAD.format(pairs=pairs))) == dict.fromkeys(pairs, True)
