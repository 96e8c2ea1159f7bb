"""Which Unix account a job runs as, and when a node refuses (docs/security.md)."""

from __future__ import annotations

import os
import pwd

import pytest

from phalanx.agent.identity import Refused, resolve

NOBODY = pwd.getpwnam("nobody")


def test_explicit_uid_wins_over_the_name() -> None:
    me = pwd.getpwuid(os.getuid())
    ra = resolve("whatever-name", me.pw_uid, None)
    assert (ra.uid, ra.gid, ra.login, ra.home) == (me.pw_uid, me.pw_gid, me.pw_name, me.pw_dir)
    assert ra.env()["USER"] == me.pw_name


@pytest.mark.parametrize(
    ("user", "uid", "why"),
    [
        ("no-such-user-xyz", None, "has no Unix account on this node"),
        ("someone", 2**31 - 2, "which has no account on this node"),
        ("root", None, "names the root account"),
    ],
)
def test_refused(user: str, uid: int | None, why: str) -> None:
    with pytest.raises(Refused, match=why):
        resolve(user, uid, None)


def test_a_personal_agent_runs_only_its_own_users(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getuid", lambda: NOBODY.pw_uid)
    assert resolve("nobody", None, None).uid == NOBODY.pw_uid
    assert resolve("anyone", NOBODY.pw_uid, None).uid == NOBODY.pw_uid
    with pytest.raises(Refused, match=f"this agent runs as uid {NOBODY.pw_uid}, not root"):
        resolve("root", 0, None)
