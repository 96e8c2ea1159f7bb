"""Real `phalanx head` and `phalanx agent` processes for the high-availability tests."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx

from phalanx.client.api import PhalanxClient
from phalanx.local.cluster import free_port
from phalanx.tls import client_context

T = TypeVar("T")
PHALANX = [sys.executable, "-m", "phalanx.cli.main"]


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: no orphans


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 30.0) -> T:
    """Poll `probe` until it returns something other than None (or False)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Proc:
    """A child process in its own process group, its output in a log file."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        with log.open("ab") as out:
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        """SIGKILL the whole group (a crash) and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM the group, SIGKILL what is left after 10 s."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)


class HeadServer:
    """`phalanx head` on a fixed address, which can crash and start again in its place."""

    def __init__(
        self,
        state_dir: Path,
        db_url: str | None = None,
        host: str = "127.0.0.1",
        head_args: tuple[str, ...] = ("--plain-http", "--users-map-to-self"),
    ):
        """`head_args`: extra `phalanx head` flags; plain HTTP unless told otherwise (these
        tests are about the API; tests/security/test_tls.py runs heads with TLS), jobs as
        the head's own account."""
        self.state_dir = state_dir
        self.db_url = db_url
        self.host = host
        self.head_args = head_args
        self.port = free_port(host)
        self.proc: Proc | None = None
        self.starts = 0

    @property
    def tls(self) -> bool:
        return "--plain-http" not in self.head_args

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def ca_file(self) -> Path:
        """The CA certificate the head made on first start (with TLS)."""
        return self.state_dir / "tls" / "ca.crt"

    @property
    def admin_token(self) -> str:
        return (self.state_dir / "admin.token").read_text().strip()

    @property
    def join_token(self) -> str:
        return (self.state_dir / "join.token").read_text().strip()

    def start(self) -> HeadServer:
        argv = [*PHALANX, "head", "--state-dir", str(self.state_dir)]
        argv += ["--host", self.host, "--port", str(self.port), *self.head_args]
        argv += ["--db", self.db_url] if self.db_url else []
        self.starts += 1
        log = self.state_dir.parent / f"{self.state_dir.name}-{self.starts}.log"
        self.proc = Proc(argv, log)
        return self

    def role(self) -> str | None:
        """What /healthz says (None: no answer)."""
        if self.tls and not self.ca_file.exists():
            return None  # not started far enough to have made its CA
        verify = client_context(str(self.ca_file) if self.tls else None)
        try:
            r = httpx.get(self.url + "/healthz", timeout=2, verify=verify)
        except httpx.HTTPError:
            return None
        return str(r.json()["role"]) if r.status_code == 200 else None

    def wait_role(self, role: str, timeout: float = 60.0) -> None:
        def probe() -> bool:
            assert self.proc is not None
            if not self.proc.alive():
                raise AssertionError(f"the head exited:\n{self.proc.tail()}")
            return self.role() == role

        wait_for(f"{self.url} to be {role}", probe, timeout)

    def restart(self) -> None:
        """Crash (SIGKILL) and start again on the same state, database and port."""
        assert self.proc is not None
        self.proc.kill()
        self.start().wait_role("leader")

    def client(self, token: str | None = None) -> PhalanxClient:
        ca = str(self.ca_file) if self.tls else None
        return PhalanxClient(self.url, token or self.admin_token, ca=ca)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def start_agent(heads: str, join_token: str, address: str, workdir: Path) -> Proc:
    """`phalanx agent --head HEADS` with one fake GPU, named after its address."""
    argv = [*PHALANX, "agent", "--head", heads, "--address", address, "--name", address]
    argv += ["--port", "0", "--fake-gpus", "1", "--state-dir", str(workdir / f"agent-{address}")]
    env = {"PHALANX_JOIN_TOKEN": join_token}
    return Proc(argv, workdir / f"agent-{address}.log", env)
