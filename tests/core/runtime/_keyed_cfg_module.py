"""A project config module whose own code reads its dict by key (``CFG["a"]``) while
another module reads the same dict through the module (``cfgmod.CFG``): the keyed rule
must not narrow a dict another traced code reaches whole
(test_dict_subclass_and_globals_reach)."""

from __future__ import annotations

CFG: dict[str, float] = {"a": 2.0, "z": 1.0}


def scale() -> float:
    return CFG["a"]
