"""The guard audit: which guards the serialized copy could not keep, and which of those
drops could change which code runs.

A *slot* is one guard (by its access path and type) of one frame, across the captured
variants. A drop is **risky** when it can change dispatch: the slot's value differed
between captured variants (so it decided which variant ran), or the user's
``guard_filter_fn`` dropped it beyond the default (which drops only identity guards that
cannot be serialized). A kept guard that pins a value the capture saw -- an int or bool
argument, a value crossing a graph break -- is reported as *won't generalize*: the
artifact serves that value only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from precompile.capturing.dynamo_frames import FrameRecord, GuardDecision
from precompile.runtime.guard_text import frame_label, user_path

#: Guard types whose checks carry shapes; listed first among risky drops.
_SHAPE_TYPES = ("TENSOR_MATCH", "SHAPE_ENV", "SIZE_MATCH", "DYNAMIC_INDICES", "LENGTH_CHECK")
#: Guard types that pin a value.
_VALUE_TYPES = ("CONSTANT_MATCH", "EQUALS_MATCH")


@dataclasses.dataclass
class Slot:
    frame: str
    name: str
    guard_type: str
    decisions: list[GuardDecision]
    #: Where the frame starts (for a continuation: the line of the break it resumes
    #: after), how many variants it has, and whether it is a continuation.
    file: str = ""
    line: int = 0
    variants: int = 0
    continuation: bool = False

    @property
    def path(self) -> str:
        return user_path(self.name)

    @property
    def dropped_by(self) -> str | None:
        return next((d.dropped_by for d in self.decisions if not d.kept), None)

    @property
    def values_differ(self) -> bool:
        keys = {d.compare_key for d in self.decisions}
        return len(self.decisions) > 1 and len(keys) > 1

    def describe(self) -> str:
        values = sorted({d.value for d in self.decisions if d.value is not None})
        shown = f" (values {', '.join(values[:4])})" if values else ""
        return f"{frame_label(self.frame)}: {self.guard_type} {self.path}{shown}"


@dataclasses.dataclass
class GuardAudit:
    dropped: list[Slot]
    risky: list[tuple[Slot, str]]
    pinned: list[Slot]
    unpicklable: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "dropped": [
                {"frame": s.frame, "guard": f"{s.guard_type} {s.path}", "by": s.dropped_by}
                for s in self.dropped
            ],
            "risky": [{"guard": s.describe(), "why": why} for s, why in self.risky],
            "wont_generalize": [s.describe() for s in self.pinned],
            "pinned": [
                {
                    "frame": s.frame,
                    "path": s.path,
                    "values": sorted({d.value for d in s.decisions if d.value is not None}),
                    "file": s.file,
                    "line": s.line,
                    "continuation": s.continuation,
                }
                for s in self.pinned
            ],
            "unpicklable": list(self.unpicklable),
        }


def audit(frames: list[FrameRecord]) -> GuardAudit:
    slots: dict[tuple[str, str, str], Slot] = {}
    for frame in frames:
        file, line = frame.code.co_filename, frame.code.co_firstlineno
        variants = len(frame.guards)
        continuation = not frame.is_entry and bool(frame.resume_names)
        for decisions in frame.guards:
            for d in decisions:
                key = (frame.name, d.name, d.guard_type)
                slot = slots.setdefault(
                    key,
                    Slot(
                        frame.name,
                        d.name,
                        d.guard_type,
                        [],
                        file=file,
                        line=line,
                        variants=variants,
                        continuation=continuation,
                    ),
                )
                slot.decisions.append(d)
    dropped = [s for s in slots.values() if s.dropped_by not in (None, "driver")]
    risky = []
    for slot in dropped:
        if slot.dropped_by == "user":
            risky.append((slot, "your guard_filter_fn dropped it beyond the default"))
        elif slot.values_differ:
            risky.append(
                (slot, "its value differed between captured variants, so it decided dispatch")
            )
    risky.sort(
        key=lambda item: (item[0].guard_type not in _SHAPE_TYPES, item[0].frame, item[0].name)
    )
    # Pinned: every variant of the frame guards the value (a variant without the guard,
    # such as an automatically dynamic one, serves other values).
    pinned = [
        s
        for s in slots.values()
        if s.guard_type in _VALUE_TYPES
        and len(s.decisions) == s.variants
        and all(d.kept for d in s.decisions)
        and (s.path.startswith("___stack") or ("." not in s.path and "[" not in s.path))
        and any(d.value not in (None, "None") for d in s.decisions)
    ]
    unpicklable = sorted(
        {user_path(d.name) for s in slots.values() for d in s.decisions if d.unpicklable}
    )
    return GuardAudit(dropped=dropped, risky=risky, pinned=pinned, unpicklable=unpicklable)
