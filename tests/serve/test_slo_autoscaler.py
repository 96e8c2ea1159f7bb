"""serve.autoscaler: the loop from pool windows to the head's scale endpoint.

The head side is a small in-memory implementation of the two ServeClient calls the loop
makes (get, scale): the serving routes live on the `deploy` branch; the window source is
our own PoolWindow source, as the router's RouterStats will be."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import pytest

from phalanx.api.serving import (
    SLO,
    DeploymentInfo,
    DeploymentSpec,
    PoolRole,
    PoolSpec,
    PoolStatus,
)
from phalanx.client.api import ApiError
from phalanx.core.slo import PoolWindow
from phalanx.serve.autoscaler import Autoscaler


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Head:
    """The deployment as the head would hold it; `scale` changes the desired count."""

    info: DeploymentInfo
    refuse: ApiError | None = None
    calls: list[tuple[str, PoolRole, int]] = field(default_factory=list)

    def get(self, name: str) -> DeploymentInfo:
        if name != self.info.spec.name:
            raise ApiError(404, f"no deployment {name!r}")
        return self.info

    def scale(
        self,
        name: str,
        pool: PoolRole,
        replicas: int,
        *,
        reason: str | None = None,
        autoscaler: str | None = None,
    ) -> DeploymentInfo:
        self.calls.append((name, pool, replicas))
        if self.refuse is not None:
            raise self.refuse
        pools = [
            PoolStatus(
                role=p.role, desired=replicas if p.role == pool else p.desired, ready=p.ready
            )
            for p in self.info.pools
        ]
        self.info = self.info.model_copy(update={"pools": pools})
        return self.info

    def claim_autoscaler(self, name: str, holder: str, ttl_s: float) -> object:
        raise AssertionError("these tests run without a holder")

    def release_autoscaler(self, name: str, holder: str) -> None:
        raise AssertionError("these tests run without a holder")

    def desired(self, role: PoolRole) -> int:
        return next(p.desired for p in self.info.pools if p.role == role)


@dataclass
class Windows:
    by_pool: dict[str, PoolWindow]
    asked: list[tuple[str, float]] = field(default_factory=list)

    def window(self, pool: str, seconds: float) -> PoolWindow:
        self.asked.append((pool, seconds))
        return self.by_pool[pool]


def window(bad: int = 0, in_flight: int = 2, queued: int = 0, ready: int = 2) -> PoolWindow:
    return PoolWindow(
        requests=20,
        errors=0,
        ttft_ms=tuple([5000.0] * bad + [100.0] * (20 - bad)),
        tpot_ms=tuple([20.0] * 20),
        in_flight=in_flight,
        queued=queued,
        replicas_ready=ready,
    )


def deployment(
    prefill: tuple[int | None, int | None], decode: tuple[int | None, int | None]
) -> DeploymentInfo:
    slo = SLO(ttft_ms=1000, tpot_ms=100)
    spec = DeploymentSpec(
        name="smol",
        engine="llama.cpp",
        model="/m.gguf",
        engine_path="/llama-server",
        handoff_dir="/tmp/h",
        pools=[
            PoolSpec(
                role="prefill",
                replicas=2,
                min_replicas=prefill[0],
                max_replicas=prefill[1],
                slots=4,
                slo=slo,
            ),
            PoolSpec(
                role="decode",
                replicas=2,
                min_replicas=decode[0],
                max_replicas=decode[1],
                slots=4,
                slo=slo,
            ),
        ],
    )
    return DeploymentInfo(
        spec=spec,
        owner="alice",
        generation=1,
        created_at=0.0,
        pools=[
            PoolStatus(role="prefill", desired=2, ready=2),
            PoolStatus(role="decode", desired=2, ready=2),
        ],
        replicas=[],
    )


def test_only_bounded_pools_are_scaled() -> None:
    head = Head(deployment(prefill=(1, 8), decode=(None, None)))
    windows = Windows(
        {"prefill": window(bad=12, in_flight=8), "decode": window(bad=20, in_flight=8)}
    )
    clock = Clock()
    scaler = Autoscaler(head, windows, "smol", window_s=20.0, clock=clock)
    actions = scaler.step()
    assert [(a.pool, a.before, a.after, a.applied) for a in actions] == [("prefill", 2, 3, True)]
    assert actions[0].reason.startswith("scale up: TTFT attainment 40% < 90%")
    assert head.calls == [("smol", "prefill", 3)]
    assert (head.desired("prefill"), head.desired("decode")) == (3, 2)
    assert windows.asked == [("prefill", 20.0)]  # the unbounded pool is not even read
    # The new replicas start: the next pass holds instead of adding again.
    windows.by_pool["prefill"] = window(bad=12, in_flight=8, ready=2)
    clock.now += 30
    assert scaler.step() == []
    assert list(scaler.history) == actions


def test_each_disaggregated_pool_answers_for_its_own_phase() -> None:
    """TTFT misses grow the prefill pool, never the decode pool; TPOT misses the reverse."""
    head = Head(deployment(prefill=(1, 8), decode=(1, 8)))
    slow_first = window(bad=12, in_flight=8)  # TTFT misses, TPOT fine
    slow_rest = PoolWindow(20, 0, (100.0,) * 20, (900.0,) * 20, 8, 0, 2)  # TPOT misses
    windows = Windows({"prefill": slow_first, "decode": slow_first})
    scaler = Autoscaler(head, windows, "smol", clock=Clock())
    assert [a.pool for a in scaler.step()] == ["prefill"]
    head = Head(deployment(prefill=(1, 8), decode=(1, 8)))
    windows = Windows({"prefill": slow_rest, "decode": slow_rest})
    scaler = Autoscaler(head, windows, "smol", clock=Clock())
    actions = scaler.step()
    assert [a.pool for a in actions] == ["decode"]
    assert actions[0].reason.startswith("scale up: TPOT attainment 0% < 90%")


def test_a_quiet_pool_shrinks_slowly_to_its_minimum() -> None:
    head = Head(deployment(prefill=(1, 8), decode=(1, 8)))
    quiet = window(in_flight=0, ready=2)
    windows = Windows({"prefill": quiet, "decode": quiet})
    clock = Clock()
    scaler = Autoscaler(head, windows, "smol", clock=clock)
    seen = []
    for _ in range(40):
        seen += [(a.pool, a.after) for a in scaler.step()]
        clock.now += 5
    assert seen == [("prefill", 1), ("decode", 1)]  # one step each, after 30 s of quiet
    assert (head.desired("prefill"), head.desired("decode")) == (1, 1)


def test_a_refused_scale_is_recorded_and_tried_again() -> None:
    head = Head(deployment(prefill=(1, 8), decode=(1, 8)), refuse=ApiError(403, "team quota"))
    windows = Windows({"prefill": window(queued=10, in_flight=8), "decode": window()})
    clock = Clock()
    scaler = Autoscaler(head, windows, "smol", clock=clock)
    first = scaler.step()
    assert [(a.pool, a.applied, a.error) for a in first] == [("prefill", False, "team quota")]
    head.refuse = None
    clock.now += 1  # the failed attempt started no cooldown
    assert [(a.pool, a.after, a.applied) for a in scaler.step()] == [("prefill", 4, True)]


def test_the_loop_outlives_failing_passes(caplog: pytest.LogCaptureFixture) -> None:
    head = Head(deployment(prefill=(1, 8), decode=(1, 8)))

    class Broken:
        def window(self, pool: str, seconds: float) -> PoolWindow:
            raise RuntimeError("router stats unavailable")

    scaler = Autoscaler(head, Broken(), "smol", interval_s=0.01)

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(scaler.run(stop))
        deadline = time.monotonic() + 10
        while sum("a pass failed" in r.message for r in caplog.records) < 3:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, timeout=5)

    with caplog.at_level(logging.ERROR, logger="phalanx.serve.autoscaler"):
        asyncio.run(main())
    assert head.calls == []
    missing = Autoscaler(head, Broken(), "other")
    with pytest.raises(ApiError, match="no deployment"):
        missing.step()


@dataclass
class LeasingHead(Head):
    """`Head` with the head's autoscaler lease (one holder; others 409 until it lapses)."""

    lease: tuple[str, float] | None = None
    clock: Clock = field(default_factory=Clock)
    scaled_by: list[tuple[str | None, str | None]] = field(default_factory=list)

    def claim_autoscaler(self, name: str, holder: str, ttl_s: float) -> object:
        now = self.clock()
        if self.lease is not None and self.lease[0] != holder and self.lease[1] > now:
            raise ApiError(409, f"deployment {name} is autoscaled by {self.lease[0]}")
        self.lease = (holder, now + ttl_s)
        return self.lease

    def release_autoscaler(self, name: str, holder: str) -> None:
        if self.lease is not None and self.lease[0] == holder:
            self.lease = None

    def scale(
        self,
        name: str,
        pool: PoolRole,
        replicas: int,
        *,
        reason: str | None = None,
        autoscaler: str | None = None,
    ) -> DeploymentInfo:
        assert self.lease is not None and self.lease[0] == autoscaler  # as the head refuses
        self.scaled_by.append((autoscaler, reason))
        return super().scale(name, pool, replicas, reason=reason, autoscaler=autoscaler)


