"""Single-writer guard: a state-dir lock for SQLite, leader election for PostgreSQL."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal

from sqlalchemy.engine import make_url

from phalanx import pidlock
from phalanx.pidlock import AlreadyRunning as AlreadyRunning  # another head: one per SQLite

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("phalanx.head")

LOCK_FILE = "head.lock"
# The session-level advisory lock every head of one cluster competes for: the 64-bit
# integer whose bytes spell "phalanx!" (8104636957236289825). Advisory locks are scoped to
# one database, so clusters with their own databases never compete.
LEADER_LOCK_KEY = int.from_bytes(b"phalanx!", "big")
CHECK_INTERVAL_S = 1.0  # the leader checks its lock connection this often
# No successful check for this long: the connection is hung (partition, frozen server), and
# the server will drop the session (and the lock) after its keepalives give up (5 + 3 × 2 s).
LOST_AFTER_S = 5.0
# A new leader waits this long after getting the lock before it writes: an old leader whose
# session the server ended (pg_terminate_backend) notices at its next check and stops.
TAKEOVER_GRACE_S = 1.5 * CHECK_INTERVAL_S
LOST_LEADERSHIP_EXIT = 3  # exit status of a leader that lost its lock connection
_SERVER_KEEPALIVE = (
    "SET tcp_keepalives_idle = 5",
    "SET tcp_keepalives_interval = 2",
    "SET tcp_keepalives_count = 3",
)


class ElectionError(Exception):
    """The leader lock's database cannot be reached (the message says where and why)."""


class Role:
    """Whether this head is the leader (serves everything) or a standby (503 but /healthz)."""

    def __init__(self, leader: bool = True) -> None:
        self.leader = leader

    @property
    def name(self) -> Literal["leader", "standby"]:
        return "leader" if self.leader else "standby"


def lock_state_dir(state_dir: Path) -> IO[str]:
    """Take `state_dir/head.lock` for this process's life (phalanx.pidlock); raises
    AlreadyRunning naming the holder's pid."""
    return pidlock.lock(state_dir, LOCK_FILE, "head")


def libpq_url(db_url: str) -> str:
    """A SQLAlchemy PostgreSQL URL (postgresql+psycopg://…) as libpq's own URI."""
    url = make_url(db_url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


class Election:
    """Leader election over PostgreSQL: whoever holds LEADER_LOCK_KEY on its own session is
    the leader. The lock lives on a dedicated connection; losing that connection loses the
    lock, so the leader checks it every second and stops at once when it is gone."""

    def __init__(self, db_url: str) -> None:
        self._conninfo = libpq_url(db_url)
        self._where = make_url(db_url).render_as_string(hide_password=True)
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._last_ok = time.monotonic()
        self._resumed = 0.0  # time.monotonic() when the process came back from a pause
        self._closed = threading.Event()

    def _connect(self) -> psycopg.Connection[tuple[object, ...]]:
        import psycopg

        try:
            conn = psycopg.connect(
                self._conninfo,
                autocommit=True,
                connect_timeout=5,
                tcp_user_timeout=int(LOST_AFTER_S * 1000),
                application_name="phalanx-head-leader-lock",
                keepalives=1,  # and we notice a dead server within seconds
                keepalives_idle=5,
                keepalives_interval=2,
                keepalives_count=3,
            )
        except psycopg.Error as e:
            raise ElectionError(f"cannot reach the database {self._where}: {e}") from None
        # The server drops a silent client's session (and its lock) after ~11 s.
        for statement in _SERVER_KEEPALIVE:
            conn.execute(statement)
        return conn

    def try_acquire(self) -> bool:
        """Take the lock if it is free (connecting first); True if we are the leader now."""
        import psycopg

        try:
            self._conn = self._conn or self._connect()
            query = "SELECT pg_try_advisory_lock(%s)"
            row = self._conn.execute(query, (LEADER_LOCK_KEY,)).fetchone()
        except psycopg.Error as e:
            self._drop()
            raise ElectionError(f"cannot take the leader lock in {self._where}: {e}") from None
        return bool(row and row[0])

    def wait(self) -> bool:
        """Block until we hold the lock (the leader's session ended), reconnecting as
        needed; False if `close()` was called first."""
        import psycopg

        backoff = 0.5
        while not self._closed.is_set():
            try:
                self._conn = self._conn or self._connect()
                self._conn.execute("SELECT pg_advisory_lock(%s)", (LEADER_LOCK_KEY,))
                break
            except (psycopg.Error, ElectionError) as e:
                if self._closed.is_set():
                    return False
                log.warning("standby: waiting for the leader lock failed (%s); retrying", e)
                self._drop()
                self._closed.wait(backoff)
                backoff = min(backoff * 2, 10.0)
        if self._closed.is_set():
            return False
        log.info("got the leader lock; taking over in %.1fs", TAKEOVER_GRACE_S)
        return not self._closed.wait(TAKEOVER_GRACE_S)

    def watch(self) -> None:
        """From now on, stop the process (fail-stop) as soon as the lock connection is lost
        or hangs: another head may already be the leader."""
        self._last_ok = time.monotonic()
        threading.Thread(target=self._check, name="phalanx-leader-check", daemon=True).start()
        threading.Thread(target=self._deadline, name="phalanx-leader-deadline", daemon=True).start()

    def _check(self) -> None:
        import psycopg

        conn = self._conn
        assert conn is not None
        while not self._closed.is_set():
            try:
                conn.execute("SELECT 1")
            except psycopg.Error as e:
                if self._closed.is_set():
                    return  # shutting down: the lock was given up on purpose
                _lost(f"the leader lock's connection failed: {e}")
            self._last_ok = time.monotonic()
            self._closed.wait(CHECK_INTERVAL_S)

    def _deadline(self) -> None:
        tick = time.monotonic()
        while not self._closed.wait(CHECK_INTERVAL_S / 2):
            now = time.monotonic()
            if now - tick > LOST_AFTER_S:
                # This thread itself did not run for that long: the whole process was paused
                # (SIGSTOP, a frozen VM), so the check could not run either. A pause does not
                # end the lock's session (the kernel answers the server's keepalives), so the
                # check gets LOST_AFTER_S from now to prove the connection again: a session
                # that did end fails it at once (or hangs past the deadline), and a healthy
                # leader is not stopped for its own pause.
                log.warning("the head was paused for %.0fs; checking the leader lock", now - tick)
                self._resumed = now
            tick = now
            silent = now - max(self._last_ok, self._resumed)
            if silent > LOST_AFTER_S:
                _lost(f"the leader lock's connection has not answered for {silent:.0f}s")

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    def close(self) -> None:
        """Give the lock up (closing its session); a standby takes over."""
        self._closed.set()
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.cancel()  # a standby blocked in pg_advisory_lock
            self._drop()


def _lost(why: str) -> None:
    log.critical("%s; this head may no longer be the leader and stops now", why)
    logging.shutdown()
    os._exit(LOST_LEADERSHIP_EXIT)
