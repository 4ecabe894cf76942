"""Log records the server drops before they reach the editor's output channel.

pygls warns 'Cancel notification for unknown message id' whenever a client cancels a
request the server has already answered. VS Code does that all the time (a hover or a
code action request superseded by the next keystroke), so the warning filled the user's
output channel while reporting nothing wrong. Only that record is dropped.
"""

from __future__ import annotations

import logging

_PYGLS_RPC = "pygls.protocol.json_rpc"
_ANSWERED_CANCEL = "Cancel notification for unknown message id"


class DropAnsweredCancels(logging.Filter):
    """Drops pygls's warning about a cancel for a request that is no longer pending."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_ANSWERED_CANCEL)


def quiet_answered_cancels() -> None:
    """Install the filter on pygls's JSON-RPC logger (once, however often called)."""
    logger = logging.getLogger(_PYGLS_RPC)
    if not any(isinstance(f, DropAnsweredCancels) for f in logger.filters):
        logger.addFilter(DropAnsweredCancels())
