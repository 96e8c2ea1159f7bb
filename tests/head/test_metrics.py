"""The head's Prometheus series move with real, committed transitions: the control loop in
process on a fake clock (phalanx.testing.headloop), its real lifecycle, scheduler and
SQLite store; the test plays the agents and reads the registry's exposition."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from phalanx.api.models import JobProgress
from phalanx.head import jobcontrol
from phalanx.head.control import HeadError
from phalanx.head.metrics import MAX_TEAM_LABELS, HeadMetrics
from phalanx.head.mirror import Settings, Tx
from phalanx.testing.headloop import USER, HeadLoop

SETTINGS = Settings(
    heartbeat_s=1.0,
    lease_s=8.0,
    requeue_margin_s=2.0,
    tick_s=0.5,
    preempt_grace_s=30.0,
    hang_timeout_s=0.0,
    max_outage_s=60.0,
)


class Scrape:
    """One exposition, parsed: sample name + labels → value."""

    def __init__(self, metrics: HeadMetrics) -> None:
        text = metrics.exposition().decode()
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def get(self, name: str, **labels: str) -> float:
        """The sample's value; 0 when the series does not exist (never moved)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[tuple[HeadLoop, HeadMetrics]]:
    head_loop = HeadLoop(tmp_path, SETTINGS)
    metrics = HeadMetrics(head_loop.mirror, head_loop.control.lock)
    head_loop.control.on_committed.append(metrics.observe)
    try:
        yield head_loop, metrics
    finally:
        head_loop.close()


def test_submit_to_running_counts_the_start_and_its_wait(
    loop: tuple[HeadLoop, HeadMetrics],
) -> None:
    hl, metrics = loop
    job = hl.submit(gpus_per_node=1)
    hl.advance(7)  # no node yet: it waits 7 s
    before = Scrape(metrics)
    assert before.get("phalanx_jobs", state="pending") == 1
    assert before.get("phalanx_pending_jobs", team="default", qos="normal") == 1
    assert before.get("phalanx_jobs_started_total", team="default", qos="normal") == 0
    hl.join("n1", gpus=4)
    hl.advance(1)
    assert hl.state(job) == "R"
    after = Scrape(metrics)
    labels = {"team": "default", "qos": "normal"}
    assert after.get("phalanx_jobs_started_total", **labels) == 1
    assert after.get("phalanx_job_submit_to_running_seconds_count", **labels) == 1
    assert after.get("phalanx_job_queue_wait_seconds_count", **labels) == 1
    waited = after.get("phalanx_job_submit_to_running_seconds_sum", **labels)
    assert 7.0 <= waited <= 7.5  # the fake clock: joined at 7 s, started at its next cycle
    # within the bucket bounds: ≤ 15 s, not ≤ 5 s
    assert after.get("phalanx_job_submit_to_running_seconds_bucket", le="15.0", **labels) == 1
    assert after.get("phalanx_job_submit_to_running_seconds_bucket", le="5.0", **labels) == 0
    assert after.get("phalanx_jobs", state="running") == 1
    assert after.get("phalanx_jobs", state="pending") == 0
    assert after.get("phalanx_gpus", state="allocated") == 1
    assert after.get("phalanx_gpus", state="idle") == 3
    assert after.get("phalanx_nodes", state="up") == 1
    assert after.get("phalanx_team_gpus_in_use", team="default") == 1
    assert after.get("phalanx_scheduling_cycle_duration_seconds_count") > 0
    hl.exit(job, 0, code=0)
    hl.advance(2)
    ended = Scrape(metrics)
    assert ended.get("phalanx_jobs_ended_total", state="completed", **labels) == 1
    assert ended.get("phalanx_gpus", state="allocated") == 0
    assert ended.get("phalanx_gpus", state="idle") == 4


