"""`SlurmCluster`: a real, throwaway Slurm cluster on this machine for tests and benchmarks.

One real `slurmctld` and N real `slurmd` (Debian's `slurm-wlm` 22.05), all on localhost, all
in a temporary folder: its own `slurm.conf` (free ports, `auth/none` so no munge is needed,
`select/cons_tres`), `gres.conf` with fake GPUs (character devices made with `mknod`), each
`slurmd` on its own `Port=` with `%n` spool, log and pid paths so several share one host.
The real client commands (`sbatch`, `squeue`, `scancel`, `sinfo`, `scontrol`, `sacct -c`)
talk to it when `SLURM_CONF` points at its configuration: `cluster.env()` gives the variables.

    with SlurmCluster(tmp_path, nodes=2, gpus_per_node=2) as slurm:
        out = slurm.run("sbatch", "--parsable", "--wrap", "true")

Runs as root (slurmd must start job steps as their users; `mknod` needs root): Debian's
`slurm-wlm` package must be installed (`.ci/run` installs it). Accounting storage is off;
`jobcomp/filetxt` records finished jobs, so `sacct -c` (the completion log) lists them.
On exit every job is cancelled, the daemons are stopped and any process still carrying
this cluster's `SLURM_CONF` (a job or a `slurmstepd` left behind) is killed.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from phalanx.testing.processes import pid_alive

SLURM_BIN = Path("/usr/bin")  # sbatch, squeue, scancel, sinfo, scontrol, sacct
SLURM_SBIN = Path("/usr/sbin")  # slurmctld, slurmd


class SlurmUnavailable(RuntimeError):
    """Slurm cannot run here (not installed, not root) or did not start (the message says)."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def listen_ports(count: int) -> list[int]:
    """`count` distinct ports free on every address now, outside the kernel's ephemeral
    range where it can: slurmctld and slurmd bind 0.0.0.0 a moment later, and a port from
    that range (what binding port 0 gives) may meanwhile become a connection's local port."""
    low, high = _ephemeral_range()
    first, last = (10000, low - 1) if low > 12000 else (high + 1, 65535)
    if last - first < 1000:  # no room outside it: anywhere unprivileged
        first, last = 1024, 65535
    ports: list[int] = []
    while len(ports) < count:
        port = random.randint(first, last)
        if port in ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        ports.append(port)
    return ports


def slurm_installed() -> bool:
    """Whether Debian's `slurm-wlm` daemons and clients are installed."""
    return all(
        (d / name).exists()
        for d, name in (
            (SLURM_SBIN, "slurmctld"),
            (SLURM_SBIN, "slurmd"),
            (SLURM_BIN, "sbatch"),
            (SLURM_BIN, "squeue"),
        )
    )


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def slurm_job_processes(conf: Path) -> list[int]:
    """Pids of live `slurmstepd`s and job processes of the cluster whose configuration is
    `conf` (their environment carries SLURM_CONF=conf; root sees every process)."""
    needle = f"SLURM_CONF={conf}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        variables = environ.split(b"\0")
        if needle not in variables or not pid_alive(int(entry.name)):
            continue
        try:
            stepd = (entry / "comm").read_text().strip() == "slurmstepd"
        except OSError:
            continue
        if stepd or any(v.startswith(b"SLURM_JOB_ID=") for v in variables):
            found.append(int(entry.name))
    return found


