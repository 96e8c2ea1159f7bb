"""The router's pure parts: policies over snapshots, the prefix index, rate limits, the
token cache, the autoscaler's stats window, body checks."""

from __future__ import annotations

import asyncio
import random

import pytest

from phalanx.api.models import WhoAmI
from phalanx.api.serving import Endpoint, Endpoints
from phalanx.serve.router.access import (
    BAD_TTL_S,
    OK_TTL_S,
    STALE_OK_S,
    Audience,
    HeadUnreachable,
    RateLimits,
    TokenCache,
)
from phalanx.serve.router.checks import depth_ok
from phalanx.serve.router.policies import (
    KvAware,
    KvAwareSimple,
    LeastLoad,
    PowerOfTwo,
    ReplicaLoad,
    RoundRobin,
    RouteRequest,
    make_policy,
)
from phalanx.serve.router.prefix import PrefixIndex, block_hashes, prompt_text, render_chat
from phalanx.serve.router.replicas import ReplicaSet
from phalanx.serve.router.server import RouterOptions, RouterSetupError, build
from phalanx.serve.router.stats import PoolWindow, RouterStats


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ep(i: int, slots: int = 4) -> Endpoint:
    return Endpoint(
        job_id=i, pool="aggregated", url=f"http://10.0.0.{i}:8000", slots=slots, generation=1
    )


def loads(*in_flight: int, blocks: tuple[int, ...] | None = None) -> list[ReplicaLoad]:
    return [ReplicaLoad(ep(i + 1), n, blocks[i] if blocks else 0) for i, n in enumerate(in_flight)]


def test_round_robin_takes_each_replica_in_turn() -> None:
    policy = RoundRobin()
    replicas = loads(0, 5, 9)
    picked = [policy.choose(replicas, RouteRequest()).job_id for _ in range(6)]
    assert picked == [1, 2, 3, 1, 2, 3]


def test_least_load_picks_the_fewest_in_flight_per_slot_and_shares_ties() -> None:
    policy = LeastLoad()
    # Replica 2 has 2 of 8 slots busy (0.25); replica 1 has 1 of 2 (0.5).
    replicas = [ReplicaLoad(ep(1, slots=2), 1), ReplicaLoad(ep(2, slots=8), 2)]
    assert {policy.choose(replicas, RouteRequest()).job_id for _ in range(5)} == {2}
    tied = loads(1, 1)
    assert {policy.choose(tied, RouteRequest()).job_id for _ in range(4)} == {1, 2}


def test_power_of_two_never_takes_the_busier_of_its_two_samples() -> None:
    policy = PowerOfTwo(rng=random.Random(7))
    replicas = loads(0, 3, 3)
    picks = [policy.choose(replicas, RouteRequest()).job_id for _ in range(200)]
    # Replica 1 loses only when both samples are the busy ones: a third of the draws.
    assert 0.55 < picks.count(1) / len(picks) < 0.8
    assert policy.choose(loads(4), RouteRequest()).job_id == 1


def test_kv_aware_simple_sends_a_cached_prefix_back_unless_its_prompts_in_flight_weigh_more() -> (
    None
):
    index = PrefixIndex()
    policy = KvAwareSimple(index)
    prompt = block_hashes("x" * 64 * 10, 64)
    assert len(prompt) == 10
    index.add(ep(2).url, prompt[:8])  # replica 2 holds 8 of the 10 blocks
    assert policy.choose(loads(0, 0, 0), RouteRequest(prompt)).job_id == 2
    # cost: replica 2 = 2 uncached + 9 active = 11 > replica 1's 10 uncached + 0.
    assert policy.choose(loads(0, 3, 0, blocks=(0, 9, 0)), RouteRequest(prompt)).job_id != 2
    # A prompt shorter than a block has no hashes: cost is the load alone.
    assert policy.choose(loads(2, 0, 1, blocks=(2, 0, 1)), RouteRequest()).job_id == 2


def load(
    in_flight: int = 0,
    prefilling: int = 0,
    prefill_blocks: int = 0,
    *,
    slots: int = 4,
    job: int = 1,
    active_blocks: int = 0,
) -> ReplicaLoad:
    return ReplicaLoad(ep(job, slots), in_flight, active_blocks, prefilling, prefill_blocks)


