"""squeue, sacct and sinfo against a real head and two agents (fake GPUs): jobs taken to
each state, and the lines compared with the layouts Slurm 22.05 prints (man squeue, man
sacct, man sinfo: widths, alignment, headers, state words, time and id forms)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from phalanx.api.models import ArraySpec, JobInfo, TeamSpec, UserCreate
from phalanx.client.api import PhalanxClient
from phalanx.local import LocalCluster
from phalanx.slurmcli import sacct, sinfo, squeue
from tests.e2e.helpers import job, sh, submit, wait_for, wait_state

FUTURE = 3600.0  # `--begin` this far ahead: the job waits (BeginTime) for the whole module


@dataclass
class Scene:
    cluster: LocalCluster
    api: PhalanxClient
    bob_token: str
    done: int
    failed: int
    timeout: int
    killed: int
    runner: int
    waiting: int  # a long name, pending on BeginTime
    array: list[int]  # three tasks, `%2`, pending on BeginTime
    bob_held: int


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    state = tmp_path_factory.mktemp("slurmcli")
    work = state / "work"
    work.mkdir()
    head_args = ["--heartbeat", "0.5", "--lease", "2", "--requeue-margin", "0.5"]
    cluster = LocalCluster(state, nodes=2, gpus_per_node=2, head_args=head_args)
    with cluster, cluster.client() as api:
        api.set_team(TeamSpec(name="lab"))
        api.create_user(UserCreate(name="bob", teams=["lab"], default_team="lab"))
        bob_token = api.create_token("bob").token
        later = time.time() + FUTURE
        done = submit(api, job(work, sh("true"), name="done"))
        failed = submit(api, job(work, sh("exit 3"), name="failed"))
        timeout = submit(api, job(work, sh("sleep 60"), name="tlimit", time_limit_s=2))
        killed = submit(api, job(work, sh("sleep 300"), name="killed"))
        runner = submit(
            api, job(work, sh("sleep 300"), name="runner", gpus_per_node=2, time_limit_s=3600)
        )
        waiting = submit(api, job(work, sh("true"), name="a-very-long-name", begin_time=later))
        array = api.submit(
            job(
                work,
                sh("true"),
                name="arr",
                begin_time=later,
                array=ArraySpec(indices=[1, 2, 3], max_parallel=2),
            )
        ).job_ids
        with cluster.client(bob_token) as bob:
            bob_held = bob.submit(job(work, sh("true"), name="bobjob", begin_time=later))
            bob.hold(bob_held.job_ids[0])
        wait_state(api, killed, "R")
        api.cancel(killed)
        for ended, final in ((done, "CD"), (failed, "F"), (timeout, "TO"), (killed, "CA")):
            wait_state(api, ended, final, timeout=60)
        wait_state(api, runner, "R")
        yield Scene(
            cluster, api, bob_token, done, failed, timeout, killed, runner, waiting, array,
            bob_held.job_ids[0],
        )  # fmt: skip


@pytest.fixture
def as_admin(scene: Scene, monkeypatch: pytest.MonkeyPatch) -> Scene:
    for key, value in scene.cluster.client_env().items():
        monkeypatch.setenv(key, value)
    for key in ("SQUEUE_FORMAT", "SQUEUE_FORMAT2", "SACCT_FORMAT"):
        monkeypatch.delenv(key, raising=False)
    return scene


@pytest.fixture
def as_bob(as_admin: Scene, monkeypatch: pytest.MonkeyPatch) -> Scene:
    monkeypatch.setenv("PHALANX_TOKEN", as_admin.bob_token)
    return as_admin


def run(capsys: pytest.CaptureFixture[str], tool: str, *args: str) -> tuple[int, str, str]:
    """The tool's main in this process (real HTTP to the head): (exit code, out, err)."""
    capsys.readouterr()
    main = {"squeue": squeue.main, "sacct": sacct.main, "sinfo": sinfo.main}[tool]
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def ok(capsys: pytest.CaptureFixture[str], tool: str, *args: str) -> str:
    """The tool's output, once it succeeded without a word on stderr."""
    code, out, err = run(capsys, tool, *args)
    assert (code, err) == (0, ""), (tool, args, code, err)
    return out


