"""The chaos suite's invariants hold with jobs running as two different Unix users: while
nodes crash, agents freeze, ranks die and the head restarts, nothing accepted is lost, no
job runs as two live copies, steps never go back past a checkpoint, no GPU is held twice —
and each job's processes ran as the user who submitted it."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import phalanx
from phalanx.testing.chaos import ChaosConfig, run_chaos

from .conftest import USERS


@pytest.fixture
def open_dir(unix_users: dict[str, pwd.struct_passwd]) -> Iterator[Path]:
    """A root-owned 0755 directory the test users may pass through (pytest's are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="phx-chaos-users-")).resolve()
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _python_runs_as(user: str) -> str | None:
    """Why `user` cannot run this Python (the job workload is Python), or None."""
    done = subprocess.run(
        ["runuser", "-u", user, "--", sys.executable, "-c", "import phalanx.testing.workload"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": "/"},
        cwd="/",
        check=False,
    )
    return None if done.returncode == 0 else done.stderr.strip()[-300:] or "no access"


@pytest.fixture
def python_for_users(unix_users: dict[str, pwd.struct_passwd]) -> Iterator[None]:
    """Let the test users reach this Python and this checkout: each folder above them that
    others may not pass through (e.g. /root, where pyenv lives) gets a traverse-only ACL
    entry for those users alone, removed afterwards (setfacl: Debian's acl, .ci/run)."""
    targets = [Path(sys.executable).resolve(), Path(sys.prefix), Path(phalanx.__file__)]
    closed = sorted({d for t in targets for d in t.parents if not d.stat().st_mode & stat.S_IXOTH})
    if closed and shutil.which("setfacl") is None:
        pytest.skip(f"setfacl is needed to open {closed[0]} to the test users (apt: acl)")
    # A folder with no ACL of its own before gets none after (not even the mask entry).
    plain = {f for f in closed if not _extended_acl(f)}
    granted = []
    try:
        for folder in closed:
            for user in USERS:
                subprocess.run(["setfacl", "-m", f"u:{user}:x", str(folder)], check=True)
                granted.append((user, folder))
        yield
    finally:
        for user, folder in granted:
            subprocess.run(["setfacl", "-x", f"u:{user}", str(folder)], check=False)
        for folder in plain:
            subprocess.run(["setfacl", "-b", str(folder)], check=False)


def _extended_acl(folder: Path) -> bool:
    done = subprocess.run(
        ["getfacl", "--skip-base", "--absolute-names", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    return bool(done.stdout.strip())


def test_chaos_invariants_hold_with_jobs_of_two_users(
    open_dir: Path, python_for_users: None
) -> None:
    for user in USERS:  # what the fixture arranged: a failure here is the setup's, named
        assert _python_runs_as(user) is None, f"{user} cannot run {sys.executable}"
    config = ChaosConfig(seed=11, duration_s=30, settle_s=25, fault_every_s=2.5, users=USERS)

    report = run_chaos(open_dir / "chaos", config)

    summary = json.dumps(report.to_json(), indent=1, default=str)
    assert report.ok, summary
    assert sum(report.actions.values()) >= 4, summary  # the chaos really happened
    assert report.runs > 0, summary
    # Both users' jobs ran, each as its own account (the job writes its ledger itself).
    assert set(report.ledger_owners) == set(USERS), summary
