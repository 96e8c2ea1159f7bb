"""The head's administration of who and what exists: revoking tokens without locking every
admin out, disabling and deleting users, deleting teams, removing dead nodes, and minting a
fresh admin token from the state dir when no admin credential is left (`phalanx admin
recover`)."""

from __future__ import annotations

import os
import time
from collections.abc import Set as AbstractSet
from pathlib import Path

from sqlalchemy import Connection, Engine, delete, select, update

from phalanx.api import models as m
from phalanx.core import NodeState
from phalanx.head import auth, db, peers, store
from phalanx.head.auth import Principal
from phalanx.head.control import HeadError
from phalanx.head.mirror import Tx
from phalanx.head.service import Head

LAST_ADMIN_HINT = (
    "no admin could use the API afterwards; add --force to do it anyway (then "
    "`phalanx admin recover --state-dir DIR`, run on the head's machine, mints a new "
    "admin token)"
)


# ----------------------------------------------------------------------------- tokens
def revoke_token(head: Head, who: Principal, token_id: int, force: bool) -> None:
    """Revoke a token and those it minted (admins any, users their own API tokens); refused
    (409) when it would leave no working admin token, unless `force`."""

    def op(tx: Tx) -> None:
        row = store.token_row(tx.conn, token_id)
        if row is None:
            raise HeadError(404, f"no token {token_id}")
        if not who.admin and (row.kind != "api" or row.user != who.user):
            raise HeadError(403, f"token {token_id} is not yours")
        gone = _with_descendants(tx.conn, token_id)
        if not force and not _admin_tokens_left(tx.conn, tx.now, lost_tokens=gone):
            raise HeadError(
                409, f"token {token_id} is the last working admin token: " + LAST_ADMIN_HINT
            )
        store.revoke_token(tx.conn, token_id)

    head.control.call(op)
    head.forget_principals()


def _with_descendants(conn: Connection, token_id: int) -> set[int]:
    """`token_id` and every token minted from it, transitively (what revoking it revokes)."""
    found = {token_id}
    todo = [token_id]
    while todo:
        rows = conn.execute(select(db.tokens.c.id).where(db.tokens.c.parent_id.in_(todo)))
        todo = [r.id for r in rows if r.id not in found]
        found.update(todo)
    return found


def _admin_tokens_left(
    conn: Connection,
    now: float,
    lost_tokens: AbstractSet[int] = frozenset(),
    lost_users: AbstractSet[str] = frozenset(),
) -> bool:
    """Whether some unrevoked, unexpired API token of an enabled admin would remain once
    `lost_tokens` are revoked and `lost_users` deleted or disabled."""
    t, u = db.tokens.c, db.users.c
    rows = conn.execute(
        select(t.id, t.user, t.expires)
        .join(db.users, u.name == t.user)
        .where(t.kind == "api", t.revoked.is_(False), u.admin.is_(True))
        .where(u.disabled.is_not(True))
    )
    return any(
        r.id not in lost_tokens
        and r.user not in lost_users
        and (r.expires is None or r.expires > now)
        for r in rows
    )


# ----------------------------------------------------------------------------- users
def set_disabled(head: Head, name: str, disabled: bool, force: bool) -> m.UserInfo:
    """Disable a user (their tokens stop working at once; their running jobs go on) or
    enable them again."""

    def op(tx: Tx) -> None:
        if not store.user_exists(tx.conn, name):
            raise HeadError(404, f"no user {name!r}")
        if disabled and not force and not _admin_tokens_left(tx.conn, tx.now, lost_users={name}):
            raise HeadError(
                409, f"user {name!r} holds the last working admin token: " + LAST_ADMIN_HINT
            )
        tx.conn.execute(update(db.users).where(db.users.c.name == name).values(disabled=disabled))
        what = "disabled" if disabled else "enabled"
        tx.event(tx.now, f"user_{what}", f"user {name} {what} by an admin")

    head.control.call(op)
    head.forget_principals()  # cached principals of the user's tokens
    return head.users_by_name()[name]


def delete_user(head: Head, name: str, force: bool) -> None:
    """Delete a user with no live job: their tokens are revoked, their memberships gone;
    their ended jobs stay in the history under their name."""

    def op(tx: Tx) -> None:
        if not store.user_exists(tx.conn, name):
            raise HeadError(404, f"no user {name!r}")
        live = sorted(j.id for j in head.mirror.jobs.values() if j.user == name)
        if live:
            raise HeadError(
                409,
                f"user {name!r} has {len(live)} live job(s) ({_ids(live)}): cancel them first "
                f"(or disable the user: `phalanx admin user disable {name}`)",
            )
        if not force and not _admin_tokens_left(tx.conn, tx.now, lost_users={name}):
            raise HeadError(
                409, f"user {name!r} holds the last working admin token: " + LAST_ADMIN_HINT
            )
        t = db.tokens.c
        tx.conn.execute(update(db.tokens).where(t.user == name).values(revoked=True))
        tx.conn.execute(delete(db.memberships).where(db.memberships.c.user == name))
        tx.conn.execute(delete(db.users).where(db.users.c.name == name))
        head.mirror.unix_accounts.pop(name, None)
        head.mirror.answers.invalidate_all()  # assignments carry the uid/gid
        tx.event(tx.now, "user_deleted", f"user {name} deleted by an admin")

    head.control.call(op)
    head.forget_principals()


