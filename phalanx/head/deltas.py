"""Delta heartbeats, the head's side: each node's last numbered report, and the deltas
agents send against it (README.md#heartbeats-at-scale).

An agent numbers its reports (`Heartbeat.seq`). The head keeps the last one it applied per
node (memory only) and acknowledges it in every answer (`DesiredState.report_ack`); the
agent then sends only what changed since that one (`Heartbeat.delta`). A delta whose base
the head does not hold (a head restarted or failed over, an answer lost on the way, a base
it refused) is not applied: the head asks for a full report (`DesiredState.full_report`),
which the agent sends at once. The agent keeps every change in its deltas until the head
acknowledged a report that holds it, so no exit status is lost on the way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from phalanx.api.models import MAX_LIST, Heartbeat, NodeHealth, ProcessStatus

RankKey = tuple[int, int, int]  # (job id, epoch, rank)


@dataclass(slots=True)
class HeldReport:
    """A node's report as the head applied it last: what its deltas build on."""

    seq: int
    version: int  # the desired-state version the agent had applied
    processes: dict[RankKey, ProcessStatus]
    ports: dict[str, int]
    health: NodeHealth


def _key(p: ProcessStatus) -> RankKey:
    return (p.job_id, p.epoch, p.rank)


KEPT = 4  # reports held per node: a delta may build on any of the latest few


class HeldReports:
    """Every node's latest HeldReports, newest last. Changed by the control thread, and by
    the event loop for a delta that only renews a lease (`renew_lease`): every method takes
    this object's own small lock, never the control lock.

    More than one is kept because an agent that has news while its long poll is held
    cancels that request and sends a new one: the head may have applied the cancelled one
    (whose answer the agent never reads), and the new delta then names the report before
    it as its base. Applying a delta on exactly the report it was computed against is
    always right, so any of the last few serves."""

    def __init__(self) -> None:
        self._held: dict[str, list[HeldReport]] = {}
        self._lock = threading.Lock()

    def _latest(self, node: str) -> HeldReport | None:
        kept = self._held.get(node)
        return kept[-1] if kept else None

    def ack(self, node: str) -> int | None:
        """The seq of `node`'s latest report the head holds (None: none)."""
        with self._lock:
            latest = self._latest(node)
            return latest.seq if latest is not None else None

    def forget(self, node: str) -> None:
        """A node (re)joined: its next report starts afresh."""
        with self._lock:
            self._held.pop(node, None)

    def stale(self, hb: Heartbeat) -> bool:
        """A numbered report older than (or the same as) the latest the head holds: a
        request the agent gave up on (a long poll it cancelled) that arrived late. Not
        applied: it would take the node's ranks back to an earlier state."""
        with self._lock:
            latest = self._latest(hb.name)
            return hb.seq is not None and latest is not None and hb.seq <= latest.seq

    def renews_only(self, hb: Heartbeat) -> bool:
        """Whether `hb` only renews its node's lease (`_renews_only`)."""
        with self._lock:
            return self._renews_only(hb)

    def renew_lease(self, hb: Heartbeat, renew: Callable[[], bool]) -> bool:
        """If `hb` only renews its node's lease and `renew()` renewed it (head/leases.py:
        False for a node that is down), the latest held report is now numbered as `hb`
        (`advance`): True. Else nothing changed: apply `hb` as a report (False)."""
        with self._lock:
            if not self._renews_only(hb) or not renew():
                return False
            self._advance(hb)
            return True

    def _renews_only(self, hb: Heartbeat) -> bool:
        """Whether `hb` is a delta on the latest held report that changes nothing in it
        (no rank, port or health news, the same desired-state version): it renews the
        node's lease, nothing more (as a kubelet's Lease is separate from its status). GPU
        readings may come with it; they are not part of the held report."""
        d = hb.delta
        if d is None or hb.health is not None or hb.seq is None:
            return False
        latest = self._latest(hb.name)
        if latest is None or latest.seq != d.base or latest.version != hb.version:
            return False
        return not (d.processes or d.gone or d.master_ports or d.ports_gone)

    def advance(self, hb: Heartbeat) -> None:
        """`hb` renewed the lease only (`renews_only`): the latest held report is now
        numbered as it is (the agent builds its next delta on `hb.seq`)."""
        with self._lock:
            self._advance(hb)

    def _advance(self, hb: Heartbeat) -> None:
        latest = self._latest(hb.name)
        if latest is not None and hb.seq is not None:
            self._keep(
                hb.name,
                HeldReport(hb.seq, hb.version, latest.processes, latest.ports, latest.health),
            )

    def _keep(self, node: str, report: HeldReport) -> None:
        kept = self._held.setdefault(node, [])
        kept.append(report)
        del kept[:-KEPT]

    def resolve(self, hb: Heartbeat) -> Heartbeat | None:
        """The full report `hb` amounts to, and it becomes the latest held one; None: a
        delta whose base the head does not hold, or one that would grow the held report
        past the bounds of a full report (ask for a full report; nothing is applied)."""
        with self._lock:
            return self._resolve(hb)

    def _resolve(self, hb: Heartbeat) -> Heartbeat | None:
        if hb.delta is None:
            assert hb.processes is not None and hb.master_ports is not None
            assert hb.health is not None
            self._held.pop(hb.name, None)
            if hb.seq is not None:  # else an agent that predates deltas: nothing to build on
                processes = {_key(p): p for p in hb.processes}
                ports = dict(hb.master_ports)
                self._keep(hb.name, HeldReport(hb.seq, hb.version, processes, ports, hb.health))
            return hb
        d = hb.delta
        base = next((r for r in self._held.get(hb.name, []) if r.seq == d.base), None)
        if base is None or hb.seq is None:
            return None
        processes = dict(base.processes)
        for ref in d.gone:
            processes.pop((ref.job_id, ref.epoch, ref.rank), None)
        for p in d.processes:
            processes[_key(p)] = p
        dropped = set(d.ports_gone)
        ports = {k: v for k, v in base.ports.items() if k not in dropped}
        ports.update(d.master_ports)
        if len(processes) > MAX_LIST or len(ports) > MAX_LIST:
            self._held.pop(hb.name, None)
            return None
        health = hb.health if hb.health is not None else base.health
        self._keep(hb.name, HeldReport(hb.seq, hb.version, processes, ports, health))
        return hb.model_copy(
            update={
                "processes": list(processes.values()),
                "master_ports": ports,
                "health": health,
                "gpus": hb.gpus or [],
                "delta": None,
            }
        )
