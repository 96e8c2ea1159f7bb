"""The SLO autoscaler loop: router measurements in, `POST …/scale` out (core.slo decides).

It runs beside the router (which owns the measurements: `RouterStats.window(pool,
seconds)`), one per deployment. Every `interval_s` it reads the deployment from the head,
and for each pool whose spec sets both `min_replicas` and `max_replicas` asks
core.slo.decide for the replica count, and calls the head's scale endpoint when it
changes. Pools without bounds are left alone (their `replicas` holds). Nothing the head or
the stats do stops the loop: a failed pass is logged and the next one tries again.

With a `holder` (an id, e.g. the router's host:port and pid) only one autoscaler acts per
deployment: each pass first takes or renews the head's autoscaler lease for
`lease_ttl_s`, and while another holder's lease is live this one stands by (it decides
nothing, and scales nothing: the head would refuse its scale requests too). Its scale
requests carry the decision's reason into the head's event log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from phalanx.api.serving import DeploymentInfo, PoolRole, PoolSpec
from phalanx.client.api import ApiError
from phalanx.core import slo

log = logging.getLogger("phalanx.serve.autoscaler")
MAX_HISTORY = 256


class Head(Protocol):
    """What the loop needs of the head: phalanx.client.serving.ServeClient's `get`,
    `scale` and the autoscaler lease's `claim_autoscaler` / `release_autoscaler`."""

    def get(self, name: str) -> DeploymentInfo: ...

    def scale(
        self,
        name: str,
        pool: PoolRole,
        replicas: int,
        *,
        reason: str | None = None,
        autoscaler: str | None = None,
    ) -> DeploymentInfo: ...

    def claim_autoscaler(self, name: str, holder: str, ttl_s: float) -> object: ...

    def release_autoscaler(self, name: str, holder: str) -> None: ...


class WindowLike(Protocol):
    """serving.md's PoolWindow (phalanx.serve.router.stats), read by field name."""

    @property
    def requests(self) -> int: ...
    @property
    def errors(self) -> int: ...
    @property
    def ttft_ms(self) -> tuple[float, ...]: ...
    @property
    def tpot_ms(self) -> tuple[float, ...]: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def queued(self) -> int: ...
    @property
    def replicas_ready(self) -> int: ...


class WindowSource(Protocol):
    """The router's RouterStats: `window(pool, seconds)`."""

    def window(self, pool: str, seconds: float) -> WindowLike: ...


@dataclass(frozen=True, slots=True)
class Action:
    """One decision the loop made (kept in `history`, newest last)."""

    at: float  # the loop's clock
    pool: PoolRole
    before: int
    after: int
    reason: str
    applied: bool  # False: the head refused or could not be reached
    error: str = ""


def to_window(w: WindowLike) -> slo.PoolWindow:
    return slo.PoolWindow(
        requests=w.requests,
        errors=w.errors,
        ttft_ms=tuple(w.ttft_ms),
        tpot_ms=tuple(w.tpot_ms),
        in_flight=w.in_flight,
        queued=w.queued,
        replicas_ready=w.replicas_ready,
    )


def target_of(pool: PoolSpec) -> slo.Target:
    """The targets a pool answers for: a prefill pool makes the first token (TTFT), a
    decode pool the rest (TPOT); an aggregated pool both."""
    if pool.slo is None:
        return slo.Target()
    ttft = pool.slo.ttft_ms if pool.role != "decode" else None
    tpot = pool.slo.tpot_ms if pool.role != "prefill" else None
    return slo.Target(ttft, tpot, pool.slo.attainment)


