"""`scancel` and `scontrol` through the installed scripts against a real local cluster:
ids, array tasks and whole arrays, filters, signals; `scontrol show …` in Slurm 22.05's
key=value layout (man scontrol's example: `JobId=… JobName=…`, `   UserId=…`, `JobState=…
Reason=… Dependency=…`, `Requeue=1 Restarts=0 BatchFlag=…`), requeue keeping the job id
(also from inside the job, as submitit's checkpoint path does), hold, release, update;
Slurm's error words and exit codes."""

from __future__ import annotations

import re

from tests.slurmcli.shimrun import (  # noqa: F401 - the fixtures
    Slurm,
    cluster_fixture,
    eventually,
    shim_dir_fixture,
    slurm_fixture,
    write,
)

LATER = "--begin=now+1hour"  # stays pending: no GPU needed


def _submit(slurm: Slurm, flags: str) -> int:
    done = slurm(f"sbatch --parsable {flags}")
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def _fields(text: str) -> dict[str, str]:
    """`scontrol show` output as key → value (values have no blanks, except at the end)."""
    return dict(re.findall(r"(\S+?)=(\S*)", text))


def test_scancel_ids_tasks_arrays_and_slurms_errors(slurm: Slurm) -> None:
    array = _submit(slurm, f"{LATER} --array=0-3 --wrap=true")
    single = _submit(slurm, f"{LATER} --wrap=true")
    done = slurm(f"scancel {array}_1 {array}_[2-3]")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")  # silent, as Slurm
    assert [slurm.wait(f"{array}_{t}").state for t in (1, 2, 3)] == ["CA"] * 3
    assert slurm.job(f"{array}_0").state == "PD"
    assert slurm(f"scancel {array}").returncode == 0  # the whole array
    assert slurm.wait(f"{array}_0").state == "CA"
    assert slurm.job(single).state == "PD"

    again = slurm(f"scancel {single} {array}_0 999999")
    assert again.returncode == 1
    assert again.stderr == (
        f"scancel: error: Kill job error on job id {array}_0: "
        "Job/step already completing or completed\n"
        "scancel: error: Kill job error on job id 999999: Invalid job id specified\n"
    )
    assert slurm.wait(single).state == "CA"  # the good id in the same call was cancelled
    for bad, said in {
        "scancel": "scancel: error: No job identification provided\n",
        "scancel 12_x": "scancel: error: Invalid job id 12_x\n",
        "scancel 12.0": "job steps are not supported",
        "scancel -s NOPE 12": "scancel: error: Invalid job signal: NOPE",
        "scancel -t WEIRD": "scancel: error: Invalid job state specified: WEIRD\n",
        "scancel --frob": "scancel: unrecognized option '--frob'\n",
    }.items():
        failed = slurm(bad)
        assert failed.returncode == 1 and said in failed.stderr, (bad, failed.stderr)
        assert "Traceback" not in failed.stderr


def test_scancel_filters_and_signals(slurm: Slurm) -> None:
    keep = _submit(slurm, f"{LATER} -J keep --wrap=true")
    drop = [_submit(slurm, f"{LATER} -J drop --wrap=true") for _ in range(2)]
    assert slurm("scancel --name drop -t PENDING -u admin").returncode == 0
    assert [slurm.wait(j).state for j in drop] == ["CA", "CA"]
    assert slurm.job(keep).state == "PD"
    # An id with a filter it does not pass is left alone, as in Slurm.
    assert slurm(f"scancel --name other {keep}").returncode == 0
    assert slurm.job(keep).state == "PD"

    # As Slurm: -s reaches the steps (srun's tasks) and spares the batch shell (submitit's
    # tests send SIGTERM so); -b reaches the batch shell only.
    write(
        slurm.workdir / "trap.sh",
        "#!/bin/bash\n"
        "trap 'echo batch got USR1' USR1\n"
        'srun sh -c \'trap "echo step got USR1; exit 0" USR1; echo ready; '
        "for i in $(seq 600); do sleep 0.1; done'\n"
        "echo step ended $?\n"
        "trap 'echo batch got USR2; exit 0' USR2\n"
        "echo waiting; for i in $(seq 600); do sleep 0.1; done\n",
    )
    running = _submit(slurm, "trap.sh")
    out = slurm.workdir / f"slurm-{running}.out"
    assert eventually(lambda: out.exists() and "ready" in out.read_text())
    assert slurm(f"scancel {running} --signal USR1").returncode == 0
    assert eventually(lambda: "waiting" in out.read_text())
    assert slurm(f"scancel -b -s SIGUSR2 {running}").returncode == 0
    assert slurm.wait(running).state == "CD"  # the batch shell caught it and exited 0
    # (the shells may also report their `sleep` killed: "User defined signal N")
    lines = [line for line in out.read_text().splitlines() if "defined signal" not in line]
    assert lines == ["ready", "step got USR1", "step ended 0", "waiting", "batch got USR2"]
    pending = slurm(f"scancel -s USR1 {keep}")
    assert pending.returncode == 1 and "Job is pending execution" in pending.stderr


