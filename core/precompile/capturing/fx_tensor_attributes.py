"""Reads of a tensor's Python attributes, which a make_fx trace's stand-ins lack.

A make_fx trace runs fn on fake tensors standing in for the parameters, buffers and
inputs. A Python attribute set on a real one (``weight.scale = 2.0``, a quantizer's
state) is not on its stand-in: ``getattr(weight, "scale", 1.0)`` took the default in
the trace, and the artifact computed with 1.0 where eager computes with 2.0, on every
call; a plain read raised an AttributeError about a fake tensor. ``watching_reads``
notes each lookup of such a name on a stand-in (the stand-in's class gets a
``__getattr__`` for the trace's length: Python calls it only after the normal lookup
failed), so the capture refuses it in words that name the tensor and the attribute.
A read through the instance dict (``vars(weight).get("scale", 1.0)``,
``"scale" in weight.__dict__``) makes no attribute lookup: the stand-in's instance dict
is, for the trace's length, a dict that notes the reads project code makes of it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

import torch

from precompile._compat.patching import patched
from precompile.errors import PrecompileError
from precompile.locations import real_path


@contextlib.contextmanager
def watching_reads(
    pairs: list[tuple[str, torch.Tensor, torch.Tensor]], reads: list[str]
) -> Iterator[None]:
    """For (label, real tensor, its stand-in) ``pairs``: append to ``reads`` each read in
    the block of a Python attribute a real tensor has and its stand-in lacks, as
    ``the Python attribute 'name' of label`` (a plain read also raises, as it would
    have)."""
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
            reads.append(f"the Python attribute {name!r} of {entry[0]}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    kinds = {type(stand) for _, _, stand in pairs if id(stand) in watched}
    stands = {id(stand): stand for _, _, stand in pairs if id(stand) in watched}
    with contextlib.ExitStack() as stack:
        for kind in kinds:
            stack.enter_context(patched(kind, "__getattr__", missing))
        for key, stand in stands.items():
            label, names = watched[key]
            stack.enter_context(_watched_dict(stand, _ReadNoting(label, names, reads)))
        yield


@contextlib.contextmanager
def _watched_dict(stand: torch.Tensor, noting: _ReadNoting) -> Iterator[None]:
    """``stand``'s instance dict replaced by ``noting`` (holding what it held) for the
    block; a plain dict holding what ``noting`` then holds is put back."""
    noting.update(python_attributes(stand))
    object.__setattr__(stand, "__dict__", noting)
    try:
        yield
    finally:
        object.__setattr__(stand, "__dict__", dict(dict.items(noting)))


#: Where the code whose reads of a stand-in's instance dict are the trace's own lives:
#: torch (the fake tensor's bookkeeping) and this package (the argument watch).
_OWN_DIRS = tuple(
    real_path(os.path.dirname(path)) + os.sep
    for path in (torch.__file__, os.path.dirname(os.path.abspath(__file__)))
)


class _ReadNoting(dict[str, Any]):
    """A stand-in's instance dict that notes the reads made through it by any code but
    torch's and this package's (the user's, a library helper's, the standard library's
    on its behalf: a ``ChainMap``, a deep copy): a key the real tensor has (its
    stand-in answers otherwise), or the whole (its keys, length, items: the real
    tensor's differ). Attribute lookups read it through the C API, which no method here
    sees, as do C functions called on it directly (``dict.get(vars(w), k)``,
    ``str(vars(w))``)."""

    def __init__(self, label: str, names: frozenset[str], reads: list[str]) -> None:
        super().__init__()
        self.label, self.names, self.reads = label, names, reads

    def _note(self, key: object = None, *, whole: bool = False) -> None:
        if (whole or key in self.names) and not real_path(
            sys._getframe(2).f_code.co_filename
        ).startswith(_OWN_DIRS):
            what = "the instance dict" if whole else f"the Python attribute {key!r}"
            self.reads.append(f"{what} of {self.label} (read through vars() or __dict__)")

    def __getitem__(self, key: str) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self._note(key)
        return super().__contains__(key)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._note(key)
        return super().setdefault(key, default)

    def pop(self, key: str, *default: Any) -> Any:
        self._note(key)
        return super().pop(key, *default)

    def __iter__(self) -> Iterator[str]:
        self._note(whole=True)
        return super().__iter__()

    def __len__(self) -> int:
        self._note(whole=True)
        return super().__len__()

    def keys(self) -> Any:
        self._note(whole=True)
        return super().keys()

    def items(self) -> Any:
        self._note(whole=True)
        return super().items()

    def values(self) -> Any:
        self._note(whole=True)
        return super().values()

    def copy(self) -> dict[str, Any]:
        self._note(whole=True)
        return dict(super().items())


def refusal(reads: list[str]) -> PrecompileError:
    """The refusal of the first of ``reads``."""
    return PrecompileError(
        f"fn reads {reads[0]}: make_fx traces a fake stand-in for that tensor, without "
        f"the Python attributes set on the real one, so the trace took another path than "
        f"eager",
        invariant=1,
        hint="keep the value on the module (an attribute or a registered buffer) rather "
        "than on the tensor",
    )


def python_attributes(tensor: torch.Tensor) -> dict[str, Any]:
    """A tensor's Python attributes: its instance dict, read without its class's
    attribute lookup (the one place the capture reads it)."""
    attrs: dict[str, Any] = object.__getattribute__(tensor, "__dict__")
    return attrs
