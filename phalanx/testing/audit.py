"""The end of a chaos or operations run: its submissions, letting the jobs end, and the
audit of what the head and the jobs' ledgers say against the invariants
(phalanx.testing.invariants). Shared by phalanx.testing.chaos and .operations."""

from __future__ import annotations

import contextlib
import itertools
import pwd
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from phalanx.api.models import JobInfo, JobSpec
from phalanx.client.api import ApiError, PhalanxClient
from phalanx.testing import workload
from phalanx.testing.faults import retry
from phalanx.testing.invariants import (
    Verdict,
    check_accounted,
    check_gpu_exclusive,
    check_never_twice,
    check_no_step_back,
)

MAX_EVIDENCE = 10  # jobs whose event log a report carries


@dataclass
class Submission:
    """One submit a driver made; `job_id` set when the head accepted it."""

    seq: int
    name: str  # unique per submit: how the audit finds duplicates
    workdir: Path
    steps: int
    nodes: int
    gpus_per_node: int
    user: str | None = None  # the Unix account it runs as (None: the cluster's own)
    job_id: int | None = None
    error: str | None = None  # why not accepted
    unreachable: bool = False  # the head did not answer (down, restarting)

    @property
    def ledger(self) -> Path:
        """Where its ranks write their ledger lines."""
        return self.workdir / "ledger.jsonl"

    @property
    def ranks(self) -> int:
        """Processes per run (one per GPU: the torchrun launcher)."""
        return self.nodes * self.gpus_per_node

    def submit(self, client: PhalanxClient, spec: JobSpec) -> None:
        """Submit `spec` for it, recording the job id or why there is none."""
        try:
            self.job_id = client.submit(spec).job_ids[0]
        except ApiError as exc:
            self.error = str(exc)
            self.unreachable = exc.status is None or exc.status >= 500


def ledger_env(sub: Submission, deadline: float) -> dict[str, str]:
    """The ledger job's environment: its ledger, and the unix time it gives up by itself
    (a safety net against processes outliving a broken run)."""
    return {"LEDGER": str(sub.ledger), "OMP_NUM_THREADS": "1", "LEDGER_DEADLINE": f"{deadline:.0f}"}


def submission_counts(subs: list[Submission]) -> dict[str, int]:
    """How the submits went, for a report: made, accepted, refused because no head
    answered (down, frozen, restarting), rejected otherwise."""
    return {
        "submitted": len(subs),
        "accepted": sum(s.job_id is not None for s in subs),
        "refused_head_unreachable": sum(s.unreachable for s in subs),
        "rejected": sum(s.error is not None and not s.unreachable for s in subs),
    }


@dataclass
class Audit:
    """What the head and the ledgers say at the end of a run, and the invariants' verdicts."""

    head: dict[int, JobInfo] = field(default_factory=dict)  # each accepted id: its job
    lives: list[workload.Life] = field(default_factory=list)  # every process in the ledgers
    final_states: Counter[str] = field(default_factory=Counter)
    restarts: int = 0
    unacknowledged: int = 0  # jobs the head has for submits whose answer never came
    ledger_owners: Counter[str] = field(default_factory=Counter)  # Unix account → ledgers
    invariants: list[Verdict] = field(default_factory=list)
    evidence: dict[int, list[str]] = field(default_factory=dict)  # job → its event log

    def add(self, client: PhalanxClient, verdicts: list[Verdict]) -> None:
        """Add `verdicts`, with the event logs of the first jobs their violations name."""
        self.invariants.extend(verdicts)
        for verdict in verdicts:
            for line in verdict.violations:
                for job in _job_ids(line)[:2]:
                    if job not in self.evidence and len(self.evidence) < MAX_EVIDENCE:
                        self.evidence[job] = events(client, job)


def audit(client: PhalanxClient, subs: list[Submission], prefix: str) -> Audit:
    """Ask the head about every job named `prefix…` and every accepted submit, read every
    ledger, and check the four invariants of docs/fault-tolerance.md: accounted,
    never_twice, no_step_back, gpu_exclusive."""
    found = Audit()
    listed = retry(lambda: client.jobs(active=True, ended=True, limit=100_000)).jobs
    ours = [j for j in listed if j.name.startswith(prefix)]
    names = Counter(j.name for j in ours)
    for job_id in (s.job_id for s in subs if s.job_id is not None):
        with contextlib.suppress(ApiError):  # 404: unknown to the head (a violation)
            found.head[job_id] = retry(partial(client.job, job_id)).job
    accepted = {s.name for s in subs if s.job_id is not None}
    found.unacknowledged = sum(1 for j in ours if j.name not in accepted)
    found.final_states = Counter(i.state for i in found.head.values())
    found.restarts = sum(i.restart_count for i in found.head.values())
    found.lives = [life for s in subs for life in workload.lives(workload.read_ledger(s.ledger))]
    # Who wrote each job's ledger: the Unix account its processes ran as.
    found.ledger_owners = Counter(_owner(s.ledger) for s in subs if s.ledger.exists())
    shapes = {s.job_id: s for s in subs if s.job_id is not None}
    completed = {
        i.id: (i.epoch, shapes[i.id].ranks, shapes[i.id].steps)
        for i in found.head.values()
        if i.state == "CD"
    }
    found.add(
        client,
        [
            check_accounted([(s.name, s.job_id) for s in subs], found.head, names),
            check_never_twice(found.lives),
            check_no_step_back(found.lives, completed),
            check_gpu_exclusive(found.lives),
        ],
    )
    return found


def settle(
    client: PhalanxClient,
    subs: list[Submission],
    prefix: str,
    timeout_s: float,
    say: Callable[[str], None],
) -> bool:
    """Let the accepted jobs end for `timeout_s`; cancel the `prefix…` jobs still queued or
    running then, and wait for those to end too. True if all ended by themselves."""
    ids = [s.job_id for s in subs if s.job_id is not None]
    if wait_ended(client, ids, timeout_s):
        return True
    for info in retry(lambda: client.jobs(active=True)).jobs:
        if info.name.startswith(prefix) and info.state in ("PD", "R", "PR"):
            with contextlib.suppress(ApiError):  # 409: it ended meanwhile
                client.cancel(info.id)
    say("settle time over: cancelled what was still queued or running")
    wait_ended(client, ids, 60)
    return False


def wait_ended(client: PhalanxClient, ids: list[int], timeout: float) -> bool:
    """Wait until none of `ids` is active; False if some still are after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        active = {j.id for j in retry(lambda: client.jobs(active=True)).jobs}
        if not active & set(ids):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def events(client: PhalanxClient, job_id: int) -> list[str]:
    """A job's event log, one line per event (the evidence a report carries)."""
    try:
        detail = client.job(job_id)
    except ApiError as exc:
        return [f"(no detail: {exc})"]
    return [f"{e.time:.3f} {e.kind} {e.node or ''}: {e.message}" for e in detail.events]


def _owner(path: Path) -> str:
    uid = path.stat().st_uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _job_ids(line: str) -> list[int]:
    words = line.replace(":", " ").split()
    return [int(w) for a, w in itertools.pairwise(words) if a == "job" and w.isdigit()]
