"""The Dynamo tracer: multi-graph artifacts served standalone in a fresh process with
zero compiles, in parity with torch.compile and eager, for every shape of graph break;
shapes and recompiles; global state; training across a break; the report."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from precompile import EagerFallbackWarning, PrecompileError
from tests.fixtures import dynamo_models
from tests.fixtures.dynamo_models import CASES
from tests.fixtures.models import MLP, observe, serve
from tests.harness import assert_same, run_python, serve_fresh, together, watched_load

BACKENDS = ["eager", "inductor"]
#: A .item() value crossing a break is pinned by the capture (a value guard): such a
#: case is served with the captured inputs; other values are refused (tested below).
SERVE_SEED = {"item_branch": 0}


@pytest.fixture(autouse=True)
def _quiet_dynamo() -> None:
    torch._logging.set_logs(dynamo=logging.ERROR)


def _capture(case_name: str, backend: str, directory: Path, **tracer: Any) -> dict[str, Any]:
    case = CASES[case_name]
    paths = str(directory / f"{case_name}.py"), str(directory / f"{case_name}.cache")
    args = case.build(0)
    with precompile.capture(
        case.fn,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.DynamoTracer(**tracer),
        backend=backend,
        training=case.training,
    ) as cap:
        served = observe(args, case.drive(cap, args))
    return {"paths": paths, "served": served, "report": cap.report(), "summary": cap.summary()}


@pytest.fixture(scope="session", params=BACKENDS)
def dynamo_captured(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    torch._logging.set_logs(dynamo=logging.ERROR)
    directory = tmp_path_factory.mktemp(f"dynamo-{request.param}")
    torch._dynamo.reset()
    cases = {name: _capture(name, request.param, directory) for name in CASES}
    entries = [
        {
            "key": name,
            "case": name,
            "artifact": c["paths"][0],
            "cache": c["paths"][1],
            "seed": SERVE_SEED.get(name, 1),
        }
        for name, c in cases.items()
    ]
    reference = [
        {"key": name, "case": name, "torch_compile": request.param, "seed": SERVE_SEED.get(name, 1)}
        for name in cases
    ]
    dirs = tmp_path_factory.mktemp("dynamo-fresh"), tmp_path_factory.mktemp("dynamo-compile")
    fresh, torch_compile = together(
        lambda: serve_fresh(entries, dirs[0]), lambda: serve_fresh(reference, dirs[1])
    )
    return {
        "backend": request.param,
        "cases": cases,
        "fresh": fresh,
        "torch_compile": torch_compile,
    }


@pytest.mark.parametrize("case_name", list(CASES))
def test_capture_runs_for_real_like_eager(dynamo_captured: dict[str, Any], case_name: str) -> None:
    assert_same(
        dynamo_captured["cases"][case_name]["served"], serve(case_name, CASES[case_name].fn, 0)
    )


@pytest.mark.parametrize("case_name", list(CASES))
def test_fresh_process_parity_with_eager_and_torch_compile(
    dynamo_captured: dict[str, Any], case_name: str
) -> None:
    fresh = dynamo_captured["fresh"][case_name]
    assert "error" not in fresh, fresh.get("traceback")
    seed = SERVE_SEED.get(case_name, 1)
    assert_same(fresh, serve(case_name, CASES[case_name].fn, seed))
    reference = dynamo_captured["torch_compile"][case_name]
    assert "error" not in reference, reference.get("traceback")
    assert_same(fresh, reference)


def test_fresh_process_compiles_nothing(dynamo_captured: dict[str, Any]) -> None:
    assert dynamo_captured["fresh"]["__dynamo_frames_compiled__"] == 0
    assert dynamo_captured["torch_compile"]["__dynamo_frames_compiled__"] > 0  # the check can fail


#: Serves a Dynamo test case in a watched load (tests.harness.watched_load).
SERVE_CASE = """
from tests.fixtures.dynamo_models import CASES
case = CASES[{case!r}]
served, expected = run(*case.build(1)), case.fn(*case.build(1))
leaves = zip(torch.utils._pytree.tree_leaves(served), torch.utils._pytree.tree_leaves(expected))
error = max((a - b).abs().max().item() for a, b in leaves)
"""


@pytest.mark.parametrize("dynamo_captured", ["inductor"], indirect=True)
@pytest.mark.parametrize(
    "case_name, sections",
    [
        ("explicit_break", {"_INDUCTOR_MODULES"}),
        ("grad_block", {"_INDUCTOR_MODULES", "_INDUCTOR_AOT_GRAPHS"}),
        ("train_step_break", {"_INDUCTOR_AOT_GRAPHS"}),
    ],
)
def test_a_cached_inductor_load_compiles_and_probes_nothing(
    dynamo_captured: dict[str, Any], tmp_path: Path, case_name: str, sections: set[str]
) -> None:
    # Neither a kernel compile nor Inductor's vector-ISA probe (which compiles and loads
    # a test program per ISA in child processes) may run: the cache has the kernels and
    # records the ISA they were built for.
    artifact, cache = dynamo_captured["cases"][case_name]["paths"]
    serve = SERVE_CASE.format(case=case_name)
    result = watched_load(artifact, cache, serve, tmp_path / "inductor-cache")
    compiler = [
        m
        for m in ("torch._inductor.compile_fx", "torch._functorch.aot_autograd")
        if m in result["modules"]
    ]
    assert result["error"] < 1e-5
    assert result["cache_files"] == [], "the load wrote into TORCHINDUCTOR_CACHE_DIR"
    text = Path(artifact).read_text()
    found = {
        name
        for name in ("_INDUCTOR_MODULES", "_INDUCTOR_AOT_GRAPHS", "_INDUCTOR_ARTIFACTS")
        if f"{name} = {{" in text
    }
    assert found == sections
    # Every subgraph is inlined as Inductor output modules -- an inference subgraph as
    # one, a training subgraph or one that switches grad mode as AOTAutograd's forward
    # and backward -- whose kernels bind from the cache: the load starts no process at
    # all (not even ``g++ --version``) and imports neither Inductor's compiler nor
    # AOTAutograd's.
    assert result["spawned"] == [], result["first_stack"]
    assert compiler == []


def test_every_break_shape_is_reported(dynamo_captured: dict[str, Any]) -> None:
    gb = {
        name: [b["gb_id"] for b in c["report"].graph_breaks]
        for name, c in dynamo_captured["cases"].items()
    }
    assert gb["explicit_break"] == ["GB0025"]
    assert gb["item_branch"] == ["GB0124"]
    assert len(gb["print_break"]) == 1 and len(gb["disabled_helper"]) == 1
    for name, c in dynamo_captured["cases"].items():
        assert c["summary"].complete, (name, str(c["summary"]))
        assert c["summary"].frames >= 2, name


def test_value_pinned_continuation_refuses_other_values(dynamo_captured: dict[str, Any]) -> None:
    run = precompile.load(*dynamo_captured["cases"]["item_branch"]["paths"])
    with pytest.raises(PrecompileError) as info:
        serve("item_branch", run, 1)
    # Named in the user's terms: the code after the break, the value that crossed it.
    assert "the code after line" in str(info.value) and "of `item_branch`" in str(info.value)
    assert "the value carried across the graph break is not" in str(info.value)
    assert "torch_dynamo_resume" not in str(info.value) and "___stack" not in str(info.value)


def test_training_step_across_a_break_matches_eager(dynamo_captured: dict[str, Any]) -> None:
    served = dynamo_captured["cases"]["train_step_break"]["served"]
    expected = serve("train_step_break", CASES["train_step_break"].fn, 0)
    assert_same(served["result"]["losses"], expected["result"]["losses"])
    assert_same(served["result"]["grads"], expected["result"]["grads"])


# ---------------------------------------------------------------- shapes and recompiles


def _shapes_capture(tmp_path: Path, dynamic: bool | None, batches: list[int]) -> tuple[Any, Any]:
    paths = tmp_path / "probs.py", tmp_path / "probs.cache"
    torch._dynamo.reset()
    model = MLP().eval()
    with precompile.capture(
        dynamo_models.probs,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.DynamoTracer(dynamic=dynamic),
        backend="eager",
    ) as cap:
        for batch in batches:
            cap(model, torch.randn(batch, 8))
    return precompile.load(*paths), cap


def test_static_shapes_become_variants_and_a_fourth_is_refused(tmp_path: Path) -> None:
    run, cap = _shapes_capture(tmp_path, dynamic=False, batches=[2, 3, 4])
    assert cap.summary().guarded_codes == 3 and len(cap.report().recompiles) == 2
    model = MLP().eval()
    for batch in (2, 3, 4):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(run(model, x), dynamo_models.probs(model, x))
        assert run.covers(model, x)["served_by"] == [2, 3, 4].index(batch)
    with pytest.raises(PrecompileError) as info:
        run(model, torch.randn(5, 8))
    text = str(info.value)
    assert "3 captured" in text and "variant 0: `x` has size 5 at dim 0; the capture saw 2" in text
    coverage = run.covers(model, torch.randn(5, 8))
    assert coverage["served_by"] is None and len(coverage["failures"]) == 3


def test_dynamic_none_promotes_the_varying_dim(tmp_path: Path) -> None:
    run, cap = _shapes_capture(tmp_path, dynamic=None, batches=[2, 3])
    assert cap.summary().guarded_codes == 2  # static, then the automatically dynamic one
    model = MLP().eval()
    for batch in (7, 31):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(run(model, x), dynamo_models.probs(model, x))


def test_a_guard_that_checks_identity_through_a_constant_is_dropped_by_default(
    tmp_path: Path,
) -> None:
    # A decorator that reads ``forward.__code__`` (as transformers' do) makes Dynamo guard
    # the code object with a CONSTANT_MATCH whose derived check is an identity: Dynamo
    # cannot serialize it, so the default filter drops it like any identity guard.
    paths = tmp_path / "code.py", tmp_path / "code.cache"
    torch._dynamo.reset()
    model, x = dynamo_models.CodeReading().eval(), torch.randn(3, 8)
    with precompile.capture(
        dynamo_models.code_reading, artifact_path=paths[0], cache_path=paths[1], backend="eager"
    ) as cap:
        cap(model, x)
    dropped = [s for s in cap.report().audit.dropped if s.path.endswith(".__code__")]
    assert dropped and all(s.dropped_by == "default" for s in dropped)
    proc = run_python(
        "import torch, precompile\n"
        "from tests.fixtures import dynamo_models\n"
        "model, x = dynamo_models.CodeReading().eval(), torch.randn(3, 8)\n"
        f"out = precompile.load({str(paths[0])!r}, {str(paths[1])!r})(model, x)\n"
        "torch.testing.assert_close(out, dynamo_models.code_reading(model, x), rtol=0, atol=0)\n"
        "print('served')\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "served"


# ---------------------------------------------------------------- global state


def test_ambient_autocast_is_refused_and_thread_count_does_not_miss(tmp_path: Path) -> None:
    """Under an ambient autocast eager computes in bfloat16; the artifact, captured
    without one, cannot: the call is refused, naming autocast (not served in float32)."""
    run, _ = _shapes_capture(tmp_path, dynamic=False, batches=[4])
    model, x = MLP().eval(), torch.randn(4, 8)
    expected = dynamo_models.probs(model, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert dynamo_models.probs(model, x).dtype == torch.bfloat16
        with pytest.raises(PrecompileError, match=r"torch\.autocast \(cpu \(torch\.bfloat16\)\)"):
            run(model, x)
    torch.testing.assert_close(run(model, x), expected)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.testing.assert_close(run(model, x), expected)
    finally:
        torch.set_num_threads(threads)


def test_served_under_the_captured_grad_mode(tmp_path: Path) -> None:
    run, _ = _shapes_capture(tmp_path, dynamic=False, batches=[4])
    out = run(MLP().eval(), torch.randn(4, 8))  # captured with training=False
    assert not out.requires_grad and torch.is_grad_enabled()


def test_capture_under_autocast_is_refused(tmp_path: Path) -> None:
    torch._dynamo.reset()
    with pytest.raises(PrecompileError, match="autocast") as info:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            with precompile.capture(
                dynamo_models.probs,
                artifact_path=tmp_path / "a.py",
                cache_path=tmp_path / "a.cache",
                backend="eager",
            ) as cap:
                cap(MLP().eval(), torch.randn(2, 8))
    assert info.value.invariant == 6


# ---------------------------------------------------------------- a frame Dynamo gives up on


def test_break_in_a_loop_is_refused_by_default(tmp_path: Path) -> None:
    torch._dynamo.reset()
    with pytest.raises(PrecompileError) as info:
        with precompile.capture(
            dynamo_models.loop_break,
            artifact_path=tmp_path / "a.py",
            cache_path=tmp_path / "a.cache",
            backend="eager",
        ) as cap:
            cap(torch.ones(3))
    text = str(info.value)
    assert (
        "incomplete" in text and "loop_break" in text and "graph break in a for/while loop" in text
    )
    assert "require_complete=False" in text
    assert not (tmp_path / "a.py").exists()


def test_break_in_a_loop_serves_eagerly_when_allowed(tmp_path: Path) -> None:
    torch._dynamo.reset()
    paths = tmp_path / "a.py", tmp_path / "a.cache"
    with precompile.capture(
        dynamo_models.loop_break,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.DynamoTracer(require_complete=False),
        backend="eager",
    ) as cap:
        cap(torch.ones(3))
    assert cap.summary().eager_fallback and not cap.summary().complete
    run = precompile.load(*paths)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(run(torch.ones(3)), dynamo_models.loop_break(torch.ones(3)))
        torch.testing.assert_close(run(torch.zeros(2)), dynamo_models.loop_break(torch.zeros(2)))
    eager = [w for w in caught if issubclass(w.category, EagerFallbackWarning)]
    assert len(eager) == 1 and "loop_break" in str(eager[0].message)


# ---------------------------------------------------------------- report and emits


def test_keyword_and_default_arguments_are_bound_like_python(tmp_path: Path) -> None:
    torch._dynamo.reset()
    paths = tmp_path / "k.py", tmp_path / "k.cache"
    model = MLP().eval()
    with precompile.capture(
        dynamo_models.keyword_call,
        artifact_path=paths[0],
        cache_path=paths[1],
        tracer=precompile.DynamoTracer(dynamic=False),
        backend="eager",
    ) as cap:
        cap(model, torch.randn(2, 8))
        cap(model, torch.randn(2, 8), shift=3.0)
    run = precompile.load(*paths)
    x = torch.randn(2, 8)
    torch.testing.assert_close(run(model, x), dynamo_models.keyword_call(model, x))
    torch.testing.assert_close(
        run(model, x, shift=3.0), dynamo_models.keyword_call(model, x, shift=3.0)
    )
    with pytest.raises(PrecompileError, match="shift"):
        run(model, x, shift=5.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_emits_are_byte_identical(tmp_path: Path, backend: str) -> None:
    torch._dynamo.reset()
    model = MLP().eval()
    with precompile.capture(
        dynamo_models.explicit_break,
        artifact_path=tmp_path / "a.py",
        cache_path=tmp_path / "a.cache",
        backend=backend,
    ) as cap:
        cap(model, torch.randn(2, 8))
        cap.save()
        first = (tmp_path / "a.py").read_bytes(), (tmp_path / "a.cache").read_bytes()
        cap.save()
        assert ((tmp_path / "a.py").read_bytes(), (tmp_path / "a.cache").read_bytes()) == first


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fresh_capture_process_emits_the_same_artifact_but_guard_debug_text(
    tmp_path: Path, backend: str
) -> None:
    # Dynamo's pickled guard state embeds process-specific type ids in its debug text, so
    # only the _FRAMES payload may differ between capture processes: names, tag, graphs,
    # metadata and driver are identical.
    script = """
