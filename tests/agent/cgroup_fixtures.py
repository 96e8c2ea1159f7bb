"""Real cgroups for tests: a parent cgroup unique to the test, removed (emptied) afterwards."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.agent import cgroups


def cgroup_parent_dirs(parent: str) -> list[Path]:
    """Every directory named `parent` that agents of this test may have made (v1: one
    per controller under the caller's own cgroup; v2: under the root)."""
    own = cgroups._thread_cgroups(os.getpid())
    found = [d / parent for d in own.values()] + [cgroups.CGROUP_FS / parent]
    return [d for d in found if d.is_dir()]


def remove_tree(parent: str) -> None:
    """Kill what is left in the test's cgroups and delete them, deepest first."""
    for top in cgroup_parent_dirs(parent):
        for d in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if d.is_dir():
                cgroups.kill_all([d], timeout_s=2.0)
                d.rmdir()
        cgroups.kill_all([top], timeout_s=2.0)
        top.rmdir()


@pytest.fixture
def cgroup_parent() -> Iterator[str]:
    """A parent cgroup name for this test (skipped where cgroups cannot be used)."""
    parent = f"phalanx-test-{uuid.uuid4().hex[:8]}"
    probe = cgroups.setup("probe", Path("/nonexistent"), parent=parent)
    try:
        if not probe.enabled:
            pytest.skip(f"no usable cgroups here: {probe.describe}")
        yield parent
    finally:
        probe.close()
        remove_tree(parent)
