"""The records a Dynamo capture keeps of what it compiled: one ``FrameRecord`` per code
object Dynamo compiled, the ``GuardDecision`` of each guard of each variant, and the
``GraphBreak`` sites, with the pure functions that read them (how the artifact serves
them, which sources they ran, the guards summary of the report).

Each frame is a code object Dynamo compiled: the entry, every graph-break continuation
(reached from the frame ahead of it by a resume name), and -- for installed serving,
part 2 -- functions the entry calls. A frame's variants are (serialized guards,
transformed bytecode) pairs, one per recompile.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Sequence
from typing import Any

import torch

from precompile._compat import dynamo
from precompile.capturing.function_records import function_records
from precompile.errors import Location
from precompile.locations import StackFrame, codepoint_column, innermost, is_user_file


@dataclasses.dataclass
class GraphBreak:
    """One graph-break site: Dynamo logs a break once per compile that meets it; we keep
    one record per (break type, innermost user location)."""

    gb_type: str
    gb_id: str | None
    doc_link: str | None
    explanation: str
    hints: list[str]
    frame: str
    user_stack: list[StackFrame]
    count: int = 1

    @property
    def location(self) -> Location | None:
        return innermost(self.user_stack)

    def to_dict(self) -> dict[str, Any]:
        location = self.location
        return {
            "reason": self.gb_type,
            "gb_id": self.gb_id,
            "doc_link": self.doc_link,
            "explanation": self.explanation,
            "hints": self.hints,
            "frame": self.frame,
            "location": None if location is None else location.to_dict(),
            "user_stack": [f.to_dict() for f in self.user_stack],
            "count": self.count,
        }


@dataclasses.dataclass
class GuardDecision:
    """What happened to one guard of one variant when it was serialized.

    ``compare_key`` tells whether two variants guarded the same value (identity for the
    identity guards); ``unpicklable`` marks a kept guard whose value cannot be serialized.
    Neither leaves the capturing process.
    """

    name: str
    guard_type: str
    kept: bool
    dropped_by: str | None  # "default" (identity guard), "driver" (global state or
    # torch's global module hooks, which the driver checks itself), "user"
    value: str | None
    compare_key: Any = None
    unpicklable: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("name", "guard_type", "kept", "dropped_by", "value")}


@dataclasses.dataclass
class FrameRecord:
    """A compiled code object and everything serving it needs (see module docstring)."""

    code: types.CodeType
    python_module: str
    is_entry: bool
    resume_names: list[str]
    import_sources: dict[str, str]
    variants: list[tuple[bytes, Any]]  # (guards_state, SerializedCode of the bytecode)
    backend_ids: list[str]
    code_source: str | None
    bypassed: bool
    bypass_reason: str | None
    eager_fallback: bool
    eager_reason: str | None
    trivial: bool
    truncated: bool
    guards: list[list[GuardDecision]]
    #: Every global Dynamo bound into the frame's module while compiling it.
    installed_globals: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Per variant, the dicts its guards name keys of by position
    #: (``_compat.dict_keys.positional_dicts``), for the load to name them by key.
    dict_keys: list[list[dict[str, Any]]] = dataclasses.field(default_factory=list)
    #: Per variant, why stride guards stay (``[path or None, why]``: a layout query its
    #: Python made, an input Inductor cannot take as a copy; ``_compat.dynamo.
    #: relaxing_unread_strides``), and why a library value's guard stays (``[path,
    #: why]``: ``_compat.dynamo_guard_relaxing.relaxing_neutral_guards``).
    layout_notes: list[list[list[str | None]]] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return self.code.co_name

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "file": self.code.co_filename,
            "line": self.code.co_firstlineno,
            "module": self.python_module,
            "entry": self.is_entry,
            "variants": len(self.variants),
            "resume_names": list(self.resume_names),
            "bypassed": self.bypassed,
            "bypass_reason": self.bypass_reason,
            "eager_fallback": self.eager_fallback,
            "eager_reason": self.eager_reason,
            "trivial": self.trivial,
            "truncated": self.truncated,
            "reached_by_call": self.code_source is not None,
        }


def describe_value(value: Any) -> str:
    """A guarded value, described without process-specific details (no addresses)."""
    if isinstance(value, (type(None), bool, int, float, str)):
        return repr(value)[:200]
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)} {value.dtype}"
    return type(value).__qualname__


def compare_key(value: Any) -> Any:
    """Equal for the same guarded value in two variants: literals by value, tensors by
    metadata, anything else by identity (what an identity guard compares)."""
    if isinstance(value, (type(None), bool, int, float, str)):
        return (type(value), value)
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype, value.device)
    return ("id", id(value))


def picklable(value: Any) -> bool:
    """Whether a guarded value can go into an artifact; used to name the access path when
    Dynamo's own guard pickler refuses one."""
    import pickle

    if isinstance(value, (type(None), bool, int, float, str, torch.Tensor, torch.nn.Module)):
        return True
    if isinstance(value, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)):
        return True  # Dynamo's guard pickler saves these by reference
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