class SlurmCluster:
    """A slurmctld and `nodes` slurmd (named n1, n2, …) with `gpus_per_node` fake GPUs each,
    in one partition (`partition`, the default), state under `root` (a temporary folder when
    None, removed on exit).

    `kill_wait` is Slurm's KillWait: the seconds between the SIGTERM a job's processes get
    when it is cancelled, preempted or reaches its time limit and the SIGKILL.
    `message_timeout` is Slurm's MessageTimeout: a client command waits about that long
    for a controller that is down before it gives up. `extra_conf`
    lines are appended to slurm.conf (e.g. "MaxJobCount=20000"). `cpus_per_node` is what
    each node declares (`SlurmdParameters=config_overrides`: whatever this host has); a job
    takes one CPU unless it asks for more, and memory is not a consumable resource.
    """

    def __init__(
        self,
        root: Path | None = None,
        *,
        nodes: int = 2,
        gpus_per_node: int = 2,
        cpus_per_node: int = 4,
        memory_mb: int = 4000,
        partition: str = "gpu",
        kill_wait: int = 30,
        message_timeout: int = 10,
        extra_conf: Sequence[str] = (),
        start_timeout_s: float = 30.0,
    ) -> None:
        if not slurm_installed():
            raise SlurmUnavailable(
                "Slurm daemons not found; install Debian's `slurm-wlm` (.ci/run does)"
            )
        if os.geteuid() != 0:
            raise SlurmUnavailable("a local Slurm cluster must run as root (slurmd, mknod)")
        if not 1 <= nodes <= 64:
            raise SlurmUnavailable(f"nodes must be between 1 and 64 (got {nodes})")
        self._own_root = root is None
        self.root = Path(root or tempfile.mkdtemp(prefix="phalanx-slurm-")).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.nodes = [f"n{i + 1}" for i in range(nodes)]
        self.gpus_per_node = gpus_per_node
        self.cpus_per_node = cpus_per_node
        self.memory_mb = memory_mb
        self.partition = partition
        self.kill_wait = kill_wait
        self.message_timeout = message_timeout
        self.extra_conf = list(extra_conf)
        self.start_timeout_s = start_timeout_s
        self.cluster_name = "phx" + uuid.uuid4().hex[:8]
        self._pick_ports()
        self.conf = self.root / "slurm.conf"
        self.log_dir = self.root / "logs"
        self.jobcomp = self.root / "jobcomp.txt"
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []

    def _pick_ports(self) -> None:
        ctld, *nodes = listen_ports(1 + len(self.nodes))
        self.ctld_port = ctld
        self.node_ports = dict(zip(self.nodes, nodes, strict=True))

    # ------------------------------------------------------------------ clients
    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for the real Slurm clients: `base` (default os.environ) plus SLURM_CONF."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(
        self, *argv: str, check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run one real Slurm client command (`sbatch`, `squeue`, …) against this cluster,
        in its folder (where a job's default output, slurm-%j.out, lands)."""
        cmd = [str(SLURM_BIN / argv[0]), *argv[1:]] if "/" not in argv[0] else list(argv)
        return subprocess.run(
            cmd,
            env=self.env(),
            cwd=self.root,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def job_state(self, job_id: str) -> str | None:
        """The job's state as squeue reports it (RUNNING, PENDING, …), or the state in the
        completion log once it left squeue; None if neither knows the id."""
        out = self.run("squeue", "-h", "-o", "%T", "-j", job_id, check=False)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
        for line in reversed(self._jobcomp_lines()):
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if fields.get("JobId") == job_id:
                return fields.get("JobState")
        return None

    def _jobcomp_lines(self) -> list[str]:
        try:
            return self.jobcomp.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return []

    def node_states(self) -> dict[str, str]:
        """Each node's state as `sinfo -N` reports it (idle, alloc, mix, down*, …)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        states = {}
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    # ------------------------------------------------------------------ config
    def _gpu_devices(self, node: str) -> list[Path]:
        return [self.root / "dev" / f"{node}-gpu{i}" for i in range(self.gpus_per_node)]

    def _write_config(self) -> None:
        root = self.root
        for sub in ("state", "spool", "logs", "dev"):
            (root / sub).mkdir(exist_ok=True)
        for node in self.nodes:
            (root / "spool" / node).mkdir(exist_ok=True)
        gres_lines = []
        for node in self.nodes:
            for dev in self._gpu_devices(node):
                if not dev.exists():
                    # A copy of /dev/null (char 1:3): a device file slurmd can stat, that
                    # opens nothing real even on a machine with GPUs.
                    os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))
                gres_lines.append(f"NodeName={node} Name=gpu File={dev}")
        gres = f"Gres=gpu:{self.gpus_per_node} " if self.gpus_per_node else ""
        lines = [
            f"ClusterName={self.cluster_name}",
            "SlurmctldHost=localhost",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/none",
            "CredType=cred/none",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={next(iter(self.node_ports.values()))}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool' / '%n'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd.%n.pid'}",
            f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}",
            f"SlurmdLogFile={self.log_dir / 'slurmd.%n.log'}",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            # Nodes declare the CPUs asked for, whatever this host has.
            "SlurmdParameters=config_overrides",
            "GresTypes=gpu",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={self.jobcomp}",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1,sched_min_interval=100000",
            "ReturnToService=2",
            f"KillWait={self.kill_wait}",
            "MinJobAge=60",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            f"MessageTimeout={self.message_timeout}",
            *self.extra_conf,
        ]
        for node in self.nodes:
            lines.append(
                f"NodeName={node} NodeHostname=localhost Port={self.node_ports[node]} "
                f"CPUs={self.cpus_per_node} RealMemory={self.memory_mb} {gres}State=UNKNOWN"
            )
        lines.append(
            f"PartitionName={self.partition} Nodes={','.join(self.nodes)} Default=YES "
            "MaxTime=INFINITE State=UP"
        )
        self.conf.write_text("\n".join(lines) + "\n", encoding="utf-8")
        (root / "gres.conf").write_text("\n".join(gres_lines) + "\n", encoding="utf-8")

    # ------------------------------------------------------------------ lifecycle
    def _spawn(self, label: str, argv: list[str]) -> None:
        log = (self.log_dir / f"{label}.out").open("ab")
        self._logs.append(log)
        self._procs[label] = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env(),
            start_new_session=True,
        )

    def start(self) -> SlurmCluster:
        """Write the configuration, start the daemons, wait until every node is idle. A
        port taken between picking it and a daemon binding it: again, on fresh ports."""
        for attempt in range(5):
            self._write_config()
            try:
                self._start_daemons()
                return self
            except SlurmUnavailable as e:
                if "Address already in use" not in str(e) or attempt == 4:
                    self.stop()
                    raise
                self._halt()
                for log in self._logs:
                    log.close()
                self._logs.clear()
                for stale in ("state", "logs"):
                    shutil.rmtree(self.root / stale, ignore_errors=True)
                self._pick_ports()
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _start_daemons(self) -> None:
        self.start_controller()
        for node in self.nodes:
            # -N: the configured node this slurmd is (several share this host).
            self._spawn(f"slurmd-{node}", [str(SLURM_SBIN / "slurmd"), "-D", "-N", node])
        self._wait("every node idle", self._all_idle)

    def start_controller(self) -> None:
        """Start slurmctld (again, after `stop_controller`: it recovers its saved state,
        the jobs and nodes it had) and wait until it answers."""
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            return
        # -D: in the foreground (this object owns the process).
        self._spawn("slurmctld", [str(SLURM_SBIN / "slurmctld"), "-D"])
        self._wait("slurmctld answers", self._ctld_up)

    def stop_controller(self) -> None:
        """Stop slurmctld alone (SIGTERM: it saves its state); the slurmd and the jobs
        running on them go on, and every client command fails until `start_controller`."""
        proc = self._procs.get("slurmctld")
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)

    def _ctld_up(self) -> bool:
        return self.run("scontrol", "ping", check=False, timeout=10).returncode == 0

    def _all_idle(self) -> bool:
        states = self.node_states()
        return len(states) == len(self.nodes) and all(s == "idle" for s in states.values())

    def _wait(self, what: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while not ready():
            dead = [label for label, p in self._procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {path.name}\n{_tail(path)}" for path in sorted(self.log_dir.glob("*"))
                )
                why = f"{', '.join(dead)} exited" if dead else f"not within {self.start_timeout_s}s"
                raise SlurmUnavailable(f"Slurm did not start ({what}: {why}):\n{logs}")
            time.sleep(0.2)

    def cancel_all(self, timeout_s: float = 20.0) -> None:
        """Cancel every job (SIGKILL now, not KillWait later) and wait until none runs."""
        if "slurmctld" not in self._procs or self._procs["slurmctld"].poll() is not None:
            return
        self.run("scancel", "--full", "--signal=KILL", "--user=root", check=False)
        self.run("scancel", "--user=root", check=False)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = self.run("squeue", "-h", "-t", "PD,R,CG,S,CF", "-o", "%i", check=False)
            if out.returncode == 0 and not out.stdout.strip():
                return
            time.sleep(0.2)

    def stop(self) -> None:
        """Cancel every job, stop the daemons, end what is left of the jobs; remove the
        folder if it was a temporary one."""
        with contextlib.suppress(Exception):
            self.cancel_all()
        self._halt()
        for log in self._logs:
            log.close()
        self._logs.clear()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def _halt(self) -> None:
        # slurmd first (a slurmctld gone first makes it wait), then the controller.
        order = sorted(self._procs, key=lambda label: label == "slurmctld")
        for label in order:
            proc = self._procs[label]
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self._procs.clear()
        # slurmstepd and job processes outlive slurmd by design: end what is left of ours.
        for _ in range(50):
            left = slurm_job_processes(self.conf)
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def leftover_pids(self) -> list[int]:
        """This cluster's slurmstepd and job processes still alive (none after `stop`)."""
        return slurm_job_processes(self.conf)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
