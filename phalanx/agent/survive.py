"""Loops that outlive an unexpected exception: log it with its traceback, count it, go on."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("phalanx.agent")


class Survivals:
    """Counts the exceptions the agent's loops (reconcile, heartbeat, health) caught and
    survived, by loop; the agent's /healthz answers the total (`loop_errors`). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def record(self, loop: str, what: str, *, quiet: bool = False) -> None:
        """Call from an `except` block: logs the exception being handled, with traceback
        (`quiet`: counts it only, for a failure the caller already reported)."""
        with self._lock:
            self._counts[loop] = self._counts.get(loop, 0) + 1
            n = self._counts[loop]
        if not quiet:
            log.exception("%s loop: unexpected error %s (#%d here); carrying on", loop, what, n)

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
