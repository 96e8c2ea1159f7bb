"""Real Unix users (phxtest-alice, phxtest-bob), a cluster whose users map to them by name,
and working directories they own (needs root: skipped, saying so, otherwise); and a real
head (SQLite and PostgreSQL) with small per-user limits, for the identity tests."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from phalanx.api.models import UserCreate
from phalanx.client.api import ApiError, PhalanxClient
from phalanx.local import LocalCluster
from tests.e2e.helpers import cancel_all
from tests.head.conftest import HeadProc, module_head

USERS = ("phxtest-alice", "phxtest-bob")
GHOST = "phxtest-ghost"  # a Phalanx user with no Unix account anywhere


@dataclass(frozen=True)
class Person:
    """A Phalanx user, its Unix account and a working directory it owns (mode 0700)."""

    name: str
    uid: int
    gid: int
    home: Path
    client: PhalanxClient


@pytest.fixture(scope="session")
def unix_users() -> dict[str, pwd.struct_passwd]:
    """The test accounts, created if missing (other test runs may share them)."""
    if os.geteuid() != 0:
        pytest.skip("tests/security create Unix users and run jobs as them: run as root")
    if shutil.which("useradd") is None:
        pytest.skip("tests/security need useradd")
    for name in USERS:
        done = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
            check=False,
        )
        # 9: it exists already (another run created it, maybe at this very moment).
        assert done.returncode in (0, 9), done.stderr
    return {name: pwd.getpwnam(name) for name in USERS}


@pytest.fixture(scope="session")
def base(unix_users: dict[str, pwd.struct_passwd]) -> Iterator[Path]:
    """A root-owned directory every test user may pass through but not write to (pytest's
    own tmp dirs are 0700, out of their reach): state dirs and working dirs live here."""
    path = Path(tempfile.mkdtemp(prefix="phx-security-")).resolve()
    path.chmod(0o755)
    (path / "top").mkdir(mode=0o755)
    yield path
    if not os.environ.get("PHX_SECURITY_KEEP"):  # to look at a failure
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(base: Path) -> Iterator[LocalCluster]:
    """One agent with four fake GPUs; users run as the account with their name."""
    with LocalCluster(base / "state", nodes=1, gpus_per_node=4, users_map_to_self=False) as c:
        yield c


@pytest.fixture(scope="session")
def people(
    cluster: LocalCluster, base: Path, unix_users: dict[str, pwd.struct_passwd]
) -> Iterator[dict[str, Person]]:
    """alice and bob: Phalanx users, clients with their tokens, and their own 0700 dirs."""
    out = {}
    with cluster.client() as admin:
        for name in (*USERS, GHOST):
            try:
                admin.create_user(UserCreate(name=name, teams=["default"]))
            except ApiError as e:
                assert e.status == 409, e
            entry = unix_users.get(name)
            home = base / "top" / name.removeprefix("phxtest-")
            home.mkdir(mode=0o700, exist_ok=True)
            if entry is not None:
                os.chown(home, entry.pw_uid, entry.pw_gid)
            token = admin.create_token(name).token
            out[name.removeprefix("phxtest-")] = Person(
                name=name,
                uid=entry.pw_uid if entry else -1,
                gid=entry.pw_gid if entry else -1,
                home=home,
                client=cluster.client(token),
            )
    yield out
    for p in out.values():
        cancel_all(p.client)
        p.client.close()


# Small enough for a test to reach: 5 live jobs per user, job specs up to 8 KiB.
SETTINGS = "max_queued_per_user=5, max_spec_bytes=8192"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def head(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HeadProc]:
    yield from module_head(request, tmp_path_factory, "security", SETTINGS)