# (replica's load, blocks of the 10-block prompt it has cached, expected cost) with the
# default weights: overlap 1 × (new + queued prefill) + decode 1 × decoding + queue 4 ×
# requests beyond a free slot.
KV_COSTS = [
    (load(), 0, 10.0),  # idle, nothing cached: the whole prompt to prefill
    (load(), 8, 2.0),  # idle, 8 cached: 2 to prefill
    (load(1, 1, 5), 8, 7.0),  # + one request still prefilling 5 blocks
    (load(1, 0, 0, active_blocks=40), 8, 3.0),  # + one decoding (its 40-block prompt done)
    (load(3, 1, 2), 8, 6.0),  # 2 + 2 queued prefill + 2 decoding; 3 of 4 slots busy
    (load(4, 0, 0), 8, 2.0 + 4.0 + 4.0),  # 4 decoding, every slot full: waits for one
    (load(5, 1, 3, slots=4), 8, 2.0 + 3.0 + 4.0 + 8.0),  # 2 beyond the slots
    (load(2, 3, 0), 0, 10.0),  # counts never go negative (decoding = max(2 − 3, 0))
]


@pytest.mark.parametrize(("replica", "cached", "cost"), KV_COSTS)
def test_kv_aware_cost_counts_the_work_still_outstanding(
    replica: ReplicaLoad, cached: int, cost: float
) -> None:
    index = PrefixIndex()
    prompt = block_hashes("x" * 64 * 10, 64)
    index.add(replica.endpoint.url, prompt[:cached])
    assert KvAware(index).cost(replica, RouteRequest(prompt)) == cost


def test_kv_aware_weights_scale_their_terms() -> None:
    index = PrefixIndex()
    prompt = block_hashes("x" * 64 * 10, 64)
    busy = load(5, 1, 3)  # new 10 + queued 3; 4 decoding; 2 beyond the slots
    policy = KvAware(index, overlap_weight=2.0, decode_weight=0.5, queue_weight=0.0)
    assert policy.cost(busy, RouteRequest(prompt)) == 2.0 * 13 + 0.5 * 4
    assert KvAware(index, overlap_weight=0.0).cost(busy, RouteRequest(prompt)) == 4 + 8


def test_kv_aware_sends_a_cached_prefix_back_unless_the_replica_is_busy_prefilling() -> None:
    index = PrefixIndex()
    policy = KvAware(index)
    prompt = block_hashes("x" * 64 * 10, 64)
    index.add(ep(2).url, prompt[:8])  # replica 2 holds 8 of the 10 blocks
    request = RouteRequest(prompt)
    idle = [load(job=1), load(job=2), load(job=3)]
    assert policy.choose(idle, request).job_id == 2
    # Replica 2 is answering long prompts, all past their first token (decoding): the old
    # cost counted their 90 blocks; what is left there is 3 sequences decoding: 2 + 3 < 10.
    decoding = [load(job=1), load(3, 0, 0, job=2, active_blocks=90), load(job=3)]
    assert policy.choose(decoding, request).job_id == 2
    assert KvAwareSimple(index).choose(decoding, request).job_id != 2
    # Replica 2 still has 9 uncached blocks to prefill before this one: 2 + 9 + 0 > 10.
    prefilling = [load(job=1), load(1, 1, 9, job=2), load(job=3)]
    assert policy.choose(prefilling, request).job_id != 2
    # Replica 2's slots are all taken (2 of 2 decoding): 2 + 2 + 4 = 8 < 10 still wins …
    full = [load(job=1), load(2, 0, 0, slots=2, job=2), load(job=3)]
    assert policy.choose(full, request).job_id == 2
    # … but not with 2 more waiting for those slots: 2 + 4 + 4 × 3 > 10.
    queued = [load(job=1), load(4, 2, 0, slots=2, job=2), load(job=3)]
    assert policy.choose(queued, request).job_id != 2


def test_kv_aware_without_blocks_balances_by_outstanding_work_then_load() -> None:
    policy = KvAware(PrefixIndex())
    short = RouteRequest()  # a prompt shorter than a block: no hashes
    # Costs 1 (1 decoding), 4 (prefilling 4 blocks), 2 (2 decoding): replica 1.
    replicas = [load(1, 0, 0, job=1), load(1, 1, 4, job=2), load(2, 0, 0, job=3)]
    assert policy.choose(replicas, short).job_id == 1
    # Equal costs: the fewest in flight per slot (replica 1 has 8 slots) …
    tied = [load(2, 0, 0, slots=8, job=1), load(2, 0, 0, job=2)]
    assert policy.choose(tied, short).job_id == 1
    # … and ties beyond that go round the replicas.
    even = [load(job=1), load(job=2), load(job=3)]
    assert {policy.choose(even, short).job_id for _ in range(6)} == {1, 2, 3}


def test_make_policy_knows_every_name() -> None:
    index = PrefixIndex()
    for name in ("round-robin", "least-load", "power-of-two", "kv-aware", "kv-aware-simple"):
        assert make_policy(name, index).name == name