def test_scontrol_show_job_layout_hold_release_update(slurm: Slurm) -> None:
    job = _submit(slurm, f"{LATER} -J shown -t 30 -A acct -o o-%j.txt --wrap=true")
    shown = slurm(f"scontrol show job {job}")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.split("\n")
    assert lines[0] == f"JobId={job} JobName=shown"
    assert all(line.startswith("   ") for line in lines[1:-2]) and lines[-2:] == ["", ""]
    fields = _fields(shown.stdout)
    assert fields["JobState"] == "PENDING" and fields["Reason"] == "BeginTime"
    assert (fields["Requeue"], fields["Restarts"], fields["BatchFlag"]) == ("1", "0", "1")
    assert (fields["TimeLimit"], fields["Account"], fields["Partition"]) == (
        "00:30:00",
        "acct",
        "default",
    )
    assert fields["StdOut"] == f"{slurm.workdir}/o-{job}.txt"
    assert fields["WorkDir"] == str(slurm.workdir) and fields["NodeList"] == "(null)"
    assert fields["TRES"] == "cpu=1,node=1,billing=1,gres/gpu=1"
    oneline = slurm(f"scontrol -o show job {job}").stdout
    assert oneline.count("\n") == 1 and oneline.startswith(f"JobId={job} JobName=shown UserId=")

    assert slurm(f"scontrol hold {job}").returncode == 0
    assert _fields(slurm(f"scontrol show job {job}").stdout)["Reason"] == "JobHeldAdmin"
    assert slurm(f"scontrol release {job}").returncode == 0
    other = _submit(slurm, f"{LATER} --wrap=true")
    done = slurm(f"scontrol update JobId={job} TimeLimit=1:00:00 Dependency=afterok:{other}")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    fields = _fields(slurm(f"scontrol show job {job}").stdout)
    assert (fields["TimeLimit"], fields["Dependency"]) == ("01:00:00", f"afterok:{other}")

    for bad, said in {
        "scontrol show job 999999": "slurm_load_jobs error: Invalid job id specified\n",
        "scontrol hold 999999": "Invalid job id specified for job 999999\n",
        f"scontrol update JobId={job} Nice=5": "Update of nice is not supported",
        f"scontrol update JobId={job} TimeLimit=UNLIMITED": "TimeLimit=UNLIMITED",
        "scontrol update JobId=999999 TimeLimit=5": "slurm_update error: Invalid job id",
        "scontrol bogus": "scontrol: error: invalid keyword: bogus",
        "scontrol show frobs": "scontrol: error: invalid entity: frobs for keyword: show",
        "scontrol show hostnames 'n[3-1]'": "scontrol: error:",
    }.items():
        failed = slurm(bad)
        assert failed.returncode == 1 and said in failed.stderr, (bad, failed.stderr)
        assert "Traceback" not in failed.stderr


