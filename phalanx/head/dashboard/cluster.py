"""What the dashboard shows of the cluster: the overview's numbers and the GPU grid.

Read under the control lock from the mirror (the live state) and the latest GPU readings
(head.telemetry); plain dataclasses out, rendered by the templates. One page of nodes is
built at a time, so the cost follows the page, not the cluster.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from phalanx.api.models import GpuInfo, GpuTelemetry
from phalanx.core import JobState
from phalanx.head.auth import Principal
from phalanx.head.records import NodeRecord
from phalanx.head.service import Head

# A GPU reading older than this is not "now" (an agent that stopped reporting).
STALE_S = 60.0
BUSY_PCT = 5.0  # at or above: busy; below: idle


@dataclass(frozen=True, slots=True)
class NodeRow:
    """One node of a page, with what its GPU cells need (grid.cells_html draws them)."""

    name: str
    address: str
    state: str
    reason: str | None
    heartbeat_age_s: float | None
    jobs: tuple[int, ...]
    gpus: tuple[GpuInfo, ...]
    holders: dict[int, tuple[int, str | None]]  # GPU index → (job id, user if viewable)
    readings: dict[int, GpuTelemetry]  # GPU index → its latest reading, if fresh
    idle: dict[int, float] = field(default_factory=dict)  # GPU index → idle since (flagged)

    @property
    def gpus_used(self) -> int:
        return len(self.holders)

    @property
    def gpu_models(self) -> str:
        return ", ".join(sorted({g.model for g in self.gpus})) or "none"


@dataclass(frozen=True, slots=True)
class NodePage:
    rows: tuple[NodeRow, ...]
    total: int  # nodes matching the filter
    page: int
    pages: int


@dataclass(slots=True)
class Overview:
    nodes_by_state: dict[str, int] = field(default_factory=dict)
    gpus_total: int = 0
    gpus_by_state: dict[str, int] = field(default_factory=dict)  # allocated, free, drain, down
    gpus_reporting: int = 0
    gpus_busy: int = 0
    mean_utilization_pct: float | None = None
    jobs_by_state: dict[str, int] = field(default_factory=dict)
    queue_depth: int = 0
    gpus_flagged_idle: int = 0  # allocated GPUs idle-GPU detection flagged
    queued_gpus: int = 0
    mfu: float | None = None  # GPU-weighted mean over the running jobs that report it
    mfu_jobs: int = 0
    mfu_gpus: int = 0


def visible(who: Principal, user: str, team: str) -> bool:
    """Whether `who` sees a job's metadata (as the REST API decides: its owner, its team's
    members and admins, cluster admins)."""
    return who.admin or user == who.user or team in who.teams or team in who.admin_of


def host_order(name: str) -> tuple[tuple[int, str], ...]:
    """Sort key of a host name whose numbers compare as numbers (`n9` before `n10`)."""
    parts = re.split(r"(\d+)", name)
    return tuple((int(p), "") if i % 2 else (0, p) for i, p in enumerate(parts))


def overview(head: Head) -> Overview:
    """The cluster at a glance (aggregates only: no job or user is named)."""
    out = Overview()
    now = head.now()
    utils: list[float] = []
    serving: list[str] = []  # nodes not down: their readings count, read after the lock
    with head.control.lock:
        mirror = head.mirror
        held: Counter[str] = Counter()
        for rec in mirror.jobs.values():
            out.jobs_by_state[rec.state.value] = out.jobs_by_state.get(rec.state.value, 0) + 1
            if rec.state is JobState.PENDING:
                out.queue_depth += 1
                out.queued_gpus += rec.spec.nodes * rec.spec.gpus_per_node
            if rec.state.holds_gpus:
                for where, indices in rec.placement:
                    held[where] += len(indices)
            if rec.state is JobState.RUNNING and rec.progress:
                mfus = [p.mfu for p in rec.progress.values() if p.mfu is not None]
                if mfus:
                    size = rec.spec.nodes * rec.spec.gpus_per_node
                    out.mfu_jobs += 1
                    out.mfu_gpus += size
                    out.mfu = (out.mfu or 0.0) + size * sum(mfus) / len(mfus)
        states: Counter[str] = Counter()
        for node in mirror.nodes.values():
            out.nodes_by_state[node.state.value] = out.nodes_by_state.get(node.state.value, 0) + 1
            n = len(node.gpus)
            out.gpus_total += n
            used = min(n, held.get(node.name, 0))
            if node.state.value == "down":
                states["down"] += n
                continue
            states["allocated"] += used
            states["drain" if node.state.value == "drain" else "free"] += n - used
            serving.append(node.name)
    for name in serving:
        reading = head.samples.latest(name)
        if reading is None or now - reading.time > STALE_S:
            continue
        utils.extend(g.utilization_pct for g in reading.gpus if g.utilization_pct is not None)
    out.gpus_flagged_idle = head.usage.idle.idle_gpus()
    out.gpus_by_state = {k: states.get(k, 0) for k in ("allocated", "free", "drain", "down")}
    out.gpus_reporting = len(utils)
    out.gpus_busy = sum(1 for u in utils if u >= BUSY_PCT)
    out.mean_utilization_pct = sum(utils) / len(utils) if utils else None
    if out.mfu is not None and out.mfu_gpus:
        out.mfu /= out.mfu_gpus
    return out


def node_page(
    head: Head, who: Principal, state: str | None, query: str | None, page: int, per: int
) -> NodePage:
    """One page of nodes (host-list order), each with its GPUs, who holds each and their
    latest readings; a job `who` may not see (another team's) is named by its id only, as
    the REST API's node list names it. The control lock is held only to copy references
    out of the mirror; the page is built after it (a grid of 8,000 GPUs must not stall the
    control thread)."""
    now = head.now()
    picked: list[tuple[NodeRecord, tuple[int, ...], dict[int, tuple[int, str | None]]]] = []
    with head.control.lock:
        mirror = head.mirror
        names = [
            n.name
            for n in mirror.nodes.values()
            if (state is None or n.state.value == state) and (not query or query in n.name)
        ]
        names.sort(key=host_order)
        total = len(names)
        pages = max(1, -(-total // per))
        page = min(page, pages)
        for name in names[(page - 1) * per : page * per]:
            holders: dict[int, tuple[int, str | None]] = {}
            ids = tuple(sorted(mirror.node_jobs.get(name, ())))
            for job_id in ids:
                rec = mirror.jobs.get(job_id)
                if rec is None or not rec.state.holds_gpus:
                    continue
                shown = rec.user if visible(who, rec.user, rec.team) else None
                for where, gpus in rec.placement:
                    if where == name:
                        for g in gpus:
                            holders[g] = (rec.id, shown)
            picked.append((mirror.nodes[name], ids, holders))
    on_page = {node.name for node, _, _ in picked}
    idle: dict[str, dict[int, float]] = {}
    for f in head.usage.idle.flags():
        if f.node in on_page:
            idle.setdefault(f.node, {})[f.index] = f.idle_since
    rows = []
    for node, ids, holders in picked:
        reading = head.samples.latest(node.name)
        fresh = reading is not None and now - reading.time <= STALE_S
        heard = node.heard_at
        rows.append(
            NodeRow(
                name=node.name,
                address=node.address,
                state=node.state.value,
                reason=node.reason,
                heartbeat_age_s=None if heard is None else max(0.0, now - heard),
                jobs=ids,
                gpus=tuple(node.gpus),
                holders=holders,
                readings={g.index: g for g in reading.gpus} if reading and fresh else {},
                idle=idle.get(node.name, {}),
            )
        )
    return NodePage(rows=tuple(rows), total=total, page=page, pages=pages)