def test_block_hashes_are_chained_and_cover_whole_blocks_only() -> None:
    a = block_hashes("abcd" * 40, 16)
    assert len(a) == 10
    b = block_hashes("abcd" * 40 + "short tail", 16)
    assert b == a  # the tail is not hashed
    c = block_hashes("Xbcd" + "abcd" * 39, 16)
    assert not set(a) & set(c)  # the first block differs: every later hash does too
    assert block_hashes("short", 16) == ()
    assert block_hashes("é" * 32, 16) == block_hashes("é" * 32, 16)


def test_prefix_index_matches_leading_blocks_and_stays_within_its_bound() -> None:
    index = PrefixIndex(max_blocks=12)
    first = block_hashes("p" * 160, 16)  # 10 blocks
    index.add("r1", first)
    assert index.matched("r1", first) == 10
    assert index.matched("r2", first) == 0
    other = block_hashes("q" * 160, 16)
    index.add("r1", other)  # 20 blocks into room for 12: the oldest 8 of `first` go
    assert index.size("r1") == 12
    assert index.matched("r1", other) == 10
    assert index.matched("r1", first) == 0  # block 0 was evicted: no prefix matches
    index.keep_only(["r2"])
    assert index.size("r1") == 0


def test_chat_is_rendered_deterministically_for_hashing() -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url"}]},
    ]
    assert render_chat(messages) == "<|system|>You are terse.\n<|user|>Hi\n"
    assert prompt_text("/v1/chat/completions", {"messages": messages}) == render_chat(messages)
    assert prompt_text("/v1/completions", {"prompt": ["a", "b"]}) == "a"
    assert prompt_text("/v1/completions", {"prompt": [1, 2]}) == ""


def test_rate_limits_are_token_buckets_per_team() -> None:
    clock = Clock()
    limits = RateLimits({"ml": 2.0}, default=None, clock=clock)
    assert limits.take("ml") is None
    assert limits.take("ml") is None  # a burst of 2
    wait = limits.take("ml")
    assert wait == pytest.approx(0.5)
    clock.now += 0.5
    assert limits.take("ml") is None
    assert all(limits.take("other") is None for _ in range(100))  # no default: unlimited
    slow = RateLimits({}, default=0.5, clock=clock)
    assert slow.take("x") is None
    assert slow.take("x") == pytest.approx(2.0)
    with pytest.raises(ValueError):
        RateLimits({"ml": 0.0})


def test_audience_lets_owner_team_and_admins_in() -> None:
    audience = Audience(owner="alice", team="ml")

    def who(user: str, role: str = "user", teams: tuple[str, ...] = ()) -> WhoAmI:
        return WhoAmI(user=user, role=role, teams=list(teams), admin_of=[])  # type: ignore[arg-type]

    assert audience.allows(who("alice"))
    assert audience.allows(who("carol", teams=("ml",)))
    assert audience.allows(who("root", role="admin"))
    assert not audience.allows(who("bob", teams=("vision",)))
    assert audience.team_of(who("carol", teams=("vision", "ml"))) == "ml"
    assert audience.team_of(who("root", role="admin")) == "user:root"


def test_token_cache_asks_the_head_once_per_ttl_and_rides_out_an_outage() -> None:
    clock = Clock()
    calls: list[str] = []
    answers: dict[str, WhoAmI | None] = {
        "good": WhoAmI(user="alice", role="user", teams=[], admin_of=[]),
        "bad": None,
    }
    down = False

    async def fetch(token: str) -> WhoAmI | None:
        calls.append(token)
        await asyncio.sleep(0)
        if down:
            raise HeadUnreachable("down")
        return answers[token]

    cache = TokenCache(fetch, clock)

    async def scenario() -> None:
        nonlocal down
        # Concurrent first requests share one call.
        results = await asyncio.gather(*(cache.who("good") for _ in range(5)))
        assert {r.user for r in results if r} == {"alice"}
        assert await cache.who("bad") is None
        assert calls == ["good", "bad"]
        clock.now += BAD_TTL_S + 0.1
        assert await cache.who("good") is not None  # still fresh
        assert await cache.who("bad") is None  # asked again
        assert calls == ["good", "bad", "bad"]
        clock.now += OK_TTL_S
        down = True
        assert await cache.who("good") is not None  # stale but known while the head is away
        with pytest.raises(HeadUnreachable):
            await cache.who("never-seen")
        clock.now += STALE_OK_S
        with pytest.raises(HeadUnreachable):
            await cache.who("good")

    asyncio.run(scenario())


