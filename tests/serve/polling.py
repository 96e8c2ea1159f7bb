"""Waiting in the serving tests: tests/head/heads.py's `wait_for`, with the minute an
engine may need to become ready as its default."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from tests.head import heads

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0) -> T:
    """Poll `probe` until it returns something other than None or False; fail naming
    `what` after `timeout`."""
    return heads.wait_for(what, probe, timeout)
