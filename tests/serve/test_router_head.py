"""The router in head mode (`--head URL --deployment NAME`) in front of a real deployment:
a head and an agent (fake GPUs), two llama-server replicas as jobs, TLS with the cluster's
CA. Endpoints come from the head and follow a scale-down; callers are checked against the
deployment's owner and team."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import httpx
import pytest

from phalanx.api.models import TeamSpec, UserCreate
from phalanx.api.serving import DeploymentSpec, Endpoint, PoolSpec
from phalanx.client.serving import ServeClient
from phalanx.local import LocalCluster
from phalanx.testing import engines
from tests.serve.polling import wait_for
from tests.serve.test_deploy_e2e import engine_pid
from tests.serve.test_router_llama import Proc, _wait_ready, metric, start_router

T = TypeVar("T")
NAME = "smol"


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalCluster, dict[str, str], Proc, ServeClient]]:
    state = tmp_path_factory.mktemp("router-head")
    with LocalCluster(state, nodes=1, gpus_per_node=2) as cluster:
        admin = cluster.client()
        admin.set_team(TeamSpec(name="ml"))
        admin.set_team(TeamSpec(name="vision"))
        for user, team in (("alice", "ml"), ("carol", "ml"), ("bob", "vision")):
            admin.create_user(UserCreate(name=user, teams=[team], default_team=team))
        tokens = {u: admin.create_token(u).token for u in ("alice", "carol", "bob")}
        alice = ServeClient(cluster.client(tokens["alice"]))
        alice.apply(
            DeploymentSpec(
                name=NAME, engine="llama.cpp", model=str(engines.smollm2()),
                engine_path=str(engines.llama_server()),
                pools=[PoolSpec(replicas=2, slots=2, args=["-t", "1", "-c", "1024"])],
            )
        )  # fmt: skip
        wait_for("2 ready replicas", lambda: len(alice.endpoints(NAME).endpoints) == 2)
        token_file = state / "router.token"
        token_file.write_text(tokens["alice"])
        assert cluster.ca_file is not None
        router = start_router(
            state, "--head", cluster.url, "--deployment", NAME, "--token-file", str(token_file),
            "--ca-file", str(cluster.ca_file), "--policy", "round-robin",
        )  # fmt: skip
        try:
            _wait_ready(router, "/health")
            yield cluster, tokens, router, alice
        finally:
            router.stop()


def test_head_mode_routes_to_the_deployment_and_checks_its_audience(
    world: tuple[LocalCluster, dict[str, str], Proc, ServeClient],
) -> None:
    cluster, tokens, router, alice = world
    body = {"model": NAME, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    url = router.url + "/v1/completions"

    def ask(token: str | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.post(url, json=body, headers=headers, timeout=60)

    key = alice.endpoints(NAME).engine_key
    replica = alice.endpoints(NAME).endpoints[0].url
    want = httpx.post(replica + "/v1/completions", json=body,
                      headers={"Authorization": f"Bearer {key}"}, timeout=60)  # fmt: skip
    served = set()
    for who in ("alice", "carol", "alice", "carol"):
        r = ask(tokens[who])
        assert r.status_code == 200, r.text
        assert r.json()["choices"] == want.json()["choices"]
        served.add(r.headers["x-phalanx-replica"])
    assert len(served) == 2
    assert ask(None).status_code == 401
    assert ask(tokens["bob"]).status_code == 403
    assert ask(cluster.admin_token).status_code == 200
    # The head's endpoints are followed: scaled to one replica, the router uses that one.
    alice.scale(NAME, "aggregated", 1)

    def one_left() -> list[Endpoint] | None:
        endpoints = alice.endpoints(NAME).endpoints
        return endpoints if len(endpoints) == 1 else None

    left = wait_for("one replica", one_left)

    def only_left() -> bool:
        served = {ask(tokens["alice"]).headers["x-phalanx-replica"] for _ in range(3)}
        return served == {str(left[0].job_id)}

    wait_for("the router to follow", only_left, timeout=30)
    metrics = httpx.get(
        router.url + "/metrics", headers={"Authorization": f"Bearer {tokens['alice']}"}
    ).text
    assert metric(metrics, "phalanx_router_requests_total", 'code="200"') >= 8


def test_a_replica_killed_mid_load_is_replaced_and_no_request_fails(
    world: tuple[LocalCluster, dict[str, str], Proc, ServeClient],
) -> None:
    # The acceptance, whole: a deployment behind the router in head mode, one
    # replica's engine SIGKILLed while non-streaming requests flow; every request is
    # answered (the router retries what had not begun elsewhere), the head replaces the
    # replica, and the router routes to the replacement.
    _, tokens, router, alice = world
    alice.scale(NAME, "aggregated", 2)
    before = wait_for(
        "2 ready replicas",
        lambda: ep if len(ep := alice.endpoints(NAME).endpoints) == 2 else None,
    )
    headers = {"Authorization": f"Bearer {tokens['alice']}"}
    body = {"model": NAME, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
    want = httpx.post(router.url + "/v1/completions", json=body, headers=headers, timeout=60)
    assert want.status_code == 200, want.text

    def ask(_: int) -> httpx.Response:
        return httpx.post(router.url + "/v1/completions", json=body, headers=headers, timeout=120)

    victim = before[0]
    pid = engine_pid(victim.url)
    assert pid is not None
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(ask, i) for i in range(24)]
        time.sleep(0.3)  # requests in flight on both replicas
        os.kill(pid, signal.SIGKILL)
        answers = [f.result() for f in futures]
    assert [r.status_code for r in answers] == [200] * 24, [r.text for r in answers]
    assert all(r.json()["choices"] == want.json()["choices"] for r in answers)

    def replaced() -> list[Endpoint] | None:
        ep = alice.endpoints(NAME).endpoints
        ids = {e.job_id for e in ep}
        return ep if len(ep) == 2 and victim.job_id not in ids else None

    fresh = wait_for("a replacement replica", replaced)
    new_id = ({e.job_id for e in fresh} - {e.job_id for e in before}).pop()

    def served_by_new() -> bool:
        got = {ask(0).headers.get("x-phalanx-replica") for _ in range(4)}
        return str(new_id) in got

    wait_for("the router to route to the replacement", served_by_new, timeout=30)