# ----------------------------------------------------------------------------- teams
def delete_team(head: Head, name: str) -> None:
    """Delete a team with no live job: its memberships go; users whose default team it was
    have none until an admin sets one (their submits then need -p)."""

    def op(tx: Tx) -> None:
        exists = tx.conn.execute(select(db.teams.c.name).where(db.teams.c.name == name)).first()
        if exists is None:
            raise HeadError(404, f"no team {name!r}")
        live = sorted(j.id for j in head.mirror.jobs.values() if j.team == name)
        if live:
            raise HeadError(
                409, f"team {name!r} has {len(live)} live job(s) ({_ids(live)}): cancel them first"
            )
        u = db.users.c
        tx.conn.execute(update(db.users).where(u.default_team == name).values(default_team=None))
        tx.conn.execute(delete(db.memberships).where(db.memberships.c.team == name))
        tx.conn.execute(delete(db.teams).where(db.teams.c.name == name))
        tx.conn.execute(delete(db.idle_policies).where(db.idle_policies.c.team == name))
        head.mirror.teams.pop(name, None)
        head.mirror.team_qos.pop(name, None)
        head.mirror.core_dirty = True  # quotas and cohorts changed: rebuild
        tx.event(tx.now, "team_deleted", f"team {name} deleted by an admin")
        tx.kick = True

    head.control.call(op)
    head.usage.idle.set_policy(name, None)  # a team made again under the name starts afresh
    head.forget_principals()  # principals carry their teams


# ----------------------------------------------------------------------------- nodes
def remove_node(head: Head, name: str) -> None:
    """Forget a node that is down and holds no job: its record and credential go; an agent
    may join under the name again later with a join token."""
    mirror = head.mirror

    def op(tx: Tx) -> None:
        node = mirror.nodes.get(name)
        if node is None:
            raise HeadError(404, f"no node {name!r}")
        if node.state is not NodeState.DOWN:
            raise HeadError(
                409,
                f"node {name!r} is {node.state.value}: only a down node can be removed (stop "
                "its agent and wait for the lease, or `phalanx admin node replace` it)",
            )
        jobs = sorted(mirror.node_jobs.get(name, set()))
        if jobs:
            raise HeadError(
                409, f"node {name!r} still holds job(s) {_ids(jobs)}: wait until they are requeued"
            )
        store.revoke_node_tokens(tx.conn, name)
        tx.conn.execute(delete(db.nodes).where(db.nodes.c.name == name))
        del mirror.nodes[name]
        mirror.node_jobs.pop(name, None)
        mirror.node_failures.pop(name, None)
        mirror.peers_sent.pop(name, None)
        mirror.core_dirty = True
        mirror.peer_lists = peers.pick(mirror)
        tx.event(tx.now, "node_removed", "removed by an admin", node=name)
        tx.kick = True

    head.control.call(op)
    head.forget_principals()


def _ids(ids: list[int], shown: int = 5) -> str:
    text = ", ".join(map(str, ids[:shown]))
    return text + (", …" if len(ids) > shown else "")


# ----------------------------------------------------------------------------- recovery
def recover_admin(engine: Engine, user: str = "admin", description: str = "recover") -> str:
    """Mint a new API token for admin user `user` straight in the database (made, enabled
    and made admin again if need be), for an operator on the head's machine who lost every
    admin token. Returns the token (never stored in clear)."""
    now = time.time()
    token = auth.new_token("api")
    with engine.begin() as conn:
        if store.user_exists(conn, user):
            conn.execute(
                update(db.users).where(db.users.c.name == user).values(admin=True, disabled=False)
            )
        else:
            default = "default" if any(t.name == "default" for t in store.all_teams(conn)) else None
            store.add_user(conn, user, True, [default] if default else [], [], default, now)
        store.add_token(conn, auth.token_hash(token), "api", user, None, description, now)
    return token


def write_admin_token(state_dir: Path, token: str) -> Path:
    """Replace the head's `admin.token` (0600 from its creation: it is the root credential)."""
    path = state_dir / "admin.token"
    tmp = path.with_name(f".admin.token.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(token + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