def test_preemption_counts_the_victim_and_its_requeue(loop: tuple[HeadLoop, HeadMetrics]) -> None:
    hl, metrics = loop
    hl.join("n1")
    victim = hl.submit(qos="low")
    hl.advance(2)
    boss = hl.submit(qos="high", preemptible=False)
    hl.advance(2)
    assert hl.state(victim) == "PR"
    noticed = Scrape(metrics)
    assert noticed.get("phalanx_job_preemptions_total", team="default", qos="low") == 1
    assert noticed.get("phalanx_job_requeues_total", team="default", qos="low") == 0
    assert noticed.get("phalanx_jobs", state="preempted") == 1
    hl.exit(victim, 0, code=0)  # it checkpoints and exits within its grace
    hl.advance(2)
    assert hl.state(boss) == "R"
    done = Scrape(metrics)
    assert done.get("phalanx_job_preemptions_total", team="default", qos="low") == 1
    assert done.get("phalanx_job_requeues_total", team="default", qos="low") == 1
    assert done.get("phalanx_jobs_started_total", team="default", qos="high") == 1
    assert done.get("phalanx_pending_jobs", team="default", qos="low") == 1
    # The victim's second queue wait counts from its requeue, not its submission.
    hl.cancel(boss)
    hl.advance(3)
    assert hl.state(victim) == "R"
    again = Scrape(metrics)
    assert again.get("phalanx_job_queue_wait_seconds_count", team="default", qos="low") == 2
    assert again.get("phalanx_job_submit_to_running_seconds_count", team="default", qos="low") == 1
    waits = again.get("phalanx_job_queue_wait_seconds_sum", team="default", qos="low")
    assert waits < 6.0  # ≤ 1 s before its first start, ≤ 5 s queued after its requeue


def test_node_failure_counts_and_gpus_go_down(loop: tuple[HeadLoop, HeadMetrics]) -> None:
    hl, metrics = loop
    hl.join("n1", gpus=2)
    job = hl.submit()
    hl.advance(2)
    hl.join("n2", gpus=2)
    hl.silence("n1")
    hl.advance(SETTINGS.lease_s + SETTINGS.requeue_margin_s + 2)
    assert hl.node_state("n1") == "down"
    assert hl.state(job) == "R" and hl.job(job).placement[0][0] == "n2"
    s = Scrape(metrics)
    assert s.get("phalanx_node_failures_total") == 1
    assert s.get("phalanx_job_requeues_total", team="default", qos="normal") == 1
    assert s.get("phalanx_gpus", state="down") == 2
    assert s.get("phalanx_gpus", state="allocated") == 1
    assert s.get("phalanx_gpus", state="idle") == 1
    assert s.get("phalanx_nodes", state="down") == 1


def test_a_rolled_back_batch_counts_nothing(loop: tuple[HeadLoop, HeadMetrics]) -> None:
    """A transition made by an operation whose batch is rolled back (a bug raised after
    it) is not counted; the same transition committed later is, once."""
    hl, metrics = loop
    job = hl.submit()

    def cancel_then_fail(tx: Tx) -> None:
        jobcontrol.cancel(hl.mirror, tx, USER, str(job))
        raise RuntimeError("a bug after the cancel")

    with pytest.raises(HeadError) as refused:
        hl.op(cancel_then_fail)
    assert refused.value.status == 500
    assert hl.state(job) == "PD"  # rolled back: the mirror was rebuilt from the database
    labels = {"team": "default", "qos": "normal", "state": "cancelled"}
    assert Scrape(metrics).get("phalanx_jobs_ended_total", **labels) == 0
    hl.cancel(job)
    assert hl.state(job) == "CA"
    assert Scrape(metrics).get("phalanx_jobs_ended_total", **labels) == 1


