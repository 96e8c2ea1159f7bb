"""The routine operations of phalanx.testing.operations, done on a LocalCluster with a
standby head: restart, freeze or fail over the leading head, upgrade one node's agent. Each
returns its timings (seconds) once every node it touched heartbeats again."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from phalanx.client.api import PhalanxClient
from phalanx.local.cluster import LocalCluster
from phalanx.testing.faults import retry

# What each head operation does, for the report.
HEAD_OPERATIONS = {
    "head_restart": "the leader: kill -9, started again after the outage",
    "head_pause": "the leader: SIGSTOP, SIGCONT after the outage",
    "failover": "the leader: kill -9, the standby takes over, the old leader returns as standby",
}


class Routine:
    """Does the operations on `cluster` (two heads, `client` on both) and times them.
    `outage_s`: how long a head stays down or frozen; `upgrade_argv`: the command line
    prefix of the newer agent that `agent_upgrade` starts."""

    def __init__(
        self,
        cluster: LocalCluster,
        client: PhalanxClient,
        *,
        outage_s: float,
        upgrade_argv: Sequence[str],
    ) -> None:
        self.cluster = cluster
        self.client = client
        self.outage_s = outage_s
        self.upgrade_argv = list(upgrade_argv)

    def head_restart(self) -> dict[str, Any]:
        leader = self.cluster.wait_leader()
        standby = 1 - leader
        # Stopped first: with a standby waiting, killing the leader is a takeover (the
        # failover operation), not a restart.
        self.cluster.kill_head(signal.SIGTERM, standby)
        killed = time.time()
        self.cluster.kill_head(signal.SIGKILL, leader)
        time.sleep(self.outage_s)
        restarted = time.time()
        self.cluster.restart_head(leader)  # returns once it answers
        answering = time.time() - restarted
        nodes_back = self.nodes_back(restarted)
        self.cluster.restart_head(standby)
        return {"down_s": restarted - killed, "answering_s": answering, "nodes_back_s": nodes_back}

    def head_pause(self) -> dict[str, Any]:
        leader = self.cluster.wait_leader()
        stopped = time.time()
        self.cluster.signal_head(signal.SIGSTOP, leader)
        try:
            time.sleep(self.outage_s)
        finally:
            self.cluster.signal_head(signal.SIGCONT, leader)
        resumed = time.time()
        return {"frozen_s": resumed - stopped, "nodes_back_s": self.nodes_back(resumed)}

    def failover(self) -> dict[str, Any]:
        leader = self.cluster.wait_leader()
        killed = time.time()
        self.cluster.kill_head(signal.SIGKILL, leader)
        self.cluster.wait_leader(60)
        took_over = time.time()
        nodes_back = self.nodes_back(took_over)
        self.cluster.restart_head(leader)  # the old leader comes back as a standby
        return {
            "takeover_s": took_over - killed,
            "nodes_back_s": took_over - killed + nodes_back,
            "old_leader_back_as": self.cluster.head_role(leader),
        }

    def agent_upgrade(self, address: str) -> dict[str, Any]:
        """Restart the agent of `address` as the newer release, its jobs left running."""
        old = self.cluster.agent_pid(address)
        started = time.time()
        self.cluster.upgrade_agent(address, list(self.upgrade_argv))
        new = self.cluster.agent_pid(address)
        return {
            "restart_s": time.time() - started,
            "node_back_s": self.nodes_back(started, [address]),
            "agent_pids": [old, new],
            "runs_upgrade_argv": _runs(new, self.upgrade_argv),
        }

    def nodes_back(self, since: float, names: Sequence[str] | None = None) -> float:
        """Seconds from `since` (unix time) until the nodes `names` (default: all) are up
        and have heartbeated to the leading head after it."""
        want = set(names or self.cluster.addresses)

        def back() -> bool:
            nodes = retry(self.client.nodes).nodes
            fresh = {n.name for n in nodes if n.state == "up" and (n.last_heartbeat or 0) > since}
            return want <= fresh

        wait(f"{', '.join(sorted(want))} to heartbeat", back, 60 + self.outage_s)
        return time.time() - since


def _runs(pid: int, argv: Sequence[str]) -> bool:
    """Whether process `pid` runs `argv…` (its command line begins with it)."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return [w.decode() for w in words[: len(argv)]] == list(argv)


def wait(what: str, probe: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll `probe` until it is true; RuntimeError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)
