"""Inputs in other memory layouts, and dict inputs shaped otherwise than at capture: the
artifact checks what its backend baked, not what the trace touched.

- Eager backend (make_fx): a channels_last image, an NHWC buffer permuted to NCHW, an
  expanded (stride 0) or transposed input into conv -> reshape -> Linear, or into a
  matmul that flattens, is served exactly: the views the trace chose for the capture's
  strides are freed (``graph_layouts.free_views``). A view whose aliasing an output
  shows is kept, and a layout it cannot view is refused, naming the way out.
- Inductor (make_fx): such inputs are served through a copy in the captured layout,
  with one ``LayoutCopyWarning`` per artifact; an input the graph writes in place, or
  that an output views, or one fn branched on the layout of, is refused instead,
  saying why.
- Dynamo: a frame whose Python queried no layout drops the stride part of its tensor
  guards, so the eager backend serves any layout exactly (standalone and installed, an
  in-place write and an output viewing the input included), and Inductor serves it
  through one warned copy; Inductor keeps the guard of an input the graph writes or an
  output views, and any frame that queried a layout (``is_contiguous()``) keeps them
  all, each refusal naming why.
- A dict fn reads only by key is served with its keys in another order, or with a key
  fn never reads (both tracers); a missing key, or a read key whose value changes
  shape or dtype, is refused; a dict fn iterates is refused in another order.

Captured here (one capture per artifact, shared by the module), served in one fresh
process, compared with eager on the same inputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import precompile
from tests.fixtures import input_layouts as fx
from tests.harness import capture_pair, run_job

IMAGES = [
    "image contiguous",
    "image channels_last",
    "image NHWC permuted",
    "image expanded",
    "image transposed",
]
MATRICES = ["mm contiguous", "mm transposed", "mm expanded"]
DICTS = ["dict a,b", "dict b,a", "dict a,b,extra", "dict a", "dict a(4),b", "dict a(f64),b"]

#: artifact name -> (fn, tracer, backend, example arguments, cases to serve)
ARTIFACTS: dict[str, tuple[str, str, str, Any, list[str]]] = {
    "fx eager head": ("head", "fx", "eager", lambda: (fx.image(0),), IMAGES),
    "fx eager mm": ("folded_matmul", "fx", "eager", fx.CASES["mm contiguous"], MATRICES),
    "fx eager flattened": (
        "flattened",
        "fx",
        "eager",
        fx.CASES["x contiguous"],
        ["x contiguous", "x transposed"],
    ),
    "dynamo eager head": ("head", "dynamo", "eager", lambda: (fx.image(0),), IMAGES),
    "dynamo installed head": ("head", "dynamo", "eager", lambda: (fx.image(0),), IMAGES),
    "dynamo eager mm": ("folded_matmul", "dynamo", "eager", fx.CASES["mm contiguous"], MATRICES),
    "dynamo eager flattened": (
        "flattened",
        "dynamo",
        "eager",
        fx.CASES["x contiguous"],
        ["x contiguous", "x transposed"],
    ),
    "dynamo eager in place": (
        "scaled_in_place",
        "dynamo",
        "eager",
        fx.CASES["x,y contiguous"],
        ["x,y contiguous", "x,y transposed"],
    ),
    "dynamo eager assigned": (
        "assigned",
        "dynamo",
        "eager",
        fx.CASES["x contiguous"],
        ["x contiguous", "x transposed"],
    ),
    "dynamo eager first row": (
        "first_row",
        "dynamo",
        "eager",
        fx.CASES["x contiguous"],
        ["x contiguous", "x transposed"],
    ),
    "dynamo eager dim order": (
        "dim_order_branch",
        "dynamo",
        "eager",
        fx.CASES["x contiguous"],
        ["x contiguous", "x transposed"],
    ),
    "dynamo eager layout branch": (
        "layout_branch",
        "dynamo",
        "eager",
        fx.CASES["x contiguous"],
        ["x contiguous", "x transposed"],
    ),
    "fx inductor head": ("head", "fx", "inductor", lambda: (fx.image(0),), IMAGES),
    "fx inductor in place": (
        "scaled_in_place",
        "fx",
        "inductor",
        fx.CASES["x,y contiguous"],
        ["x,y contiguous", "x,y transposed"],
    ),
    "fx inductor first row": (
        "first_row",
        "fx",
        "inductor",
        fx.CASES["x contiguous"],
        ["x contiguous", "x transposed"],
    ),
    "fx inductor layout branch": (
        "layout_branch",
        "fx",
        "inductor",
        fx.CASES["x contiguous"],
        ["x contiguous", "x transposed"],
    ),
    "dynamo inductor head": ("head", "dynamo", "inductor", lambda: (fx.image(0),), IMAGES),
    "dynamo installed inductor head": (
        "head",
        "dynamo",
        "inductor",
        lambda: (fx.image(0),),
        IMAGES,
    ),
    "dynamo inductor in place": (
        "scaled_in_place",
        "dynamo",
        "inductor",
        fx.CASES["x,y contiguous"],
        ["x,y contiguous", "x,y transposed"],
    ),
    "dynamo inductor first row": (
        "first_row",
        "dynamo",
        "inductor",
        fx.CASES["x contiguous"],
        ["x contiguous", "x transposed"],
    ),
    "dynamo inductor layout branch": (
        "layout_branch",
        "dynamo",
        "inductor",
        fx.CASES["x contiguous"],
        ["x contiguous", "x transposed"],
    ),
    "fx by key": ("by_key", "fx", "eager", fx.CASES["dict a,b"], DICTS),
    "dynamo by key": ("by_key", "dynamo", "eager", fx.CASES["dict a,b"], DICTS),
    "fx folded": ("folded", "fx", "eager", fx.CASES["dict a,b"], DICTS[:4]),
    "dynamo folded": ("folded", "dynamo", "eager", fx.CASES["dict a,b"], DICTS[:4]),
}


def _capture(tmp: Path, name: str, fn_name: str, tracer: str, backend: str, args: Any) -> dict:
    fn = getattr(fx, fn_name)
    factory = (
        ("broken_conv_head" if "installed" in name else "conv_head") if fn_name == "head" else None
    )
    model = (getattr(fx, factory)(1),) if factory else ()
    with torch.no_grad():
        paths = capture_pair(
            fn,
            *model,
            *args(),
            directory=tmp,
            name=name.replace(" ", "_"),
            tracer=precompile.MakeFxTracer() if tracer == "fx" else precompile.DynamoTracer(),
            backend=backend,
        )
    return {"artifact": paths[0], "cache": paths[1], "fn": fn_name, "model": factory}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every artifact captured once, then served in one fresh process."""
    tmp = tmp_path_factory.mktemp("layouts")
    job = {}
    for name, (fn_name, tracer, backend, args, cases) in ARTIFACTS.items():
        job[name] = {**_capture(tmp, name, fn_name, tracer, backend, args), "cases": cases}
    return run_job("tests.fixtures.input_layouts", job, tmp / "job.json", timeout=600)