import torch, precompile
from tests.fixtures import dynamo_models
from tests.fixtures.models import MLP
torch.manual_seed(0)
with precompile.capture(dynamo_models.explicit_break, artifact_path={out!r} + ".py", cache_path={out!r} + ".cache", backend={backend!r}) as cap:
    cap(MLP().eval(), torch.randn(2, 8))
    cap(MLP().eval(), torch.randn(5, 8))
"""
    texts = []
    procs = together(
        *(
            lambda name=name: run_python(script.format(out=str(tmp_path / name), backend=backend))
            for name in ("one", "two")
        )
    )
    for name, proc in zip(("one", "two"), procs):
        assert proc.returncode == 0, proc.stderr
        text = (tmp_path / f"{name}.py").read_text()
        start = text.index("_FRAMES = ")
        end = text.index("_ENTRY_BINDING = ")
        texts.append(text[:start] + text[end:])
    assert texts[0] == texts[1]


def test_report_agrees_with_dynamo_explain(dynamo_captured: dict[str, Any]) -> None:
    torch._dynamo.reset()
    case = CASES["explicit_break"]
    explanation = torch._dynamo.explain(case.fn)(*case.build(0))
    report = dynamo_captured["cases"]["explicit_break"]["report"]
    assert len(report.graph_breaks) == explanation.graph_break_count == 1
    reported = report.graph_breaks[0]["location"]
    explained = explanation.break_reasons[0].user_stack[-1]
    assert (Path(reported["file"]), reported["line"]) == (
        Path(explained.filename),
        explained.lineno,
    )
    assert reported["column"] == 4  # `torch._dynamo.graph_break()` is indented by 4
    json.dumps(report.to_dict())


def test_report_fields(dynamo_captured: dict[str, Any]) -> None:
    report = dynamo_captured["cases"]["explicit_break"]["report"].to_dict()
    assert report["serving_mode"] == "standalone"
    entry, resume = report["frames"]
    assert entry["entry"] and entry["name"] == "explicit_break" and entry["variants"] == 1
    assert (
        resume["name"].startswith("torch_dynamo_resume_in_explicit_break")
        and resume["resume_names"]
    )
    gb = report["graph_breaks"][0]
    assert gb["doc_link"].endswith("gb0025.html") and gb["hints"] and gb["user_stack"]
    assert report["guards"] and all("kept" in g and "dropped" in g for g in report["guards"])
    assert report["function_sources"][0]["function"] == "explicit_break"
    assert report["summary"]["complete"] and "2 frames" in report["summary"]["text"]
