"""The attack table of docs/security.md: each attack fails, and its victim is untouched."""

from __future__ import annotations

import os
from pathlib import Path

from phalanx.local import LocalCluster
from tests.e2e.helpers import final_log, job, read_log, sh, submit, wait_for, wait_state

from .conftest import Person

SECRET = "s3cret-of-alice-db"


def _alice_running(alice: Person) -> tuple[int, int]:
    """Alice's long job holding a secret in its environment: (job id, its pid)."""
    job_id = submit(
        alice.client,
        job(alice.home, sh("echo $$; exec sleep 300"), env={"DB_PASSWORD": SECRET}),
    )
    wait_state(alice.client, job_id, "R")
    text = wait_for("alice's pid", lambda: read_log(alice.client, job_id)[0].strip() or None)
    return job_id, int(text.splitlines()[0])


def _ended(person: Person, job_id: int) -> tuple[str, str, str]:
    """(state, stdout, stderr) of a job once it ended."""
    info = wait_state(person.client, job_id, ("CD", "F"), timeout=60)
    return (
        info.state,
        final_log(person.client, job_id),
        final_log(person.client, job_id, 0, "stderr"),
    )


def test_bob_cannot_read_the_environment_of_alices_job(people: dict[str, Person]) -> None:
    alice, bob = people["alice"], people["bob"]
    alice_job, pid = _alice_running(alice)
    spy = submit(
        bob.client,
        job(bob.home, sh(f"tr '\\0' '\\n' < /proc/{pid}/environ; echo rc=$?")),
    )
    _, out, err = _ended(bob, spy)
    assert SECRET not in out + err
    assert "PHALANX_STEP_TOKEN" not in out + err
    assert "Permission denied" in err
    assert alice.client.job(alice_job).job.state == "R"  # the victim runs on, untouched
    alice.client.cancel(alice_job)


def test_a_job_cannot_read_the_agents_environment_nor_state(
    people: dict[str, Person], cluster: LocalCluster
) -> None:
    bob = people["bob"]
    agent = cluster.agent_pid(cluster.addresses[0])
    agent_state = cluster.state_dir / f"agent-{cluster.addresses[0]}"
    script = "; ".join(
        [
            f"tr '\\0' '\\n' < /proc/{agent}/environ",
            f"cat {cluster.head_dir}/admin.token {cluster.head_dir}/join.token",
            f"ls {agent_state} {agent_state}/jobs {agent_state}/logs",
            f"cat {agent_state}/lease {agent_state}/jobs/*/*/pgids",
            "env",
        ]
    )
    _, out, err = _ended(bob, submit(bob.client, job(bob.home, sh(script))))
    for secret in (cluster.join_token, cluster.admin_token):
        assert secret not in out + err
    assert "PHALANX_JOIN_TOKEN" not in out
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert env["USER"] == bob.name and env["HOME"]  # its own login variables, not root's


def test_bob_cannot_truncate_alices_file_with_output(people: dict[str, Person], base: Path) -> None:
    alice, bob = people["alice"], people["bob"]
    shared = base / "top" / "alice-shared"
    shared.mkdir(mode=0o755, exist_ok=True)
    os.chown(shared, alice.uid, alice.gid)
    victim = shared / "results.txt"
    victim.write_text("alice's results\n")
    os.chown(victim, alice.uid, alice.gid)
    victim.chmod(0o644)  # bob may read it, not write it
    attack = submit(bob.client, job(bob.home, sh("echo bob was here"), output=str(victim)))
    state, _out, err = _ended(bob, attack)
    assert victim.read_text() == "alice's results\n"
    assert victim.stat().st_uid == alice.uid
    assert state == "F"
    assert f"LaunchFailed: cannot write {victim} as user {bob.name}" in err
    _launch_failed_once(bob, attack)


def _launch_failed_once(person: Person, job_id: int) -> None:
    """The job failed as LaunchFailed (the same cause on any node) and was not requeued."""
    info = person.client.job(job_id).job
    assert (info.reason, info.restart_count) == ("LaunchFailed", 0), info


def test_output_naming_a_directory_fails_the_launch_as_the_user(people: dict[str, Person]) -> None:
    bob = people["bob"]
    folder = bob.home / "a-folder"
    folder.mkdir(exist_ok=True)
    os.chown(folder, bob.uid, bob.gid)
    attack = submit(bob.client, job(bob.home, sh("echo x"), output=str(folder)))
    state, _out, err = _ended(bob, attack)
    assert state == "F"
    assert f"LaunchFailed: cannot write {folder} as user {bob.name}" in err
    assert folder.is_dir() and not any(folder.iterdir())
    _launch_failed_once(bob, attack)


def test_output_cannot_escape_upwards(people: dict[str, Person], base: Path) -> None:
    bob = people["bob"]
    attack = submit(bob.client, job(bob.home, sh("echo escaped"), output="../../escaped-%j.txt"))
    state, _out, err = _ended(bob, attack)
    assert not (base / f"escaped-{attack}.txt").exists()
    assert state == "F"
    assert "LaunchFailed: cannot write" in err