def _results(served: dict[str, Any], name: str) -> dict[str, str]:
    return {case: cell["result"] for case, cell in served[name].items() if case[:2] != "__"}


def test_eager_graph_serves_any_layout_exactly(served: dict[str, Any]) -> None:
    # The crash of issue 26: channels_last / permuted NHWC into conv -> reshape -> Linear.
    assert _results(served, "fx eager head") == dict.fromkeys(IMAGES, "exact")
    assert _results(served, "fx eager mm") == dict.fromkeys(MATRICES, "exact")
    # The eager backend copies nothing and warns of nothing.
    assert served["fx eager head"]["__copy_warning_text__"] is None


def test_eager_view_an_output_shows_is_kept_and_refused_when_unviewable(
    served: dict[str, Any],
) -> None:
    cells = served["fx eager flattened"]
    assert cells["x contiguous"]["result"] == "exact"
    assert cells["x transposed"]["result"] == "refused"
    message = cells["x transposed"]["message"]
    assert "a view in the captured graph cannot take" in message
    assert "an output or an in-place write goes through it" in message
    assert "invariant 6" in message


def test_inductor_serves_other_layouts_through_one_warned_copy(served: dict[str, Any]) -> None:
    cells = served["fx inductor head"]
    assert _results(served, "fx inductor head") == dict.fromkeys(IMAGES, "exact")
    # One warning for the whole artifact, though four calls were copied (covers(),
    # asked before each call, says they are served, and copies and warns of nothing).
    assert cells["image channels_last"]["copy_warnings"] == 1
    assert all(cells[case]["covered"] for case in IMAGES)
    text = cells["__copy_warning_text__"]
    assert "input 0 has strides (75, 1, 15, 3)" in text
    assert "compiled for strides (75, 25, 5, 1)" in text
    assert "costs a copy" in text and "once per artifact" in text


