"""The guard audit and the require_* gates: risky drops refused or warned, any drop
refused on request, pinned values reported, unpicklable guarded values named by access
path; truncated and uncovered frames refused by require_complete."""

from __future__ import annotations

import logging
import types
from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from precompile import PrecompileError, RiskyGuardWarning
from precompile.capturing.dynamo_artifact import summarize
from precompile.capturing.dynamo_frames import FrameRecord
from tests.fixtures import dynamo_models
from tests.fixtures.models import MLP


@pytest.fixture(autouse=True)
def _quiet_dynamo() -> None:
    torch._logging.set_logs(dynamo=logging.ERROR)


def _capture(tmp_path: Path, fn: Any, calls: list[tuple[Any, ...]], **tracer: Any) -> Any:
    torch._dynamo.reset()
    with precompile.capture(
        fn,
        artifact_path=tmp_path / "a.py",
        cache_path=tmp_path / "a.cache",
        tracer=precompile.DynamoTracer(**tracer),
        backend="eager",
    ) as cap:
        for args in calls:
            cap(*args)
    return cap


def _drop_flag(entries: list[Any]) -> list[bool]:
    return [entry.name != "flag" for entry in entries]


GATED_CALLS = [(MLP().eval(), torch.randn(2, 8), True), (MLP().eval(), torch.randn(2, 8), False)]


def test_a_user_dropped_guard_that_decided_dispatch_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PrecompileError) as info:
        _capture(
            tmp_path, dynamo_models.gated, GATED_CALLS, dynamic=False, guard_filter_fn=_drop_flag
        )
    text = str(info.value)
    assert (
        "flag" in text
        and "guard_filter_fn dropped it" in text
        and "require_no_risky_drops=False" in text
    )
    assert not (tmp_path / "a.py").exists()


def test_with_the_gate_off_a_risky_drop_warns_once(tmp_path: Path) -> None:
    with pytest.warns(RiskyGuardWarning, match="flag") as record:
        cap = _capture(
            tmp_path,
            dynamo_models.gated,
            GATED_CALLS,
            dynamic=False,
            guard_filter_fn=_drop_flag,
            require_no_risky_drops=False,
        )
    assert len([w for w in record if w.category is RiskyGuardWarning]) == 1
    audit = cap.report().to_dict()["audit"]
    assert any("flag" in r["guard"] for r in audit["risky"])
    assert (tmp_path / "a.py").exists()


def test_the_default_filter_keeps_value_guards(tmp_path: Path) -> None:
    cap = _capture(tmp_path, dynamo_models.gated, GATED_CALLS, dynamic=False)
    audit = cap.report().audit
    assert audit.risky == []
    assert all(slot.dropped_by in ("default",) for slot in audit.dropped)
    run = precompile.load(tmp_path / "a.py", tmp_path / "a.cache")
    model, x = MLP().eval(), torch.randn(2, 8)
    torch.testing.assert_close(run(model, x, True), dynamo_models.gated(model, x, True))
    torch.testing.assert_close(run(model, x, False), dynamo_models.gated(model, x, False))


def test_require_no_dropped_guards_refuses_any_drop(tmp_path: Path) -> None:
    with pytest.raises(PrecompileError, match="could not be kept") as info:
        _capture(
            tmp_path,
            dynamo_models.gated,
            GATED_CALLS[:1],
            dynamic=False,
            guard_filter_fn=_drop_flag,
            require_no_dropped_guards=True,
        )
    assert "flag (dropped by user)" in str(info.value)


def test_pinned_values_are_reported_as_wont_generalize(tmp_path: Path) -> None:
    case = dynamo_models.CASES["item_branch"]
    cap = _capture(tmp_path, case.fn, [case.build(0)])
    pinned = cap.report().to_dict()["audit"]["wont_generalize"]
    assert any("the value carried across the graph break" in p for p in pinned), pinned
    assert not any("___stack" in p or "torch_dynamo_resume" in p for p in pinned), pinned
    cap = _capture(tmp_path, dynamo_models.gated, GATED_CALLS[:1], dynamic=False)
    assert any(
        p.endswith("flag (values True)") for p in cap.report().to_dict()["audit"]["wont_generalize"]
    )


def _local_tokenizer() -> Any:
    class LocalTokenizer:
        scale = 2.0

    return LocalTokenizer()


def test_an_unpicklable_guarded_value_is_refused_naming_its_path(tmp_path: Path) -> None:
    model = dynamo_models.Configured(types.SimpleNamespace(tokenizer=_local_tokenizer()))
    with pytest.raises(PrecompileError, match=r"model\.cfg\.tokenizer") as info:
        _capture(tmp_path, dynamo_models.configured, [(model, torch.randn(2, 8))])
    assert "cannot be serialized" in str(info.value)
    # The same model with a module-level (picklable) tokenizer captures fine.
    model = dynamo_models.Configured(types.SimpleNamespace(tokenizer=dynamo_models.Tokenizer(2.0)))
    cap = _capture(tmp_path, dynamo_models.configured, [(model, torch.randn(2, 8))])
    assert cap.summary().complete


def test_recompile_limit_hit_is_refused_as_truncated(tmp_path: Path) -> None:
    calls = [(MLP().eval(), torch.randn(n, 8)) for n in (2, 3, 4)]
    with pytest.raises(PrecompileError, match=r"frame probs hit the recompile limit \(truncated\)"):
        _capture(tmp_path, dynamo_models.probs, calls, recompile_limit=2, dynamic=False)
    cap = _capture(
        tmp_path,
        dynamo_models.probs,
        calls,
        recompile_limit=2,
        dynamic=False,
        require_complete=False,
    )
    assert cap.summary().truncated == ["probs"]


def test_an_uncovered_frame_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        PrecompileError, match=r"torch_dynamo_resume_in_one_sided.* never compiled \(uncovered\)"
    ):
        _capture(tmp_path, dynamo_models.one_sided, [(torch.ones(3),)])
    cap = _capture(tmp_path, dynamo_models.one_sided, [(torch.ones(3),), (-torch.ones(3),)])
    assert cap.summary().complete  # both sides exercised: both continuations compiled


def _record(name: str, **flags: Any) -> FrameRecord:
    return FrameRecord(
        code=compile("pass", "<test>", "exec").replace(co_name=name),
        python_module="m",
        is_entry=False,
        resume_names=["__resume"],
        import_sources={},
        variants=[],
        backend_ids=[],
        code_source=None,
        bypassed=flags.get("bypassed", False),
        bypass_reason=flags.get("bypass_reason"),
        eager_fallback=False,
        eager_reason=None,
        trivial=False,
        truncated=False,
        guards=[],
    )


def test_a_bypassed_frame_makes_the_summary_incomplete_with_its_reason() -> None:
    # No capture on torch 2.13 bypasses a frame naturally that our own checks do not
    # refuse first (unpicklable values are named above), so the summary is tested directly.
    summary = summarize(
        [_record("forward", bypassed=True, bypass_reason="Guard evaluation failed: x")], 0, 0
    )
    assert not summary.complete
    assert summary.problems() == ["frame forward (Guard evaluation failed: x) was bypassed"]
