"""Reads and writes of the head's tables, as plain functions over a SQLAlchemy connection."""

from __future__ import annotations

import functools
import itertools
import json
import operator
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, Dialect, Table, bindparam, delete, func, insert, select, update

from phalanx.api.models import JobEvent, JobSpec, TeamSpec, TokenInfo, UserInfo
from phalanx.core import JobState
from phalanx.head import db
from phalanx.head.records import JobRecord, NodeRecord

LIVE_STATES = tuple(s.value for s in JobState if not s.terminal)


# ----------------------------------------------------------------------------- jobs
def insert_jobs(conn: Connection, records: Sequence[JobRecord]) -> None:
    insert_rows(conn, db.jobs, [r.row() for r in records])


# Rows per multi-row INSERT on SQLite, at most: fewer where the SQLite build allows fewer
# parameters per statement than rows × columns (32,766 since 3.32; 999 before).
ROWS_PER_INSERT = 500


def insert_rows(conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
    """Insert `rows` (dicts with the same keys), in as few round trips and GIL releases as
    the driver allows, with the SQL text built once per shape from the table's quoted names.

    On SQLite, multi-row `INSERT … VALUES (…), (…)`, one per ROWS_PER_INSERT rows: an
    executemany steps once per row, each step releases and re-takes the GIL, and under load
    the control thread then waits for the API's event loop to hand it back, once per row.
    On PostgreSQL, the driver's own executemany of the one-row statement: psycopg pipelines
    the rows in one round trip with one prepared statement (a long multi-row text would be
    re-parsed in Python every time). SQLAlchemy's `insert()` costs more than either here: it
    processes each row's parameters in Python, and its multi-row `values([...])` compiles
    one bind parameter per value (~30× slower)."""
    if not rows:
        return
    columns = tuple(rows[0])
    prefix, group = _insert_text(conn.dialect, table.name, columns)
    values = _values_of(columns)
    if conn.dialect.paramstyle != "qmark":
        conn.exec_driver_sql(prefix + group, list(map(values, rows)))
        return
    per = max(1, min(ROWS_PER_INSERT, _sqlite_max_parameters(conn) // len(columns)))
    for start in range(0, len(rows), per):
        chunk = rows[start : start + per]
        params = tuple(itertools.chain.from_iterable(map(values, chunk)))
        conn.exec_driver_sql(prefix + ", ".join([group] * len(chunk)), params)


def _values_of(columns: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """A row's values in column order, as a tuple (gathered in C: itemgetter)."""
    get = operator.itemgetter(*columns)
    if len(columns) > 1:
        return get
    return lambda row: (get(row),)  # itemgetter of one key gives the value itself


def _sqlite_max_parameters(conn: Connection) -> int:
    """The most bound parameters one statement may have on this SQLite connection."""
    driver = conn.connection.driver_connection
    assert driver is not None  # a connection in use is never invalidated
    return int(driver.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))


@functools.cache
def _insert_text(dialect: Dialect, table: str, columns: tuple[str, ...]) -> tuple[str, str]:
    """`INSERT INTO table (columns) VALUES ` and one row's `(?, ?, …)` in `dialect`'s
    quoting and parameter style."""
    quote = dialect.identifier_preparer.quote
    mark = "?" if dialect.paramstyle == "qmark" else "%s"
    names = ", ".join(quote(c) for c in columns)
    return f"INSERT INTO {quote(table)} ({names}) VALUES ", f"({', '.join([mark] * len(columns))})"


def update_job(conn: Connection, rec: JobRecord) -> None:
    """Write a job's changed columns (callers flush the Tx's buffered inserts first)."""
    row = rec.row()
    del row["id"], row["spec_json"]
    conn.execute(update(db.jobs).where(db.jobs.c.id == rec.id).values(**row))


def live_jobs(conn: Connection) -> list[JobRecord]:
    rows = conn.execute(
        select(db.jobs).where(db.jobs.c.state.in_(LIVE_STATES)).order_by(db.jobs.c.id)
    )
    specs: dict[str, JobSpec] = {}  # an array's tasks share their spec: parsed once
    return [JobRecord.from_row(r, specs) for r in rows]


def job(conn: Connection, job_id: int) -> JobRecord | None:
    row = conn.execute(select(db.jobs).where(db.jobs.c.id == job_id)).first()
    return None if row is None else JobRecord.from_row(row)


def array_task(conn: Connection, array_job_id: int, task: int) -> JobRecord | None:
    """Task `task` of array `array_job_id` (`123_4`), live or ended, if it exists."""
    row = conn.execute(
        select(db.jobs).where(
            db.jobs.c.array_job_id == array_job_id, db.jobs.c.array_task_id == task
        )
    ).first()
    return None if row is None else JobRecord.from_row(row)


def update_job_spec(conn: Connection, rec: JobRecord) -> None:
    """Write a job's spec (changed by `phalanx update`; `update_job` leaves it alone)."""
    spec_json = rec.spec.model_dump_json()
    conn.execute(update(db.jobs).where(db.jobs.c.id == rec.id).values(spec_json=spec_json))


# Built once: every keyed submit runs it, and building a statement costs more than running it.
_BY_CLIENT_TOKEN = select(db.jobs.c.id).where(
    db.jobs.c.user == bindparam("user"), db.jobs.c.client_token == bindparam("token")
)


def job_by_client_token(conn: Connection, user: str, token: str) -> JobRecord | None:
    """The job `user` submitted with idempotency key `token` (an array's first task), if
    any: one row at most, by the unique index on (user, client_token)."""
    job_id = conn.execute(_BY_CLIENT_TOKEN, {"user": user, "token": token}).scalar()
    return None if job_id is None else job(conn, job_id)


def ended_jobs(
    conn: Connection,
    since: float | None,
    user: str | None,
    teams: Iterable[str] | None,
    limit: int,
    array_job_id: int | None = None,
    ids: Iterable[int] | None = None,
) -> list[JobRecord]:
    """Ended jobs, newest `limit` of them, oldest first; `ids`: only these jobs and the
    tasks of arrays among them (at most 400 ids, 800 bound parameters: the route bounds them)."""
    query = select(db.jobs).where(db.jobs.c.state.not_in(LIVE_STATES))
    if array_job_id is not None:
        query = query.where(db.jobs.c.array_job_id == array_job_id)
    if ids is not None:
        wanted = list(ids)
        query = query.where(db.jobs.c.id.in_(wanted) | db.jobs.c.array_job_id.in_(wanted))
    if since is not None:
        query = query.where(db.jobs.c.end_time >= since)
    if user is not None and teams is not None:
        query = query.where((db.jobs.c.user == user) | db.jobs.c.team.in_(list(teams)))
    elif user is not None:
        query = query.where(db.jobs.c.user == user)
    query = query.order_by(db.jobs.c.id.desc()).limit(limit)
    return [JobRecord.from_row(r) for r in conn.execute(query)][::-1]


def outcomes(conn: Connection, ids: Iterable[int]) -> dict[int, tuple[bool, str]]:
    """For ended jobs among `ids`: (whether it ever started, its final state code)."""
    wanted = list(ids)
    if not wanted:
        return {}
    rows = conn.execute(
        select(db.jobs.c.id, db.jobs.c.state, db.jobs.c.start_time).where(
            db.jobs.c.id.in_(wanted), db.jobs.c.state.not_in(LIVE_STATES)
        )
    )
    return {r.id: (r.start_time is not None, r.state) for r in rows}


def existing_job_ids(conn: Connection, ids: Iterable[int]) -> set[int]:
    wanted = list(ids)
    if not wanted:
        return set()
    rows = conn.execute(select(db.jobs.c.id).where(db.jobs.c.id.in_(wanted)))
    return {r.id for r in rows}


def max_job_id(conn: Connection) -> int:
    return int(conn.execute(select(func.max(db.jobs.c.id))).scalar() or 0)


def insert_events(conn: Connection, rows: list[dict[str, Any]]) -> None:
    insert_rows(conn, db.events, rows)


def job_events(conn: Connection, job_id: int) -> list[JobEvent]:
    rows = conn.execute(
        select(db.events).where(db.events.c.job_id == job_id).order_by(db.events.c.id)
    )
    return [
        JobEvent(
            time=r.time,
            kind=r.kind,
            message=r.message,
            node=r.node,
            from_state=r.from_state,
            to_state=r.to_state,
            epoch=r.epoch,
        )
        for r in rows
    ]


def node_moves(conn: Connection, node: str) -> list[tuple[str, str]]:
    """A node's state transitions, (from, to), oldest first."""
    e = db.events.c
    rows = conn.execute(
        select(e.from_state, e.to_state)
        .where(e.node == node, e.job_id.is_(None), e.to_state.is_not(None))
        .order_by(e.id)
    )
    return [(r.from_state, r.to_state) for r in rows]


# ----------------------------------------------------------------------------- nodes
def all_nodes(conn: Connection) -> list[NodeRecord]:
    return [NodeRecord.from_row(r) for r in conn.execute(select(db.nodes))]


def upsert_node(conn: Connection, node: NodeRecord, now: float, new: bool) -> None:
    row = node.row()
    if new:
        conn.execute(insert(db.nodes).values(**row, registered=now))
    else:
        del row["name"]
        conn.execute(update(db.nodes).where(db.nodes.c.name == node.name).values(**row))


def set_node_state(conn: Connection, node: NodeRecord) -> None:
    conn.execute(
        update(db.nodes)
        .where(db.nodes.c.name == node.name)
        .values(
            state=node.state.value,
            reason=node.reason,
            drain_cause=None if node.drain_cause is None else node.drain_cause.value,
            drain_reason=node.drain_reason,
        )
    )


# ----------------------------------------------------------------------------- teams, users
def all_teams(conn: Connection) -> list[TeamSpec]:
    return [
        TeamSpec(
            name=r.name,
            quota_gpus=r.quota_gpus,
            cohort=r.cohort,
            borrowing_limit=r.borrowing_limit,
            weight=r.weight,
            qos=split_list(r.qos),
        )
        for r in conn.execute(select(db.teams).order_by(db.teams.c.name))
    ]


def split_list(value: str | None) -> list[str] | None:
    """A comma-separated column's values (None stays None: not set)."""
    return None if value is None else [v for v in value.split(",") if v]


def join_list(values: Sequence[str] | None) -> str | None:
    return None if values is None else ",".join(values)


def put_team(conn: Connection, team: TeamSpec, now: float) -> None:
    values = team.model_dump()
    values["qos"] = join_list(team.qos)
    exists = conn.execute(select(db.teams.c.name).where(db.teams.c.name == team.name)).first()
    if exists:
        del values["name"]
        conn.execute(update(db.teams).where(db.teams.c.name == team.name).values(**values))
    else:
        conn.execute(insert(db.teams).values(**values, created=now))


def team_members(conn: Connection) -> dict[str, list[str]]:
    members: dict[str, list[str]] = {}
    for r in conn.execute(select(db.memberships).order_by(db.memberships.c.user)):
        members.setdefault(r.team, []).append(r.user)
    return members


def user_exists(conn: Connection, name: str) -> bool:
    return conn.execute(select(db.users.c.name).where(db.users.c.name == name)).first() is not None


def add_user(
    conn: Connection,
    name: str,
    admin: bool,
    teams: Sequence[str],
    admin_of: Sequence[str],
    default_team: str | None,
    now: float,
    uid: int | None = None,
    gid: int | None = None,
) -> None:
    conn.execute(
        insert(db.users).values(
            name=name,
            admin=admin,
            default_team=default_team,
            created=now,
            unix_uid=uid,
            unix_gid=gid,
        )
    )
    for team in dict.fromkeys([*teams, *admin_of]):
        conn.execute(
            insert(db.memberships).values(user=name, team=team, team_admin=team in admin_of)
        )


def users(conn: Connection) -> list[UserInfo]:
    teams: dict[str, list[str]] = {}
    admin_of: dict[str, list[str]] = {}
    for r in conn.execute(select(db.memberships)):
        teams.setdefault(r.user, []).append(r.team)
        if r.team_admin:
            admin_of.setdefault(r.user, []).append(r.team)
    return [
        UserInfo(
            name=r.name,
            admin=bool(r.admin),
            teams=sorted(teams.get(r.name, [])),
            team_admin_of=sorted(admin_of.get(r.name, [])),
            default_team=r.default_team,
            uid=r.unix_uid,
            gid=r.unix_gid,
            qos=split_list(r.qos),
            disabled=bool(r.disabled),
        )
        for r in conn.execute(select(db.users).order_by(db.users.c.name))
    ]


def set_unix_account(conn: Connection, name: str, uid: int | None, gid: int | None) -> None:
    """Map user `name` to a Unix uid/gid (None, None: to the account with its name)."""
    conn.execute(update(db.users).where(db.users.c.name == name).values(unix_uid=uid, unix_gid=gid))


def unix_accounts(conn: Connection) -> dict[str, tuple[int | None, int | None]]:
    """Every user's (uid, gid) mapping, for the mirror."""
    query = select(db.users.c.name, db.users.c.unix_uid, db.users.c.unix_gid)
    return {r.name: (r.unix_uid, r.unix_gid) for r in conn.execute(query)}


def set_user_qos(conn: Connection, name: str, qos: Sequence[str] | None) -> bool:
    result = conn.execute(
        update(db.users).where(db.users.c.name == name).values(qos=join_list(qos))
    )
    return bool(result.rowcount)


# ----------------------------------------------------------------------------- tokens
def add_token(
    conn: Connection,
    hashed: str,
    kind: str,
    user: str | None,
    node: str | None,
    description: str,
    now: float,
    expires: float | None = None,
    parent_id: int | None = None,
    single_use: bool = False,
    bind_nodes: Sequence[str] = (),
    bind_addresses: Sequence[str] = (),
) -> int:
    result = conn.execute(
        insert(db.tokens).values(
            hash=hashed,
            kind=kind,
            user=user,
            node=node,
            description=description,
            created=now,
            revoked=False,
            expires=expires,
            parent_id=parent_id,
            single_use=single_use,
            bind_nodes=",".join(bind_nodes) or None,
            bind_addresses=",".join(bind_addresses) or None,
        )
    )
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def token_by_hash(conn: Connection, hashed: str) -> Any:
    return conn.execute(
        select(db.tokens).where(db.tokens.c.hash == hashed, db.tokens.c.revoked.is_(False))
    ).first()


def user_row(conn: Connection, name: str) -> Any:
    return conn.execute(select(db.users).where(db.users.c.name == name)).first()


def memberships_of(conn: Connection, name: str) -> list[tuple[str, bool]]:
    rows = conn.execute(select(db.memberships).where(db.memberships.c.user == name))
    return [(r.team, bool(r.team_admin)) for r in rows]


def revoke_node_tokens(conn: Connection, node: str) -> None:
    conn.execute(
        update(db.tokens)
        .where(db.tokens.c.kind == "node", db.tokens.c.node == node)
        .values(revoked=True)
    )


def token_row(conn: Connection, token_id: int) -> Any:
    return conn.execute(select(db.tokens).where(db.tokens.c.id == token_id)).first()


def revoke_token(conn: Connection, token_id: int) -> bool:
    """Revoke a token and every token it minted, and theirs (a minted token dies with its
    parent)."""
    result = conn.execute(update(db.tokens).where(db.tokens.c.id == token_id).values(revoked=True))
    if not result.rowcount:
        return False
    todo = [token_id]
    while todo:
        children = [
            r.id
            for r in conn.execute(
                select(db.tokens.c.id).where(
                    db.tokens.c.parent_id.in_(todo), db.tokens.c.revoked.is_(False)
                )
            )
        ]
        if children:
            conn.execute(update(db.tokens).where(db.tokens.c.id.in_(children)).values(revoked=True))
        todo = children
    return True


def use_single_use_token(conn: Connection, token_id: int) -> bool:
    """Spend a single-use token: True if it was still unrevoked (this caller spent it)."""
    result = conn.execute(
        update(db.tokens)
        .where(db.tokens.c.id == token_id, db.tokens.c.revoked.is_(False))
        .values(revoked=True)
    )
    return bool(result.rowcount)


def tokens(conn: Connection, user: str | None = None) -> list[TokenInfo]:
    """Every token (`user`: only that user's API tokens)."""
    query = select(db.tokens).order_by(db.tokens.c.id)
    if user is not None:
        query = query.where(db.tokens.c.user == user, db.tokens.c.kind == "api")
    return [
        TokenInfo(
            id=r.id,
            user=r.user,
            kind=r.kind,
            description=r.description or (f"node {r.node}" if r.node else ""),
            created=r.created,
            last_used=r.last_used,
            revoked=bool(r.revoked),
            expires=r.expires,
            node=r.node,
            single_use=bool(r.single_use),
            nodes=split_list(r.bind_nodes) or [],
            addresses=split_list(r.bind_addresses) or [],
        )
        for r in conn.execute(query)
    ]


def delete_all(conn: Connection) -> None:
    """Empty every table (tests reuse one PostgreSQL database)."""
    for table in reversed(db.metadata.sorted_tables):
        conn.execute(delete(table))


def dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))
