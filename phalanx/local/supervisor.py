"""What `phalanx up` does while it runs: it keeps the local cluster going when one of its
processes dies, as a real cluster would (a dead agent is a node failure: its jobs requeue
on other nodes; a dead head is restarted, and running jobs ride through the outage), says
so, and carries out `phalanx local …` requests (kill a node, start it again, add one)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from phalanx.local import control
from phalanx.local.cluster import ClusterError, LocalCluster

# A head that keeps dying is not restarted for ever: past this many restarts in the window,
# `up` stops and shows its log.
MAX_HEAD_RESTARTS = 5
HEAD_RESTART_WINDOW_S = 120.0


class Supervisor:
    """Call `step()` every half second or so; it raises ClusterError when `up` must stop."""

    def __init__(self, cluster: LocalCluster, say: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.say = say
        self._head_restarts: list[float] = []
        self._killed: set[int] = set()  # agent pids killed on request: not reported as deaths
        self._status: list[dict[str, object]] | None = None

    def describe(self) -> str:
        """One line per process: what, pid, address, log (what `up` prints at start)."""
        lines = []
        for row in self.cluster.process_table():
            what = "head" if row["kind"] == "head" else f"agent {row['address']}"
            where = f"  {row['address']}" if row["kind"] == "head" else ""
            lines.append(f"  {what:<17} pid {row['pid']:<8}{where}  log {row['log']}")
        return "\n".join(lines)

    def step(self) -> None:
        for row in self.cluster.exited():
            pid = row["pid"]
            if pid in self._killed:
                continue
            if row["kind"] == "head":
                self._head_died(row)
            else:
                self._agent_died(row)
        for request in control.pending(self.cluster.state_dir):
            self._handle(request)
        self.publish()

    def stop(self) -> None:
        control.clear_status(self.cluster.state_dir)

    # ------------------------------------------------------------------ deaths
    def _agent_died(self, row: dict[str, object]) -> None:
        node = row["address"]
        self.say(
            f"agent {node} (pid {row['pid']}) exited with code {row['exit_code']}: node {node} "
            "has failed; the head marks it down after the lease and requeues its jobs on other "
            f"nodes. `phalanx local start-node {node}` starts it again (log: {row['log']})"
        )

    def _head_died(self, row: dict[str, object]) -> None:
        now = time.monotonic()
        self._head_restarts = [t for t in self._head_restarts if now - t < HEAD_RESTART_WINDOW_S]
        if len(self._head_restarts) >= MAX_HEAD_RESTARTS:
            raise ClusterError(
                f"the head exited with code {row['exit_code']} again ({MAX_HEAD_RESTARTS} "
                f"restarts in {HEAD_RESTART_WINDOW_S:.0f}s); last lines of {row['log']}:\n"
                f"{row['tail']}"
            )
        self._head_restarts.append(now)
        self.say(
            f"head (pid {row['pid']}) exited with code {row['exit_code']}; restarting it on "
            "the same state (running jobs go on) …"
        )
        self.cluster.restart_head()
        pid = next(r["pid"] for r in self.cluster.process_table() if r["kind"] == "head")
        self.say(f"head restarted: pid {pid}, {self.cluster.url}")

    # ------------------------------------------------------------------ requests
    def _handle(self, request: control.Request) -> None:
        try:
            message = self._do(request.action, request.node)
        except ClusterError as exc:
            control.answer(request, False, str(exc))
            return
        self.say(message)
        control.answer(request, True, message)

    def _do(self, action: str, node: str | None) -> str:
        cluster = self.cluster
        if action == "add-node":
            address = cluster.add_agent()
            return f"added node {address}: {self._agent_line(address)}; it joins in a few seconds"
        if action == "kill-head":
            pid = self._pid("head")
            cluster.kill_head(signal.SIGKILL)  # reported as a death at the next step
            return f"killed the head (pid {pid}) with SIGKILL"
        if node is None or node not in cluster.addresses:
            known = ", ".join(cluster.addresses)
            raise ClusterError(f"no node {node!r} in this cluster (its nodes: {known})")
        if action == "kill-node":
            if not cluster.agent_alive(node):
                raise ClusterError(
                    f"node {node} is not running (`phalanx local start-node {node}`)"
                )
            pid = cluster.agent_pid(node)
            self._killed.add(pid)
            jobs = cluster.crash_node(node)
            return (
                f"killed node {node} (agent pid {pid} and {len(jobs)} job process(es)): the "
                "head marks it down after the lease and requeues its jobs on other nodes"
            )
        if cluster.agent_alive(node):
            raise ClusterError(f"node {node} is running already")
        cluster.start_agent(node)
        return f"started node {node} again: {self._agent_line(node)}"

    def _pid(self, kind: str, address: str | None = None) -> int:
        for row in self.cluster.process_table():
            if row["kind"] == kind and (address is None or row["address"] == address):
                pid = row["pid"]
                assert isinstance(pid, int)
                return pid
        raise ClusterError(f"no {kind} process")

    def _agent_line(self, address: str) -> str:
        log = Path(self.cluster.log_dir) / f"agent-{address}.log"
        return f"agent pid {self._pid('agent', address)}, log {log}"

    def publish(self) -> None:
        """Rewrite up.json when a process changed (what `phalanx local ps` reads)."""
        table = self.cluster.process_table()
        if table == self._status:
            return
        self._status = table
        control.write_status(
            self.cluster.state_dir,
            {"head": self.cluster.url, "processes": table},
        )
