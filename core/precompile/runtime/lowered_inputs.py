"""What an Inductor-lowered graph assumes of its inputs, checked on each call.

Two assumptions hold for the calls a capture traced but not for every call the guards
let through; where one fails, the call is refused rather than served wrong or failed
with an error from inside the kernels.

Inputs the graph writes share memory with no other input. Inductor lowers a functional
graph: ``a.mul_(2); return a + b`` becomes ``new = a * 2; copy_(a, new); return new +
b``, reading ``b`` as if nothing wrote its memory. When ``b`` is ``a[:]`` (or
``a.view(3)``, or an overlapping slice of ``a``'s base), eager reads the updated values
and the lowered graph the old ones: a silently wrong answer. Dynamo's guards compare
tensor objects by identity and the driver's checks shapes and strides, so neither sees
it. The capture records which inputs each lowered graph writes (the placeholders its
functional graph copies into, or AOTAutograd's input mutation metadata); each call of
such a graph compares their memory with every other tensor input's. Graphs that write no
input pay nothing. The eager backend runs the in-place ops themselves, which is exact
for aliased inputs, and needs no check.

A dynamic integer input fits a signed 64-bit integer: the kernels take it as
``int64_t``, and a Python int past that range fails inside them (``RuntimeError:
expected int arg``) where eager computes with it.

Artifacts carry this module whole (the single-graph driver and the Dynamo artifacts'
subgraph table call it); the capture runs the same functions on its own calls.
"""

from __future__ import annotations

import operator as _operator
from collections.abc import Callable, Sequence
from itertools import compress as _compress
from itertools import repeat as _repeat
from typing import Any, NoReturn

# >>> not emitted: an artifact's prelude binds _torch, and it carries refusal.refuse
import torch as _torch

from precompile.runtime.refusal import refuse
from precompile.runtime.single_graph_inputs import warn_layout_copy

# <<< not emitted

_INT64_MIN = -(2**63)
_INT64_END = 2**63

_Tensor = _torch.Tensor
_data_ptr = _Tensor.data_ptr
_nbytes = _operator.attrgetter("nbytes")
_is_contiguous = _Tensor.is_contiguous
_is_inference = _Tensor.is_inference
_is_inference_mode_enabled = _torch.is_inference_mode_enabled


def _element_span(t: Any) -> tuple[int, int]:
    """The bytes ``t``'s elements can occupy, ``[first, end)``: from its data pointer over
    its sizes and strides (a negative stride reaches below it). Elements of two tensors
    can only coincide where their spans intersect; two interleaved views (``x[::2]``,
    ``x[1::2]``) have intersecting spans without sharing an element, and are counted as
    overlapping, which refuses a call that would have been exact, never the reverse."""
    low = high = 0
    for size, stride in zip(t.shape, t.stride()):
        if stride >= 0:
            high += (size - 1) * stride
        else:
            low += (size - 1) * stride
    item = t.element_size()
    start = t.data_ptr()
    return start + low * item, start + (high + 1) * item


def _disjoint(inputs: Sequence[Any]) -> bool:
    """Whether the tensor inputs are all contiguous and no two of them share a byte:
    the usual call, every input its own memory, answered in a few C-level passes over
    the list (a Python loop over 200 inputs would cost a training step's call more than
    its kernels do).

    Half-open spans ``[start, end)`` are pairwise disjoint exactly when, with the
    starts and the ends each sorted on their own, the k-th end is at most the
    (k+1)-th start: at no address have more spans begun than ended, plus one."""
    try:
        starts = list(map(_data_ptr, inputs))
        tensors = inputs
    except TypeError:  # not all tensors: an int, None, a float among them
        tensors = list(_compress(inputs, map(isinstance, inputs, _repeat(_Tensor))))
        starts = list(map(_data_ptr, tensors))
    if not all(map(_is_contiguous, tensors)):
        return False
    ends = sorted(map(_operator.add, starts, map(_nbytes, tensors)))
    starts.sort()
    return all(map(_operator.le, ends, starts[1:]))


def aliased_mutation(inputs: Sequence[Any], mutated: Sequence[int]) -> tuple[int, int] | None:
    """The first pair ``(m, j)`` found: a tensor input ``m`` the graph writes whose
    elements may share memory with another tensor input ``j`` (the same object passed
    twice, a view of it, an overlapping slice of one base, two tensors made from one
    buffer); None when each written input's memory is its own.

    Inputs are compared by the bytes their elements can occupy (``_element_span``):
    addresses rather than storage objects, so tensors sharing memory without sharing a
    storage (``torch.from_numpy`` of one array twice) are seen, and views of one base
    that do not overlap (``base[:2]``, ``base[2:]``) are served. It runs on every call
    over every tensor input (a training step passes each parameter and buffer), so the
    usual call is answered by ``_disjoint``, and any other by one sort and one sweep of
    the spans, O(n log n), never by comparing each written input with every other."""
    if _disjoint(inputs):
        return None
    written = set(mutated)
    spans: list[tuple[int, int, int]] = []
    for i, t in enumerate(inputs):
        if isinstance(t, _Tensor) and t.numel():  # no elements: shares nothing
            if t.is_contiguous():
                start = t.data_ptr()
                spans.append((start, start + t.nbytes, i))
            else:
                spans.append((*_element_span(t), i))
    spans.sort()
    # In order of start: a span overlaps an earlier one exactly when it starts below
    # the earlier span's end. The furthest end so far (of any span, and of a written
    # one) finds a pair with a written member if there is one.
    reach = reach_written = -1
    holder = holder_written = -1
    for start, end, i in spans:
        if i in written:
            if start < reach:
                return i, holder
            if end > reach_written:
                reach_written, holder_written = end, i
        elif start < reach_written:
            return holder_written, i
        if end > reach:
            reach, holder = end, i
    return None