def test_with_holders_one_autoscaler_acts_and_a_standby_takes_over() -> None:
    clock = Clock()
    head = LeasingHead(deployment(prefill=(1, 8), decode=(None, None)), clock=clock)
    windows = Windows({"prefill": window(bad=12, in_flight=8)})
    first = Autoscaler(head, windows, "smol", clock=clock, holder="router@a:1-1", interval_s=5)
    second = Autoscaler(head, windows, "smol", clock=clock, holder="router@b:1-2", interval_s=5)
    assert first.lease_ttl_s == 15.0  # three passes
    assert [a.after for a in first.step()] == [3]
    assert second.step() == [] and not second.leader and first.leader
    assert "autoscaled by router@a:1-1" in second.standby_reason
    assert head.scaled_by == [("router@a:1-1", first.history[0].reason)]
    assert second.info is None  # a standby does not even read the deployment
    # The holder stops (asyncio task ends): it releases, and the standby acts next pass.
    stop = asyncio.Event()
    stop.set()
    asyncio.run(first.run(stop))
    assert head.lease is None and not first.leader
    clock.now += 60
    windows.by_pool["prefill"] = window(bad=12, in_flight=8, ready=3)
    assert [a.after for a in second.step()] == [5]  # 3 -> 5 (by the SLO shortfall)
    assert second.leader and head.lease is not None and head.lease[0] == "router@b:1-2"
    # A holder that dies without releasing: its lease lapses after three passes.
    assert first.step() == [] and not first.leader
    clock.now += 16
    first.step()
    assert first.leader


def test_a_lease_error_other_than_409_fails_the_pass(caplog: pytest.LogCaptureFixture) -> None:
    head = LeasingHead(deployment(prefill=(1, 8), decode=(None, None)))

    def down(name: str, holder: str, ttl_s: float) -> object:
        raise ApiError(None, "head unreachable")

    head.claim_autoscaler = down  # type: ignore[method-assign]
    scaler = Autoscaler(
        head, Windows({"prefill": window()}), "smol", holder="r@h:1-1", interval_s=0.01
    )
    with pytest.raises(ApiError):
        scaler.step()

    async def main() -> None:  # run() logs one line (no traceback) and tries again
        stop = asyncio.Event()
        task = asyncio.create_task(scaler.run(stop))
        deadline = time.monotonic() + 10
        while sum("head unreachable" in r.getMessage() for r in caplog.records) < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, timeout=5)

    with caplog.at_level(logging.WARNING, logger="phalanx.serve.autoscaler"):
        asyncio.run(main())
    assert all(r.exc_info is None for r in caplog.records)
    assert head.calls == []
