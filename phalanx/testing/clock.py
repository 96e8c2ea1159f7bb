"""A clock tests move by hand (the head's `Clock`): wall and monotonic time advance together."""

from __future__ import annotations


class FakeClock:
    """Starts at `start` (wall seconds) and moves only when told."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.wall = start
        self.mono = 0.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self.wall += seconds
        self.mono += seconds
