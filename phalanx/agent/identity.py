"""Who a job runs as on this node: its user's Unix account, never the agent's by accident."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

# A job's processes create files readable by their owner only (logs, checkpoints).
JOB_UMASK = 0o077
SANE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Refused(Exception):
    """This node will not run the job as anyone: the message says why and what to fix."""


@dataclass(frozen=True)
class RunAs:
    """A Unix identity: uid, primary gid, supplementary groups, and its passwd entry's
    login name, home and shell."""

    login: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str

    @property
    def switches(self) -> bool:
        """Whether starting a process as this identity changes user (the agent is root)."""
        return (self.uid, self.gid) != (os.getuid(), os.getgid())

    def env(self) -> dict[str, str]:
        """The login variables of this account (a job's base environment)."""
        return {
            "HOME": self.home,
            "USER": self.login,
            "LOGNAME": self.login,
            "SHELL": self.shell,
        }


def resolve(user: str, uid: int | None, gid: int | None) -> RunAs:
    """The account Phalanx user `user` runs as here: `uid`/`gid` when an admin set them,
    else the Unix account named `user`. Raises Refused when there is no such account, when
    it is root by name only, or when this agent is not root and the account is not its own
    (a personal agent runs jobs only as itself)."""
    me = os.getuid()
    try:
        entry = pwd.getpwuid(uid) if uid is not None else pwd.getpwnam(user)
    except KeyError:
        if uid is not None and uid == me and me != 0:
            # Our own uid without a passwd entry (containers): we switch nothing.
            return _self(user)
        if uid is not None:
            raise Refused(
                f"user {user!r} maps to uid {uid}, which has no account on this node"
            ) from None
        raise Refused(
            f"user {user!r} has no Unix account on this node (an admin maps it to one: "
            f"phalanx admin user set {user} --uid UID --gid GID)"
        ) from None
    if uid is None and entry.pw_uid == 0:
        raise Refused(
            f"user {user!r} names the root account; jobs run as root only when an admin "
            f"maps the user to uid 0 explicitly"
        )
    if me != 0 and entry.pw_uid != me:
        raise Refused(
            f"this agent runs as uid {me}, not root, and starts only jobs of users that map "
            f"to it; user {user!r} maps to uid {entry.pw_uid}"
        )
    primary = entry.pw_gid if gid is None else gid
    if me != 0:
        primary = os.getgid()  # a personal agent cannot change its group: run as itself
        groups = tuple(os.getgroups())
    else:
        groups = tuple(os.getgrouplist(entry.pw_name, primary))
    return RunAs(
        login=entry.pw_name,
        uid=entry.pw_uid,
        gid=primary,
        groups=groups,
        home=entry.pw_dir or "/",
        shell=entry.pw_shell or "/bin/sh",
    )


def _self(user: str) -> RunAs:
    """This process's own identity, for a uid without a passwd entry."""
    return RunAs(
        login=os.environ.get("USER", user),
        uid=os.getuid(),
        gid=os.getgid(),
        groups=tuple(os.getgroups()),
        home=os.environ.get("HOME", "/"),
        shell="/bin/sh",
    )


def sane_env() -> dict[str, str]:
    """What every job gets before its own variables: a standard PATH and the agent's
    locale, nothing else of the agent's environment (it may hold credentials)."""
    return {"PATH": SANE_PATH, "LANG": os.environ.get("LANG", "C.UTF-8")}
