"""Administration against a real head process and the real CLI: the last admin token is kept
unless --force, `admin recover` mints a new one from the state dir, users are disabled and
deleted, teams deleted, dead nodes removed, and a restarted head shows no fake heartbeat."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from phalanx.api.models import NodeList, UserList
from phalanx.cli.main import app
from tests.head.conftest import HeadProc, start_head, stop_head
from tests.head.heads import start_agent, wait_for

JOB = {"command": ["sleep", "60"], "workdir": "/tmp"}


@pytest.fixture
def head(tmp_path: Path) -> Iterator[HeadProc]:
    h = start_head(tmp_path / "head", None)
    try:
        yield h
    finally:
        stop_head(h.proc)


def cli(head: HeadProc, *args: str, token: str | None = None) -> Result:
    env = {"PHALANX_HEAD": head.url, "PHALANX_TOKEN": token or head.admin_token}
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


def test_last_admin_token_is_kept_unless_forced_and_recover_mints_one(head: HeadProc) -> None:
    first = head.admin_token
    refused = cli(head, "token", "revoke", "1")
    assert refused.exit_code == 2
    assert "last working admin token" in refused.stderr and "--force" in refused.stderr
    assert refused.stderr.count("\n") == 1  # one line
    assert cli(head, "whoami").exit_code == 0  # still works

    # A token minted with it dies with it, so it does not count as another admin token.
    child = head.client().post("/v1/tokens", json={"user": "admin"}).json()
    assert cli(head, "token", "revoke", "1", token=child["token"]).exit_code == 2
    # With another admin's token, the first may go.
    r = head.client().post("/v1/users", json={"name": "ops", "admin": True})
    assert r.status_code == 201, r.text
    issued = head.client().post("/v1/tokens", json={"user": "ops"}).json()
    assert cli(head, "token", "revoke", "1", token=issued["token"]).exit_code == 0
    assert cli(head, "whoami", token=first).exit_code == 2
    assert cli(head, "whoami", token=child["token"]).exit_code == 2
    # The second is now the last one: --force revokes it, and nobody is admin any more.
    again = cli(head, "token", "revoke", str(issued["id"]), token=issued["token"])
    assert again.exit_code == 2 and "last working admin token" in again.stderr
    forced = cli(head, "token", "revoke", str(issued["id"]), "--force", token=issued["token"])
    assert forced.exit_code == 0, forced.stderr
    lost = cli(head, "whoami", token=issued["token"])
    assert lost.exit_code == 2 and "revoked" in lost.stderr

    # On the head's machine, with the running head: a new admin token, accepted at once.
    recovered = CliRunner().invoke(app, ["admin", "recover", "--state-dir", str(head.state_dir)])
    assert recovered.exit_code == 0, recovered.output
    assert "admin.token" in recovered.stdout
    new = head.admin_token
    assert new not in (first, issued["token"])
    me = cli(head, "whoami", token=new)
    assert me.exit_code == 0 and "role:  admin" in me.stdout


def test_recover_refuses_a_directory_that_is_not_a_head_state_dir(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["admin", "recover", "--state-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and "phalanx.db" in result.stderr


def test_disabled_user_is_refused_deleted_user_is_gone(head: HeadProc) -> None:
    admin = head.client()
    assert admin.post("/v1/users", json={"name": "alice", "teams": ["default"]}).status_code == 201
    alice = admin.post("/v1/tokens", json={"user": "alice"}).json()["token"]
    assert cli(head, "whoami", token=alice).exit_code == 0
    job = head.client(alice).post("/v1/jobs", json=JOB).json()["job_ids"][0]

    disabled = cli(head, "admin", "user", "disable", "alice")
    assert disabled.exit_code == 0, disabled.stderr
    refused = cli(head, "whoami", token=alice)
    assert refused.exit_code == 2 and "disabled" in refused.stderr
    listed = UserList.model_validate_json(cli(head, "admin", "user", "list", "--json").stdout)
    assert [u.disabled for u in listed.users if u.name == "alice"] == [True]
    assert "disabled" in cli(head, "admin", "user", "list").stdout

    assert cli(head, "admin", "user", "enable", "alice").exit_code == 0
    assert cli(head, "whoami", token=alice).exit_code == 0

    # A user with a live job is not deleted; once it has ended, they are (tokens and all).
    busy = cli(head, "admin", "user", "delete", "alice")
    assert busy.exit_code == 2 and "live job" in busy.stderr and str(job) in busy.stderr
    assert cli(head, "cancel", str(job)).exit_code == 0
    wait_for("job ended", lambda: admin.get(f"/v1/jobs/{job}").json()["job"]["state"] == "CA")
    deleted = cli(head, "admin", "user", "delete", "alice")
    assert deleted.exit_code == 0, deleted.stderr
    assert cli(head, "whoami", token=alice).exit_code == 2
    assert "alice" not in cli(head, "admin", "user", "list").stdout
    assert cli(head, "admin", "user", "delete", "alice").exit_code == 2  # no such user
    # Its ended job stays in the history.
    assert admin.get(f"/v1/jobs/{job}").json()["job"]["user"] == "alice"


def test_the_only_admin_user_is_not_disabled_or_deleted_without_force(head: HeadProc) -> None:
    for args in (("disable", "admin"), ("delete", "admin")):
        result = cli(head, "admin", "user", *args)
        assert result.exit_code == 2 and "last working admin token" in result.stderr
    assert cli(head, "whoami").exit_code == 0


def test_team_with_live_jobs_cannot_be_deleted(head: HeadProc) -> None:
    admin = head.client()
    assert admin.put("/v1/teams/vision", json={"name": "vision"}).status_code == 200
    r = admin.post("/v1/users", json={"name": "vic", "teams": ["vision"]})
    assert r.status_code == 201
    job = admin.post("/v1/jobs", json={**JOB, "team": "vision"}).json()["job_ids"][0]
    busy = cli(head, "admin", "team", "delete", "vision")
    assert busy.exit_code == 2 and "live job" in busy.stderr
    assert cli(head, "cancel", str(job)).exit_code == 0
    wait_for("job ended", lambda: admin.get(f"/v1/jobs/{job}").json()["job"]["state"] == "CA")
    assert cli(head, "admin", "team", "delete", "vision").exit_code == 0
    assert [t["name"] for t in admin.get("/v1/teams").json()["teams"]] == ["default"]
    vic = next(u for u in admin.get("/v1/users").json()["users"] if u["name"] == "vic")
    assert vic["teams"] == [] and vic["default_team"] is None
    assert cli(head, "admin", "team", "delete", "vision").exit_code == 2


def test_dead_node_is_removed_and_a_restarted_head_fakes_no_heartbeat(tmp_path: Path) -> None:
    settings = "heartbeat_s=0.3, lease_s=1.5, requeue_margin_s=0.3"
    head = start_head(tmp_path / "head", None, settings)
    agents = [
        start_agent(head.url, head.join_token, a, tmp_path) for a in ("127.0.0.2", "127.0.0.3")
    ]
    try:
        api = head.client()

        def states() -> dict[str, str]:
            listed = NodeList.model_validate(api.get("/v1/nodes").json())
            return {n.name: n.state for n in listed.nodes}

        wait_for("2 nodes up", lambda: states() == {"127.0.0.2": "up", "127.0.0.3": "up"})
        up = cli(head, "admin", "node", "remove", "127.0.0.3")
        assert up.exit_code == 2 and "only a down node" in up.stderr
        agents[1].kill()
        wait_for("node down", lambda: states().get("127.0.0.3") == "down")

        # A head restarted on the same database: the down node's heartbeat age is unknown
        # (it is not heard), not counted from the restart.
        stop_head(head.proc)
        head = start_head(tmp_path / "head", None, settings)
        listed = NodeList.model_validate(head.client().get("/v1/nodes").json())
        dead = next(n for n in listed.nodes if n.name == "127.0.0.3")
        assert dead.heartbeat_age_s is None and dead.last_heartbeat is None
        assert "127.0.0.3" in cli(head, "nodes").stdout

        removed = cli(head, "admin", "node", "remove", "127.0.0.3")
        assert removed.exit_code == 0, removed.stderr
        api = head.client()
        assert "127.0.0.3" not in states()
        assert cli(head, "admin", "node", "remove", "127.0.0.3").exit_code == 2
        # The name may join again later.
        agents[1] = start_agent(head.url, head.join_token, "127.0.0.3", tmp_path)
        wait_for("node back", lambda: states().get("127.0.0.3") == "up")
    finally:
        for agent in agents:
            agent.stop()
        stop_head(head.proc)
