"""`phalanx head`: open the store, migrate it, bootstrap auth, run the API and control loop."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path

import uvicorn
from sqlalchemy import Engine

from phalanx.head import auth, db, store
from phalanx.head.app import create_app
from phalanx.head.control import ControlThread
from phalanx.head.migrate import upgrade
from phalanx.head.mirror import Settings
from phalanx.head.service import Head

log = logging.getLogger("phalanx.head")

ADMIN_TOKEN_FILE = "admin.token"
JOIN_TOKEN_FILE = "join.token"


def write_secret(path: Path, secret: str) -> None:
    """Write a secret readable by its owner only (created 0600, never world-readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    os.chmod(path, 0o600)


def bootstrap(engine: Engine, state_dir: Path) -> None:
    """First start: team `default`, user `admin`, an admin token and a join token in files."""
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
        if not join_file.exists():
            token = auth.new_token("join")
            store.add_token(conn, auth.token_hash(token), "join", None, None, "bootstrap", now)
            write_secret(join_file, token)


def build(state_dir: Path, db_url: str | None, settings: Settings) -> Head:
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    engine = db.make_engine(db_url or db.default_url(state_dir))
    upgrade(engine)
    bootstrap(engine, state_dir)
    control = ControlThread(engine, settings)
    control.load()
    return Head(control)


def serve(
    state_dir: Path,
    host: str = "127.0.0.1",
    port: int = 8265,
    db_url: str | None = None,
    lease_s: float = 10.0,
    heartbeat_s: float = 2.0,
) -> None:
    """Run the head until SIGINT/SIGTERM. Prints `head listening on URL` once it serves."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per log proxy call
    url = f"http://{host}:{port}"
    settings = Settings(heartbeat_s=heartbeat_s, lease_s=lease_s, public_url=url)
    head = build(state_dir, db_url, settings)
    head.control.start()
    config = uvicorn.Config(
        create_app(head),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        proxy_headers=False,  # the head is addressed directly; no X-Forwarded-* to trust
        server_header=False,
        timeout_graceful_shutdown=3,
    )
    server = uvicorn.Server(config)

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.02)
        if server.started:
            print(f"head listening on {url}", flush=True)
            print(f"admin token in {state_dir / ADMIN_TOKEN_FILE}", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    try:
        server.run()
    finally:
        head.control.stop()
    if not server.started:
        print(f"error: the head could not listen on {host}:{port}", file=sys.stderr)
        raise SystemExit(1)
