"""The artifact-side refusal every emitted runtime raises through.

Carried by every artifact (``capturing.carried``) before the runtime modules that call
``refuse``, which declare it under ``TYPE_CHECKING``. An artifact that runs where the
precompile package is importable raises ``precompile.PrecompileError`` itself, so a
handler written against the package's class catches it; elsewhere it raises this
module's stand-in of the same name and fields.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn


class PrecompileError(RuntimeError):
    """Raised by an artifact running where the precompile package is not importable.

    Same name and fields as ``precompile.PrecompileError``, so handlers written against
    the name keep working; where the package is importable that class is raised instead.
    """

    def __init__(
        self,
        message: str,
        *,
        invariant: int | None = None,
        location: Any = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.invariant = invariant
        self.location = location
        self.hint = hint
        suffix = "" if invariant is None else f" (invariant {invariant})"
        super().__init__(message + suffix)


def refuse(message: str, invariant: int | None = None) -> NoReturn:
    # Imported at the moment of failure only, so a normal call never touches the
    # package and an artifact runs where it is not installed.
    error_type: Callable[..., Exception]
    try:
        from precompile.errors import PrecompileError as packaged_error

        error_type = packaged_error
    except ImportError:
        error_type = PrecompileError
    raise error_type(message, invariant=invariant) from None