def gave_up_reason(message: str) -> str:
    """The break that made Dynamo give up on a frame: the last one in a chained message,
    as 'type: explanation'."""
    last = message.split("another graph break occurred: ***")[-1]
    lines = [line.strip() for line in last.strip().splitlines() if line.strip()]
    explanation = next(
        (t.removeprefix("Explanation:").strip() for t in lines if t.startswith("Explanation:")), ""
    )
    return f"{lines[0]}: {explanation}" if lines and explanation else (lines[0] if lines else "")


def _explanation_and_hints(message: str) -> tuple[str, list[str]]:
    explanation, hints = "", []
    for line in message.splitlines():
        text = line.strip()
        if text.startswith("Explanation:"):
            explanation = text.removeprefix("Explanation:").strip()
        elif text.startswith("Hint:"):
            hints.append(text.removeprefix("Hint:").strip())
        elif text.startswith("*** While handling this graph break"):
            break
    return explanation, hints


def _user_stack(summaries: list[Any]) -> list[StackFrame]:
    frames = []
    for s in summaries:
        if not is_user_file(s.filename):
            continue
        column = codepoint_column(s.filename, s.lineno, getattr(s, "colno", None))
        frames.append(StackFrame(s.filename, s.lineno, column, s.name))
    return frames


def dedupe_breaks(events: list[dict[str, Any]]) -> list[GraphBreak]:
    breaks: dict[tuple[Any, ...], GraphBreak] = {}
    for event in events:
        gb_type = event["gb_type"] or event["message"].splitlines()[0]
        stack = _user_stack(event["stack"])
        where = innermost(stack)
        key = (gb_type, None if where is None else (where.file, where.line, where.column))
        if key in breaks:
            breaks[key].count += 1
            continue
        gb_id, link = dynamo.graph_break_link(gb_type)
        explanation, hints = _explanation_and_hints(event["message"])
        breaks[key] = GraphBreak(
            gb_type=gb_type,
            gb_id=gb_id,
            doc_link=link,
            explanation=explanation,
            hints=hints,
            frame=event["code"].co_name,
            user_stack=stack,
        )
    return list(breaks.values())


def serving_mode(frames: list[FrameRecord]) -> tuple[str, str | None]:
    """Standalone when every compiled frame is the entry or a continuation reached by a
    resume name; installed otherwise (a frame reached by an ordinary call)."""
    called = [f for f in frames if not f.is_entry and f.code_source is not None and f.variants]
    if called:
        names = ", ".join(f"{f.name} ({f.python_module})" for f in called)
        return "installed", f"frames reached by an ordinary call, not a resume name: {names}"
    return "standalone", None


def function_sources(
    fn: types.FunctionType,
    frames: list[FrameRecord],
    artifact_path: str,
    traced: Sequence[types.CodeType] = (),
) -> list[dict[str, Any]]:
    """Function-level digests of the traced source: the entry, every frame's code and
    every function Dynamo inlined into a graph (``traced``: a model's ``forward``,
    helpers, hooks), so a load can refuse a changed function by name and an editor can
    tell a stale artifact from an edit elsewhere in the same file
    (``precompile.runtime.source_digest``)."""
    codes = [fn.__code__, *(frame.code for frame in frames), *traced]
    return function_records(
        [c for c in codes if not c.co_name.startswith("torch_dynamo_resume_in")], artifact_path
    )


def inlined_source_files(package: Any) -> list[str]:
    files = set()
    for source in package.cache_entry().source_info.inlined_sources:
        module = sys.modules.get(source.module)
        path = getattr(module, "__file__", None)
        if path and is_user_file(path):
            files.add(path)
    return sorted(files)


def guards_summary(frames: list[FrameRecord]) -> list[dict[str, Any]]:
    """Per frame and variant, which guards the serialized copy kept and which it dropped
    (and who dropped them: the default filter, the driver, or the user's filter)."""
    rows = []
    for frame in frames:
        for index, decisions in enumerate(frame.guards):
            rows.append(
                {
                    "frame": frame.name,
                    "variant": index,
                    "kept": [f"{d.guard_type} {d.name}" for d in decisions if d.kept],
                    "dropped": [
                        {"guard": f"{d.guard_type} {d.name}", "by": d.dropped_by, "value": d.value}
                        for d in decisions
                        if not d.kept
                    ],
                }
            )
    return rows
