"""`phalanx serve router --autoscale` end to end: a head and an agent (fake GPUs), a
llama-server deployment with min 1 / max 3 replicas and a TTFT target one single-slot
replica cannot hold under a burst, the real router with the autoscaler beside it. The
pool scales up (the head's deployment shows more replicas; they become ready and serve),
and back down to min once the load stops; decisions show in the head's event log and the
router's metrics. A second router with --autoscale stands by (the head's lease) and takes
over when the first one stops."""

from __future__ import annotations

import signal
import sqlite3
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from phalanx.api.models import TeamSpec, UserCreate
from phalanx.api.serving import SLO, DeploymentInfo, DeploymentSpec, PoolSpec
from phalanx.client.api import ApiError
from phalanx.client.serving import ServeClient
from phalanx.local import LocalCluster
from phalanx.serve.router.autoscale import AutoscaleOptions, autoscale_job
from phalanx.serve.router.server import RouterOptions, RouterSetupError
from phalanx.testing import engines
from tests.serve.polling import wait_for
from tests.serve.test_router_llama import Proc, _wait_ready, metric, start_router

NAME = "burst"
# Short passes, windows and cooldowns: the policy's defaults, compressed for a test.
AUTOSCALE = [
    "--autoscale", "--autoscale-interval", "0.5", "--autoscale-window", "4",
    "--autoscale-up-cooldown", "1", "--autoscale-miss-cooldown", "2",
    "--autoscale-down-cooldown", "2", "--autoscale-down-stable", "1",
]  # fmt: skip


@dataclass
class World:
    cluster: LocalCluster
    alice: ServeClient
    bob: ServeClient
    token: str
    token_file: Path
    state: Path
    router: Proc
    others: list[Proc] = field(default_factory=list)

    def info(self) -> DeploymentInfo:
        return self.alice.get(NAME)

    def desired(self) -> int:
        return self.info().pools[0].desired

    def events(self) -> list[str]:
        db = sqlite3.connect(f"file:{self.cluster.head_dir / 'phalanx.db'}?mode=ro", uri=True)
        try:
            rows = db.execute("SELECT message FROM events WHERE kind = 'serve' ORDER BY id")
            return [str(r[0]) for r in rows]
        finally:
            db.close()

    def metrics(self) -> str:
        auth = {"Authorization": f"Bearer {self.token}"}
        return httpx.get(self.router.url + "/metrics", headers=auth).text

    def start_router(self, *args: str) -> Proc:
        assert self.cluster.ca_file is not None
        proc = start_router(
            self.state, "--head", self.cluster.url, "--deployment", NAME,
            "--token-file", str(self.token_file), "--ca-file", str(self.cluster.ca_file),
            "--policy", "least-load", *args,
        )  # fmt: skip
        self.others.append(proc)
        _wait_ready(proc, "/health")
        return proc


def _holder(info: DeploymentInfo) -> str | None:
    return info.autoscaler


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    state = tmp_path_factory.mktemp("autoscale")
    with LocalCluster(state, nodes=1, gpus_per_node=4) as cluster:
        admin = cluster.client()
        admin.set_team(TeamSpec(name="ml"))
        admin.set_team(TeamSpec(name="vision"))
        for user, team in (("alice", "ml"), ("bob", "vision")):
            admin.create_user(UserCreate(name=user, teams=[team], default_team=team))
        token = admin.create_token("alice").token
        alice = ServeClient(cluster.client(token))
        bob = ServeClient(cluster.client(admin.create_token("bob").token))
        alice.apply(
            DeploymentSpec(
                name=NAME, engine="llama.cpp", model=str(engines.smollm2()),
                engine_path=str(engines.llama_server()),
                pools=[PoolSpec(
                    replicas=1, min_replicas=1, max_replicas=3, slots=1,
                    args=["-t", "1", "-c", "512"], slo=SLO(ttft_ms=150, attainment=0.9),
                )],
            )
        )  # fmt: skip
        wait_for("a ready replica", lambda: len(alice.endpoints(NAME).endpoints) == 1)
        token_file = state / "router.token"
        token_file.write_text(token)
        w = World(cluster, alice, bob, token, token_file, state, router=None)  # type: ignore[arg-type]
        try:
            w.router = w.start_router(*AUTOSCALE)
            yield w
        finally:
            for proc in w.others:
                proc.stop()


class Load:
    """Four clients asking the router back to back (a burst a one-slot replica queues)."""

    def __init__(self, w: World) -> None:
        self.url = w.router.url + "/v1/completions"
        self.headers = {"Authorization": f"Bearer {w.token}"}
        self.stop = threading.Event()
        self.served: list[str] = []
        self.failed: list[str] = []
        self.threads = [threading.Thread(target=self._client, args=(i,)) for i in range(4)]

    def _client(self, i: int) -> None:
        body = {"model": NAME, "prompt": f"Count to ten, {i}:", "max_tokens": 24,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                try:
                    r = client.post(self.url, json=body, headers=self.headers)
                except httpx.HTTPError as e:
                    self.failed.append(repr(e))
                    continue
                if r.status_code == 200:
                    self.served.append(r.headers["x-phalanx-replica"])
                else:
                    self.failed.append(f"{r.status_code} {r.text[:200]}")

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)


