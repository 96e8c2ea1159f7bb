"""The head's scheduling cycle: the core decides, the head applies (core state, then jobs)."""

from __future__ import annotations

import logging
import re

from phalanx.core import JobState, Reason, ReasonCode, schedule
from phalanx.head import corestate, lifecycle
from phalanx.head.mirror import Mirror, Tx
from phalanx.head.records import JobRecord

log = logging.getLogger("phalanx.head")

NO_NODES = Reason(ReasonCode.RESOURCES, "no nodes have joined the cluster yet")


def cycle(mirror: Mirror, tx: Tx, now: float) -> None:
    """One scheduling cycle: core decides, the head applies, all in the caller's transaction."""
    if mirror.core_dirty:
        corestate.rebuild(mirror, tx, now)
    core = mirror.core
    if core is None:
        return
    applied = corestate.apply(mirror, schedule(core, now), now)
    for start in applied.starts:
        # Ranks follow the host-list order of the nodes, as in Slurm: node 0 is the first
        # name of SLURM_JOB_NODELIST, which compresses (`n[1-4]`), whatever order the core
        # chose.
        placement = sorted(
            (
                (core.nodes[n].name, list(start.placement.gpu_indices(slot)))
                for slot, (n, _mask) in enumerate(start.placement.slots)
            ),
            key=lambda node_gpus: _host_order(node_gpus[0]),
        )
        lifecycle.start(mirror, tx, mirror.jobs[start.job_id], placement, now)
    for victim, for_job in applied.notices:
        victim_rec = mirror.jobs.get(victim)
        if victim_rec is not None:
            lifecycle.preempt(mirror, tx, victim_rec, for_job, now)


def pending_reason(mirror: Mirror, rec: JobRecord) -> tuple[str | None, str | None]:
    """Why a queued job waits, from the last cycle's decisions (computed when asked, so a
    cycle costs nothing per pending job it did not look at)."""
    core, decisions = mirror.core, mirror.decisions
    if rec.state is not JobState.PENDING or not rec.in_core:
        return rec.reason, rec.reason_message
    if core is None:
        return NO_NODES.code.value, NO_NODES.message
    request = core.pending.get(rec.id)
    if request is None or decisions is None:
        return rec.reason, rec.reason_message
    reason = decisions.reason_for(request)
    return reason.code.value, reason.message


def _host_order(name: str) -> list[tuple[int, str]]:
    """Sort key of a host name whose numbers compare as numbers (`n9` before `n10`)."""
    parts = re.split(r"(\d+)", name)
    return [(int(p), "") if i % 2 else (0, p) for i, p in enumerate(parts)]
