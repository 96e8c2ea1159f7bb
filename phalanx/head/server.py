"""`phalanx head`: open the store, migrate it, bootstrap auth, run the API and control loop."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import uvicorn
from sqlalchemy import Connection, Engine

from phalanx.head import auth, db, leader, store
from phalanx.head.app import create_app
from phalanx.head.certs import TLS_DIR, AgentSigner, TLSRequest
from phalanx.head.control import ControlThread
from phalanx.head.http import JoinedWritesProtocol
from phalanx.head.migrate import upgrade
from phalanx.head.mirror import Settings
from phalanx.head.service import Head
from phalanx.tls import TLSError, client_context

log = logging.getLogger("phalanx.head")

ADMIN_TOKEN_FILE = "admin.token"
JOIN_TOKEN_FILE = "join.token"


def write_secret(path: Path, secret: str) -> None:
    """Write a secret readable by its owner only (created 0600, never world-readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    os.chmod(path, 0o600)


def secure_state(state_dir: Path) -> None:
    """The state dir 0700; its SQLite database (with WAL and SHM) and token files 0600 —
    also on installs made before the head set these modes."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(state_dir, 0o700)
    for name in (ADMIN_TOKEN_FILE, JOIN_TOKEN_FILE, *DB_FILES):
        path = state_dir / name
        if path.exists():
            os.chmod(path, 0o600)


DB_FILES = ("phalanx.db", "phalanx.db-wal", "phalanx.db-shm", "phalanx.db-journal")


def bootstrap(engine: Engine, state_dir: Path, join_ttl_s: float = auth.JOIN_TOKEN_TTL_S) -> None:
    """First start: team `default`, user `admin`, an admin token and a join token in files.

    The admin token never expires (it is the cluster's root credential, 0600 in the state
    dir; revoke it to rotate). The join token expires after `join_ttl_s` (0: never); at
    each start, once it has expired, been revoked or used, a fresh one replaces it, so
    `phalanx up` on an old state dir still starts its agents."""
    now = time.time()
    with engine.begin() as conn:
        if not store.all_teams(conn):
            from phalanx.api.models import TeamSpec

            store.put_team(conn, TeamSpec(name="default"), now)
        if not store.user_exists(conn, "admin"):
            store.add_user(conn, "admin", True, ["default"], [], "default", now)
        admin_file = state_dir / ADMIN_TOKEN_FILE
        if not admin_file.exists():
            token = auth.new_token("api")
            store.add_token(conn, auth.token_hash(token), "api", "admin", None, "bootstrap", now)
            write_secret(admin_file, token)
        join_file = state_dir / JOIN_TOKEN_FILE
        if not _join_token_valid(conn, join_file, now):
            token = auth.new_token("join")
            expires = now + join_ttl_s if join_ttl_s > 0 else None
            store.add_token(
                conn, auth.token_hash(token), "join", None, None, "bootstrap", now, expires
            )
            write_secret(join_file, token)


def _join_token_valid(conn: Connection, path: Path, now: float) -> bool:
    """Whether `path` holds a join token the head would still accept."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        return False
    row = store.token_by_hash(conn, auth.token_hash(token))
    return row is not None and (row.expires is None or row.expires > now)


def build(state_dir: Path, db_url: str | None, settings: Settings) -> Head:
    """A head ready to serve: schema migrated, auth bootstrapped, state loaded (not started).

    Takes no single-writer lock: `serve` does (in-process tests own their database)."""
    secure_state(state_dir)
    engine = db.make_engine(db_url or db.default_url(state_dir))
    head = Head(ControlThread(engine, settings))
    _take_over(head, state_dir)
    return head


def _take_over(head: Head, state_dir: Path) -> None:
    """Become the writer: migrate, bootstrap, rebuild the mirror from the database."""
    engine = head.control.engine
    upgrade(engine)
    bootstrap(engine, state_dir, head.mirror.settings.join_token_ttl_s)
    secure_state(state_dir)  # the database files exist now
    head.control.load()


def serve(
    state_dir: Path,
    host: str = "127.0.0.1",
    port: int = 8265,
    db_url: str | None = None,
    settings: Settings | None = None,
    tls: TLSRequest | None = None,
) -> None:
    """Run the head until SIGINT/SIGTERM. Prints `head listening on URL` once it serves:
    https with `tls` (certificates made or checked once this head owns the state dir),
    else plain http (the CLI allows that on loopback only, unless told otherwise).

    One writer per database (docs/high-availability.md): on SQLite the state dir's lock
    (exit 2 if another head holds it); on PostgreSQL the leader lock; a head that does not
    get it serves as a standby (503 but /healthz) until the leader's session ends.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per log proxy call
    os.umask(0o077)  # whatever the head creates (database, WAL, tokens) is its user's alone
    secure_state(state_dir)  # tokens and the database: no job may read them
    database = db_url or db.default_url(state_dir)
    election: leader.Election | None = None
    try:
        if database.startswith("postgresql"):
            election = leader.Election(database)
            leading = election.try_acquire()
        else:
            _state_lock = leader.lock_state_dir(state_dir)  # held while we run
            leading = True
        served = tls.resolve(state_dir, host) if tls is not None else None
    except (leader.AlreadyRunning, leader.ElectionError, TLSError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    # Bound here, not by uvicorn: with --port 0 the kernel picks the port, and the URL the
    # head announces (and gives jobs as PHALANX_HEAD) must name that port, not 0.
    sock = _listen(host, port)
    port = sock.getsockname()[1]
    url = f"{'https' if served else 'http'}://{_url_host(host)}:{port}"
    settings = replace(settings or Settings(), public_url=url)
    head = Head(ControlThread(db.make_engine(database), settings))
    if served is not None and served.ca_file is not None:
        head.agent_verify = client_context(str(served.ca_file))
        if tls is not None and tls.cert is None:  # its own CA: it signs agents' certificates
            head.signer = AgentSigner(state_dir / TLS_DIR)
    role = leader.Role(leader=False)
    if leading:
        _lead(head, state_dir, role, election)
    else:
        assert election is not None
        log.info("standby: another head holds the leader lock; waiting for it")
        threading.Thread(
            target=_stand_by, args=(head, state_dir, role, election), daemon=True
        ).start()
    config = uvicorn.Config(
        create_app(head, role),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        proxy_headers=False,  # the head is addressed directly; no X-Forwarded-* to trust
        server_header=False,
        timeout_graceful_shutdown=3,
        http=JoinedWritesProtocol,  # an answer's header and body in one send
        ssl_certfile=str(served.certfile) if served else None,
        ssl_keyfile=str(served.keyfile) if served else None,
    )
    server = uvicorn.Server(config)

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.02)
        if server.started:
            standby = "" if role.leader else " (standby)"
            print(f"head listening on {url}{standby}", flush=True)
            print(f"admin token in {state_dir / ADMIN_TOKEN_FILE}", flush=True)
            if served is not None and served.ca_file is not None:
                print(f"CA certificate in {served.ca_file} (clients pin it)", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    _tune_gc()
    try:
        server.run(sockets=[sock])
    finally:
        if role.leader:
            head.serving.stop()  # before the control thread its passes run on
            head.control.stop()
            with contextlib.suppress(Exception):  # logged; the database is away
                head.usage.stop()
        if election is not None:
            election.close()  # after the last commit: a standby may take over now
    if not server.started:
        print(f"error: the head could not listen on {host}:{port}", file=sys.stderr)
        raise SystemExit(1)


def _url_host(host: str) -> str:
    """`host` as it goes in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


def _listen(host: str, port: int) -> socket.socket:
    """The API's listening socket (exit 1 with the reason if it cannot be had)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        # A restarted head is reconnected to by every agent at once (10,000 nodes), while
        # it still loads its state: queue them all (the kernel caps this at
        # net.core.somaxconn) rather than drop SYNs that the agents retry seconds later.
        return socket.create_server((host, port), family=family, backlog=65535)
    except OSError as e:
        print(
            f"error: the head could not listen on {host}:{port}: {e.strerror or e}", file=sys.stderr
        )
        raise SystemExit(1) from None


# Young-generation size of the cyclic garbage collector (Python's default: 700 objects).
GC_YOUNG = 50_000


def _tune_gc() -> None:
    """Collect less often: the head holds every live job in memory, and each submit makes
    a few dozen objects that live as long as the job. At Python's default thresholds a
    flood of submits spent ~10 % of the head's CPU in the collector (in a trial of
    bench/submit.py's flood, the head's CPU per submit went from 470 to 394 µs at these);
    what start-up loaded is moved out of its sight."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, 20, 10)


def _lead(head: Head, state_dir: Path, role: leader.Role, election: leader.Election | None) -> None:
    _take_over(head, state_dir)
    head.control.start()
    head.usage.start()
    head.serving.start()  # adopts the replica jobs that outlived the last head
    if election is not None:
        election.watch()
    role.leader = True
    log.info("serving as the leader")


def _stand_by(head: Head, state_dir: Path, role: leader.Role, election: leader.Election) -> None:
    """Wait for the leader lock, then take over; any failure to take over stops the process
    (a half-loaded head must not serve)."""
    if not election.wait():
        return
    try:
        _lead(head, state_dir, role, election)
    except BaseException:
        log.exception("taking over as the leader failed; stopping")
        logging.shutdown()
        os._exit(1)