class Autoscaler:
    """Scales one deployment's bounded pools (see the module docstring)."""

    def __init__(
        self,
        head: Head,
        stats: WindowSource,
        deployment: str,
        *,
        interval_s: float = 5.0,
        window_s: float = 30.0,
        tuning: Callable[[PoolSpec], slo.Tuning] | None = None,
        clock: Callable[[], float] = time.monotonic,
        holder: str | None = None,
        lease_ttl_s: float | None = None,
        on_action: Callable[[Action], None] | None = None,
    ) -> None:
        if interval_s <= 0 or window_s <= 0:
            raise ValueError("interval_s and window_s must be positive")
        self.holder = holder
        self.on_action = on_action  # e.g. the router's decision counter
        # Three passes: a holder that stopped without releasing is replaced that soon.
        self.lease_ttl_s = min(600.0, max(1.0, lease_ttl_s or 3 * interval_s))
        self.leader = holder is None  # whether this one acts (it holds the lease)
        self.standby_reason = ""  # why not, while it stands by
        self.info: DeploymentInfo | None = None  # the deployment at the last pass
        self.head = head
        self.stats = stats
        self.deployment = deployment
        self.interval_s = interval_s
        self.window_s = window_s
        self.tuning = tuning or (lambda pool: slo.Tuning(slots_per_replica=pool.slots))
        self.clock = clock
        self.states: dict[PoolRole, slo.PolicyState] = {}
        self.history: deque[Action] = deque(maxlen=MAX_HISTORY)

    def step(self) -> list[Action]:
        """One pass over the deployment's pools; the changes it made (or tried)."""
        if self.holder is not None and not self._lease():
            self.info = None
            return []
        info = self.info = self.head.get(self.deployment)
        now = self.clock()
        desired = {p.role: p.desired for p in info.pools}
        actions = []
        for pool in info.spec.pools:
            if pool.min_replicas is None or pool.max_replicas is None:
                self.states.pop(pool.role, None)
                continue
            current = desired.get(pool.role, pool.replicas)
            window = to_window(self.stats.window(pool.role, self.window_s))
            decision = slo.decide(
                window,
                target_of(pool),
                pool.min_replicas,
                pool.max_replicas,
                current,
                self.states.get(pool.role, slo.PolicyState()),
                now,
                self.tuning(pool),
            )
            if decision.replicas == current:
                self.states[pool.role] = decision.state
                continue
            action = self._apply(now, pool.role, current, decision)
            if action.applied:
                self.states[pool.role] = decision.state
            actions.append(action)
        return actions

    def _lease(self) -> bool:
        """Take or renew the lease; False (standing by) while another holder has it."""
        assert self.holder is not None
        try:
            self.head.claim_autoscaler(self.deployment, self.holder, self.lease_ttl_s)
        except ApiError as exc:
            if exc.status != 409:
                raise
            if self.leader or exc.detail != self.standby_reason:
                log.info("autoscaler %s: standing by: %s", self.deployment, exc.detail)
            self.leader, self.standby_reason = False, exc.detail
            self.states.clear()  # a fresh start if it takes over later
            return False
        if not self.leader:
            log.info("autoscaler %s: %s holds the lease; acting", self.deployment, self.holder)
        self.leader, self.standby_reason = True, ""
        return True

    def release(self) -> None:
        """Give the lease up (at shutdown) so that a standby takes over at its next pass."""
        if self.holder is not None and self.leader:
            self.head.release_autoscaler(self.deployment, self.holder)
            self.leader = False

    def _apply(
        self, now: float, role: PoolRole, current: int, decision: slo.ScaleDecision
    ) -> Action:
        try:
            self.info = self.head.scale(
                self.deployment,
                role,
                decision.replicas,
                reason=decision.reason,
                autoscaler=self.holder,
            )
        except ApiError as exc:
            action = Action(now, role, current, decision.replicas, decision.reason, False, str(exc))
            log.warning(
                "autoscaler %s/%s: scale to %d failed: %s",
                self.deployment,
                role,
                decision.replicas,
                exc,
            )
        else:
            action = Action(now, role, current, decision.replicas, decision.reason, True)
            log.info(
                "autoscaler %s/%s: %d -> %d (%s)",
                self.deployment,
                role,
                current,
                decision.replicas,
                decision.reason,
            )
        self.history.append(action)
        if self.on_action is not None:
            self.on_action(action)
        return action

    async def run(self, stop: asyncio.Event) -> None:
        """Step every `interval_s` until `stop` is set (or the task is cancelled), then
        release the lease; a failed pass is logged, never fatal."""
        try:
            while not stop.is_set():
                try:
                    await asyncio.to_thread(self.step)
                except ApiError as exc:  # head down, deployment gone, no right to scale it
                    log.warning("autoscaler %s: a pass failed: %s", self.deployment, exc)
                except Exception:  # the loop must outlive any one pass (a bad answer)
                    log.exception("autoscaler %s: a pass failed; trying again", self.deployment)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.interval_s)
        finally:
            try:
                await asyncio.to_thread(self.release)
            except Exception as exc:  # the lease lapses by itself
                log.warning("autoscaler %s: cannot release the lease: %s", self.deployment, exc)