def test_the_pool_scales_up_under_a_burst_and_back_down_after_it(world: World) -> None:
    w = world
    wait_for("the router to take the lease", lambda: _holder(w.info()), timeout=30)
    first = {e.job_id for e in w.alice.endpoints(NAME).endpoints}
    with Load(w) as load:
        wait_for("a step up", lambda: w.desired() >= 2, timeout=60)

        def new_replicas_serving() -> bool:
            ready = {e.job_id for e in w.alice.endpoints(NAME).endpoints}
            return len(ready) >= 2 and len({*load.served} - {str(j) for j in first}) >= 1

        wait_for("a new replica ready and serving", new_replicas_serving, timeout=90)
    assert load.failed == []  # scaling up drops nothing
    peak = w.desired()
    assert peak >= 2
    # The load stopped: one replica at a time, back to min_replicas.
    wait_for("the pool back at min", lambda: w.desired() == 1, timeout=90)
    wait_for("one replica left", lambda: len(w.alice.endpoints(NAME).endpoints) == 1)

    events = w.events()
    ups = [e for e in events if "scaled 1 -> 2 by autoscaler router@" in e]
    downs = [e for e in events if "-> 1 by autoscaler router@" in e]
    assert ups and "scale up:" in ups[0], events
    assert downs and "scale down:" in downs[-1], events
    desired = 'phalanx_autoscaler_desired_replicas{pool="aggregated"} 1.0'
    wait_for("the gauge at min", lambda: desired in w.metrics())
    text = w.metrics()
    assert metric(text, "phalanx_autoscaler_leader") == 1
    up = 'direction="up",outcome="applied",pool="aggregated"'
    down = 'direction="down",outcome="applied",pool="aggregated"'
    assert metric(text, "phalanx_autoscaler_decisions_total", up) >= 1
    assert metric(text, "phalanx_autoscaler_decisions_total", down) >= 1
    log = w.router.log.read_text(errors="replace")
    assert f"autoscaler {NAME}/aggregated: 1 -> 2 (scale up:" in log


def test_one_autoscaler_acts_per_deployment(world: World) -> None:
    w = world
    holder = wait_for("the first router's lease", lambda: _holder(w.info()), timeout=30)
    second = w.start_router(*AUTOSCALE)
    wait_for("the second to stand by", lambda: "standing by" in second.log.read_text(), 30)
    assert _holder(w.info()) == holder
    # The head refuses anyone else: a claim, and a scale naming a holder without the lease.
    with pytest.raises(ApiError) as claimed:
        w.alice.claim_autoscaler(NAME, "intruder", 30)
    assert claimed.value.status == 409 and holder in claimed.value.detail
    with pytest.raises(ApiError) as scaled:
        w.alice.scale(NAME, "aggregated", 2, autoscaler="intruder", reason="mine")
    assert scaled.value.status == 409
    assert w.desired() == 1
    with pytest.raises(ApiError) as hidden:
        w.bob.claim_autoscaler(NAME, "bob", 30)
    assert hidden.value.status == 404
    # Bounded fields: a holder outside its charset or length, a reason over 512 characters.
    base = f"{w.cluster.url}/v1/serve/deployments/{NAME}"
    auth = {"Authorization": f"Bearer {w.token}"}
    ca = ssl.create_default_context(cafile=str(w.cluster.ca_file))
    for path, body in (
        ("/autoscaler", {"holder": "a b", "ttl_s": 5}),
        ("/autoscaler", {"holder": "x" * 129, "ttl_s": 5}),
        ("/autoscaler", {"holder": "x", "ttl_s": 10_000}),
        ("/scale", {"replicas": 2, "reason": "r" * 513}),
    ):
        r = httpx.post(base + path, json=body, headers=auth, verify=ca)
        assert r.status_code == 422, (path, body, r.text)
    assert httpx.post(base + "/autoscaler", json={"holder": "x"}, verify=ca).status_code == 401
    # The first stops (and releases the lease): the second takes over.
    w.router.proc.send_signal(signal.SIGTERM)
    w.router.proc.wait(timeout=30)

    def other_holder() -> str | None:
        now = _holder(w.info())
        return now if now != holder else None

    taken = wait_for("the second to take over", other_holder)
    assert taken.startswith("router@")
    second.proc.send_signal(signal.SIGTERM)
    second.proc.wait(timeout=30)
    assert _holder(w.info()) is None  # released
    # A lease that is not renewed lapses.
    w.alice.claim_autoscaler(NAME, "short", 1)
    with pytest.raises(ApiError):
        w.alice.claim_autoscaler(NAME, "next", 30)

    def lapsed() -> bool:
        try:
            w.alice.claim_autoscaler(NAME, "next", 30)
        except ApiError:
            return False
        return True

    wait_for("the lease to lapse", lapsed, timeout=10)
    w.alice.release_autoscaler(NAME, "next")


def test_autoscale_needs_a_head_and_a_deployment() -> None:
    for options in (RouterOptions(replicas=["http://127.0.0.1:9"], no_auth=True), RouterOptions()):
        with pytest.raises(RouterSetupError, match="--autoscale needs --head and --deployment"):
            autoscale_job(options, 8000, AutoscaleOptions())
    head = RouterOptions(head="https://h:1", deployment="smol", token="t")
    with pytest.raises(RouterSetupError, match="interval_s"):
        autoscale_job(head, 8000, AutoscaleOptions(interval_s=0))
