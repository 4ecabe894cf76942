"""Dynamo's guard failures in the user's words: every form a review saw leak raw."""

from __future__ import annotations

import pytest

from precompile.runtime.guard_text import guard_failure_text


def test_only_a_plain_value_negated_is_said_to_be_empty() -> None:
    # `not ___check_obj_id(...)` is not an emptiness test.
    assert "empty" not in guard_failure_text("not ___check_obj_id(L['x'], 1234)")


@pytest.mark.parametrize(
    "raw, said",
    [
        (
            "len(L['model']._modules['layers']._modules) != 3",
            "`model.layers` does not hold 3 items",
        ),
        (
            "len(L['xs']) == 2  # f(*xs)  # m.py:12 in fn",
            "`xs` does not hold 2 items, as it did at capture (read at m.py:12 in `fn`)",
        ),
        (
            "TYPE_MISMATCH(L['model']._modules['layers']._modules)",
            "`model.layers` is not of the type the capture saw",
        ),
        (
            "list(dict.keys(L['d']))[0] == 'a'",
            "`d` does not have 'a' as its key number 0: its keys differ from the capture's, or are in another order",
        ),
        ("not L['log']", "`log` is not empty, as it was at capture"),
        (
            "(type(L['s']) is float and __math_isnan(L['s']))  # x / s  # m.py:3 in fn",
            "`s` is not nan, the value the capture specialized on (read at m.py:3 in `fn`)",
        ),
        (
            "expected type of 'L['x']' to be a tensor type, ' but found <class 'torch.nn.parameter.Parameter'>",
            "`x` is a torch.nn.parameter.Parameter, not the exact tensor type the capture saw "
            "(Dynamo's guards compare it: an nn.Parameter, a plain torch.Tensor and a tensor "
            "subclass differ)",
        ),
        (
            # helper-87: the reverse (a Parameter captured, a plain tensor passed) was
            # said as "a torch.Tensor, where the capture saw a plain torch.Tensor".
            "expected type of 'L['model'].l.bias' to be a tensor type, ' but found <class "
            "'torch.Tensor'>",
            "`model.l.bias` is a torch.Tensor, not the exact tensor type the capture saw",
        ),
        (
            "tensor 'L['x']' dispatch key set mismatch. expected DispatchKeySet(CPU, "
            "ADInplaceOrView, AutogradCPU, AutocastCPU), actual DispatchKeySet(CPU, Negative, "
            "ADInplaceOrView, AutogradCPU, AutocastCPU)",
            "`x` is not the kind of tensor the capture saw: it is a negative-bit view (its "
            "storage holds -x; pass `x.resolve_neg()`)",
        ),
        (
            "tensor 'L['z']' dispatch key set mismatch. expected DispatchKeySet(CPU, "
            "ADInplaceOrView, AutogradCPU), actual DispatchKeySet(CPU, Conjugate, "
            "ADInplaceOrView, AutogradCPU)",
            "it is a conjugate view (pass `z.resolve_conj()`)",
        ),
        (
            "tensor 'L['x']' dispatch key set mismatch. expected DispatchKeySet(CPU, "
            "ADInplaceOrView, AutogradCPU), actual DispatchKeySet(CPU, FuncTorchBatched, "
            "ADInplaceOrView, AutogradCPU)",
            "it carries the FuncTorchBatched key",
        ),
        (
            "Duplicate tensor found where not expected!",
            "are one tensor, which they were not at capture",
        ),
    ],
)
def test_raw_guard_text_is_said_in_the_users_words(raw: str, said: str) -> None:
    text = guard_failure_text(raw)
    assert said in text
    for raw_word in ("L[", "_modules", "TYPE_MISMATCH", "dict.keys", "expected type of", "isnan"):
        assert raw_word not in text


@pytest.mark.parametrize(
    "raw, said",
    [
        (
            "not ___dict_contains('forward', L['model'].__dict__)",
            "`model.forward` was set on the instance (an attribute in model.__dict__ shadows "
            "the class's `forward`)",
        ),
        (
            "not ___dict_contains(\"extra_repr\", L['net']._modules['2']._modules['proj'].__dict__)",
            "`net[2].proj.extra_repr` was set on the instance",
        ),
        (
            "___dict_contains('scale', G['MODEL']._modules['fc'].__dict__)",
            "`MODEL.fc.scale` is no longer in MODEL.fc.__dict__, where the capture read it",
        ),
    ],
)
def test_an_instance_attribute_guard_is_said_for_any_name_and_path(raw: str, said: str) -> None:
    text = guard_failure_text(raw)
    assert said in text, text
    assert "___dict_contains" not in text and "L[" not in text and "G[" not in text


def test_a_value_of_another_type_is_named_with_both_types_given_the_frame() -> None:
    # 2.0 == 2, yet the capture specialized on the int: "is not 2" would read as false.
    text = guard_failure_text("L['cfg'][1] == 2  # x * cfg[1]  # m.py:3 in fn", {"cfg": [0, 2.0]})
    assert text.startswith("`cfg[1]` is the float 2.0; the capture saw the int 2"), text
    # Without the frame (the language server's findings), the words stay as they were.
    assert guard_failure_text("L['n'] == 2") == "`n` is not 2, the value the capture specialized on"


def test_a_modules_table_of_another_type_is_named_as_the_table() -> None:
    """A TYPE_MATCH on ``model._modules`` names the table and what replaced it, not
    ``model`` (``user_path`` drops a bare table), with the fix that keeps its order."""
    from collections import OrderedDict

    from torch import nn

    model = nn.Sequential(nn.Linear(2, 2))
    model._modules = OrderedDict(model._modules)
    raw = "___check_type_id(L['model']._modules, 1234), type=<class 'dict'>  # y  # m.py:3 in f"
    text = guard_failure_text(raw, {"model": model})
    assert text.startswith(
        "`model._modules` (the dict of `model`'s submodules) was replaced by an OrderedDict, "
        "where the capture saw a plain dict"
    ), text
    assert "`model._modules = dict(model._modules)` keeps its order" in text, text
    assert text.endswith("(read at m.py:3 in `f`)"), text
    nested = "___check_type_id(L['model']._modules['fc']._buffers, 1234), type=<class 'dict'>"
    assert guard_failure_text(nested).startswith(
        "`model.fc._buffers` (the dict of `model.fc`'s buffers) was replaced by another type"
    )