def test_stats_window_counts_what_ended_in_it() -> None:
    clock = Clock()
    stats = RouterStats(clock)
    stats.set_ready("aggregated", 2)
    for i in range(3):
        stats.started("aggregated")
        clock.now += 1
        stats.ended("aggregated", True, ttft_s=0.1 * (i + 1), tpot_s=0.01)
    stats.started("aggregated")
    stats.ended("aggregated", False)
    stats.started("aggregated")  # still in flight
    stats.queued("aggregated", 1)
    window = stats.window("aggregated", 1.5)
    assert window == PoolWindow(
        requests=3,
        errors=1,
        ttft_ms=(pytest.approx(200.0), pytest.approx(300.0)),  # type: ignore[arg-type]
        tpot_ms=(10.0, 10.0),
        in_flight=1,
        queued=1,
        replicas_ready=2,
    )
    assert stats.window("aggregated", 100).requests == 4
    assert stats.window("decode", 10) == PoolWindow(0, 0, (), (), 0, 0, 0)


def test_depth_check() -> None:
    assert depth_ok({"a": [1, {"b": 2}]}, 3)
    assert not depth_ok({"a": [[[[1]]]]}, 3)
    assert depth_ok({}, 0)


def _endpoints(*eps: Endpoint, key: str = "k") -> Endpoints:
    return Endpoints(
        name="d", served_model_name="m", engine="llama.cpp", policy="kv-aware",
        block_chars=16, generation=1, engine_key=key, endpoints=list(eps),
    )  # fmt: skip


def test_replica_set_follows_endpoints_and_keeps_what_it_knows() -> None:
    clock = Clock()
    index = PrefixIndex()
    replicas = ReplicaSet(index, clock)
    replicas.update(_endpoints(ep(1), ep(2)))
    first = replicas.by_url(ep(1).url)
    assert first is not None
    first.in_flight = 3
    index.add(ep(1).url, block_hashes("a" * 64, 16))
    index.add(ep(2).url, block_hashes("b" * 64, 16))
    # Same replica again: same state. Replica 2 gone: its cache forgotten. A new job at
    # replica 1's address would start empty; a URL that is not http://HOST:PORT is skipped.
    bad = Endpoint(job_id=9, pool="aggregated", url="https://10.0.0.9:1", slots=1, generation=1)
    replicas.update(_endpoints(ep(1), bad))
    assert replicas.by_url(ep(1).url) is first and first.in_flight == 3
    assert index.size(ep(1).url) == 4 and index.size(ep(2).url) == 0
    assert [r.endpoint.job_id for r in replicas.routable("aggregated")] == [1]
    moved = Endpoint(job_id=7, pool="aggregated", url=ep(1).url, slots=4, generation=2)
    replicas.update(_endpoints(moved))
    again = replicas.by_url(ep(1).url)
    assert again is not None and again is not first and again.in_flight == 0
    assert index.size(ep(1).url) == 0


def test_a_failed_replica_is_skipped_for_a_while_doubling_per_failure() -> None:
    clock = Clock()
    replicas = ReplicaSet(PrefixIndex(), clock)
    replicas.update(_endpoints(ep(1), ep(2)))
    one = replicas.by_url(ep(1).url)
    assert one is not None
    replicas.failed(one)
    assert [r.endpoint.job_id for r in replicas.routable("aggregated")] == [2]
    assert replicas.ready("aggregated") == 1
    clock.now += 1.0
    assert len(replicas.routable("aggregated")) == 2  # tried again after 1 s
    replicas.failed(one)
    clock.now += 1.5
    assert len(replicas.routable("aggregated")) == 1  # 2 s the second time
    # Every replica down: all are tried anyway (better than refusing outright).
    two = replicas.by_url(ep(2).url)
    assert two is not None
    replicas.failed(two)
    assert len(replicas.routable("aggregated")) == 2
    replicas.succeeded(one)
    assert [r.endpoint.job_id for r in replicas.routable("aggregated")] == [1]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (RouterOptions(), "--head and --deployment"),
        (RouterOptions(replicas=["http://a:1"]), "--no-auth"),
        (RouterOptions(head="http://h", deployment="../users", token="t"), "deployment name"),
        (RouterOptions(head="http://h", deployment="d"), "--token-file"),
        (RouterOptions(prefill=["http://a:1"], no_auth=True), "--prefill and --decode"),
        (RouterOptions(replicas=["http://a:1"], head="http://h"), "--owner"),
    ],
)
def test_router_setup_refuses_what_cannot_work(options: RouterOptions, says: str) -> None:
    with pytest.raises(RouterSetupError, match=says):
        build(options)
