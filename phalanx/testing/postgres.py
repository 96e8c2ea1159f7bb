"""A throwaway PostgreSQL server for tests and benchmarks (initdb in a temporary folder).

Runs the server binaries Debian's `postgresql` package installs; as root it runs them as the
`postgres` user (PostgreSQL refuses to run as root). `.ci/run` installs the package.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from phalanx.local.cluster import free_port


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries here: install Debian's `postgresql` package."""


def _bindir() -> Path:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(candidate, "initdb").exists():
            return Path(candidate)
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise PostgresUnavailable(
        "PostgreSQL server binaries (initdb, postgres) not found; "
        "install them with `apt-get install postgresql` (.ci/run does)"
    )


class PostgresServer:
    """`with PostgresServer() as pg: pg.url` — a fresh cluster with a `phalanx` database."""

    def __init__(self) -> None:
        self.bindir = _bindir()
        self.root = Path(tempfile.mkdtemp(prefix="phalanx-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            self._as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.root, "postgres")
            os.chmod(self.root, 0o700)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/phalanx"

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as_user, *args], check=True, capture_output=True, timeout=120)

    def start(self) -> PostgresServer:
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
        )
        log = open(self.root / "server.log", "wb")  # noqa: SIM115  # lives as long as the server
        self.proc = subprocess.Popen(
            [
                *self._as_user,
                str(self.bindir / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-h",
                "127.0.0.1",
                "-k",
                str(self.root),
                "-c",
                "max_connections=200",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            ready = subprocess.run(
                [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True,
            )
            if ready.returncode == 0:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.root / "server.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise PostgresUnavailable(f"PostgreSQL did not start:\n{tail}")
            time.sleep(0.1)
        subprocess.run(
            [
                str(self.bindir / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "phalanx",
            ],
            check=True,
            capture_output=True,
        )
        return self

    def reset(self) -> None:
        """Drop every table, so the next user starts from an empty database."""
        self._psql("phalanx", "DROP SCHEMA public CASCADE; CREATE SCHEMA public;")

    def new_database(self, name: str) -> str:
        """The URL of a new, empty database `name` (dropped first if it exists, with its
        sessions): a head of its own there holds no other head's leader lock."""
        # Two commands: DROP/CREATE DATABASE cannot run inside one transaction.
        self._psql("postgres", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._psql("postgres", f'CREATE DATABASE "{name}"')
        return self.url.rsplit("/", 1)[0] + "/" + name

    def _psql(self, database: str, command: str) -> None:
        psql = [str(self.bindir / "psql"), "-h", "127.0.0.1", "-p", str(self.port)]
        subprocess.run(
            [*psql, "-U", "postgres", "-d", database, "-q", "-c", command],
            check=True,
            capture_output=True,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # smart shutdown: SIGTERM
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
