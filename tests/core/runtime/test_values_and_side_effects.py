"""Python values and side effects an artifact must serve exactly or refuse: a float
argument at a signed zero (``0.0 == -0.0``, yet ``x / s`` differs), NaN and infinity, a
complex one (``0j == -0j``, yet ``x / s.imag`` differs), for Dynamo also in a frame
served by installing, a dict input in another key order (served where fn reads it by key only), a tensor still carrying its
mark_unbacked mark (both tracers as they apply); and, for make_fx, a trace that changes Python state (fn's list
and dict arguments, a parameter's requires_grad, a module global) is refused at capture,
since a served call runs no Python. Captured here, served in one fresh process; a
"/warm" cell follows a served call, so it meets the per-call fast path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import precompile
from precompile import PrecompileError
from tests.fixtures import values_side_effects as v
from tests.harness import capture_pair, run_job

#: (tracer, captured cell) -> {served cell: words the refusal must contain, or None: exact}
EXPECTED: dict[tuple[str, str], dict[str, tuple[str, ...] | None]] = {
    ("fx", "divide 0.0"): {
        "divide -0.0": ("input value 2 is -0.0", "baked 0.0", "Pass 0.0"),
        "divide 0.0": None,
        "divide -0.0/warm": ("input value 2 is -0.0", "baked 0.0"),
    },
    ("fx", "clamp nan"): {
        "clamp nan": None,
        "clamp 1.0": ("input value 2 is 1.0", "baked nan"),
        "clamp nan/warm": None,
        "clamp 1.0/warm": ("input value 2 is 1.0", "baked nan"),
    },
    ("fx", "clamp inf"): {
        "clamp -inf": ("input value 2 is -inf", "baked inf"),
        "clamp inf": None,
        "clamp -inf/warm": ("input value 2 is -inf", "baked inf"),
    },
    ("fx", "imag 0j"): {
        "imag -0j": ("input value 2 is -0j", "baked 0j", "Pass 0j"),
        "imag 0j": None,
        "imag -0j/warm": ("input value 2 is -0j", "baked 0j"),
    },
    ("fx", "scale 1+2j"): {
        "scale 1-2j": ("input value 2 is (1-2j)", "baked (1+2j)"),
        "scale 1+2j": None,
        "scale 1-2j/warm": ("input value 2 is (1-2j)", "baked (1+2j)"),
    },
    # fn reads the dict by key only: its key order reaches nothing (as under Dynamo).
    ("fx", "dict a,b"): {
        "dict b,a": None,
        "dict a,b": None,
        "dict b,a/warm": None,
    },
    # fn iterates the dict: its key order is the order of the computation.
    ("fx", "folded a,b"): {
        "folded b,a": (
            "keys in the order ['b', 'a']",
            "captured with ['a', 'b']",
            "captured order",
        ),
        "folded a,b": None,
        "folded b,a/warm": ("keys in the order ['b', 'a']",),
    },
    ("dynamo", "divide 0.0"): {
        "divide -0.0": ("`s` is -0.0", "was 0.0 at capture", "Pass 0.0"),
        "divide 0.0": None,
        "divide -0.0/warm": ("`s` is -0.0", "was 0.0 at capture"),
    },
    ("dynamo", "global 0.0"): {
        "global -0.0": ("`EPS` is -0.0", "was 0.0 at capture"),
        "global 0.0": None,
        "global -0.0/warm": ("`EPS` is -0.0", "was 0.0 at capture"),
    },
    ("dynamo", "divide nan"): {
        "divide nan": None,
        "divide 1.0": ("`s` is not nan, the value the capture specialized on",),
        "divide nan/warm": None,
        "divide 1.0/warm": ("`s` is not nan",),
    },
    ("dynamo", "divide 1.0"): {
        "divide nan": ("`s` is not 1.0",),
        "divide 1.0": None,
        "divide inf": ("`s` is not 1.0",),
    },
    ("dynamo", "divide inf"): {
        "divide -inf": ("`s` is not inf",),
        "divide inf": None,
        "divide -inf/warm": ("`s` is not inf",),
    },
    ("dynamo", "divide -inf"): {
        "divide inf": ("`s` is not -inf",),
        "divide -inf": None,
    },
    # 0j == -0j: Dynamo's guard passes the other sign of a complex zero part.
    ("dynamo", "imag 0j"): {
        "imag -0j": ("`s` is -0j", "was 0j at capture", "Pass 0j"),
        "imag 0j": None,
        "imag -0j/warm": ("`s` is -0j", "was 0j at capture"),
    },
    ("dynamo", "imag -0j"): {
        "imag 0j": ("`s` is 0j", "was -0j at capture"),
        "imag -0j": None,
    },
    ("dynamo", "scale 1+2j"): {
        "scale 1-2j": ("`s` is not (1+2j)",),
        "scale 1+2j": None,
        "scale 1-2j/warm": ("`s` is not (1+2j)",),
    },
    # Installed: the division runs in a frame of its own, reached by an ordinary call.
    ("dynamo", "helper 0.0"): {
        "helper -0.0": ("`s` is -0.0", "was 0.0 at capture"),
        "helper 0.0": None,
        "helper -0.0/warm": ("`s` is -0.0", "was 0.0 at capture"),
    },
    ("dynamo", "helper nan"): {
        "helper nan": None,
        "helper 1.0": ("no captured variant serves this call", "`s` is not nan"),
    },
    ("dynamo", "helper inf"): {
        "helper -inf": ("`s` is not inf",),
        "helper inf": None,
    },
    ("dynamo", "marked 8"): {
        "marked 8": None,
        "marked 3": None,
        "unmarked 5": None,
    },
}


def _tracer(name: str) -> object:
    return precompile.MakeFxTracer() if name == "fx" else precompile.DynamoTracer()


def test_values_served_exactly_or_refused(tmp_path: Path) -> None:
    job = {}
    for (tracer, cell), cells in EXPECTED.items():
        fn, model, args = v.CELLS[cell]
        name = f"{tracer} {cell}"
        paths = capture_pair(
            fn,
            model(),
            *args(),
            directory=tmp_path,
            name=name.replace(" ", "_"),
            tracer=_tracer(tracer),
        )
        if cell.startswith("helper"):
            # Not vacuous: the guard on `s` is the helper frame's own.
            assert precompile.inspect_artifact(paths[0])["SERVING_MODE"] == "installed"
        job[name] = (paths, list(cells))
    results = run_job("tests.fixtures.values_side_effects", job, tmp_path / "job.json")
    problems = []
    for (tracer, cell), cells in EXPECTED.items():
        for served, words in cells.items():
            got = results[f"{tracer} {cell}: {served}"]
            if words is None:
                if got["result"] != "exact":
                    problems.append(f"{tracer} {cell} -> {served}: expected exact, got {got}")
            elif got["result"] != "refused" or not all(w in got["message"] for w in words):
                problems.append(f"{tracer} {cell} -> {served}: expected {words}, got {got}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("fn", "model", "args", "words"),
    [
        (
            v.appends,
            None,
            lambda: (torch.ones(2), [], {}),
            ("the list passed as fn's argument 2", "the dict passed as fn's argument 3"),
        ),
        (v.linear, v.Freezes, lambda: (torch.ones(2, 4),), ("parameter 'fc.bias'.requires_grad",)),
        (v.counts, None, lambda: (torch.ones(2),), ("global CALLS of module",)),
    ],
    ids=["container arguments", "requires_grad", "global counter"],
)
def test_fx_trace_side_effects_refused_at_capture(
    tmp_path: Path, fn: object, model: object, args: object, words: tuple[str, ...]
) -> None:
    with pytest.raises(PrecompileError) as caught:
        capture_pair(fn, model() if model else None, *args(), directory=tmp_path)  # type: ignore[operator]
    message = str(caught.value)
    assert caught.value.invariant == 4, message
    assert "fn changed state in Python while it was traced" in message
    assert all(w in message for w in words), message
    assert "return the value from fn" in message


@pytest.mark.parametrize(("first", "second"), [(0.0, -0.0), (0j, complex(0.0, -0.0))])
def test_dynamo_capture_of_both_signs_of_a_zero_is_refused(
    tmp_path: Path, first: object, second: object
) -> None:
    """Dynamo's guard compares with ==: one compiled variant would serve both signs."""
    fn = v.divide if isinstance(first, float) else v.divide_by_imag
    x = torch.tensor([1.0, -2.0, 0.0])
    with pytest.raises(PrecompileError) as caught:
        with precompile.capture(
            fn,
            artifact_path=tmp_path / "a.py",
            cache_path=tmp_path / "a.cache",
            tracer=precompile.DynamoTracer(),
            backend="eager",
        ) as cap:
            cap(None, x, first)
            cap(None, x, second)
    message = str(caught.value)
    assert f"`s` was {first!r} in one captured call and {second!r} in another" in message
    assert "one sign of zero per artifact" in (caught.value.hint or "")


@pytest.mark.parametrize("fn", [v.divide_by_item, v.divide_in_helper_by_item])
@pytest.mark.parametrize("zero", [0.0, -0.0])
def test_dynamo_zero_computed_in_a_later_frame_is_refused_at_capture(
    tmp_path: Path, fn: object, zero: float
) -> None:
    """A float computed at run time (``t.item()``, ``t.tolist()``) that a continuation or
    helper frame guards at a zero: its guard is ==, and no per-call check of fn's
    arguments sees it, so a call with the other sign would be answered with the
    captured one (it was, before this refusal: inf for eager's -inf)."""
    with pytest.raises(PrecompileError) as caught:
        with precompile.capture(
            fn,  # type: ignore[arg-type]
            artifact_path=tmp_path / "a.py",
            cache_path=tmp_path / "a.cache",
            tracer=precompile.DynamoTracer(),
            backend="eager",
        ) as cap:
            cap(None, torch.tensor([1.0, -2.0, 0.0]), torch.tensor(zero))
    message = str(caught.value)
    assert "(a frame after a graph break, or a helper frame)" in message, message
    assert f"was {zero!r} when captured" in message, message
    assert "does not tell a zero from the other sign's" in message
    assert "keep the value a tensor" in (caught.value.hint or "")
