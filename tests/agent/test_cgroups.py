"""Job confinement with real cgroups and real processes: memory (OOM), cpuset, pids, GPU
device files, and teardown of everything in a job's cgroup. Skipped, with the reason,
where the machine has no usable cgroups (not root, not mounted)."""

from __future__ import annotations

import os
import signal
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.agent import cgroups
from phalanx.agent.confine import JobConfiner
from phalanx.agent.gpus import FakeProvider
from phalanx.agent.processes import ProcessManager
from phalanx.agent.reconcile import LaunchContext, Reconciler
from phalanx.api.models import Assignment, ProcessStatus
from phalanx.testing.processes import pid_alive

from .cgroup_fixtures import cgroup_parent  # noqa: F401  (a fixture)
from .helpers import (
    AgentProcess,
    FakeHead,
    assignment,
    desired,
    guards,
    lease_left,
    wait_for,
)

ADDRESS = "127.0.0.5"
NVIDIA_MAJOR = 195


def job(tmp_path: Path, code: str, **changes: object) -> Assignment:
    """One rank (node launcher) running Python `code` in `tmp_path`."""
    fields: dict[str, object] = {
        "launcher": "node",
        "command": [sys.executable, "-c", code],
        "workdir": str(tmp_path),
        "nodes": [ADDRESS],
        "addresses": [ADDRESS],
        "agent_urls": [f"http://{ADDRESS}:1"],
        "gpus": [0],
        "gpus_per_node": 1,
        "master_addr": ADDRESS,
        **changes,
    }
    return assignment(**fields)


@pytest.fixture
def node(
    tmp_path: Path,
    cgroup_parent: str,  # noqa: F811  (the fixture)
) -> Iterator[tuple[Reconciler, cgroups.Confinement]]:
    """A reconciler confining jobs in real cgroups (pids limit 32), with two fake GPUs whose
    device files are real character devices (major 195) in a temp dir."""
    devices = tmp_path / "dev"
    devices.mkdir()
    for i in range(2):
        try:
            os.mknod(devices / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, i))
        except OSError as e:
            pytest.skip(f"cannot mknod a fake GPU device file: {e}")
    conf = cgroups.setup("n1", tmp_path / "state", parent=cgroup_parent, pids_max=32)
    gpus = FakeProvider(2, node_name="n1", device_dir=devices)
    ctx = LaunchContext(state_dir=tmp_path / "state", base_env={"PATH": os.environ["PATH"]})
    reconciler = Reconciler(ctx, ProcessManager(), confine=JobConfiner(conf, gpus.device_files()))
    try:
        yield reconciler, conf
    finally:
        reconciler.shutdown()


def ended(reconciler: Reconciler) -> ProcessStatus:
    """The one rank's status, once it ended."""
    return wait_for(
        "the rank to end",
        lambda: next((p for p in reconciler.process_statuses() if not p.running), None),
        timeout=60.0,
    )


def output(tmp_path: Path) -> str:
    return (tmp_path / "state" / "logs" / "7" / "e1" / "rank-0.out").read_text()


def test_a_job_over_its_memory_limit_is_reported_oom(
    node: tuple[Reconciler, cgroups.Confinement], tmp_path: Path
) -> None:
    reconciler, _ = node
    hog = "chunks = []\nfor _ in range(64):\n    chunks.append(b'x' * (16 << 20))\n"
    reconciler.apply(desired(job(tmp_path, hog, mem_mb=64)))
    p = ended(reconciler)
    assert (p.signal, p.oom, p.lost) == (signal.SIGKILL, True, False)


def test_a_failing_job_within_its_memory_is_not_oom(
    node: tuple[Reconciler, cgroups.Confinement], tmp_path: Path
) -> None:
    reconciler, _ = node
    reconciler.apply(desired(job(tmp_path, "import os; os.kill(os.getpid(), 9)", mem_mb=256)))
    p = ended(reconciler)
    assert (p.signal, p.oom) == (signal.SIGKILL, False)


def test_cpus_per_task_becomes_the_jobs_cpuset(
    node: tuple[Reconciler, cgroups.Confinement], tmp_path: Path
) -> None:
    reconciler, conf = node
    code = (
        "import os; print(sorted(os.sched_getaffinity(0))); print(open('/proc/self/cgroup').read())"
    )
    reconciler.apply(desired(job(tmp_path, code, cpus_per_task=1)))
    assert ended(reconciler).exit_code == 0
    text = output(tmp_path)
    assert text.splitlines()[0] == f"[{conf.cpus[0]}]"  # one CPU: the first free one
    assert "/job-7-1\n" in text  # in its own cgroup