def info(api: PhalanxClient, job_id: int) -> JobInfo:
    return api.job(job_id).job


def iso(when: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(when)) if when else "Unknown"


def hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


# ----------------------------------------------------------------------------- squeue
squeue_header = (
    "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)"
)


def test_squeue_default_columns_for_pending_jobs(
    as_admin: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    s = as_admin
    a = s.array[0]
    code, out, err = run(capsys, "squeue", "-t", "PD")
    assert (code, err) == (0, "")
    # `%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R`; sorted by partition, state, priority.
    assert out.splitlines() == [
        squeue_header,
        f"{s.waiting:>18}   default a-very-l    admin PD       0:00      1 (BeginTime)",
        f"{f'{a}_[1-3%2]':>18}   default      arr    admin PD       0:00      1 (BeginTime)",
        f"{s.bob_held:>18}       lab   bobjob      bob PD       0:00      1 (JobHeldUser)",
    ]
    out = ok(capsys, "squeue", "-t", "pending", "-r", "-h", "-p", "default")
    assert [line.split()[0] for line in out.splitlines()] == [
        str(s.waiting), f"{a}_1", f"{a}_2", f"{a}_3",
    ]  # fmt: skip


def test_squeue_long_view_and_a_running_job(
    as_admin: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    s = as_admin
    node = info(s.api, s.runner).placement[0].node
    out = ok(capsys, "squeue", "-l", "-t", "R")
    lines = out.splitlines()
    time.strptime(lines[0], "%a %b %d %H:%M:%S %Y")  # the date line, as print_date()
    assert lines[1] == (
        "             JOBID PARTITION     NAME     USER    STATE       TIME TIME_LIMI  NODES "
        "NODELIST(REASON)"  # headers are cut to the width (`%.9l`), as slurm 22.05 prints
    )
    prefix = f"{s.runner:>18}   default   runner    admin  RUNNING "
    assert lines[2].startswith(prefix) and lines[2].endswith(f"   1:00:00      1 {node}")
    used = lines[2][len(prefix) :].split()[0]  # TIME: M:SS while under an hour
    assert len(lines) == 3 and used.count(":") == 1 and used.split(":")[1].isdigit()
    out = ok(
        capsys, "squeue", "-h", "-j", str(s.runner), "-o", "%A|%F|%K|%T|%t|%D|%C|%b|%N|%l|%P|%q"
    )
    assert (
        out == f"{s.runner}|{s.runner}|N/A|RUNNING|R|1|1|gres:gpu:2|{node}|1:00:00|default|normal\n"
    )


def test_squeue_format_widths_prefix_and_suffix(
    as_admin: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    s = as_admin
    a = s.array[0]
    out = ok(capsys, "squeue", "-t", "PD", "-p", "default", "-o", "<%5i|%.5j|%4u>%r")
    assert out.splitlines() == [
        "<JOBID| NAME|USER>REASON",
        f"<{s.waiting!s:<5}|a-ver|admi>BeginTime",
        f"<{f'{a}_[1-3%2]'[:5]}|  arr|admi>BeginTime",  # cut to 5, as Slurm cuts
    ]
    out = ok(capsys, "squeue", "-h", "-t", "PD", "-u", "bob", "-O", "JobID:8,State:.9,Name")
    assert out == f"{s.bob_held:<8}  PENDING{'bobjob':<20}\n"
    out = ok(capsys, "squeue", "-h", "-t", "PD", "--name", "bobjob,arr", "-o", "%i %K")
    assert out.splitlines() == [f"{a}_[1-3%2] 1-3%2", f"{s.bob_held} N/A"]


def test_squeue_ids_states_and_unknown_ids(
    as_admin: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    s = as_admin
    # `-j` lists a job in any state while slurmctld would keep it (MinJobAge, 300 s).
    ids = f"{s.done},{s.failed},{s.timeout},{s.killed}"
    out = ok(capsys, "squeue", "-h", "-j", ids, "-o", "%i %T %t %r")
    assert out.splitlines() == [  # sorted by the compact state as a string (`t`)
        f"{s.killed} CANCELLED CA None",
        f"{s.done} COMPLETED CD None",
        f"{s.failed} FAILED F NonZeroExitCode",
        f"{s.timeout} TIMEOUT TO TimeLimit",
    ]
    # A pending job's START_TIME is its `--begin`; END_TIME NONE without a time limit.
    begin = info(s.api, s.waiting).begin_time
    out = ok(capsys, "squeue", "-h", "-j", str(s.waiting), "-o", "%S|%e|%L|%n|%V")
    submitted = iso(info(s.api, s.waiting).submit_time)
    assert out == f"{iso(begin)}|NONE|UNLIMITED||{submitted}\n"
    out = ok(capsys, "squeue", "--start", "-p", "default")
    assert out.splitlines() == [
        "             JOBID PARTITION     NAME     USER ST          START_TIME  NODES "
        "SCHEDNODES           NODELIST(REASON)",
        f"{s.waiting:>18}   default a-very-l    admin PD {iso(begin)}      1 "
        "(null)               (BeginTime)",
        f"{f'{s.array[0]}_[1-3%2]':>18}   default      arr    admin PD {iso(begin)}      1 "
        "(null)               (BeginTime)",
    ]
    code, out, err = run(capsys, "squeue", "-j", "999999")
    assert (code, out, err) == (1, "", "slurm_load_jobs error: Invalid job id specified\n")
    out = ok(capsys, "squeue", "-h", "-j", f"{s.array[0]}_2", "-o", "%i")
    assert out == f"{s.array[0]}_2\n"
    # Without -t: pending, running and completing only.
    out = ok(capsys, "squeue", "-h", "-o", "%t")
    assert sorted(set(out.split())) == ["PD", "R"]


def test_users_see_only_the_jobs_they_may(
    as_bob: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    s = as_bob
    out = ok(capsys, "squeue", "-h", "-t", "all", "-o", "%i %u %P")
    assert out == f"{s.bob_held} bob lab\n"
    out = ok(capsys, "squeue", "-h", "--me", "-o", "%i")
    assert out == f"{s.bob_held}\n"
    code, out, err = run(capsys, "squeue", "-j", str(s.done))
    assert (code, err) == (1, "slurm_load_jobs error: Invalid job id specified\n")
    out = ok(capsys, "sacct", "-P", "-o", "JobID,User,Partition,State")
    assert out.splitlines() == ["JobID|User|Partition|State", f"{s.bob_held}|bob|lab|PENDING"]


def test_squeue_json_has_slurms_field_names(
    as_admin: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    s = as_admin
    out = ok(capsys, "squeue", "--json", "-j", f"{s.runner},{s.array[0]}")
    body = json.loads(out)
    assert body["meta"]["Slurm"]["release"] == "22.05.8" and body["errors"] == []
    by_id = {j["job_id"]: j for j in body["jobs"]}
    runner, arr = by_id[s.runner], by_id[s.array[0]]
    r = info(s.api, s.runner)
    assert runner | {"end_time": 0} == runner | {
        "job_state": "RUNNING", "name": "runner", "user_name": "admin", "partition": "default",
        "nodes": r.placement[0].node, "node_count": 1, "array_job_id": 0, "array_task_id": None,
        "time_limit": 60, "start_time": int(r.start_time or 0), "submit_time": int(r.submit_time),
        "state_reason": "None", "restart_cnt": 0, "end_time": 0,
    }  # fmt: skip
    assert (arr["job_state"], arr["array_job_id"], arr["array_task_string"]) == (
        "PENDING", s.array[0], "1-3%2",
    )  # fmt: skip
    assert (arr["array_task_id"], arr["array_max_tasks"], arr["state_reason"]) == (
        None,
        2,
        "BeginTime",
    )


# ----------------------------------------------------------------------------- sacct
def test_sacct_default_table_of_ended_jobs(
    as_admin: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    s = as_admin
    ids = f"{s.done},{s.failed},{s.timeout},{s.killed}"
    out = ok(capsys, "sacct", "-j", ids)
    cut = f"CANCELLED by {_uid('admin')}"[:9] + "+"  # longer than 10: cut, with a `+`
    ended = _exit(s, s.timeout)
    assert out.splitlines() == [
        "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode ",
        "------------ ---------- ---------- ---------- ---------- ---------- -------- ",
        f"{s.done:<12}       done    default                     1  COMPLETED      0:0 ",
        f"{s.failed:<12}     failed    default                     1     FAILED      3:0 ",
        f"{s.timeout:<12}     tlimit    default                     1    TIMEOUT {ended:>8} ",
        f"{s.killed:<12}     killed    default                     1 {cut:>10}     0:15 ",
    ]


def _uid(user: str) -> str:
    """What sacct prints after `CANCELLED by`: the local account's uid, else the name."""
    try:
        return str(pwd.getpwnam(user).pw_uid)
    except KeyError:
        return user


def _exit(s: Scene, job_id: int) -> str:
    return info(s.api, job_id).exit_code or "0:0"


def test_sacct_parsable2_fields_of_every_state(
    as_admin: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    s = as_admin
    fields = (
        "JobID,JobIDRaw,JobName%30,State,ExitCode,NodeList,Elapsed,ElapsedRaw,Start,End,Submit,"
        "Timelimit,NNodes,AllocCPUS,ReqTRES"
    )
    ids = [s.done, s.failed, s.timeout, s.killed, s.waiting]
    out = ok(capsys, "sacct", "--parsable2", "-j", ",".join(map(str, ids)), "-o", fields)
    lines = out.splitlines()
    assert lines[0] == fields.replace("%30", "").replace(",", "|")
    expected = []
    for job_id in ids:
        j = info(s.api, job_id)
        words = {"CD": "COMPLETED", "F": "FAILED", "TO": "TIMEOUT", "PD": "PENDING"}
        word = words.get(j.state) or f"CANCELLED by {_uid('admin')}"
        ran = j.start_time is not None
        elapsed = int((j.end_time or 0) - (j.start_time or 0)) if ran else 0
        limit = "UNLIMITED" if j.time_limit_s is None else hms(j.time_limit_s)
        expected.append(
            "|".join([
                str(job_id), str(job_id), j.name, word, j.exit_code or "0:0",
                j.placement[0].node if ran else "None assigned", hms(elapsed), str(elapsed),
                iso(j.start_time), iso(j.end_time), iso(j.submit_time), limit, "1",
                "1" if ran else "0", "cpu=1,node=1,billing=1,gres/gpu=1",
            ])
        )  # fmt: skip
    assert lines[1:] == expected
    out = ok(capsys, "sacct", "-p", "-n", "-j", str(s.done), "-o", "jobid,state")
    assert out == f"{s.done}|COMPLETED|\n"  # `-p`: a delimiter after every field


def test_sacct_arrays_time_window_names_and_states(
    as_admin: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    s = as_admin
    a = s.array[0]
    out = ok(capsys, "sacct", "-X", "-n", "-P", "-j", str(a), "-o", "JobID,JobIDRaw,State")
    assert out == f"{a}_[1-3%2]|{a}|PENDING\n"
    hour_ago = time.strftime("%Y-%m-%dT%H:00", time.localtime(time.time() - 3600))
    # Snakemake's call: its jobs by name in a window, allocations only.
    out = ok(
        capsys, "sacct", "-X", "--parsable2", "--noheader", "--clusters", "all",
        "--format=JobIdRaw,State", "--starttime", hour_ago,
        "--endtime", "now", "--name", "failed,tlimit",
    )  # fmt: skip
    assert out.splitlines() == [f"{s.failed}|FAILED", f"{s.timeout}|TIMEOUT"]
    out = ok(capsys, "sacct", "-n", "-P", "-a", "-s", "CD,to", "-S", "now-1hours", "-o", "JobID")
    assert out.splitlines() == [str(s.done), str(s.timeout)]
    out = ok(capsys, "sacct", "-n", "-P", "-a", "-S", "now+1hours", "-o", "JobID", "-s", "F")
    assert out == ""  # ended before the window


def test_hostile_input_gets_slurms_errors(
    as_admin: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    bogus = (
        'squeue: error: option --bogus not recognized\nTry "squeue --help" for more information\n'
    )
    valid = f"squeue: error: {squeue.VALID_STATES}\n"
    node_states = f"sinfo: error: {sinfo.VALID_STATES}\n"
    cases = [
        ("sacct", ["-o", "JobID,Bogus"], 'sacct: error: Invalid field requested: "Bogus"\n'),
        ("sacct", ["-S", "soonish"], "sacct: error: Invalid time specification: soonish\n"),
        ("sacct", ["-s", "WEIRD"], "sacct: error: Invalid job state specified: WEIRD\n"),
        ("sacct", ["-j", "12x"], "sacct: error: Invalid job id: 12x\n"),
        ("squeue", ["-t", "NOPE"], f"squeue: error: Invalid job state specified: NOPE\n{valid}"),
        ("squeue", ["-j", "99999999999"], "squeue: error: Invalid job id: 99999999999\n"),
        ("squeue", ["-j", "1_x"], "squeue: error: Invalid job id: 1_x\n"),
        ("sinfo", ["-t", "weird"], f'sinfo: error: Bad state string: "weird"\n{node_states}'),
        ("squeue", ["--bogus"], bogus),
        ("sacct", ["stray"], "sacct: error: Unknown arguments: stray\n"),
    ]  # fmt: skip
    for tool, args, message in cases:
        code, out, err = run(capsys, tool, *args)
        assert (code, out, err) == (1, "", message), (tool, args)
    # squeue goes on without an unknown -O field, or with no job for an unknown uid.
    code, out, err = run(capsys, "squeue", "-h", "-t", "R", "-O", "jobid:6,nosuch")
    spec = "Invalid job format specification"
    assert (code, out, err) == (0, f"{as_admin.runner:<6}\n", f"squeue: error: {spec}: nosuch\n")
    code, out, err = run(capsys, "squeue", "-u", "4000000000")
    assert (code, err) == (0, "squeue: error: Invalid user: 4000000000\n")
    assert out == squeue_header + "\n"
    # An unknown `%` field prints literally, as Slurm's, with its error.
    code, out, err = run(capsys, "squeue", "-h", "-t", "R", "-o", "%.8i %x|")
    assert (code, err) == (0, "squeue: error: Invalid job format specification: x\n")
    assert out == f"{as_admin.runner:>8} %x|\n"


# ----------------------------------------------------------------------------- sinfo
def test_sinfo_views(as_admin: Scene, capsys: pytest.CaptureFixture[str]) -> None:
    s = as_admin
    busy = info(s.api, s.runner).placement[0].node
    idle = next(a for a in s.cluster.addresses if a != busy)
    out = ok(capsys, "sinfo")
    assert out.splitlines() == [
        "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST",
        f"default*     up   infinite      1  alloc {busy}",  # admin's default team
        f"default*     up   infinite      1   idle {idle}",
        f"lab          up   infinite      1  alloc {busy}",
        f"lab          up   infinite      1   idle {idle}",
    ]
    out = ok(capsys, "sinfo", "-N", "-p", "default")
    first, second = sorted(s.cluster.addresses)
    states = {busy: "alloc", idle: "idle"}
    assert out.splitlines() == [
        "NODELIST   NODES PARTITION STATE ",
        f"{first}      1  default* {states[first]:<6}",
        f"{second}      1  default* {states[second]:<6}",
    ]
    out = ok(capsys, "sinfo", "-h", "-p", "lab", "-o", "%P|%C|%G|%c|%D|%T|%N", "-t", "idle")
    cpus = s.api.nodes().nodes[0].cpus
    assert out == f"lab|0/{cpus}/0/{cpus}|gpu:h100:2|{cpus}|1|idle|{idle}\n"
    out = ok(capsys, "sinfo", "-s", "-p", "default")
    assert out.splitlines() == [
        "PARTITION AVAIL  TIMELIMIT   NODES(A/I/O/T) NODELIST",
        f"default*     up   infinite          1/1/0/2 {_hosts(s)}",
    ]
    out = ok(capsys, "sinfo", "--version")
    assert out == "slurm 22.05.8\n"


def test_sinfo_marks_the_default_partition(
    as_bob: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ok(capsys, "sinfo", "-h", "-o", "%P %a", "-t", "idle")
    assert out.splitlines() == ["default up", "lab* up"]


def _hosts(s: Scene) -> str:
    prefix = "127.0.0."
    numbers = sorted(int(a.rsplit(".", 1)[1]) for a in s.cluster.addresses)
    return f"{prefix}[{numbers[0]}-{numbers[-1]}]"


# ----------------------------------------------------------------------------- moves
def test_requeued_preempted_and_node_failed_jobs(
    as_admin: Scene, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    s = as_admin
    api = s.api
    work = tmp_path.resolve()
    # Requeue: the same id, a restart counted, running again.
    api.requeue(s.runner)
    wait_for("the runner's second run", lambda: info(api, s.runner).restart_count == 1 or None)
    wait_state(api, s.runner, "R")
    out = ok(capsys, "sacct", "-n", "-P", "-j", str(s.runner), "-o", "JobID,State,Restarts")
    assert out == f"{s.runner}|RUNNING|1\n"
    # Preemption: a low job that ignores its notice stays PREEMPTED until its deadline.
    stubborn = "trap '' USR1; sleep 300"
    victim = submit(
        api, job(work, sh(stubborn), name="victim", gpus_per_node=2, qos="low", preempt_grace_s=120)
    )
    wait_state(api, victim, "R")
    urgent = submit(api, job(work, sh("sleep 300"), name="urgent", gpus_per_node=2, qos="high"))
    wait_state(api, victim, "PR", timeout=30)
    out = ok(capsys, "squeue", "-h", "-t", "PR", "-o", "%i %t %T %j")
    assert out == f"{victim} PR PREEMPTED victim\n"
    out = ok(capsys, "sacct", "-n", "-P", "-j", str(victim), "-o", "State")
    assert out == "PREEMPTED\n"
    api.cancel(urgent)
    api.cancel(victim)
    wait_state(api, victim, "CA", timeout=30)
    # Node failure: a job that may not be requeued ends NODE_FAIL when its node dies.
    lost = submit(api, job(work, sh("sleep 300"), name="lost", requeue=False))
    node = wait_state(api, lost, "R").placement[0].node
    # The runner holds both GPUs of the other node: it lives on for the tests after this.
    assert node != info(api, s.runner).placement[0].node
    s.cluster.crash_node(node)
    final = wait_state(api, lost, "NF", timeout=60)
    out = ok(capsys, "sacct", "-n", "-P", "-j", str(lost), "-o", "JobID,State,ExitCode,NodeList")
    assert out == f"{lost}|NODE_FAIL|{final.exit_code}|{node}\n"
    out = ok(capsys, "sinfo", "-h", "-N", "-p", "default", "-o", "%N %t", "-n", node)
    assert out == f"{node} down*\n"


def test_the_module_entry_point_runs_each_tool(as_admin: Scene) -> None:
    env = {**os.environ, **as_admin.cluster.client_env()}
    for tool, args, first in (
        ("squeue", ["-h", "-j", str(as_admin.runner), "-o", "%T"], "RUNNING"),
        ("sacct", ["-n", "-P", "-j", str(as_admin.done), "-o", "State"], "COMPLETED"),
        ("sinfo", ["-V"], "slurm 22.05.8"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "phalanx.slurmcli", tool, *args],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert (r.returncode, r.stdout, r.stderr) == (0, first + "\n", ""), tool


def test_the_calls_real_clients_make(as_admin: Scene, capsys: pytest.CaptureFixture[str]) -> None:
    s = as_admin
    # submitit's SlurmInfoWatcher: repeated -j, array ids; it reads `N_[a-b%p]` ranges too.
    out = ok(
        capsys, "sacct", "-o", "JobID,State,NodeList", "--parsable2",
        "-j", str(s.failed), "-j", str(s.array[0]),
    )  # fmt: skip
    node = info(s.api, s.failed).placement[0].node
    assert out.splitlines() == [
        "JobID|State|NodeList",
        f"{s.failed}|FAILED|{node}",
        f"{s.array[0]}_[1-3%2]|PENDING|None assigned",
    ]
    # Nextflow's queue status: every state, its partition and user.
    out = ok(capsys, "squeue", "--noheader", "-o", "%i %t", "-t", "all", "-p", "lab", "-u", "bob")
    assert out == f"{s.bob_held} PD\n"


def test_a_reader_that_goes_away_ends_the_output_quietly(as_admin: Scene) -> None:
    env = {**os.environ, **as_admin.cluster.client_env()}
    read, write = os.pipe()
    os.close(read)  # `squeue | head -0`: the reader is gone before the first line
    try:
        r = subprocess.run(
            [sys.executable, "-m", "phalanx.slurmcli", "squeue", "-t", "all"],
            env=env, stdout=write, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (0, "")


def test_long_id_lists_go_to_the_head_in_batches(
    as_admin: Scene, capsys: pytest.CaptureFixture[str]
) -> None:
    s = as_admin
    ids = [*range(100_000, 100_450), s.done, s.runner]  # 452 ids: two requests of ≤ 400
    out = ok(capsys, "sacct", "-n", "-P", "-o", "JobID,State", "-j", ",".join(map(str, ids)))
    assert out.splitlines() == [f"{s.done}|COMPLETED", f"{s.runner}|RUNNING"]
    out = ok(capsys, "squeue", "-h", "-o", "%i %t", "-j", ",".join(map(str, ids)))
    assert out.splitlines() == [f"{s.done} CD", f"{s.runner} R"]


def test_sacct_and_sinfo_json(as_admin: Scene, capsys: pytest.CaptureFixture[str]) -> None:
    s = as_admin
    body = json.loads(ok(capsys, "sacct", "--json", "-j", f"{s.failed},{s.killed},{s.array[0]}"))
    assert body["meta"]["plugin"]["type"] == "openapi/dbv0.0.38" and body["errors"] == []
    by_id = {j["job_id"]: j for j in body["jobs"]}
    failed, killed, arr = by_id[s.failed], by_id[s.killed], by_id[s.array[0]]
    f = info(s.api, s.failed)
    assert failed["state"] == {"current": "FAILED", "reason": "NonZeroExitCode"}
    assert failed["exit_code"] == {"status": "FAILED", "return_code": 3}
    assert failed["time"]["start"] == int(f.start_time or 0)
    assert failed["time"]["end"] == int(f.end_time or 0)
    assert failed["nodes"] == f.placement[0].node and failed["partition"] == "default"
    assert killed["state"]["current"] == "CANCELLED" and killed["kill_request_user"] == "admin"
    assert killed["exit_code"] == {
        "status": "SIGNALED", "return_code": None,
        "signal": {"signal_id": 15, "name": "Terminated"},
    }  # fmt: skip
    assert arr["array"] == {
        "job_id": s.array[0], "limits": {"max": {"running": {"tasks": 2}}}, "task": "1-3%2",
        "task_id": None,
    }  # fmt: skip
    assert arr["nodes"] == "None assigned" and arr["exit_code"]["status"] == "PENDING"

    nodes = json.loads(ok(capsys, "sinfo", "--json"))
    busy = info(s.api, s.runner).placement[0].node
    states = {n["name"]: (n["state"], n["alloc_cpus"] == n["cpus"]) for n in nodes["nodes"]}
    assert states[busy] == ("allocated", True)
    assert sorted(p["name"] for p in nodes["partitions"]) == ["default", "lab"]
    default = next(p for p in nodes["partitions"] if p["name"] == "default")
    assert (default["flags"], default["total_nodes"]) == (["default"], 2)
