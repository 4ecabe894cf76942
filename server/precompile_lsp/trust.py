"""The one trust gate: whether a workspace's programs may run.

Everything the engine does that would start a program of the workspace asks this gate
first: probing the interpreter ``[tool.precompile] python`` names (config.py), and
starting a worker with it or handing a worker a job, which imports the workspace's
modules and calls their ``examples()`` (workers.py). Callers above those two places hold
no check of their own, so a new feature that starts a program goes through the gate or
cannot start one.

In an untrusted workspace the gate refuses: settings that name programs are read (and
checked for what can be checked without running them) but not acted on, and what was
refused is remembered, so a client can tell the user once what trust would enable.
``Engine.trust()`` grants trust later and runs what was deferred: the interpreter's
probe and the captures.

A CLI command (``precompile check``, ``emit``, ``daemon``) is run by the user on the
command line, on the workspace they chose: that is trusting it, and its gate is open.
"""

from __future__ import annotations

from collections.abc import Callable


class TrustGate:
    """Whether the workspace's programs may run, and what waits for trust."""

    def __init__(self, trusted: bool = False) -> None:
        self._trusted = trusted is True
        #: What was refused, in order, without repeats ("run the interpreter ...").
        self.deferred: list[str] = []
        #: Told of each refusal (the engine passes it on to its client).
        self.on_refuse: Callable[[str], None] = lambda what: None

    @property
    def trusted(self) -> bool:
        return self._trusted

    def allows(self, what: str) -> bool:
        """Whether ``what`` -- a program of the workspace started, its code imported --
        may happen now. When not, it is remembered as deferred and ``on_refuse`` told.
        ``what`` completes "the workspace is not trusted, so it does not ..."."""
        if self._trusted:
            return True
        if what not in self.deferred:
            self.deferred.append(what)
        self.on_refuse(what)
        return False

    def grant(self) -> None:
        """Trust the workspace from now on (the caller runs what was deferred)."""
        self._trusted = True
        self.deferred.clear()
