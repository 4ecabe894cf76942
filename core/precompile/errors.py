"""The error and warning types every part of precompile raises.

This module imports nothing from torch: emitted artifacts import it lazily, only at the
moment they raise, and the language server builds findings from these fields without ever
loading torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Location:
    """A place in user source: 1-based line, 0-based column in Unicode code points.

    Code points, not CPython's UTF-8 byte offsets, because every consumer (LSP, SARIF, a
    terminal) converts from code points, and a byte offset on a line holding non-ASCII
    text would point at the wrong character.
    """

    file: str
    line: int
    column: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column + 1}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class PrecompileError(RuntimeError):
    """A capture, load or call that precompile refuses, with the reason and the fix.

    The structured fields let an editor place the error: ``invariant`` is the number of
    the programming-model invariant that was broken (docs/programming-model.md), or None;
    ``location`` is the user line at fault when known; ``hint`` says what to do;
    ``details`` keeps raw material (what torch said, long lists) out of the message, for
    whoever wants it (an editor's hover, ``--format json``).
    """

    def __init__(
        self,
        message: str,
        *,
        invariant: int | None = None,
        location: Location | None = None,
        hint: str | None = None,
        details: str | None = None,
    ) -> None:
        self.message = message
        self.invariant = invariant
        self.location = location
        self.hint = hint
        self.details = details
        super().__init__(self._render())

    def _render(self) -> str:
        text = self.message
        if self.invariant is not None and f"invariant {self.invariant}" not in text:
            text = f"{text} (invariant {self.invariant})"
        if self.hint:
            text = f"{text}\n  hint: {self.hint}"
        if self.location is not None:
            text = f"{text}\n  at {self.location}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "message": self.message,
            "invariant": self.invariant,
            "location": None if self.location is None else self.location.to_dict(),
            "hint": self.hint,
            "details": self.details,
        }


class SignatureError(PrecompileError):
    """A load or verify with trusted keys refused the pair: it is not signed, it is signed
    by a key that is not trusted, or a file changed since it was signed.

    Its own type so a deployment can tell "not authentic" from every other refusal.
    """


class ArtifactWriteError(PrecompileError):
    """Writing files failed (a full disk, a read-only folder): the previous files are as
    they were. Its own type so a tool can tell a failed write from a refused capture."""


class ArtifactTrustWarning(UserWarning):
    """Emitted by every load that did not verify a signature: both files of the pair are
    code (python_code is executed; the cache's compiled kernels are loaded as native
    code), so they are trusted input, like a pickle.

    Its own category so a deployment that vets its artifacts can silence exactly this
    warning and nothing else; a load with ``trusted_keys`` that verifies does not warn.
    """


class CacheFallbackWarning(UserWarning):
    """The cache could not be used; the artifact runs from its python_code alone.

    Results are identical either way; only load time differs.
    """


class EagerFallbackWarning(UserWarning):
    """A frame Dynamo gave up on during capture missed its variants and ran eagerly."""


class ServingFallbackWarning(EagerFallbackWarning):
    """A call the loaded artifact refused ran ``load(..., fallback=fn)`` instead: warned
    once per refusal reason (``runnable.stats()`` counts every one).

    A subclass of EagerFallbackWarning, so a filter on that catches both ways a call runs
    eagerly; its own class, so a service can single out production fallbacks.
    """


class InferenceGradWarning(UserWarning):
    """An inference artifact (captured with ``training=False``) was called with grad mode
    on while a parameter or input it reads requires grad: its outputs carry no gradient,
    where eager's would. Warned once per loaded artifact, at the first such call.

    Serving code often calls a model with grad on without needing gradients, so this is
    a warning, not a refusal; its own category so such code can filter it (or call under
    ``torch.no_grad()``), and code that trains through the outputs learns to capture
    with ``training=True`` instead of losing gradients silently.
    """


class LayoutCopyWarning(UserWarning):
    """A call passed an input in another memory layout (strides) than the one the
    artifact's Inductor kernels were compiled for -- transposed, expanded, channels_last
    where the capture's was contiguous -- and was served through a copy in the captured
    layout: exact, but a copy of that input on each such call. Warned once per loaded
    artifact; its own category so serving code can filter it or turn it into an error.
    """


class RiskyGuardWarning(UserWarning):
    """The artifact dropped guards that decide which captured variant runs (warned when
    ``DynamoTracer(require_no_risky_drops=False)`` accepts them)."""


def generator_input_refusal(what: str, location: Location | None) -> PrecompileError:
    """The capture refusal of a ``torch.Generator`` passed to fn, in the same words for
    both tracers: a generator's state is process state no graph input carries, so an
    artifact could neither replay draws from it nor check it per call."""
    return PrecompileError(
        f"{what} is a torch.Generator; an artifact can neither carry a generator's state "
        f"nor check it per call, so draws from it could not be served as eager makes them",
        invariant=3,
        location=location,
        hint="draw the random tensor outside fn with the generator and pass it as an "
        "input, or seed torch's default generator (torch.manual_seed) outside fn and draw "
        "from it inside",
    )
