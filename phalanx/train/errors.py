"""The one error type phalanx.train raises for input a user can fix."""

from __future__ import annotations


class TrainConfigError(ValueError):
    """A parallel layout, flag, environment or checkpoint that cannot work, and why."""