def test_bob_cannot_work_in_alices_private_directory(people: dict[str, Person]) -> None:
    alice, bob = people["alice"], people["bob"]
    before = sorted(p.name for p in alice.home.iterdir())
    attack = submit(bob.client, job(alice.home, sh("ls; echo x > planted"), output="bob-%j.out"))
    state, _out, err = _ended(bob, attack)
    assert state == "F"
    assert f"LaunchFailed: working directory {alice.home}: user {bob.name} may not enter it" in err
    assert sorted(p.name for p in alice.home.iterdir()) == before  # nothing created there
    _launch_failed_once(bob, attack)


def test_a_missing_working_directory_fails_the_launch_and_is_not_created(
    people: dict[str, Person],
) -> None:
    # Checked as the job's user; the checkpoint dir the head puts inside the working
    # directory must not create it either (a mistyped -D ran the job in a new dir).
    bob = people["bob"]
    typo = bob.home / "no-such" / "dir"
    attack = submit(bob.client, job(typo, sh("echo ran")))
    state, out, err = _ended(bob, attack)
    assert (state, out) == ("F", "")
    assert f"LaunchFailed: working directory {typo} does not exist on this node" in err
    assert not (bob.home / "no-such").exists()
    _launch_failed_once(bob, attack)


def test_logs_never_follow_a_symlink_the_job_planted(
    people: dict[str, Person], cluster: LocalCluster
) -> None:
    bob = people["bob"]
    # The job writes, then swaps its -o file for a link to /etc/shadow and its -e file's
    # directory for a link to the head's state dir (where admin.token lives).
    script = (
        "echo ordinary output; echo ordinary error >&2; "
        "rm out.txt; ln -s /etc/shadow out.txt; "
        f"mv logs logs.old; ln -s {cluster.head_dir} logs"
    )
    (bob.home / "logs").mkdir(exist_ok=True)
    os.chown(bob.home / "logs", bob.uid, bob.gid)
    attack = submit(
        bob.client,
        job(bob.home, sh(script), output="out.txt", error="logs/admin.token"),
    )
    _state, out, err = _ended(bob, attack)
    shadow = Path("/etc/shadow").read_text()
    assert "root:" in shadow
    assert "root:" not in out
    assert cluster.admin_token not in err
    assert (bob.home / "out.txt").is_symlink()  # the attack did happen


def test_a_user_without_a_unix_account_is_refused(people: dict[str, Person]) -> None:
    ghost = people["ghost"]
    refused = submit(ghost.client, job(ghost.home, sh("echo ran > ran.txt")))
    state, _out, err = _ended(ghost, refused)
    assert state == "F"
    assert "LaunchFailed: user 'phxtest-ghost' has no Unix account on this node" in err
    assert not (ghost.home / "ran.txt").exists()


def test_each_user_runs_as_its_own_account(people: dict[str, Person]) -> None:
    """The positive case: the job is alice, with her groups, her umask, in her dir."""
    alice = people["alice"]
    ok = submit(
        alice.client,
        job(alice.home, sh("id -u; id -g; umask; pwd; echo data > mine.txt"), output="o-%j"),
    )
    state, out, err = _ended(alice, ok)
    assert state == "CD", err
    assert out.split() == [str(alice.uid), str(alice.gid), "0077", str(alice.home)]
    made = alice.home / "mine.txt"
    assert (made.stat().st_uid, made.stat().st_mode & 0o777) == (alice.uid, 0o600)


def test_no_daemon_logs_a_secret(people: dict[str, Person], cluster: LocalCluster) -> None:
    """The join, admin, node and step tokens and a job's environment values appear in no
    head or agent log (their own log files, written while jobs ran and ended)."""
    alice = people["alice"]
    job_id = submit(
        alice.client,
        job(
            alice.home,
            sh('echo "$PHALANX_STEP_TOKEN"; exec sleep 300'),
            env={"DB_PASSWORD": SECRET},
        ),
    )
    wait_state(alice.client, job_id, "R")
    step_token = wait_for(
        "its step token", lambda: read_log(alice.client, job_id)[0].strip() or None
    )
    assert step_token.startswith("phxs_")
    alice.client.cancel(job_id)
    wait_state(alice.client, job_id, ("CA",), timeout=60)
    agent_state = cluster.state_dir / f"agent-{cluster.addresses[0]}"
    secrets = {
        "the job's DB_PASSWORD": SECRET,
        "its step token": step_token,
        "the admin token": cluster.admin_token,
        "the join token": cluster.join_token,
        "the node credential": (agent_state / "node.token").read_text().strip(),
    }
    logs = {p.name: p.read_text(errors="replace") for p in cluster.log_dir.glob("*.log")}
    assert logs, "no daemon logs to check"
    leaks = [
        f"{what} in {name}"
        for what, value in secrets.items()
        for name, text in logs.items()
        if value and value in text
    ]
    assert leaks == []
