"""Every capture refusal: its message names the invariant, and ``location`` is the user's
line (found here by a marker comment on that line)."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from torch import nn

import precompile
from precompile import PrecompileError

HERE = Path(__file__).resolve()
SOURCE_LINES = HERE.read_text().splitlines()


def line_of(marker: str) -> int:
    hits = [i + 1 for i, line in enumerate(SOURCE_LINES) if line.rstrip().endswith(f"# <{marker}>")]
    assert len(hits) == 1, marker
    return hits[0]


def refuse(
    fn: Callable[..., Any],
    *args: Any,
    invariant: int | None,
    marker: str | None,
    words: tuple[str, ...],
    training: bool = False,
    tmp: Path,
) -> PrecompileError:
    artifact, cache = tmp / "a.py", tmp / "a.cache"
    with pytest.raises(PrecompileError) as info:
        with precompile.capture(
            fn,
            artifact_path=artifact,
            cache_path=cache,
            tracer=precompile.MakeFxTracer(),
            backend="eager",
            training=training,
        ) as cap:
            cap(*args)
    error = info.value
    assert error.invariant == invariant, str(error)
    if invariant is not None:
        assert f"invariant {invariant}" in str(error)
    for word in words:
        assert word in str(error), (word, str(error))
    if marker is not None:
        assert error.location is not None, str(error)
        assert Path(error.location.file).resolve() == HERE
        assert error.location.line == line_of(marker), (error.location, str(error))
    assert not artifact.exists() and not cache.exists(), "a refused capture wrote files"
    assert cap.report().ok is False and cap.report().error["message"] == error.message
    return error


GLOBAL_SCALE = torch.full((4,), 2.0)


def uses_global(x: torch.Tensor) -> torch.Tensor:
    return x * GLOBAL_SCALE  # <global>


def make_closure() -> Callable[..., Any]:
    offset = torch.ones(4)

    def uses_closure(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return model(x) + offset

    return uses_closure


class WithPlainAttribute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.shift = torch.zeros(4)  # not a buffer: would be baked in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) - self.shift  # <attribute>


def builds_literal(x: torch.Tensor) -> torch.Tensor:
    return x * torch.tensor([1.0, 2.0, 3.0, 4.0])


def uses_item(x: torch.Tensor) -> torch.Tensor:
    return x * x.sum().item()  # <item>


def uses_nonzero(x: torch.Tensor) -> torch.Tensor:
    return x.nonzero()  # <nonzero>


def uses_tensor_if(x: torch.Tensor) -> torch.Tensor:
    if x.sum() > 0:  # <if>
        return x
    return -x


def uses_data_ptr(x: torch.Tensor) -> torch.Tensor:
    return x + (x.data_ptr() % 2)  # <data_ptr>


def uses_numpy(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(x.numpy() * 2)  # <numpy>


def uses_cond(x: torch.Tensor) -> torch.Tensor:
    return torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,))  # <cond>


def uses_while_loop(x: torch.Tensor) -> torch.Tensor:
    return torch._higher_order_ops.while_loop(  # <while>
        lambda i, t: i < 3, lambda i, t: (i + 1, t * 2), (torch.tensor(0), x)
    )[1]


@torch.library.custom_op("precompile_tests::no_fake_kernel", mutates_args=())
def no_fake_kernel(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


def uses_custom_op(x: torch.Tensor) -> torch.Tensor:
    return no_fake_kernel(x) + 1  # <custom_op>


def backward_without_training(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    loss = model(x).sum()
    loss.backward()  # <backward>
    return loss


class GradBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)
        self.register_buffer("scale", torch.ones(4, requires_grad=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x * self.scale)


def backward_into_buffer(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    loss = model(x).sum()
    loss.backward()
    return loss.detach()


def backward_into_input(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    loss = model(x).sum()
    loss.backward()
    return loss.detach()


def forward_only(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


class MyTensor(torch.Tensor):
    pass


def returns_object(x: torch.Tensor) -> Any:
    return {"value": x + 1, "meta": object()}


# ---------------------------------------------------------------- invariant 1


def test_global_tensor_is_refused(tmp_path: Path) -> None:
    refuse(
        uses_global,
        torch.randn(4),
        invariant=1,
        marker="global",
        words=("GLOBAL_SCALE", "not an input"),
        tmp=tmp_path,
    )


def test_closure_tensor_is_refused_at_the_function(tmp_path: Path) -> None:
    fn = make_closure()
    error = refuse(
        fn,
        nn.Linear(4, 4),
        torch.randn(4),
        invariant=1,
        marker=None,
        words=("closure variable 'offset'",),
        tmp=tmp_path,
    )
    assert error.location.line == fn.__code__.co_firstlineno


def test_unregistered_module_attribute_is_refused(tmp_path: Path) -> None:
    refuse(
        forward_only,
        WithPlainAttribute(),
        torch.randn(4),
        invariant=1,
        marker="attribute",
        words=("attribute 'shift'", "register_buffer"),
        tmp=tmp_path,
    )


def test_small_literal_tensor_built_inside_fn_is_kept(tmp_path: Path) -> None:
    x = torch.randn(4)
    with precompile.capture(
        builds_literal,
        artifact_path=tmp_path / "a.py",
        cache_path=tmp_path / "a.cache",
        tracer=precompile.MakeFxTracer(),
        backend="eager",
    ) as cap:
        out = cap(x)
    torch.testing.assert_close(out, builds_literal(x))
    assert "torch.tensor([1.0, 2.0, 3.0, 4.0]" in (tmp_path / "a.py").read_text()


def test_module_as_fn_is_refused(tmp_path: Path) -> None:
    refuse(
        nn.Linear(4, 4),
        torch.randn(4),
        invariant=1,
        marker=None,
        words=("is itself an nn.Module",),
        tmp=tmp_path,
    )


def test_fn_holding_a_module_in_a_closure_is_refused(tmp_path: Path) -> None:
    model = nn.Linear(4, 4)

    def holds(x: torch.Tensor) -> torch.Tensor:
        return model(x)

    error = refuse(
        holds,
        torch.randn(4),
        invariant=1,
        marker=None,
        words=("closure variable 'model'",),
        tmp=tmp_path,
    )
    assert error.location.line == holds.__code__.co_firstlineno


def test_fn_holding_a_tensor_as_default_is_refused(tmp_path: Path) -> None:
    def holds(x: torch.Tensor, bias: torch.Tensor = torch.ones(4)) -> torch.Tensor:  # noqa: B008 (the point)
        return x + bias

    refuse(
        holds, torch.randn(4), invariant=1, marker=None, words=("default argument",), tmp=tmp_path
    )


# ---------------------------------------------------------------- invariant 3: data dependence


@pytest.mark.parametrize(
    ("fn", "marker"),
    [(uses_item, "item"), (uses_nonzero, "nonzero"), (uses_tensor_if, "if")],
)
def test_data_dependent_ops_are_refused(
    tmp_path: Path, fn: Callable[..., Any], marker: str
) -> None:
    refuse(
        fn,
        torch.randn(4),
        invariant=3,
        marker=marker,
        words=("depends on tensor values", "DynamoTracer"),
        tmp=tmp_path,
    )


@pytest.mark.parametrize(
    ("fn", "marker", "name"),
    [(uses_cond, "cond", "cond"), (uses_while_loop, "while", "while_loop")],
)
def test_control_flow_ops_are_refused(
    tmp_path: Path, fn: Callable[..., Any], marker: str, name: str
) -> None:
    refuse(
        fn, torch.randn(4), invariant=3, marker=marker, words=(name, "control-flow"), tmp=tmp_path
    )


# ---------------------------------------------------------------- invariant 4: what cannot be traced


@pytest.mark.parametrize(
    ("fn", "marker", "word"),
    [(uses_data_ptr, "data_ptr", ".data_ptr()"), (uses_numpy, "numpy", ".numpy()")],
)
def test_leaving_the_graph_is_refused(
    tmp_path: Path, fn: Callable[..., Any], marker: str, word: str
) -> None:
    refuse(fn, torch.randn(4), invariant=4, marker=marker, words=(word,), tmp=tmp_path)


def test_op_without_fake_kernel_is_refused(tmp_path: Path) -> None:
    refuse(
        uses_custom_op,
        torch.randn(4),
        invariant=None,
        marker="custom_op",
        words=("no_fake_kernel", "register_fake"),
        tmp=tmp_path,
    )


@pytest.mark.parametrize(
    ("make", "word"),
    [
        (lambda: torch.randn(4, 4).to_sparse(), "sparse"),
        (lambda: torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8), "quantized"),
        (lambda: torch.nested.nested_tensor([torch.randn(2), torch.randn(3)]), "nested"),
        (lambda: torch.randn(4, 4).to_mkldnn(), "mkldnn"),
        (lambda: torch.randn(4).as_subclass(MyTensor), "subclass (MyTensor)"),
    ],
)
def test_unsupported_input_kinds_are_refused(
    tmp_path: Path, make: Callable[[], torch.Tensor], word: str
) -> None:
    refuse(lambda x: x, make(), invariant=4, marker=None, words=(word,), tmp=tmp_path)


def test_pinned_input_is_refused(tmp_path: Path) -> None:
    # A CPU-only build cannot pin memory, so report every tensor as pinned instead.
    with mock.patch.object(torch.Tensor, "is_pinned", lambda self: True):
        refuse(
            lambda x: x,
            torch.randn(4),
            invariant=4,
            marker=None,
            words=("pinned memory",),
            tmp=tmp_path,
        )


def test_capture_inside_another_trace_is_refused(tmp_path: Path) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(4)
    with FakeTensorMode():
        with pytest.raises(PrecompileError, match="inside"):
            with precompile.capture(
                lambda t: t + 1,
                artifact_path=tmp_path / "a.py",
                cache_path=tmp_path / "a.cache",
                tracer=precompile.MakeFxTracer(),
                backend="eager",
            ) as cap:
                cap(x)


def test_non_literal_output_is_refused(tmp_path: Path) -> None:
    refuse(
        returns_object,
        torch.randn(4),
        invariant=3,
        marker=None,
        words=("returned a object",),
        tmp=tmp_path,
    )


def test_non_literal_input_is_refused(tmp_path: Path) -> None:
    refuse(
        lambda x, cfg: x,
        torch.randn(4),
        object(),
        invariant=3,
        marker=None,
        words=("input value 1 is a object",),
        tmp=tmp_path,
    )


class Mode(enum.IntEnum):
    FAST = 1


def test_literal_subclass_input_is_refused(tmp_path: Path) -> None:
    # Baked values are re-checked by exact type and value: the call would never match.
    error = refuse(
        lambda x, mode: x * mode,
        torch.randn(4),
        Mode.FAST,
        invariant=3,
        marker=None,
        words=("input value 1 is a Mode, a subclass of int",),
        tmp=tmp_path,
    )
    assert "int(value)" in (error.hint or "")


# ---------------------------------------------------------------- invariant 5: training


def test_backward_without_training_is_refused(tmp_path: Path) -> None:
    refuse(
        backward_without_training,
        nn.Linear(4, 1),
        torch.randn(4),
        invariant=5,
        marker="backward",
        words=("training=True",),
        tmp=tmp_path,
    )


def test_buffer_receiving_a_grad_is_refused(tmp_path: Path) -> None:
    refuse(
        backward_into_buffer,
        GradBuffer(),
        torch.randn(4),
        invariant=5,
        marker=None,
        words=("buffer 'scale'",),
        training=True,
        tmp=tmp_path,
    )


def test_input_receiving_a_grad_is_refused(tmp_path: Path) -> None:
    x = torch.randn(4, requires_grad=True)
    refuse(
        backward_into_input,
        nn.Linear(4, 1),
        x,
        invariant=5,
        marker=None,
        words=("input value 0 received a gradient",),
        training=True,
        tmp=tmp_path,
    )


def test_training_without_backward_is_refused(tmp_path: Path) -> None:
    refuse(
        forward_only,
        nn.Linear(4, 1),
        torch.randn(4),
        invariant=5,
        marker=None,
        words=("ran no backward",),
        training=True,
        tmp=tmp_path,
    )


# ---------------------------------------------------------------- the session itself


def _session(tmp_path: Path, fn: Callable[..., Any] = builds_literal) -> Any:
    return precompile.capture(
        fn,
        artifact_path=tmp_path / "a.py",
        cache_path=tmp_path / "a.cache",
        tracer=precompile.MakeFxTracer(),
        backend="eager",
    )


def test_second_call_points_to_the_dynamo_tracer(tmp_path: Path) -> None:
    with _session(tmp_path) as cap:
        cap(torch.randn(4))
        with pytest.raises(PrecompileError, match="DynamoTracer"):
            cap(torch.randn(4))


def test_keyword_call_is_refused(tmp_path: Path) -> None:
    with _session(tmp_path) as cap:
        with pytest.raises(PrecompileError, match="positional"):
            cap(x=torch.randn(4))
        cap(torch.randn(4))


def test_capture_is_single_use(tmp_path: Path) -> None:
    session = _session(tmp_path)
    with session as cap:
        cap(torch.randn(4))
    with pytest.raises(PrecompileError, match="single-use"):
        with session:
            pass


def _previous(x: torch.Tensor) -> torch.Tensor:
    return x - 1


def _previous_pair(tmp_path: Path) -> tuple[bytes, bytes]:
    """A pair an earlier capture wrote at a.py/a.cache (only such a pair may be
    replaced: precompile.write_policy), and its bytes."""
    with _session(tmp_path, _previous) as cap:
        cap(torch.randn(4))
    return (tmp_path / "a.py").read_bytes(), (tmp_path / "a.cache").read_bytes()


def test_block_that_raises_writes_nothing_new(tmp_path: Path) -> None:
    previous = _previous_pair(tmp_path)
    with pytest.raises(KeyError):
        with _session(tmp_path) as cap:
            cap(torch.randn(4))
            raise KeyError("user error after the call")
    assert ((tmp_path / "a.py").read_bytes(), (tmp_path / "a.cache").read_bytes()) == previous


def test_save_writes_at_once_and_exit_writes_again(tmp_path: Path) -> None:
    with _session(tmp_path) as cap:
        cap(torch.randn(4))
        cap.save()
        first = (tmp_path / "a.py").read_bytes()
        (tmp_path / "a.py").unlink()
    assert (tmp_path / "a.py").read_bytes() == first


def test_empty_block_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PrecompileError, match="nothing was captured"):
        with _session(tmp_path):
            pass


def test_failed_write_leaves_the_previous_pair(tmp_path: Path) -> None:
    previous = _previous_pair(tmp_path)
    real_replace = os.replace
    calls: list[str] = []

    def failing_replace(src: str, dst: str) -> None:
        calls.append(dst)
        raise OSError(28, "No space left on device", dst)

    with pytest.raises(PrecompileError, match="previous files are unchanged") as info:
        with _session(tmp_path) as cap:
            cap(torch.randn(4))
            with mock.patch("os.replace", failing_replace):
                cap.save()
    assert isinstance(info.value.__cause__, OSError) and calls
    assert ((tmp_path / "a.py").read_bytes(), (tmp_path / "a.cache").read_bytes()) == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.cache",
        "a.py",
    ], "temp files left behind"
    assert real_replace is os.replace


def test_unknown_backend_is_a_value_error_naming_both(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'inductor' or 'eager'"):
        precompile.capture(
            builds_literal,
            artifact_path=tmp_path / "a.py",
            cache_path=tmp_path / "a.cache",
            backend="tvm",
        )
