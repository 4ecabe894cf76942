"""The artifact-side refusal every emitted runtime raises through, and the one way an
artifact reaches the user's modules (``import_user_module``: imported, or refused in one
set of words for both tracers).

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


def import_user_module(name: str) -> Any:
    """The module an artifact's code came from, as this process has it (imported if it is
    not yet), or a refusal naming it: its code and globals cannot be served or checked
    without it. A script's ``__main__`` is refused here (another process's ``__main__`` is
    another script); a runtime that recorded the script's path tells its own ``__main__``
    apart before asking (``single_graph_checks.live_module``)."""
    import importlib
    import sys

    if name == "__main__":
        refuse(
            "precompile: this artifact was captured from code in a script's __main__ "
            "module, which no other process can import. Move that code into an importable "
            "module",
            3,
        )
    module = sys.modules.get(name)
    if module is not None:
        return module
    try:
        return importlib.import_module(name)
    except Exception as error:
        refuse(
            f"precompile: this artifact was traced through module {name!r}, which is not "
            f"importable here ({type(error).__name__}: {error}), so its code and globals "
            f"cannot be served or checked. Make it importable (sys.path, installed "
            f"packages), or capture again in this environment",
            3,
        )
