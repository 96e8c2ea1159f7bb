"""`phalanx serve router --autoscale`: the SLO autoscaler (phalanx.serve.autoscaler) as one
of the router's background tasks, fed by the router's own measurements (`router.stats`),
scaling the deployment through the head, with its decisions in the router's log and its
state in the router's Prometheus `/metrics`.

Only one autoscaler acts per deployment: each router started with `--autoscale` takes or
renews the head's autoscaler lease every pass (a lease of three passes); the others stand
by and take over when the holder stops (it releases the lease) or dies (it lapses).
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from phalanx.api.serving import PoolSpec
from phalanx.client.api import PhalanxClient
from phalanx.client.serving import ServeClient
from phalanx.core import slo
from phalanx.serve.autoscaler import Action, Autoscaler
from phalanx.serve.router.app import Router
from phalanx.serve.router.server import RouterOptions, RouterSetupError

_DEFAULT = slo.Tuning()


@dataclass(frozen=True)
class AutoscaleOptions:
    """How often and how eagerly (defaults: core.slo.Tuning's and the loop's)."""

    interval_s: float = 5.0
    window_s: float = 30.0
    up_cooldown_s: float = _DEFAULT.up_cooldown_s
    miss_cooldown_s: float = _DEFAULT.miss_cooldown_s
    down_cooldown_s: float = _DEFAULT.down_cooldown_s
    down_stable_s: float = _DEFAULT.down_stable_s

    def check(self) -> None:
        for name, value in vars(self).items():
            if not 0 <= value <= 86_400 or (name in ("interval_s", "window_s") and value <= 0):
                raise RouterSetupError(f"--autoscale: {name} {value} is out of range")

    def tuning(self, pool: PoolSpec) -> slo.Tuning:
        return slo.Tuning(
            slots_per_replica=pool.slots,
            up_cooldown_s=self.up_cooldown_s,
            miss_cooldown_s=self.miss_cooldown_s,
            down_cooldown_s=self.down_cooldown_s,
            down_stable_s=self.down_stable_s,
        )


def holder_id(port: int) -> str:
    """This router's name on the head's lease: router@HOST:PORT-PID (the lease's charset)."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:80] or "host"
    return f"router@{host}:{port}-{os.getpid()}"


class _State(Collector):
    """The autoscaler's view, read at each scrape."""

    def __init__(self, scaler: Autoscaler) -> None:
        self.scaler = scaler

    def collect(self) -> Iterator[Metric]:
        leader = GaugeMetricFamily(
            "phalanx_autoscaler_leader",
            "1 while this router's autoscaler holds the deployment's lease and acts",
        )
        leader.add_metric([], 1.0 if self.scaler.leader else 0.0)
        desired = GaugeMetricFamily(
            "phalanx_autoscaler_desired_replicas",
            "Replicas the head holds as desired per pool (at the last pass)",
            labels=["pool"],
        )
        ready = GaugeMetricFamily(
            "phalanx_autoscaler_ready_replicas",
            "Ready replicas per pool (at the last pass)",
            labels=["pool"],
        )
        info = self.scaler.info
        for p in info.pools if info is not None else ():
            desired.add_metric([p.role], p.desired)
            ready.add_metric([p.role], p.ready)
        yield from (leader, desired, ready)


def autoscale_job(
    options: RouterOptions, port: int, auto: AutoscaleOptions
) -> Callable[[Router], Coroutine[Any, Any, None]]:
    """The background task `build(..., background=[...])` runs (head mode only)."""
    if not (options.head and options.deployment) or options.replicas or options.prefill:
        raise RouterSetupError(
            "--autoscale needs --head and --deployment: it scales the deployment's pools "
            "through the head (fixed --replica URLs cannot be scaled)"
        )
    auto.check()
    head, deployment = options.head, options.deployment

    async def job(router: Router) -> None:
        client = PhalanxClient(head, options.token, ca=options.ca, timeout=10.0)
        decisions = Counter(
            "phalanx_autoscaler_decisions",
            "Scale decisions, by pool, direction and whether the head applied them",
            ["pool", "direction", "outcome"],
            registry=router.metrics.registry,
        )

        def count(action: Action) -> None:
            direction = "up" if action.after > action.before else "down"
            outcome = "applied" if action.applied else "refused"
            decisions.labels(action.pool, direction, outcome).inc()

        scaler = Autoscaler(
            ServeClient(client),
            router.stats,
            deployment,
            interval_s=auto.interval_s,
            window_s=auto.window_s,
            tuning=auto.tuning,
            holder=holder_id(port),
            on_action=count,
        )
        router.metrics.registry.register(_State(scaler))
        try:
            await scaler.run(asyncio.Event())  # until the router stops (cancelled)
        finally:
            client.close()

    return job
