"""Serving in production: the fallback, the counters, the serving log and shadow checks.

``precompile.load(..., fallback=fn, serving_log=PATH, shadow=RATE)`` wraps every call of
a loaded artifact in a :class:`Serving`. A call the artifact refuses (PrecompileError)
runs ``fallback`` instead -- warned once per reason, counted always -- unless part of the
call already ran before the refusal (a Dynamo continuation refused after the entry's
graph updated a BatchNorm buffer): running the fallback then would apply those effects a
second time, so that refusal is raised, with a sentence saying why. The drivers say so
by setting ``ran_before_refusal`` on the error.

Counters cost a served call one ``next()`` on an ``itertools.count`` (atomic under the
GIL, no lock); everything else -- the per-reason tables, the input signatures, the log --
is paid on the refusal path or by a once-per-process flusher thread.

This module imports no torch at import time (``import precompile`` stays light): the
tensor checks read ``torch`` from ``sys.modules``, which a call that reached here has
imported.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import random
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from precompile.errors import PrecompileError, ServingFallbackWarning
from precompile.serving_log import (
    FLUSH_INTERVAL_S,
    LOG_FORMAT,
    LOG_VERSION,
    LogWriter,
    register_for_flush,
)

#: Distinct input signatures kept per reason (and shadow mismatches per record).
MAX_SIGNATURES = 8
#: Reasons kept per runnable; later ones are counted under OTHER_REASON.
MAX_REASONS = 64
OTHER_REASON = "(other refusal reasons, over the limit of distinct reasons)"
#: A reason is the refusal's first line, cut to this many characters.
MAX_REASON_CHARS = 500
#: The environment variable that turns the serving log on for every load.
LOG_ENV = "PRECOMPILE_SERVING_LOG"


def _count_value(counter: itertools.count[int]) -> int:
    """How many times ``next(counter)`` ran: the count's next value (it starts at 0)."""
    return int(repr(counter)[6:-1])


def reason_of(error: BaseException) -> str:
    """The refusal's first line: the first failing check in the user's words."""
    text = getattr(error, "message", None) or str(error)
    line = str(text).strip().splitlines()[0] if str(text).strip() else type(error).__name__
    return line[:MAX_REASON_CHARS]


def _strides_class(t: Any, torch: Any) -> str:
    try:
        if t.is_contiguous():
            return "contiguous"
        if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
            return "channels_last"
        if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
            return "channels_last_3d"
    except Exception:
        pass
    return "other"


def _leaf(value: Any, torch: Any) -> str:
    if torch is not None and isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        shape = ",".join(str(int(s)) for s in value.shape)
        return f"{dtype}[{shape}] {value.device} {_strides_class(value, torch)}"
    return type(value).__name__


