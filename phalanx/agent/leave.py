"""`phalanx agent --on-sigterm leave`: SIGTERM means "this server is going away".

Where the agent itself runs as a job of another scheduler (a Slurm job of
`phalanx slurm-pool`), SIGTERM is that scheduler's warning: the allocation reaches its time
limit (`sbatch --signal=B:TERM@SECS` sends it ahead), or Slurm cancels or preempts it and
sends SIGKILL KillWait seconds later. The default agent answers SIGTERM by killing its
jobs, which then fail or wait a lease to be requeued. A leaving agent instead:

1. asks the head at once (`POST /v1/nodes/{name}/leave`, with its node credential) to drain
   the node and give each of its jobs the preemption notice, with a deadline no later than
   `grace_s` minus a margin: the jobs checkpoint, exit and are requeued from their
   checkpoint on other nodes;
2. keeps reconciling and heartbeating, so the head hears every rank's exit and takes the
   jobs out of this node's desired state;
3. stops (killing whatever still runs) once nothing is left here — after one last
   heartbeat, so the head settles the jobs' stops at once — or `grace_s` after the signal,
   whichever comes first.

The call to the head is made before the event loop runs anything else, so the head has
noticed the jobs before it hears of a rank that the same signal ended (Slurm signals every
process of the allocation): that exit then requeues the job, it does not fail it. If the
head cannot be reached, the agent stops as the default does; the head requeues the jobs
once the node's lease runs out. A second SIGTERM while leaving changes nothing; SIGINT
still stops at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable

import httpx
from pydantic import ValidationError

from phalanx.api.leaving import LeaveAnswer, LeaveRequest

from .headlink import HeadLink
from .headlink import _headers as headlink_headers
from .reconcile import Reconciler

log = logging.getLogger(__name__)

ON_SIGTERM = ("stop", "leave")  # `phalanx agent --on-sigterm`
DEFAULT_GRACE_S = 60.0
ASK_TIMEOUT_S = 5.0  # the head's answer to the leave request, at most
# The head's deadline for the jobs comes this much before the agent's own: a job that
# ignores its notice is stopped by the head (and requeued) before the agent gives up.
MARGIN_S = 2.0
POLL_S = 0.2


class Leaver:
    """Handles SIGTERM for an agent started with `--on-sigterm leave` (see the module)."""

    def __init__(
        self,
        link: HeadLink,
        reconciler: Reconciler,
        stop: asyncio.Event,
        grace_s: float = DEFAULT_GRACE_S,
        reason: str = "the agent got SIGTERM (allocation ending, cancelled or preempted)",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.link = link
        self.reconciler = reconciler
        self.stop = stop
        self.grace_s = grace_s
        self.reason = reason
        self.clock = clock
        self.leaving = False
        self._task: asyncio.Task[None] | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make SIGTERM leave instead of stop (main thread only; SIGINT still stops)."""
        loop.add_signal_handler(signal.SIGTERM, self.on_signal)

    def on_signal(self) -> None:
        """SIGTERM: ask the head now (blocking the loop for at most ASK_TIMEOUT_S, so no
        heartbeat reports a rank's exit first), then wait for the jobs to go."""
        if self.leaving:
            log.info("SIGTERM again while leaving: still waiting for the jobs to requeue")
            return
        self.leaving = True
        deadline = self.clock() + self.grace_s
        answer = self._ask_head()
        if answer is None:
            self.stop.set()
            return
        log.warning(
            "leaving: node %s drained; %d job(s) noticed to checkpoint and requeue within "
            "%.0f s: %s",
            answer.node,
            len(answer.jobs),
            self.grace_s,
            ", ".join(f"{j.id} ({j.state})" for j in answer.jobs) or "none",
        )
        self._task = asyncio.get_running_loop().create_task(self._wait(deadline))

    def _ask_head(self) -> LeaveAnswer | None:
        token = self.link.node_token
        if token is None:
            log.warning("SIGTERM before joining the head: stopping")
            return None
        name = self.link.request.name
        body = LeaveRequest(
            reason=self.reason[:500], grace_s=max(0.0, self.grace_s - MARGIN_S)
        ).model_dump_json()
        problems = []
        for url in [
            self.link.head_url,
            *(u for u in self.link.head_urls if u != self.link.head_url),
        ]:
            try:
                with httpx.Client(timeout=ASK_TIMEOUT_S, verify=self.link.verify) as client:
                    r = client.post(
                        f"{url}/v1/nodes/{name}/leave",
                        content=body,
                        headers=headlink_headers(token),
                    )
            except httpx.HTTPError as e:
                problems.append(f"{url}: {e}")
                continue
            if r.status_code == 200:
                try:
                    return LeaveAnswer.model_validate_json(r.content)
                except ValidationError as e:
                    problems.append(f"{url}: unreadable answer ({e.error_count()} errors)")
                    continue
            problems.append(f"{url}: {r.status_code} {r.text[:200]}")
        log.error(
            "leaving: the head did not take the notice (%s); stopping the jobs here, the head "
            "requeues them once this node's lease runs out",
            "; ".join(problems),
        )
        return None

    async def _wait(self, deadline: float) -> None:
        try:
            while self.clock() < deadline and self._holding():
                await asyncio.sleep(POLL_S)
            if self._holding():
                log.warning("leaving: grace over; stopping what still runs here")
            else:
                log.info("leaving: no job left here; stopping")
                # The head learns at once that nothing runs here any more (it settles the
                # jobs' stops now, not when this node's lease runs out).
                await self.link.last_beat()
        finally:
            self.stop.set()

    def _holding(self) -> bool:
        """Whether a job is still desired here or a rank of one still runs."""
        desired = self.reconciler.desired()
        if desired is not None and desired.jobs:
            return True
        return any(p.running for p in self.reconciler.process_statuses())
