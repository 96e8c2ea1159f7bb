"""`phalanx exec` with real Unix users (a real head and agent, TLS): the command runs as
the job's user beside its rank, in the rank's cgroup; nobody else gets in: not another
user, not a node's credential, not into a job that ended."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.api.models import ExecFrame, ExecRequest, UserCreate
from phalanx.client.api import ApiError, PhalanxClient
from phalanx.local import LocalCluster
from tests.e2e.helpers import job, read_log, sh, submit, wait_for, wait_state

from .conftest import Person

SECRET = "s3cret-of-alice-exec"


def _running(person: Person) -> tuple[int, int]:
    """A long job of `person` with a secret in its environment: (job id, its pid)."""
    job_id = submit(
        person.client,
        job(person.home, sh("echo $$; exec sleep 300"), env={"DB_PASSWORD": SECRET}),
    )
    wait_state(person.client, job_id, "R")

    def pid_printed() -> str | None:
        try:
            return read_log(person.client, job_id)[0].strip() or None
        except ApiError as e:  # R, but its agent has not started the rank yet: no log
            if e.status != 404:
                raise
            return None

    text = wait_for("the rank's pid", pid_printed)
    return job_id, int(text.splitlines()[0])


def _exec(client: PhalanxClient, job_id: int, argv: list[str]) -> list[ExecFrame]:
    return list(client.exec(job_id, ExecRequest(argv=argv)))


def _out(frames: list[ExecFrame]) -> str:
    return "".join(f.data for f in frames if f.kind == "stdout")


def test_exec_runs_as_the_jobs_user_beside_its_rank(people: dict[str, Person]) -> None:
    alice = people["alice"]
    job_id, pid = _running(alice)
    script = "id -u; id -g; pwd; echo $DB_PASSWORD; cat /proc/self/cgroup; exit 4"
    frames = _exec(alice.client, job_id, ["bash", "-c", script])
    uid, gid, cwd, secret, *cgroup = _out(frames).splitlines()
    assert (int(uid), int(gid)) == (alice.uid, alice.gid)
    assert (cwd, secret) == (str(alice.home), SECRET)  # the rank's directory and environment
    # In the rank's own cgroup (its job's, where the node confines jobs), not the agent's.
    assert "\n".join(cgroup) + "\n" == Path(f"/proc/{pid}/cgroup").read_text()
    assert frames[-1].kind == "exit" and frames[-1].exit_code == 4
    events = [e for e in alice.client.job(job_id).events if e.kind == "exec"]
    assert [e.message for e in events] == [f"{alice.name} ran 'bash' beside rank 0 on 127.0.0.2"]
    alice.client.cancel(job_id)


def test_another_user_cannot_exec_into_someones_job(people: dict[str, Person], base: Path) -> None:
    alice, bob = people["alice"], people["bob"]
    job_id, _ = _running(alice)
    marker = base / "bob-was-here"
    with pytest.raises(ApiError) as refused:
        _exec(bob.client, job_id, ["touch", str(marker)])
    assert refused.value.status == 403
    assert "teammates see its metadata only" in refused.value.detail
    assert not marker.exists()
    assert not [e for e in alice.client.job(job_id).events if e.kind == "exec"]
    assert alice.client.job(job_id).job.state == "R"  # the victim runs on, untouched
    alice.client.cancel(job_id)


def test_a_node_credential_cannot_exec(
    people: dict[str, Person], cluster: LocalCluster, base: Path
) -> None:
    alice = people["alice"]
    job_id, _ = _running(alice)
    node_token = (cluster.state_dir / f"agent-{cluster.addresses[0]}" / "node.token").read_text()
    marker = base / "node-was-here"
    with cluster.client(node_token.strip()) as node, pytest.raises(ApiError) as refused:
        _exec(node, job_id, ["touch", str(marker)])
    assert refused.value.status == 403
    assert "needs a user's API token" in refused.value.detail
    assert not marker.exists()
    alice.client.cancel(job_id)


def test_a_team_admin_may_exec_and_the_command_still_runs_as_the_jobs_user(
    people: dict[str, Person], cluster: LocalCluster
) -> None:
    alice = people["alice"]
    job_id, _ = _running(alice)
    with cluster.client() as admin:
        try:
            admin.create_user(UserCreate(name="phxtest-lead", team_admin_of=["default"]))
        except ApiError as e:
            assert e.status == 409, e  # made by an earlier run
        token = admin.create_token("phxtest-lead").token
    with cluster.client(token) as lead:
        frames = _exec(lead, job_id, ["id", "-u"])
    assert int(_out(frames)) == alice.uid  # alice's rights, not the lead's nor root's
    alice.client.cancel(job_id)


def test_exec_into_a_job_that_ended_is_refused(people: dict[str, Person]) -> None:
    alice = people["alice"]
    job_id = submit(alice.client, job(alice.home, ["true"]))
    wait_state(alice.client, job_id, "CD", timeout=60)
    with pytest.raises(ApiError) as refused:
        _exec(alice.client, job_id, ["true"])
    assert refused.value.status == 409
    assert f"job {job_id} has ended (CD)" in refused.value.detail