def test_the_pids_limit_stops_a_fork_bomb_and_the_agent_carries_on(
    node: tuple[Reconciler, cgroups.Confinement], tmp_path: Path
) -> None:
    reconciler, _ = node
    bomb = """
import os, time
children, refused = [], 0
for _ in range(200):  # bounded: never more than 200 tries
    try:
        pid = os.fork()
    except BlockingIOError:  # EAGAIN: the cgroup's pids.max
        refused += 1
        continue
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    children.append(pid)
print(len(children), refused, flush=True)
"""
    reconciler.apply(desired(job(tmp_path, bomb)))
    assert ended(reconciler).exit_code == 0
    started, refused = map(int, output(tmp_path).split())
    assert started < 32 and refused > 0
    # Its sleeping children are in the job's cgroup: ending the job ends them.
    reconciler.apply(desired(version=2))
    wait_for("the job's cgroup to go", lambda: not any(d.exists() for d in job_dirs(reconciler)))
    # The agent still starts processes.
    reconciler.apply(desired(job(tmp_path, "print('next')", epoch=2), version=3))
    assert ended(reconciler).exit_code == 0


def job_dirs(reconciler: Reconciler) -> list[Path]:
    assert reconciler.confine is not None
    return [d / "job-7-1" for d in reconciler.confine.confinement.node_dirs]


def test_a_job_opens_only_its_own_gpu_device_files(
    node: tuple[Reconciler, cgroups.Confinement], tmp_path: Path
) -> None:
    reconciler, conf = node
    if not conf.devices:
        pytest.skip(f"no device control here: {conf.describe}")
    code = f"""
import errno, os
for i in (0, 1):
    try:
        os.close(os.open("{tmp_path}/dev/nvidia%d" % i, os.O_RDWR))
        print(i, "opened")
    except OSError as e:
        print(i, errno.errorcode[e.errno])
"""
    reconciler.apply(desired(job(tmp_path, code, gpus=[0])))
    assert ended(reconciler).exit_code == 0
    lines = output(tmp_path).splitlines()
    # GPU 0 is the job's: the cgroup lets it through (no driver here: ENXIO, or opened
    # with a real one); GPU 1 is not: the devices cgroup refuses it.
    assert lines[0] in ("0 ENXIO", "0 opened") and lines[1] == "1 EPERM", lines


ESCAPE = """
import os, sys, time
if os.fork() == 0:
    os.setsid()  # out of the rank's session and process group
    if os.fork() == 0:
        with open(sys.argv[1], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(300)
    os._exit(0)
time.sleep(float(sys.argv[2]))
"""


def test_teardown_kills_what_escaped_the_process_group(
    node: tuple[Reconciler, cgroups.Confinement], tmp_path: Path
) -> None:
    reconciler, _ = node
    escaped_file = tmp_path / "escaped"
    a = job(tmp_path, "", command=[sys.executable, "-c", ESCAPE, str(escaped_file), "0"])
    reconciler.apply(desired(a))
    assert ended(reconciler).exit_code == 0
    escaped = int(wait_for("the escaped pid", lambda: escaped_file.read_text() or None))
    assert pid_alive(escaped) and os.getpgid(escaped) != os.getpgid(os.getpid())
    reconciler.apply(desired(version=2))  # the job is over: its cgroup is torn down
    wait_for("the escaped process to die", lambda: not pid_alive(escaped))
    assert not any(d.exists() for d in job_dirs(reconciler))


def test_nothing_survives_kill_9_of_agent_and_guard(
    tmp_path: Path,
    cgroup_parent: str,  # noqa: F811  (the fixture)
) -> None:
    escaped_file = tmp_path / "escaped"
    argv = [sys.executable, "-c", ESCAPE, str(escaped_file), "300"]
    a = job(tmp_path, "", command=argv, master_port=None)
    head = FakeHead(desired(a, lease_s=1.5, heartbeat_s=0.2))
    state = tmp_path / "agent"
    extra = ["--cgroup-parent", cgroup_parent]
    first = AgentProcess(head.url, ADDRESS, state, tmp_path / "agent.log", extra)
    second: AgentProcess | None = None
    escaped = 0
    try:
        rank = wait_for("the rank", lambda: [p for p in head.processes() if p.running])[0]
        assert rank.pid is not None
        escaped = int(wait_for("the escaped pid", lambda: _read(escaped_file)))
        [guard] = wait_for("the guard", lambda: guards(state))
        first.kill()
        os.kill(guard, signal.SIGKILL)
        wait_for("the guard to die", lambda: not pid_alive(guard))
        # Past the lease a new agent adopts nothing: it kills what it finds.
        wait_for("the lease to run out", lambda: lease_left(state) < 0)
        assert pid_alive(rank.pid) and pid_alive(escaped)  # nobody left to stop them
        head.beats.clear()
        second = AgentProcess(head.url, ADDRESS, state, tmp_path / "agent.log", extra)
        # Killed before the new agent registers (its first heartbeat).
        wait_for("the new agent's report", head.processes)
        assert not pid_alive(rank.pid) and not pid_alive(escaped)
        assert "killed the processes left in cgroup job-7-1" in (tmp_path / "agent.log").read_text()
    finally:
        if second is not None:
            second.stop()
        first.stop()
        head.close()
        if escaped and pid_alive(escaped):
            os.kill(escaped, signal.SIGKILL)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None
