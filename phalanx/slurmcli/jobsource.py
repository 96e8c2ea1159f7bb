"""The jobs squeue and sacct print, fetched from the head as one compact table per request
(`GET /v1/jobs?format=table`; explicit ids in batches the head accepts)."""

from __future__ import annotations

from collections.abc import Iterable

from phalanx.client.api import MAX_JOB_IDS, PhalanxClient
from phalanx.slurmcli.fields import Job

MAX_LISTED = 100_000  # the head's own cap on one listing


def fetch(
    client: PhalanxClient,
    *,
    active: bool,
    ended: bool,
    user: str | None = None,
    team: str | None = None,
    states: Iterable[str] | None = None,
    since: float | None = None,
    ids: Iterable[int] | None = None,
) -> list[Job]:
    """The visible jobs that match, in id order; `ids` names jobs or arrays (all tasks)."""
    wanted = sorted(set(ids)) if ids is not None else None
    batches: list[list[int] | None] = (
        [wanted[i : i + MAX_JOB_IDS] for i in range(0, len(wanted), MAX_JOB_IDS)]
        if wanted
        else [None]
    )
    state_list = sorted(states) if states is not None else None
    seen: dict[int, Job] = {}
    for batch in batches:
        table = client.job_table(
            active=active,
            ended=ended,
            user=user,
            team=team,
            states=state_list,
            since=since,
            limit=MAX_LISTED,
            ids=batch,
        )
        columns = table.columns
        for row in table.rows:
            job = Job.from_wire(dict(zip(columns, row, strict=True)))
            seen[job.id] = job
    return [seen[i] for i in sorted(seen)]