def signature_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The call's input signature: per tensor its dtype, shape, device and strides class,
    per other leaf its type name, through lists, tuples and dicts. Never a value (a dict's
    keys are shown only when they are strings: they are the structure's field names)."""
    torch = sys.modules.get("torch")

    def walk(value: Any, depth: int) -> str:
        if depth > 4:
            return "..."
        if isinstance(value, (list, tuple)) and (
            torch is None or not isinstance(value, torch.Size)
        ):
            inner = ", ".join(walk(v, depth + 1) for v in list(value)[:16])
            more = ", ..." if len(value) > 16 else ""
            return f"[{inner}{more}]" if isinstance(value, list) else f"({inner}{more})"
        if isinstance(value, dict):
            items = list(value.items())[:16]
            inner = ", ".join(
                f"{k if isinstance(k, str) else type(k).__name__}: {walk(v, depth + 1)}"
                for k, v in items
            )
            return "{" + inner + (", ..." if len(value) > 16 else "") + "}"
        return _leaf(value, torch)

    parts = [walk(a, 0) for a in args]
    parts += [f"{k}={walk(v, 0)}" for k, v in kwargs.items()]
    return ", ".join(parts)


class _Reason:
    __slots__ = ("fallback", "partial", "refused", "signatures")

    def __init__(self) -> None:
        self.refused = 0
        self.fallback = 0
        self.partial = 0
        self.signatures: list[str] = []

    def note(self, signature: str) -> None:
        if signature not in self.signatures and len(self.signatures) < MAX_SIGNATURES:
            self.signatures.append(signature)


class Serving:
    """Per loaded artifact: the fallback policy, the counters, the log and the shadow.

    Counting semantics (each call counts exactly once): ``served`` -- the artifact
    answered; ``fallback`` -- it refused and the fallback answered; ``refused`` -- it
    refused and the caller got the PrecompileError (no fallback, or part of the call had
    run). Per reason, ``refused``/``fallback`` split the same way.
    """

    def __init__(
        self,
        forward: Callable[..., Any],
        *,
        code_hash: str,
        target: str,
        fallback: Callable[..., Any] | None = None,
        serving_log: str | None = None,
        shadow: float = 0.0,
        shadow_strict: bool = False,
        shadow_seed: int | None = None,
    ) -> None:
        self._forward = forward
        # The same call taking (args, kwargs) as one tuple and one dict, where the
        # artifact offers it (single-graph artifacts): the loaded runnable's
        # ``__call__`` serves through it as ``serve`` does, without packing them again.
        self.packed_forward: Callable[[tuple[Any, ...], dict[str, Any]], Any] | None = getattr(
            forward, "packed", None
        )
        self.code_hash = code_hash
        self.target = target
        self._fallback = fallback
        self.served_counter = itertools.count()
        self._lock = threading.Lock()
        self._refused = 0
        self._fallbacks = 0
        self._reasons: dict[str, _Reason] = {}
        self._warned: set[str] = set()
        self.shadow_rate = shadow
        self._shadow_strict = shadow_strict
        self._random = random.Random(shadow_seed)
        self._shadow_runs = 0
        self._shadow_skipped = 0
        self._mismatches: list[dict[str, str]] = []
        self._mismatch_count = 0
        self._log = LogWriter.for_path(serving_log) if serving_log else None
        self._flushed = _Snapshot()
        self._last_flush = time.monotonic()
        self.session = f"{os.getpid()}-{id(self):x}-{int(time.time() * 1000)}"
        if self._log is not None:
            register_for_flush(self)

    # -- the call ------------------------------------------------------------------------

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Serve one call, sampled for a shadow check at ``shadow_rate``."""
        if self.shadow_rate and self._random.random() < self.shadow_rate:
            return self._shadow_call(args, kwargs)
        return self.serve(args, kwargs)

    def serve(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Serve one call: the artifact, or on its refusal the fallback (when allowed).
        A served call pays one counter step beside the artifact's own call."""
        try:
            result = self._forward(*args, **kwargs)
        except PrecompileError as error:
            return self.refused(error, args, kwargs)
        next(self.served_counter)
        return result

    def refused(self, error: PrecompileError, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Count the refusal; run the fallback when one is set and nothing of the call ran;
        otherwise raise."""
        partial = bool(getattr(error, "ran_before_refusal", False))
        use_fallback = self._fallback is not None and not partial
        reason = reason_of(error)
        signature = signature_of(args, kwargs)
        with self._lock:
            entry = self._reasons.get(reason)
            if entry is None:
                if len(self._reasons) >= MAX_REASONS:
                    reason = OTHER_REASON
                    entry = self._reasons.setdefault(reason, _Reason())
                else:
                    entry = self._reasons[reason] = _Reason()
            entry.note(signature)
            if use_fallback:
                entry.fallback += 1
                self._fallbacks += 1
            else:
                entry.refused += 1
                self._refused += 1
                if partial:
                    entry.partial += 1
            first = use_fallback and reason not in self._warned
            if first:
                self._warned.add(reason)
        self._maybe_flush()
        if not use_fallback:
            if partial and self._fallback is not None:
                raise PrecompileError(
                    f"{error.message} -- the artifact refused this call after part of it had "
                    f"already run (a graph or your code before a graph break, with whatever "
                    f"it wrote: buffers, inputs); running the fallback now would apply that "
                    f"a second time, so this call could not fall back",
                    invariant=error.invariant,
                    location=error.location,
                    hint=error.hint
                    or "capture the call shape this one has (add a call like it to the capture)",
                    details=error.details,
                ) from error
            raise error
        if first:
            warnings.warn(
                f"precompile: {self.target} fell back to its fallback for a call the artifact "
                f"refuses: {reason} (warned once per reason; runnable.stats() counts them all)",
                ServingFallbackWarning,
                stacklevel=4,
            )
        assert self._fallback is not None
        return self._fallback(*args, **kwargs)

    # -- shadow --------------------------------------------------------------------------

    def _shadow_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Serve the call, and run the fallback on deep copies of the arguments (taken
        before the artifact ran) from the same RNG state: the arguments' state is changed
        once, by the artifact, and the process's RNG stream is the served call's. The
        outputs and the arguments' state after each are compared."""
        torch = sys.modules.get("torch")
        try:
            copied = copy.deepcopy((args, kwargs))
        except Exception:
            copied = None
        rng = _rng_state(torch)
        try:
            result = self._forward(*args, **kwargs)
        except PrecompileError as error:
            return self.refused(error, args, kwargs)
        next(self.served_counter)
        if copied is None or self._fallback is None:
            with self._lock:
                self._shadow_skipped += 1
            return result
        after = _rng_state(torch)
        _set_rng_state(torch, rng)
        try:
            expected = self._fallback(*copied[0], **copied[1])
        finally:
            _set_rng_state(torch, after)
        problem = _difference((result, args, kwargs), (expected, *copied), torch)
        with self._lock:
            self._shadow_runs += 1
            if problem is not None:
                self._mismatch_count += 1
                signature = signature_of(args, kwargs)
                if len(self._mismatches) < MAX_SIGNATURES:
                    self._mismatches.append({"signature": signature, "detail": problem})
        if problem is not None:
            self._maybe_flush(force=True)
            if self._shadow_strict:
                raise PrecompileError(
                    f"precompile: a shadow check of {self.target} found the artifact's answer "
                    f"differs from the fallback's for this call ({signature}): {problem}",
                    hint="the artifact and the code it was captured from disagree; capture "
                    "again and report it if it persists",
                )
        return result

    # -- stats and the log ---------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The counters since load: a plain dict (JSON-ready)."""
        with self._lock:
            return self._stats_locked()

    def _stats_locked(self) -> dict[str, Any]:
        served = _count_value(self.served_counter)
        return {
            "calls": served + self._refused + self._fallbacks,
            "served": served,
            "refused": self._refused,
            "fallback": self._fallbacks,
            "reasons": [
                {
                    "reason": reason,
                    "count": r.refused + r.fallback,
                    "refused": r.refused,
                    "fallback": r.fallback,
                    "partial": r.partial,
                    "signatures": list(r.signatures),
                }
                for reason, r in self._reasons.items()
            ],
            "shadow": {
                "rate": self.shadow_rate,
                "runs": self._shadow_runs,
                "skipped": self._shadow_skipped,
                "mismatches": self._mismatch_count,
                "mismatch_signatures": [dict(m) for m in self._mismatches],
            },
        }

    def _maybe_flush(self, force: bool = False) -> None:
        if self._log is None:
            return
        now = time.monotonic()
        if force or now - self._last_flush >= FLUSH_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        """Write one record of what happened since the last one (nothing when nothing did)."""
        if self._log is None:
            return
        with self._lock:
            self._last_flush = time.monotonic()
            now = self._stats_locked()
            record = self._flushed.delta(now)
            if record is None:
                return
            self._flushed = _Snapshot(now)
        record.update(
            format=LOG_FORMAT,
            version=LOG_VERSION,
            code_hash=self.code_hash,
            target=self.target,
            pid=os.getpid(),
            session=self.session,
            time=round(time.time(), 3),
        )
        self._log.write(record)


class _Snapshot:
    """The cumulative stats at the last flush: a record carries the difference."""

    def __init__(self, stats: dict[str, Any] | None = None) -> None:
        self.stats = stats

    def delta(self, now: dict[str, Any]) -> dict[str, Any] | None:
        before = self.stats or {
            "served": 0,
            "refused": 0,
            "fallback": 0,
            "reasons": [],
            "shadow": {"runs": 0, "skipped": 0, "mismatches": 0, "mismatch_signatures": []},
        }
        old = {r["reason"]: r for r in before["reasons"]}
        reasons = []
        for r in now["reasons"]:
            o = old.get(r["reason"], {"count": 0, "refused": 0, "fallback": 0, "partial": 0})
            if r["count"] != o["count"]:
                reasons.append(
                    {
                        "reason": r["reason"],
                        "count": r["count"] - o["count"],
                        "refused": r["refused"] - o["refused"],
                        "fallback": r["fallback"] - o["fallback"],
                        "partial": r["partial"] - o["partial"],
                        "signatures": r["signatures"],
                    }
                )
        shadow_now, shadow_before = now["shadow"], before["shadow"]
        seen = {json.dumps(m, sort_keys=True) for m in shadow_before["mismatch_signatures"]}
        record = {
            "served": now["served"] - before["served"],
            "refused": now["refused"] - before["refused"],
            "fallback": now["fallback"] - before["fallback"],
            "reasons": reasons,
            "shadow_runs": shadow_now["runs"] - shadow_before["runs"],
            "shadow_mismatches": shadow_now["mismatches"] - shadow_before["mismatches"],
            "mismatches": [
                m
                for m in shadow_now["mismatch_signatures"]
                if json.dumps(m, sort_keys=True) not in seen
            ],
        }
        if not any(
            record[k] for k in ("served", "refused", "fallback", "shadow_runs", "shadow_mismatches")
        ):
            return None
        return record


def _rng_state(torch: Any) -> Any:
    if torch is None:
        return None
    cuda = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = torch.cuda.get_rng_state_all()
    return torch.get_rng_state(), cuda


def _set_rng_state(torch: Any, state: Any) -> None:
    if torch is None or state is None:
        return
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


def _difference(served: Any, expected: Any, torch: Any) -> str | None:
    """None when ``served`` matches ``expected`` within the default tolerance of each
    tensor's dtype (``torch.testing.assert_close``, as ``precompile check --verify``
    compares); else its first line. Modules compare by their state dicts."""
    if torch is None:
        return None if served == expected else "the outputs differ"

    def plain(value: Any) -> Any:
        if isinstance(value, torch.nn.Module):
            return {k: v.detach() for k, v in value.state_dict(keep_vars=True).items()}
        if isinstance(value, torch.Tensor):
            return value.detach()
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    try:
        torch.testing.assert_close(plain(served), plain(expected), equal_nan=True)
    except AssertionError as error:
        lines = [line for line in str(error).splitlines() if line.strip()]
        return " ".join(lines[:3])[:MAX_REASON_CHARS] or "the outputs differ"
    except Exception as error:  # a structure assert_close cannot compare
        return f"the outputs could not be compared: {type(error).__name__}: {error}"[
            :MAX_REASON_CHARS
        ]
    return None


def validate(
    fallback: Any, shadow: Any, shadow_strict: Any, serving_log: Any
) -> tuple[float, str | None]:
    """Check load's serving arguments; the shadow rate and the log path to use."""
    if fallback is not None and not callable(fallback):
        raise TypeError(
            f"precompile.load(fallback=...) must be callable (the eager function to run for "
            f"a call the artifact refuses); got {type(fallback).__name__} {fallback!r:.80}"
        )
    if isinstance(shadow, bool) or not isinstance(shadow, (int, float)):
        raise TypeError(f"precompile.load(shadow=...) must be a number in [0, 1]; got {shadow!r}")
    rate = float(shadow)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(
            f"precompile.load(shadow={shadow!r}): the sampled fraction of served calls must "
            f"be in [0, 1] (0.01 checks one call in a hundred)"
        )
    if rate and fallback is None:
        raise ValueError(
            "precompile.load(shadow=...) needs fallback=: a shadow check compares the "
            "artifact's answer with the fallback's; pass fallback=the eager function"
        )
    path = serving_log if serving_log is not None else os.environ.get(LOG_ENV) or None
    return rate, None if path is None else os.fspath(path)