def test_checkpoints_are_observed_once_each(loop: tuple[HeadLoop, HeadMetrics]) -> None:
    hl, metrics = loop
    hl.join("n1", gpus=2)
    job = hl.submit(gpus_per_node=2)
    hl.advance(1)
    rec = hl.mirror.jobs[job]
    now = hl.clock.time()
    for rank in (0, 1):  # both ranks report the same checkpoint, twice
        for step in (10, 11):
            report = JobProgress(
                rank=rank, step=step, time=now, checkpoint_s=3.5, checkpoint_step=10
            )
            metrics.progress(rec, report)
    metrics.progress(rec, JobProgress(rank=0, step=20, time=now, checkpoint_s=1.5))
    metrics.progress(rec, JobProgress(rank=0, step=21, time=now))  # no checkpoint reported
    s = Scrape(metrics)
    labels = {"team": "default", "qos": "normal"}
    assert s.get("phalanx_job_checkpoint_duration_seconds_count", **labels) == 2
    assert s.get("phalanx_job_checkpoint_duration_seconds_sum", **labels) == 5.0
    # Requeued, its next run saves step 10 again: a new checkpoint, observed.
    hl.op(lambda tx: jobcontrol.requeue(hl.mirror, tx, USER, str(job)))
    hl.advance(3)
    rec = hl.mirror.jobs[job]
    assert rec.state.value == "R" and rec.epoch == 2
    again = JobProgress(rank=0, step=10, time=now, checkpoint_s=2.0, checkpoint_step=10)
    metrics.progress(rec, again)
    metrics.progress(rec, again)
    assert Scrape(metrics).get("phalanx_job_checkpoint_duration_seconds_count", **labels) == 3


def test_team_labels_are_capped(loop: tuple[HeadLoop, HeadMetrics]) -> None:
    from phalanx.core import Team

    hl, metrics = loop
    for i in range(MAX_TEAM_LABELS + 5):
        hl.mirror.teams[f"t{i:03d}"] = Team(name=f"t{i:03d}", quota=1)
    s = Scrape(metrics)
    in_use = "phalanx_team_gpus_in_use"
    teams = {dict(labels)["team"] for name, labels in s.samples if name == in_use}
    # The first 100 by name (default, t000 … t098), and "other" for the rest.
    assert len(teams) == MAX_TEAM_LABELS + 1
    assert {"default", "t000", "t098", "other"} <= teams and "t099" not in teams
    assert s.get("phalanx_team_quota_gpus", team="other") == 6  # t099 … t104
    assert metrics.qos("custom") == "other"


def _holders_from_mirror(hl: HeadLoop) -> dict[str, dict[int, tuple[int, str, str]]]:
    """Who holds each GPU, computed the slow way from the mirror."""
    out: dict[str, dict[int, tuple[int, str, str]]] = {}
    for rec in hl.mirror.jobs.values():
        if rec.state.holds_gpus:
            for node, indices in rec.placement:
                for i in indices:
                    out.setdefault(node, {})[i] = (rec.id, rec.user, rec.team)
    return out


def test_gpu_holders_follow_every_transition(loop: tuple[HeadLoop, HeadMetrics]) -> None:
    """The per-GPU scrape's lock-free map of who holds each GPU stays equal to the mirror
    through starts, preemption, requeue, a node failure, ends, and a mirror reload."""
    hl, metrics = loop
    holders = metrics.gpu_holders

    def same() -> None:
        current = {node: gpus for node, gpus in holders.current().items() if gpus}
        assert current == _holders_from_mirror(hl)

    hl.join("n1", gpus=2)
    hl.join("n2", gpus=2)
    low = [hl.submit(qos="low", gpus_per_node=1) for _ in range(4)]
    hl.advance(2)
    same()
    assert sum(len(g) for g in holders.current().values()) == 4
    boss = hl.submit(qos="high", preemptible=False, gpus_per_node=2)
    hl.advance(2)
    same()
    for job in low:
        if hl.state(job) == "PR":
            hl.exit(job, 0)
    hl.advance(2)
    assert hl.state(boss) == "R"
    same()
    hl.silence("n1")
    hl.advance(SETTINGS.lease_s + SETTINGS.requeue_margin_s + 2)
    same()
    hl.cancel(boss)
    hl.advance(2)
    same()
    hl.control._reload()  # as after a rolled-back batch: a fresh mirror from the database
    same()
    hl.advance(2)
    same()