def test_inductor_refuses_a_copy_that_would_break_the_promise(served: dict[str, Any]) -> None:
    written = served["fx inductor in place"]
    assert written["x,y contiguous"]["result"] == "exact"
    assert written["x,y transposed"]["result"] == "refused"
    message = written["x,y transposed"]["message"]
    assert "input 0 has strides (1, 3)" in message and "captured with strides (4, 1)" in message
    assert "the graph writes it in place, and a copy would take the write" in message
    assert not written["x,y transposed"]["covered"]
    viewed = served["fx inductor first row"]
    assert viewed["x contiguous"]["result"] == "exact"
    assert viewed["x transposed"]["result"] == "refused"
    assert "an output is it or a view of it" in viewed["x transposed"]["message"]
    # fn branched on the layout: a copy would hide that eager takes the other branch.
    branch = served["fx inductor layout branch"]
    assert branch["x contiguous"]["result"] == "exact"
    assert branch["x transposed"]["result"] == "refused"
    assert "fn reads memory layout (.is_contiguous() at" in branch["x transposed"]["message"]


@pytest.mark.parametrize("serving", ["eager", "installed"])
def test_dynamo_eager_serves_any_layout_its_python_never_read(
    served: dict[str, Any], serving: str
) -> None:
    # Issue 26 asks for this: these calls were refused by Dynamo's stride guards. The
    # subgraphs hold torch calls as written (reshape stays reshape) and the Python read
    # no layout, so the stride part of each tensor guard goes (shape, dtype, device stay).
    assert _results(served, f"dynamo {serving} head") == dict.fromkeys(IMAGES, "exact")
    assert served[f"dynamo {serving} head"]["__copy_warning_text__"] is None


def test_dynamo_eager_serves_writes_and_views_of_inputs_in_any_layout(
    served: dict[str, Any],
) -> None:
    # The graph runs on the caller's own tensors: an in-place write lands in them and an
    # output that views an input views the caller's (aliasing compared with eager's).
    assert _results(served, "dynamo eager mm") == dict.fromkeys(MATRICES, "exact")
    assert _results(served, "dynamo eager in place") == {
        "x,y contiguous": "exact",
        "x,y transposed": "exact",
    }
    assert _results(served, "dynamo eager assigned") == {
        "x contiguous": "exact",
        "x transposed": "exact",
    }
    assert _results(served, "dynamo eager first row") == {
        "x contiguous": "exact",
        "x transposed": "exact",
    }
    # reshape of a transposed input copies, as eager's does (no view to keep).
    assert _results(served, "dynamo eager flattened") == {
        "x contiguous": "exact",
        "x transposed": "exact",
    }


def test_dynamo_layout_read_keeps_the_stride_guard_and_names_the_read(
    served: dict[str, Any],
) -> None:
    cells = served["dynamo eager layout branch"]
    assert cells["x contiguous"]["result"] == "exact"
    assert cells["x transposed"]["result"] == "refused"
    assert not cells["x transposed"]["covered"]
    message = cells["x transposed"]["message"]
    assert "`x` has stride 1 at dim 0; the capture saw 4" in message
    assert "the traced code reads memory layout (.is_contiguous() at input_layouts.py:" in message
    # Any tensor method whose answer Dynamo folds into a non-tensor value counts, not a
    # list of names: dim_order() has no handler of its own in Dynamo.
    cells = served["dynamo eager dim order"]
    assert cells["x contiguous"]["result"] == "exact"
    assert cells["x transposed"]["result"] == "refused"
    message = cells["x transposed"]["message"]
    assert "the traced code reads memory layout (.dim_order() at input_layouts.py:" in message


