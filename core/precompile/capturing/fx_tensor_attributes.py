"""Reads of a tensor's Python attributes, which a make_fx trace's stand-ins lack.

A make_fx trace runs fn on fake tensors standing in for the parameters, buffers and
inputs. A Python attribute set on a real one (``weight.scale = 2.0``, a quantizer's
state) is not on its stand-in: ``getattr(weight, "scale", 1.0)`` took the default in
the trace, and the artifact computed with 1.0 where eager computes with 2.0, on every
call; a plain read raised an AttributeError about a fake tensor. ``watching_reads``
notes each lookup of such a name on a stand-in (the stand-in's class gets a
``__getattr__`` for the trace's length: Python calls it only after the normal lookup
failed), so the capture refuses it in words that name the tensor and the attribute.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, NoReturn

import torch

from precompile._compat.patching import patched
from precompile.errors import PrecompileError


@contextlib.contextmanager
def watching_reads(
    pairs: list[tuple[str, torch.Tensor, torch.Tensor]], reads: list[str]
) -> Iterator[None]:
    """For (label, real tensor, its stand-in) ``pairs``: append to ``reads`` each read in
    the block of a Python attribute a real tensor has and its stand-in lacks, as
    ``'name' of label`` (a plain read also raises, as it would have)."""
    watched = {
        id(stand): (label, frozenset(python_attributes(real)))
        for label, real, stand in pairs
        if python_attributes(real)
    }
    if not watched:
        yield
        return

    def missing(self: Any, name: str) -> NoReturn:
        entry = watched.get(id(self))
        if entry is not None and name in entry[1]:
            reads.append(f"{name!r} of {entry[0]}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    kinds = {type(stand) for _, _, stand in pairs if id(stand) in watched}
    with contextlib.ExitStack() as stack:
        for kind in kinds:
            stack.enter_context(patched(kind, "__getattr__", missing))
        yield


def refusal(reads: list[str]) -> PrecompileError:
    """The refusal of the first of ``reads``."""
    return PrecompileError(
        f"fn reads the Python attribute {reads[0]}, which the trace's stand-in for that "
        f"tensor does not have (make_fx traces fake tensors without the attributes set "
        f"on the real ones): the trace took another path than eager",
        invariant=1,
        hint="keep the value on the module (an attribute or a registered buffer) rather "
        "than on the tensor",
    )


def python_attributes(tensor: torch.Tensor) -> dict[str, Any]:
    """A tensor's Python attributes: its instance dict, read without its class's
    attribute lookup (the one place the capture reads it)."""
    attrs: dict[str, Any] = object.__getattribute__(tensor, "__dict__")
    return attrs
