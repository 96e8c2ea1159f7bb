"""What the dashboard shows of the cluster: the overview's numbers and the GPU grid.

Read under the control lock from the mirror (the live state) and the latest GPU readings
(head.telemetry); plain dataclasses out, rendered by the templates. One page of nodes is
built at a time, so the cost follows the page, not the cluster.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from phalanx.core import JobState
from phalanx.head.service import Head

# A GPU reading older than this is not "now" (an agent that stopped reporting).
STALE_S = 60.0
BUSY_PCT = 5.0  # at or above: busy; below: idle


@dataclass(frozen=True, slots=True)
class GpuCell:
    """One GPU of the grid (grid.cells_html draws it): its latest reading, if fresh, and
    the job and user holding it."""

    node: str
    index: int
    model: str
    utilization_pct: float | None
    memory_used_mb: int | None
    memory_mb: int
    job_id: int | None
    user: str | None
    node_state: str


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    address: str
    state: str
    reason: str | None
    gpus_used: int
    gpu_models: str
    heartbeat_age_s: float | None
    jobs: tuple[int, ...]
    cells: tuple[GpuCell, ...]


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
    queued_gpus: int = 0
    mfu: float | None = None  # GPU-weighted mean over the running jobs that report it
    mfu_jobs: int = 0
    mfu_gpus: int = 0


def host_order(name: str) -> tuple[tuple[int, str], ...]:
    """Sort key of a host name whose numbers compare as numbers (`n9` before `n10`)."""
    parts = re.split(r"(\d+)", name)
    return tuple((int(p), "") if i % 2 else (0, p) for i, p in enumerate(parts))


def overview(head: Head) -> Overview:
    """The cluster at a glance (aggregates only: no job or user is named)."""
    out = Overview()
    now = head.now()
    utils: list[float] = []
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
            reading = head.samples.latest(node.name)
            if reading is None or now - reading.time > STALE_S:
                continue
            for g in reading.gpus:
                if g.utilization_pct is not None:
                    utils.append(g.utilization_pct)
    out.gpus_by_state = {k: states.get(k, 0) for k in ("allocated", "free", "drain", "down")}
    out.gpus_reporting = len(utils)
    out.gpus_busy = sum(1 for u in utils if u >= BUSY_PCT)
    out.mean_utilization_pct = sum(utils) / len(utils) if utils else None
    if out.mfu is not None and out.mfu_gpus:
        out.mfu /= out.mfu_gpus
    return out


def node_page(head: Head, state: str | None, query: str | None, page: int, per: int) -> NodePage:
    """One page of nodes (host-list order), each with a cell per GPU: its latest reading and
    the job and user holding it."""
    now = head.now()
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
        rows = []
        for name in names[(page - 1) * per : page * per]:
            node = mirror.nodes[name]
            owner: dict[int, tuple[int, str]] = {}
            ids = sorted(mirror.node_jobs.get(name, set()))
            for job_id in ids:
                rec = mirror.jobs.get(job_id)
                if rec is None or not rec.state.holds_gpus:
                    continue
                for where, gpus in rec.placement:
                    if where == name:
                        for g in gpus:
                            owner[g] = (rec.id, rec.user)
            reading = head.samples.latest(name)
            fresh = reading is not None and now - reading.time <= STALE_S
            by_index = {g.index: g for g in reading.gpus} if reading is not None and fresh else {}
            cells = []
            for gpu in node.gpus:
                sample = by_index.get(gpu.index)
                job = owner.get(gpu.index)
                cells.append(
                    GpuCell(
                        node=name,
                        index=gpu.index,
                        model=gpu.model,
                        utilization_pct=None if sample is None else sample.utilization_pct,
                        memory_used_mb=None if sample is None else sample.memory_used_mb,
                        memory_mb=gpu.memory_mb,
                        job_id=None if job is None else job[0],
                        user=None if job is None else job[1],
                        node_state=node.state.value,
                    )
                )
            heard = node.heard_at
            rows.append(
                NodeRow(
                    name=name,
                    address=node.address,
                    state=node.state.value,
                    reason=node.reason,
                    gpus_used=len(owner),
                    gpu_models=", ".join(sorted({g.model for g in node.gpus})) or "none",
                    heartbeat_age_s=None if heard is None else max(0.0, now - heard),
                    jobs=tuple(ids),
                    cells=tuple(cells),
                )
            )
    return NodePage(rows=tuple(rows), total=total, page=page, pages=pages)
