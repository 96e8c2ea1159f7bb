"""Shared pieces of the table-driven scheduler tests: one case shape, one way to run it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from phalanx.core import (
    DEFAULT_CONFIG,
    ClusterState,
    Decisions,
    JobRequest,
    Node,
    ReasonCode,
    SchedulerConfig,
    Team,
    schedule,
)
from phalanx.testing import run_job


@dataclass(frozen=True)
class Running:
    """A job already running when the cycle starts: where, since when, last checkpoint."""

    request: JobRequest
    on: Mapping[str, int] | None = None  # node name → GPUs (default: first nodes that fit)
    start: float = 0.0
    checkpoint: float | None = None
    borrowed: int = 0


@dataclass(frozen=True)
class Case:
    """Cluster + queue in; what one `schedule()` call must decide out.

    `starts` maps job id → node names (in rank order); `preemptions` maps the preempting job
    to its victims; `reservation` is (job id, start time, node names) or None; `reasons` maps
    a pending job to its code and words its message must contain. Expectations left as None
    are not checked.
    """

    nodes: Sequence[Node]
    queue: Sequence[JobRequest] = ()
    running: Sequence[Running] = ()
    teams: Sequence[Team] = ()
    policy: str = "priority"
    now: float = 100.0
    config: SchedulerConfig = DEFAULT_CONFIG
    down: Sequence[str] = ()
    preempting: Mapping[int, int] = field(default_factory=dict)  # victim → preemptor
    starts: Mapping[int, Sequence[str]] | None = None
    preemptions: Mapping[int, Sequence[int]] | None = None
    reservation: tuple[int, float, Sequence[str]] | bool | None = False  # False: unchecked
    reasons: Mapping[int, tuple[ReasonCode, Sequence[str]]] = field(default_factory=dict)


def build(case: Case) -> ClusterState:
    """The state a case describes: nodes, teams, running jobs, then the queue."""
    state = ClusterState(case.nodes, case.teams, policy=case.policy)
    for run in case.running:
        run_job(state, run.request, run.on, run.start, run.checkpoint, run.borrowed)
    for victim, preemptor in case.preempting.items():
        state.mark_preempting(victim, preemptor)
    for request in case.queue:
        state.submit(request, request.submit_s)
    for name in case.down:
        state.set_node_up(name, False, "down for the test")
    return state


def started_on(state: ClusterState, decisions: Decisions) -> dict[int, tuple[str, ...]]:
    return {s.job_id: state.node_names(s.placement) for s in decisions.starts}


def check(case: Case) -> tuple[ClusterState, Decisions]:
    """Run one cycle of `case` and assert every expectation it states."""
    state = build(case)
    decisions = schedule(state, case.now, case.config)
    if case.starts is not None:
        assert started_on(state, decisions) == {j: tuple(n) for j, n in case.starts.items()}
    if case.preemptions is not None:
        got = {p.for_job: p.victims for p in decisions.preemptions}
        assert got == {j: tuple(v) for j, v in case.preemptions.items()}
    if case.reservation is not False:
        if case.reservation is None or case.reservation is True:
            assert (decisions.reservation is not None) is bool(case.reservation)
        else:
            job_id, start_s, names = case.reservation
            r = decisions.reservation
            assert r is not None, "expected a reservation"
            got_names = tuple(state.nodes[n].name for n in r.nodes)
            assert (r.job_id, r.start_s, got_names) == (job_id, start_s, tuple(names))
    for job_id, (code, words) in case.reasons.items():
        reason = decisions.reason_for(state.pending[job_id])
        assert reason.code is code, f"job {job_id}: {reason}"
        for word in words:
            assert word in reason.message, f"job {job_id}: {word!r} not in {reason.message!r}"
    return state, decisions