def _name(labels: Sequence[str | None], i: int) -> str:
    label = labels[i] if i < len(labels) else None
    return label or f"graph input {i}"


def check_written_inputs(
    inputs: Sequence[Any], mutated: Sequence[int], labels: Sequence[str | None]
) -> None:
    """Refuse the call when an input the graph writes shares memory with another input,
    or when an input's memory cannot be read to tell (a tensor without ordinary storage
    reaching here: ``data_ptr`` raises), which is never served as if it did not; or when
    it is an inference tensor and the call runs outside inference mode, where eager's
    in-place op raises and the kernels would write it."""
    if not _is_inference_mode_enabled():
        for i in mutated:
            if i < len(inputs) and _is_inference(inputs[i]):
                refuse_inference_write(_name(labels, i))
    try:
        pair = aliased_mutation(inputs, mutated)
    except RuntimeError as error:
        refuse(
            f"precompile: the captured graph writes an input in place, and where the "
            f"inputs' memory lies cannot be read to check that no other input shares it "
            f"({error}). Pass dense tensors, or capture with backend='eager'",
            4,
        )
    if pair is not None:
        refuse_aliased_mutation(pair, labels)


def refuse_inference_write(written: str) -> NoReturn:
    """Refuse the call: the graph writes ``written``, an inference tensor, outside
    inference mode."""
    refuse(
        f"precompile: the captured graph writes {written} in place, and it is an inference "
        f"tensor (made under torch.inference_mode()) while this call runs outside inference "
        f'mode. Eager raises for an in-place operation on it there ("Inplace update to '
        f'inference tensor outside InferenceMode is not allowed"), though not for a '
        f"kernel's own writes (BatchNorm's running statistics); the compiled kernels write "
        f"it either way, and cannot tell which eager would do. Pass a clone (.clone()) of "
        f"it, or make the call under torch.inference_mode()",
        4,
    )


def refuse_aliased_mutation(pair: tuple[int, int], labels: Sequence[str | None]) -> NoReturn:
    """Refuse the call, naming the input the graph writes and the one sharing its memory."""
    written, other = _name(labels, pair[0]), _name(labels, pair[1])
    refuse(
        f"precompile: the captured graph writes {written} in place, and {other} shares "
        f"memory with it (the same tensor, a view of it, or an overlapping slice of one "
        f"base). The Inductor backend lowered the graph assuming that no other input "
        f"shares the memory of an input it writes, so this call would compute another "
        f"result than eager. Pass a copy (.clone()) of one of them, or capture with "
        f"backend='eager'",
        4,
    )


def refuse_wide_int(
    inputs: Sequence[Any], ints: Sequence[int], labels: Sequence[str | None]
) -> None:
    """Refuse the call when a dynamic integer input does not fit in 64 bits."""
    for i in ints:
        value = inputs[i]
        if isinstance(value, int) and not _INT64_MIN <= value < _INT64_END:
            refuse(
                f"precompile: {_name(labels, i)} is {value}, outside the signed 64-bit "
                f"range [-2**63, 2**63) in which the Inductor backend's kernels take a "
                f"dynamic integer; eager would compute with the Python int. Pass a value "
                f"in that range, or capture with backend='eager'",
                3,
            )


#: The bound on a dynamic integer that reaches an expression the capture could not
#: convert (``int_bounded``: a function outside the trees' operators): a product of two
#: such terms still fits int64, one of a higher degree need not (a documented limit;
#: Dynamo lifts dynamic sizes to integer inputs, so they convert).
BOUND = 2**31


def _int_value(tree: Any, args: Sequence[Any]) -> int | None:
    """The value of an integer expression's tree (``precompile._compat.symbolic``) on
    the call's inputs, with Python ints; None where it or any term of it lies outside
    int64, where the kernels' ``int64_t`` arithmetic would wrap."""
    if tree.__class__ is int:
        return tree
    op = tree[0]
    if op == "arg":
        return args[tree[1]]
    values = []
    for operand in tree[1:]:
        value = _int_value(operand, args)
        if value is None:
            return None
        values.append(value)
    if op == "add":
        result = sum(values)
    elif op == "mul":
        result = 1
        for value in values:
            result *= value
    elif op == "pow":
        result = values[0] ** values[1]
    elif op == "floordiv":
        result = values[0] // values[1] if values[1] else 0  # the kernel's to answer
    elif op == "mod":
        result = values[0] % values[1] if values[1] else 0
    elif op == "max":
        result = max(values)
    elif op == "min":
        result = min(values)
    elif op == "abs":
        result = abs(values[0])
    else:  # identity
        result = values[0]
    return result if _INT64_MIN <= result < _INT64_END else None


