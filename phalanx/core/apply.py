"""Applying a cycle's decisions to the cluster state: the one way the head, the simulator and
the tests do it, so that what the simulator measures is what the head runs."""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.core.decisions import Decisions, Start
from phalanx.core.state import ClusterState


@dataclass(frozen=True, slots=True)
class Applied:
    """What applying changed: the jobs started, and the victims newly asked to leave
    (victim, for_job) — each caller turns these into processes, notices or events."""

    starts: tuple[Start, ...] = ()
    notices: tuple[tuple[int, int], ...] = ()


def apply_decisions(state: ClusterState, decisions: Decisions, now: float) -> Applied:
    """Start the started jobs and mark the preemption victims in `state`. A victim that
    ended or was already asked meanwhile is skipped (a notice is given once per run)."""
    for start in decisions.starts:
        state.start(start.job_id, start.placement, now, start.borrowed)
    notices = []
    for preemption in decisions.preemptions:
        for victim in preemption.victims:
            if victim in state.running and victim not in state.preempting:
                state.mark_preempting(victim, preemption.for_job)
                notices.append((victim, preemption.for_job))
    return Applied(decisions.starts, tuple(notices))
