"""Fixtures: a real head process (SQLite or PostgreSQL) on a free loopback port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from phalanx.local.cluster import free_port
from phalanx.testing.postgres import PostgresServer


@dataclass
class HeadProc:
    url: str
    state_dir: Path
    proc: subprocess.Popen[bytes]

    @property
    def admin_token(self) -> str:
        return (self.state_dir / "admin.token").read_text().strip()

    @property
    def join_token(self) -> str:
        return (self.state_dir / "join.token").read_text().strip()

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def start_head(state_dir: Path, db_url: str | None, settings: str = "") -> HeadProc:
    """`settings`: keyword arguments of the head's Settings, as Python source."""
    port = free_port()
    code = (
        "import sys; from pathlib import Path; from phalanx.head.server import serve; "
        "from phalanx.head.mirror import Settings; "
        f"serve(Path({str(state_dir)!r}), '127.0.0.1', {port}, {db_url!r}, Settings({settings}))"
    )
    log = open(state_dir.parent / f"head-{port}.log", "wb")  # noqa: SIM115  # closed by the OS at exit
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((state_dir.parent / f"head-{port}.log").read_text()[-3000:])
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return HeadProc(url, state_dir, proc)
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    stop_head(proc)
    raise RuntimeError("head did not start in 30 s")


def stop_head(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def head(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HeadProc]:
    """One head per test module and database (start-up costs seconds on a busy machine)."""
    yield from module_head(request, tmp_path_factory, "head")


def module_head(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    prefix: str,
    settings: str = "",
) -> Iterator[HeadProc]:
    """The body of a module-scoped `head` fixture parametrized by database (`settings`: as
    start_head takes them); stopped afterwards."""
    tmp_path = tmp_path_factory.mktemp(prefix)
    db_url = None
    if request.param == "postgresql":
        pg: PostgresServer = request.getfixturevalue("postgres")
        # Its own database: the session's e2e cluster holds the leader lock of the shared
        # one, and a second head there would only be its standby.
        db_url = pg.new_database(f"{prefix}_{request.module.__name__.rsplit('.', 1)[-1]}")
    h = start_head(tmp_path / "head", db_url, settings)
    try:
        yield h
    finally:
        stop_head(h.proc)