def refuse_wide_expression(
    inputs: Sequence[Any],
    exprs: Sequence[tuple[Any, str]],
    bounded: Sequence[tuple[int, str]],
    labels: Sequence[str | None],
) -> None:
    """Refuse the call when an integer expression the graph computes from its dynamic
    integer inputs leaves int64 (``4 * k`` for ``k = 2**61``): the kernels would wrap
    where eager computes with Python ints."""
    for tree, shown in exprs:
        if _int_value(tree, inputs) is None:
            refuse(
                f"precompile: the captured graph computes {shown} from its dynamic "
                f"integer inputs, and with this call's values it (or a term of it) lies "
                f"outside the signed 64-bit range [-2**63, 2**63) in which the Inductor "
                f"backend's kernels compute it; eager would compute with Python ints. "
                f"Pass smaller values, or capture with backend='eager'",
                3,
            )
    for i, shown in bounded:
        value = inputs[i]
        if isinstance(value, int) and not -BOUND < value < BOUND:
            refuse(
                f"precompile: {_name(labels, i)} is {value}, and the captured graph "
                f"computes {shown} from it, an expression the capture could not check "
                f"exactly against the signed 64-bit range of the Inductor backend's "
                f"kernels; a dynamic integer reaching it is kept within (-2**31, 2**31). "
                f"Pass a smaller value, or capture with backend='eager'",
                3,
            )


#: One LayoutCopyWarning per artifact (this module is emitted once into each).
_layout_copy_unwarned = [True]


def in_captured_layouts(
    args: tuple[Any, ...],
    layouts: Sequence[tuple[int, ...] | None],
    labels: Sequence[str | None],
    pending: list[tuple[str, tuple[int, ...], Any]] | None = None,
) -> tuple[Any, ...]:
    """``args`` with each tensor that has a captured layout (``layouts``) but other
    strides replaced by a copy in the captured layout: the kernels index by those
    strides. Only inputs the graph neither writes nor returns a view of have one (the
    copy is then exact); the first copy warns, once per artifact -- into ``pending``
    where given, for the caller to issue after the graph ran: a warnings hook is user
    code, and between the frame's guards and the graph it could restride a tensor they
    proved (an Inductor graph no longer asserts what they prove)."""
    copied = None
    for i, strides in enumerate(layouts):
        if strides is None:
            continue
        t = args[i]
        if t.stride() != strides:
            copy = _torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
            copy.copy_(t)
            if copied is None:
                copied = list(args)
            copied[i] = copy
            if _layout_copy_unwarned[0]:
                _layout_copy_unwarned[0] = False
                note = (f"input `{_name(labels, i)}`", tuple(t.stride()), strides)
                if pending is None:
                    warn_layout_copy(*note)
                else:
                    pending.append(note)
    return args if copied is None else tuple(copied)


def check_inputs(
    run: Callable[..., Any],
    mutated: Sequence[int],
    ints: Sequence[int],
    labels: Sequence[str | None],
    int_exprs: Sequence[tuple[Any, str]] = (),
    int_bounded: Sequence[tuple[int, str]] = (),
    layouts: Sequence[Sequence[int] | None] = (),
) -> Callable[..., Any]:
    """``run`` (a lowered subgraph, called with its inputs positionally), refusing a call
    where an input it writes shares memory with another input, or a dynamic integer
    input, or an integer expression the graph computes from those, does not fit in 64
    bits; a tensor in another layout than its kernels were compiled for (``layouts``,
    where the guards let one through) is passed as a copy in the captured layout."""
    mutated = tuple(mutated)
    ints = tuple(ints)
    int_exprs = tuple(int_exprs)
    int_bounded = tuple(int_bounded)
    captured = tuple(None if s is None else tuple(s) for s in layouts)
    copies = any(s is not None for s in captured)

    def checked(*args: Any) -> Any:
        if ints:
            refuse_wide_int(args, ints, labels)
            if int_exprs or int_bounded:
                refuse_wide_expression(args, int_exprs, int_bounded, labels)
        if mutated:
            check_written_inputs(args, mutated, labels)
        if not copies:
            return run(*args)
        pending: list[tuple[str, tuple[int, ...], Any]] = []
        args = in_captured_layouts(args, captured, labels, pending)
        try:
            return run(*args)
        finally:
            # After the graph: its inputs were proven before it, and the hook a
            # warning runs can change only what the next call's guards check.
            for note in pending:
                warn_layout_copy(*note)

    return checked