def test_requeue_keeps_the_id_and_counts_a_restart_also_from_inside(slurm: Slurm) -> None:
    write(
        slurm.workdir / "rq.sh",
        "#!/bin/bash\n#SBATCH -J rq\n"
        'echo "run $SLURM_RESTART_COUNT"\n'
        'if [ "$SLURM_RESTART_COUNT" = 0 ]; then\n'
        "  scontrol requeue $SLURM_JOB_ID || echo refused\n"
        "  sleep 60\n"
        "fi\n",
    )
    job = _submit(slurm, "rq.sh")
    assert slurm.wait(job).state == "CD"
    assert (slurm.workdir / f"slurm-{job}.out").read_text() == "run 0\nrun 1\n"
    fields = _fields(slurm(f"scontrol show job {job}").stdout)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "1")

    write(slurm.workdir / "long.sh", "#!/bin/sh\nfor i in $(seq 600); do sleep 0.1; done\n")
    outside = _submit(slurm, "long.sh")
    assert slurm.wait(outside, ("R",)).state == "R"
    assert slurm(f"scontrol requeue {outside}").returncode == 0
    assert eventually(lambda: slurm.job(outside).restart_count == 1)
    assert slurm.job(outside).id == outside
    # An array task requeues itself by its array name (SLURM_ARRAY_JOB_ID_TASK), as
    # submitit does; only that task.
    write(
        slurm.workdir / "arr.sh",
        "#!/bin/bash\n"
        'if [ "$SLURM_RESTART_COUNT" = 0 ] && [ "$SLURM_ARRAY_TASK_ID" = 0 ]; then\n'
        '  scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"; sleep 60\n'
        "fi\n",
    )
    array = _submit(slurm, "--array=0-1 arr.sh")
    assert [slurm.wait(f"{array}_{t}").state for t in (0, 1)] == ["CD", "CD"]
    assert [slurm.job(f"{array}_{t}").restart_count for t in (0, 1)] == [1, 0]


def test_scontrol_nodes_partitions_config_and_hostlists(slurm: Slurm) -> None:
    nodes = slurm("scontrol show node")
    assert nodes.returncode == 0
    records = [_fields(text) for text in nodes.stdout.strip().split("\n\n")]
    assert [r["NodeName"] for r in records] == ["127.0.0.2", "127.0.0.3"]
    assert all(r["Gres"] == "gpu:h100:2" and r["State"] == "IDLE" for r in records)
    one = slurm("scontrol show node 127.0.0.3").stdout
    assert one.startswith("NodeName=127.0.0.3 Arch=")
    missing = slurm("scontrol show node nope")
    assert (missing.returncode, missing.stderr) == (1, "Node nope not found\n")

    part = _fields(slurm("scontrol show partition").stdout)
    assert (part["PartitionName"], part["Nodes"], part["TotalNodes"]) == (
        "default",
        "127.0.0.[2-3]",
        "2",
    )
    assert part["State"] == "UP" and part["TRES"].endswith(",gres/gpu=4")
    config = slurm("scontrol show config").stdout
    assert config.startswith("Configuration data as of ")
    assert "SLURM_VERSION           = 22.05\n" in config and "ClusterName             = " in config
    assert slurm("scontrol show hostnames 'n[1-3],x'").stdout == "n1\nn2\nn3\nx\n"
    assert slurm("scontrol show hostlist n1,n2,n3").stdout == "n[1-3]\n"
    from_env = slurm("scontrol show hostnames", env={"SLURM_JOB_NODELIST": "a[01-02]"})
    assert from_env.stdout == "a01\na02\n"


PROBE = """\
import os, ssl, sys, urllib.error, urllib.request
url = os.environ["PHALANX_HEAD"].split(",")[0] + "/v1/jobs/%s/self/requeue" % sys.argv[1]
request = urllib.request.Request(url, method="POST", headers={
    "Authorization": "Bearer " + os.environ["PHALANX_STEP_TOKEN"]})
context = ssl.create_default_context(cadata=os.environ.get("PHALANX_CA_PEM") or None)
try:
    print(urllib.request.urlopen(request, context=context).status)
except urllib.error.HTTPError as exc:
    print(exc.code)
"""


def test_a_jobs_own_credential_requeues_that_job_only(slurm: Slurm) -> None:
    import sys

    other = _submit(slurm, "--wrap='sleep 60'")
    assert slurm.wait(other, ("R",)).state == "R"
    write(slurm.workdir / "probe.py", PROBE)
    prober = _submit(slurm, f"--wrap='{sys.executable} probe.py {other}'")
    assert slurm.wait(prober).state == "CD"
    assert (slurm.workdir / f"slurm-{prober}.out").read_text() == "401\n"
    assert slurm.job(other).restart_count == 0 and slurm.job(other).state == "R"
