"""`LocalCluster`: a head (and optionally a standby) and N agents on 127.0.0.2… as real
subprocesses (`phalanx up`, tests)."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from phalanx.client.api import ApiError, PhalanxClient
from phalanx.tls import CA_FILE_ENV, CA_PEM_ENV

_LISTENING = re.compile(r"head listening on (https?://\S+)")
_PR_SET_PDEATHSIG = 1
# The client's and other local clusters' credentials must not leak into our processes.
_SCRUBBED_ENV = (
    "PHALANX_HEAD",
    "PHALANX_TOKEN",
    "PHALANX_JOIN_TOKEN",
    CA_FILE_ENV,
    CA_PEM_ENV,
)


class ClusterError(Exception):
    """The local cluster could not start (the message includes the failing process's log)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


class _Proc:
    """One child process in its own process group, its output going to a log file."""

    def __init__(self, label: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.label = label
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file: IO[bytes] = log.open("ab")
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own group: we signal it and its children together
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def failure(self, what: str) -> str:
        code = self.popen.poll()
        status = "is running" if code is None else f"exited with code {code}"
        return f"{what}: {self.label} {status}; last lines of {self.log}:\n{_tail(self.log)}"

    def close_log(self) -> None:
        self._log_file.close()


class _Head:
    """One head of the cluster: its state dir, address, fixed port (a restarted head comes
    back on the same URL) and, while started, its process."""

    def __init__(self, label: str, state_dir: Path, host: str, port: int | None) -> None:
        self.label = label  # "head" (the first), "head-b" (the standby): also its log's name
        self.state_dir = state_dir
        self.host = host
        self.port = port
        self.proc: _Proc | None = None
        self.url: str | None = None  # what it announced ("head listening on URL")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()


class LocalCluster:
    """A head and `nodes` agents with fake GPUs, each agent on its own 127.0.0.N (N from 2).

    State lives under `state_dir` (head in `head/`, agents in `agent-127.0.0.N/`, process
    logs in `logs/`). Use as a context manager, or call `start()` and `stop()`; the
    processes are also stopped at interpreter exit and get SIGTERM if this process dies.
    The head serves TLS with its own CA (`ca_file`) unless `tls` is False (plain HTTP on
    loopback, as `phalanx head --plain-http`).

    With `standby` (a PostgreSQL `db_url` only) a second head runs on `standby_host`, state
    in `head-b/` and the first head's CA, and waits as a standby for the leader lock
    (docs/high-availability.md); agents, clients and jobs get both URLs (`url`). Heads are
    numbered 0 (the first) and 1 (the standby): `leader()` says which one leads now.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        nodes: int = 2,
        gpus_per_node: int = 4,
        gpu_model: str = "H100",
        port: int | None = None,
        db_url: str | None = None,
        start_timeout_s: float = 60.0,
        head_args: Sequence[str] = (),
        agent_args: Sequence[str] = (),
        users_map_to_self: bool = True,
        tls: bool = True,
        standby: bool = False,
        standby_host: str = "127.0.1.1",
    ) -> None:
        if nodes < 0 or nodes > 253:
            # 0: a head alone (simulated agents join it: phalanx.testing.fleet)
            raise ClusterError(f"nodes must be between 0 and 253 (got {nodes})")
        if gpus_per_node < 1:
            raise ClusterError(f"gpus_per_node must be at least 1 (got {gpus_per_node})")
        if standby and not (db_url or "").startswith("postgresql"):
            # Only PostgreSQL elects a leader; a second SQLite head refuses to start.
            raise ClusterError("a standby head needs a PostgreSQL db_url")
        self.state_dir = Path(state_dir).resolve()
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.gpu_model = gpu_model
        self.port = port
        self.db_url = db_url
        self.start_timeout_s = start_timeout_s
        self.head_args = list(head_args)  # extra `phalanx head` flags (e.g. --lease 3)
        self.agent_args = list(agent_args)  # extra `phalanx agent` flags
        # A personal cluster: every user's jobs run as this process's Unix account (False:
        # as the account named like the user, as on a shared cluster; docs/security.md).
        self.users_map_to_self = users_map_to_self
        self.tls = tls
        self.addresses = [f"127.0.0.{i + 2}" for i in range(nodes)]
        self._heads = [_Head("head", self.state_dir / "head", "127.0.0.1", port)]
        if standby:
            self._heads.append(_Head("head-b", self.state_dir / "head-b", standby_host, None))
        self._started = False
        self._agents: list[_Proc] = []
        self._reported: set[int] = set()  # pids whose exit `exited()` has returned

    # ------------------------------------------------------------------ properties
    @property
    def head_dir(self) -> Path:
        """The head's state dir (database, admin.token, join.token)."""
        return self.state_dir / "head"

    @property
    def log_dir(self) -> Path:
        """Where each process's stdout+stderr goes (`head.log`, the standby's `head-b.log`,
        `agent-127.0.0.N.log`)."""
        return self.state_dir / "logs"

    @property
    def admin_token_file(self) -> Path:
        """The file the head writes its admin token to."""
        return self.head_dir / "admin.token"

    @property
    def ca_file(self) -> Path | None:
        """The head's CA certificate that clients pin (None with plain HTTP)."""
        return self.head_dir / "tls" / "ca.crt" if self.tls else None

    def client_env(self, token: str | None = None) -> dict[str, str]:
        """The variables that point the CLI at this cluster (as admin unless `token`)."""
        env = {"PHALANX_HEAD": self.url, "PHALANX_TOKEN": token or self.admin_token}
        if self.ca_file is not None:
            env[CA_FILE_ENV] = str(self.ca_file)
        return env

    @property
    def url(self) -> str:
        """The head's URL (after `start()`); with a standby, every head's URL comma-separated,
        as agents, clients and jobs (PHALANX_HEAD) get it."""
        return ",".join(self.head_url(i) for i in range(len(self._heads)))

    def head_url(self, index: int = 0) -> str:
        """The URL of head `index` (0: the first head, 1: the standby)."""
        url = self._heads[index].url
        if url is None or not self._started:
            raise ClusterError("the cluster is not started")
        return url

    @property
    def admin_token(self) -> str:
        """The admin API token the head wrote on first start."""
        return self._read_token(self.admin_token_file)

    @property
    def join_token(self) -> str:
        """The token agents join with."""
        return self._read_token(self.head_dir / "join.token")

    def client(self, token: str | None = None) -> PhalanxClient:
        """A client for the head, as admin unless another token is given."""
        return PhalanxClient(self.url, token or self.admin_token, ca=self._ca())

    def processes(self) -> list[subprocess.Popen[bytes]]:
        """The head (heads) and agent processes (to check they are alive, or their pids)."""
        return [p.popen for p in [*self._head_procs(), *self._agents]]

    def _head_procs(self) -> list[_Proc]:
        return [h.proc for h in self._heads if h.proc is not None]

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the head, then the agents; return once every node is up.

        Raises ClusterError (everything already started is stopped again).
        """
        if self._started:
            raise ClusterError("the cluster is already started")
        self._started = True
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        self.head_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.head_dir.chmod(0o700)  # the head's database and tokens: also an old state dir's
        if self.port is None:
            self.port = free_port()  # kept: a restarted head comes back on the same URL
        self._heads[0].port = self.port
        self._start_head(self._heads[0], deadline)
        for standby in self._heads[1:]:
            self._share_ca(standby)
            standby.port = standby.port or free_port(standby.host)
            self._start_head(standby, deadline)
        self._agents = [self._agent_proc(address) for address in self.addresses]
        self._wait_nodes(deadline)

    def _share_ca(self, standby: _Head) -> None:
        """Give the standby the first head's CA before its first start: it then signs its
        own server certificate (for its own address) and agents' certificates with the CA
        that clients and agents already pin."""
        if not self.tls or (standby.state_dir / "tls" / "ca.key").exists():
            return
        source = self.head_dir / "tls"
        target = standby.state_dir / "tls"
        target.mkdir(parents=True, exist_ok=True, mode=0o700)
        standby.state_dir.chmod(0o700)
        for name in ("ca.crt", "ca.key"):
            shutil.copy2(source / name, target / name)  # keeps ca.key's 0600

    def _start_head(self, head: _Head, deadline: float) -> None:
        argv = [*self._phalanx(), "head", "--state-dir", str(head.state_dir)]
        argv += ["--host", head.host, "--port", str(head.port), *self.head_args]
        if self.users_map_to_self:
            argv.append("--users-map-to-self")
        if not self.tls:
            argv.append("--plain-http")
        if self.db_url:
            argv += ["--db", self.db_url]
        head.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        head_log = self.log_dir / f"{head.label}.log"
        start_offset = head_log.stat().st_size if head_log.exists() else 0
        head.proc = _Proc(head.label, argv, head_log, self._env())
        head.url = self._wait_listening(head, start_offset, deadline)
        self._wait_healthy(head, deadline)

    def _agent_proc(
        self, address: str, head_url: str | None = None, argv_prefix: list[str] | None = None
    ) -> _Proc:
        phalanx = argv_prefix if argv_prefix is not None else self._phalanx()
        argv = [*phalanx, "agent", "--head", head_url or self.url, "--address", address]
        argv += ["--name", address, "--port", "0"]
        argv += ["--fake-gpus", str(self.gpus_per_node), "--gpu-model", self.gpu_model]
        argv += ["--state-dir", str(self.state_dir / f"agent-{address}"), *self.agent_args]
        log = self.log_dir / f"agent-{address}.log"
        join_env = {**self._env(), "PHALANX_JOIN_TOKEN": self.join_token}
        if self.ca_file is not None:
            join_env[CA_FILE_ENV] = str(self.ca_file)
        return _Proc(f"agent {address}", argv, log, join_env)

    # ------------------------------------------------------------------ chaos
    def kill_head(self, sig: int = signal.SIGKILL, index: int | None = None) -> int:
        """Signal head `index` (default: the leader; SIGKILL: a crash; SIGTERM: a clean
        stop), wait for it to exit and return its exit status."""
        proc = self._head_proc(index)
        proc.signal_group(sig)
        status = proc.popen.wait(timeout=30)
        proc.close_log()
        return status

    def signal_head(self, sig: int, index: int | None = None) -> None:
        """Send `sig` to head `index` (default: the leader) without waiting (SIGSTOP freezes
        it, SIGCONT thaws it: name the frozen head by its index, it cannot say it leads)."""
        self._head_proc(index).signal_group(sig)

    def restart_head(self, index: int | None = None) -> None:
        """Start head `index` again on its state dir, database and port (after kill_head);
        default: the one head that is not running. Returns once it answers /healthz (as the
        leader, or as a standby when another head holds the leader lock)."""
        if index is None:
            stopped = [i for i, h in enumerate(self._heads) if not h.alive()]
            if not stopped:
                raise ClusterError("the head is still running")
            index = stopped[0]
        if self._heads[index].alive():
            raise ClusterError(f"{self._heads[index].label} is still running")
        old = self._heads[index].proc
        if old is not None:
            old.close_log()
        self._start_head(self._heads[index], time.monotonic() + self.start_timeout_s)

    def head_returncode(self, index: int) -> int | None:
        """The exit status of head `index` once it has exited (None while it runs)."""
        proc = self._heads[index].proc
        if proc is None:
            raise ClusterError(f"{self._heads[index].label} was never started")
        return proc.popen.poll()

    def head_role(self, index: int = 0) -> str | None:
        """What head `index` says it is in /healthz: "leader", "standby", or None when it
        does not answer (stopped, frozen, starting)."""
        head = self._heads[index]
        if head.url is None or not head.alive():
            return None
        try:
            with PhalanxClient(head.url, None, timeout=2.0, ca=self._ca()) as client:
                return client.health().role
        except ApiError:
            return None

    def leader(self) -> int | None:
        """The index of the head that answers as the leader now (None: none does)."""
        for index in range(len(self._heads)):
            if self.head_role(index) == "leader":
                return index
        return None

    def wait_leader(self, timeout_s: float | None = None) -> int:
        """Wait until a head answers as the leader; its index. Raises ClusterError."""
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        while (found := self.leader()) is None:
            if not any(h.alive() for h in self._heads):
                raise ClusterError("no head is running")
            if time.monotonic() > deadline:
                raise ClusterError(f"no head became the leader in {timeout_s}s")
            time.sleep(0.1)
        return found

    def _head_proc(self, index: int | None) -> _Proc:
        if not self._started:
            raise ClusterError("the cluster is not started")
        if index is None:  # one head: that one, without asking it (it may be frozen)
            index = 0 if len(self._heads) == 1 else self.leader()
            if index is None:
                raise ClusterError("no head answers as the leader")
        proc = self._heads[index].proc
        if proc is None:
            raise ClusterError(f"{self._heads[index].label} was never started")
        return proc

    def agent_pid(self, address: str) -> int:
        """The pid of the agent of node `address`."""
        return self._agent(address).popen.pid

    def agent_alive(self, address: str) -> bool:
        """Whether the agent process of node `address` is running."""
        return self._agent(address).alive()

    def signal_agent(self, address: str, sig: int) -> None:
        """Send `sig` to the agent of `address` only (SIGSTOP freezes it, SIGCONT thaws it;
        SIGKILL kills the agent but not its jobs, which are in their own process groups)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._agent(address).popen.pid, sig)

    def crash_node(self, address: str) -> list[int]:
        """Power off node `address`: SIGKILL its agent and every job process it started for
        this cluster. Returns the killed job pids."""
        agent = self._agent(address)
        agent.signal_group(signal.SIGKILL)
        agent.popen.wait(timeout=30)
        agent.close_log()
        killed = []
        for pid in _job_pids(address, self.url):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        return killed

    def start_agent(self, address: str, head_url: str | None = None) -> None:
        """Start the agent of `address` again (after crash_node or a SIGKILL); `head_url`:
        reach the head there instead (a proxy, in tests of a cut-off node)."""
        index = self.addresses.index(address)
        old = self._agents[index]
        if old.alive():
            raise ClusterError(f"the agent of {address} is still running")
        old.close_log()
        self._agents[index] = self._agent_proc(address, head_url)

    def add_agent(self) -> str:
        """Start an agent on the next free 127.0.0.N (a new node joining); its address."""
        if not self._started:
            raise ClusterError("the cluster is not started")
        taken = {int(a.rsplit(".", 1)[1]) for a in self.addresses}
        free = [i for i in range(2, 255) if i not in taken]
        if not free:
            raise ClusterError("no free 127.0.0.N address left (at most 253 nodes)")
        address = f"127.0.0.{free[0]}"
        self._agents.append(self._agent_proc(address))
        self.addresses.append(address)
        self.nodes = len(self.addresses)
        return address

    def process_table(self) -> list[dict[str, object]]:
        """Each process: what it is, its pid, where it listens or which node it is, its log,
        and its exit code (None while it runs)."""
        rows: list[dict[str, object]] = []
        for head in self._heads:
            if head.proc is not None:
                rows.append(self._row("head", head.proc, head.url or ""))
        for address, agent in zip(self.addresses, self._agents, strict=False):
            rows.append(self._row("agent", agent, address))
        return rows

    @staticmethod
    def _row(kind: str, proc: _Proc, where: str) -> dict[str, object]:
        return {
            "kind": kind,
            "label": proc.label,
            "pid": proc.popen.pid,
            "address": where,
            "log": str(proc.log),
            "exit_code": proc.popen.poll(),
        }

    def exited(self) -> list[dict[str, object]]:
        """Processes that exited since the last call (each reported once), as in
        process_table, with the last lines of their log under "tail"."""
        out = []
        for row in self.process_table():
            pid = row["pid"]
            assert isinstance(pid, int)
            if row["exit_code"] is not None and pid not in self._reported:
                self._reported.add(pid)
                out.append({**row, "tail": _tail(Path(str(row["log"])), 5)})
        return out

    def upgrade_agent(self, address: str, argv_prefix: list[str] | None = None) -> None:
        """Restart the agent of `address` as an operator upgrading it would: SIGUSR2 (it
        exits and leaves its jobs running), then start it again on the same state dir and
        address, with `argv_prefix` in place of the `phalanx` command when given (another
        release: `phalanx.testing.newer_agent.argv_prefix("1.99")`). The new agent adopts
        the jobs (docs/fault-tolerance.md#agent-restarts-and-upgrades). Returns once the
        node heartbeats again; raises ClusterError if the old agent does not exit or the
        new one does not come back within `start_timeout_s`."""
        index = self.addresses.index(address)
        old = self._agent(address)
        os.kill(old.popen.pid, signal.SIGUSR2)  # the agent only: never its process group
        try:
            old.popen.wait(timeout=self.start_timeout_s)
        except subprocess.TimeoutExpired:
            raise ClusterError(old.failure("the agent did not exit on SIGUSR2")) from None
        old.close_log()
        started = time.time()
        self._agents[index] = self._agent_proc(address, argv_prefix=argv_prefix)
        deadline = time.monotonic() + self.start_timeout_s
        with self.client() as client:
            while True:
                with contextlib.suppress(ApiError):
                    node = next(n for n in client.nodes().nodes if n.name == address)
                    if node.state != "down" and (node.last_heartbeat or 0.0) > started:
                        return
                self._check_alive("an agent stopped while restarting")
                if time.monotonic() > deadline:
                    late = self._agents[index].failure("it did not heartbeat again")
                    raise ClusterError(f"node {address} not back after an upgrade: {late}")
                time.sleep(0.1)

    def _agent(self, address: str) -> _Proc:
        if address not in self.addresses or len(self._agents) != len(self.addresses):
            raise ClusterError(f"no running node {address!r}")
        return self._agents[self.addresses.index(address)]

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every process group, wait up to `grace_s`, then SIGKILL what is left.

        Agents go first (they stop their jobs), then the head. Safe to call twice.
        """
        atexit.unregister(self.stop)
        for group in (self._agents, self._head_procs()):
            for proc in group:
                if proc.alive():
                    proc.signal_group(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for proc in group:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            for proc in group:
                # Also catch grandchildren (job processes) left in the group after the leader.
                proc.signal_group(signal.SIGKILL)
                proc.popen.wait()
                proc.close_log()
        self._agents = []
        for head in self._heads:
            head.proc = None
        self._started = False

    # ------------------------------------------------------------------ helpers
    def _ca(self) -> str | None:
        return str(self.ca_file) if self.ca_file is not None else None

    @staticmethod
    def _phalanx() -> list[str]:
        return [sys.executable, "-m", "phalanx.cli.main"]

    @staticmethod
    def _env() -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        env["PYTHONUNBUFFERED"] = "1"  # logs reach the file as they are written
        return env

    @staticmethod
    def _read_token(path: Path) -> str:
        try:
            return path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ClusterError(f"cannot read {path}: {exc.strerror}") from None

    def check(self) -> None:
        """Raise ClusterError (with the log tail) if any process of the cluster has exited."""
        self._check_alive("a cluster process stopped")

    def _check_alive(self, what: str, head: _Head | None = None) -> None:
        """Raise if a process has exited: the agents, and `head` (default: every head; a
        head that starts is not failed by another one stopped on purpose)."""
        heads = self._head_procs() if head is None else [head.proc] if head.proc else []
        for proc in [*heads, *self._agents]:
            if not proc.alive():
                raise ClusterError(proc.failure(what))

    def _wait_listening(self, head: _Head, offset: int, deadline: float) -> str:
        assert head.proc is not None
        while True:
            with contextlib.suppress(OSError), head.proc.log.open("rb") as f:
                f.seek(offset)
                match = _LISTENING.search(f.read().decode("utf-8", "replace"))
                if match:
                    return match.group(1).rstrip("/")
            if not head.alive():
                assert head.proc is not None
                refusal = _head_refusal(head.proc, offset)
                raise ClusterError(refusal or head.proc.failure("the head did not start"))
            self._check_alive("the head did not start", head)
            if time.monotonic() > deadline:
                raise ClusterError(head.proc.failure("the head did not start in time"))
            time.sleep(0.1)

    def _wait_healthy(self, head: _Head, deadline: float) -> None:
        assert head.url is not None and head.proc is not None
        with PhalanxClient(head.url, None, timeout=5.0, ca=self._ca()) as client:
            while True:
                try:
                    client.health()
                    break
                except ApiError as exc:
                    last = exc
                self._check_alive("the head did not become healthy", head)
                if time.monotonic() > deadline:
                    raise ClusterError(head.proc.failure(f"/healthz failed: {last}"))
                time.sleep(0.1)
        while not (self.head_dir / "join.token").exists():
            self._check_alive("the head wrote no join token", head)
            if time.monotonic() > deadline:
                raise ClusterError(f"the head wrote no {self.head_dir / 'join.token'}")
            time.sleep(0.1)

    def _wait_nodes(self, deadline: float) -> None:
        expected = set(self.addresses)
        with self.client() as client:
            while True:
                try:
                    listed = client.nodes().nodes
                    up = {n.name for n in listed if n.state == "up"}
                    missing = sorted(expected - up)
                except ApiError as exc:
                    missing, up = [f"(nodes unreadable: {exc})"], set()
                if not missing:
                    return
                self._check_alive("an agent stopped while joining")
                if time.monotonic() > deadline:
                    agents = {a.label.removeprefix("agent "): a for a in self._agents}
                    late = agents.get(missing[0])
                    detail = late.failure("it did not join") if late else ""
                    raise ClusterError(
                        f"nodes not up after {self.start_timeout_s:.0f}s: "
                        f"{', '.join(missing)}. {detail}"
                    )
                time.sleep(0.2)


def _head_refusal(head: _Proc, offset: int) -> str | None:
    """The head's own one-line `error: …` from its log since `offset` (a port in use, a
    state dir another head holds), with what to do about a port in use; None if none."""
    try:
        with head.log.open("rb") as f:
            f.seek(offset)
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    errors = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    if not errors:
        return None
    message = f"the head did not start: {errors[-1]}"
    if "already in use" in message.lower():
        message += "; use --port 0 (any free port) or another port"
    return message


def _job_pids(node: str, head_url: str) -> list[int]:
    """Processes started by the agent of `node` for the head at `head_url` (from their
    environment: other clusters on this machine reuse the same node names), and the shims
    they run under (their parents, with the agent's environment, not the job's)."""
    want = (f"SLURMD_NODENAME={node}".encode(), f"PHALANX_HEAD={head_url}".encode())
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if all(w in env for w in want):
            pids.append(int(entry))
    return pids + [p for p in {_parent(pid) for pid in pids} if p is not None and _is_shim(p)]


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def _is_shim(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a.endswith(b"phalanx/agent/shim.py") for a in argv)
