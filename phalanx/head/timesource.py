"""Where the head reads the time: passed in (the control loop's `clock`), so its lifecycle
runs in tests on a fake clock (phalanx.testing.clock) exactly as on the real one."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Wall time (stored, shown, compared with agents' reports) and monotonic time (the
    control loop's ticks and its own pause detection), both in seconds."""

    def time(self) -> float: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The real clocks."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()