@pytest.mark.parametrize("serving", ["inductor", "installed inductor"])
def test_dynamo_inductor_serves_other_layouts_through_one_warned_copy(
    served: dict[str, Any], serving: str
) -> None:
    # Issue 26: refused by the stride guard until now. Inductor's kernels index by the
    # captured strides, so the input the graph neither writes nor returns a view of is
    # copied into the captured layout, with one LayoutCopyWarning per artifact.
    cells = served[f"dynamo {serving} head"]
    assert _results(served, f"dynamo {serving} head") == dict.fromkeys(IMAGES, "exact")
    assert all(cells[case]["covered"] for case in IMAGES)
    assert cells["image channels_last"]["copy_warnings"] == 1
    text = cells["__copy_warning_text__"]
    assert "input `x` has strides (75, 1, 15, 3)" in text
    assert "compiled for strides (75, 25, 5, 1)" in text
    assert "costs a copy" in text and "once per artifact" in text


def test_dynamo_inductor_refuses_a_copy_that_would_break_the_promise(
    served: dict[str, Any],
) -> None:
    written = served["dynamo inductor in place"]
    assert written["x,y contiguous"]["result"] == "exact"
    assert written["x,y transposed"]["result"] == "refused"
    assert not written["x,y transposed"]["covered"]
    message = written["x,y transposed"]["message"]
    assert "`x` has stride 1 at dim 0; the capture saw 4" in message
    assert "the graph writes it in place, and a copy would take the write" in message
    viewed = served["dynamo inductor first row"]
    assert viewed["x contiguous"]["result"] == "exact"
    assert viewed["x transposed"]["result"] == "refused"
    assert "an output is it or a view of it" in viewed["x transposed"]["message"]
    branch = served["dynamo inductor layout branch"]
    assert branch["x contiguous"]["result"] == "exact"
    assert branch["x transposed"]["result"] == "refused"
    assert (
        "the traced code reads memory layout (.is_contiguous() at input_layouts.py:"
        in branch["x transposed"]["message"]
    )


@pytest.mark.parametrize("tracer", ["fx", "dynamo"])
def test_dict_read_by_key_serves_other_orders_and_unread_keys(
    served: dict[str, Any], tracer: str
) -> None:
    cells = served[f"{tracer} by key"]
    results = _results(served, f"{tracer} by key")
    assert results == {
        "dict a,b": "exact",
        "dict b,a": "exact",
        "dict a,b,extra": "exact",
        "dict a": "refused",
        "dict a(4),b": "refused",
        "dict a(f64),b": "refused",
    }
    missing = cells["dict a"]["message"]
    assert "no key 'b'" in missing
    assert (
        "size 4" in cells["dict a(4),b"]["message"]
        or "shape (4,)" in cells["dict a(4),b"]["message"]
    )
    dtype = cells["dict a(f64),b"]["message"]
    assert "float64" in dtype if tracer == "fx" else "has dtype Double" in dtype


@pytest.mark.parametrize("tracer", ["fx", "dynamo"])
def test_dict_fn_iterates_is_refused_in_another_order(served: dict[str, Any], tracer: str) -> None:
    cells = served[f"{tracer} folded"]
    assert cells["dict a,b"]["result"] == "exact"
    for case in ("dict b,a", "dict a,b,extra", "dict a"):
        assert cells[case]["result"] == "refused", (case, cells[case])
    if tracer == "fx":
        assert "keys in the order ['b', 'a']" in cells["dict b,a"]["message"]
        extra = cells["dict a,b,extra"]["message"]
        assert "has the keys ['a', 'b', 'c'] but was captured with ['a', 'b']" in extra
        assert "fn reads more of it than values by key" in extra
    else:
        assert "another order" in cells["dict b,a"]["message"]
