"""Serving deployments end to end: a real head and two agents (fake GPUs), real llama-server
replicas of SmolLM2-135M, real HTTP. One deployment is shared by the module's tests, in
order: ready → answers → a killed engine replaced → scale → rolling update → authorization
→ head restart → delete (each test leaves it with 2 ready replicas, or says otherwise)."""

from __future__ import annotations

import os
import signal
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from phalanx.api.models import JobSpec, UserCreate
from phalanx.api.serving import DeploymentInfo, DeploymentSpec, Endpoints, PoolSpec
from phalanx.cli.main import app
from phalanx.client.api import ApiError, PhalanxClient
from phalanx.client.serving import ServeClient
from phalanx.local import LocalCluster
from phalanx.testing import engines
from tests.head.heads import wait_for

T = TypeVar("T")
NAME = "smol"
ARGS = ["-t", "1", "-c", "1024"]


def spec(args: list[str] = ARGS, replicas: int = 2) -> DeploymentSpec:
    return DeploymentSpec(
        name=NAME,
        engine="llama.cpp",
        model=str(engines.smollm2()),
        engine_path=str(engines.llama_server()),
        pools=[PoolSpec(replicas=replicas, slots=2, args=args)],
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state = tmp_path_factory.mktemp("deploy")
    with LocalCluster(state, nodes=2, gpus_per_node=2) as running:
        yield running


@pytest.fixture(scope="module")
def api(cluster: LocalCluster) -> Iterator[PhalanxClient]:
    with cluster.client() as client:
        yield client


@pytest.fixture(scope="module")
def serve(api: PhalanxClient) -> ServeClient:
    client = ServeClient(api)
    client.apply(spec())
    return client


def ready(serve: ServeClient, n: int = 2, generation: int | None = None) -> Endpoints | None:
    ep = serve.endpoints(NAME)
    if len(ep.endpoints) != n:
        return None
    if generation is not None and any(e.generation != generation for e in ep.endpoints):
        return None
    return ep


def complete(url: str, key: str | None, prompt: str = "The capital of France is") -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": NAME, "prompt": prompt, "max_tokens": 4, "temperature": 0}
    return httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=30)


def engine_pid(url: str) -> int | None:
    """The llama-server process listening at `url` (by its command line)."""
    port = url.rsplit(":", 1)[1]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"llama-server") and port.encode() in argv:
            return int(entry.name)
    return None


def replica_env(job_id: int) -> dict[str, str]:
    """The environment of replica job `job_id`'s wrapper process."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"phalanx.serve.replica" not in (entry / "cmdline").read_bytes():
                continue
            raw = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(v.decode().split("=", 1) for v in raw if b"=" in v)
        if env.get("PHALANX_JOB_ID") == str(job_id):
            return env
    raise AssertionError(f"no wrapper process of job {job_id}")


def job_state(api: PhalanxClient, job_id: int) -> str:
    return api.job(job_id).job.state


def cancelled(api: PhalanxClient, job_id: int) -> Callable[[], bool]:
    return lambda: job_state(api, job_id) == "CA"


def exited(url: str) -> Callable[[], bool]:
    return lambda: engine_pid(url) is None


def live_replica_jobs(api: PhalanxClient) -> set[int]:
    return {j.id for j in api.jobs(active=True).jobs if j.name.startswith(f"serve:{NAME}:")}


# ---------------------------------------------------------------------------- tests
def test_two_llama_cpp_replicas_become_ready_and_answer_openai_requests(
    serve: ServeClient,
) -> None:
    ep = wait_for("2 ready replicas", lambda: ready(serve))
    assert ep.engine == "llama.cpp" and ep.served_model_name == NAME
    assert {e.slots for e in ep.endpoints} == {2}
    texts = []
    for e in ep.endpoints:
        answer = complete(e.url, ep.engine_key)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["usage"]["completion_tokens"] == 4
        texts.append(body["choices"][0]["text"])
        assert complete(e.url, None).status_code == 401  # the engines need the key
        assert complete(e.url, "not-the-key").status_code == 401
    assert texts[0] == texts[1]  # greedy: the same model answers the same
    info = serve.get(NAME)
    assert [(p.role, p.desired, p.ready) for p in info.pools] == [("aggregated", 2, 2)]
    assert all(r.state == "R" and r.ready for r in info.replicas)


def test_the_engine_key_is_on_no_command_line(serve: ServeClient) -> None:
    ep = wait_for("2 ready replicas", lambda: ready(serve))
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            assert ep.engine_key.encode() not in argv


def test_a_killed_engine_is_replaced_and_the_deployment_is_ready_again(
    api: PhalanxClient, serve: ServeClient
) -> None:
    ep = wait_for("2 ready replicas", lambda: ready(serve))
    victim = ep.endpoints[0]
    pid = engine_pid(victim.url)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for("the replica's job to fail", lambda: job_state(api, victim.job_id) == "F")

    def replaced() -> Endpoints | None:
        ep = ready(serve)
        return ep if ep and victim.job_id not in {x.job_id for x in ep.endpoints} else None

    again = wait_for("2 ready replicas again", replaced)
    assert len({e.job_id for e in again.endpoints}) == 2
    pool = serve.get(NAME).pools[0]
    assert pool.last_failure is not None
    assert pool.last_failure.startswith(f"replica job {victim.job_id} ended F (exit 1:0): rank 0")
    assert "exited with code 1" in pool.last_failure
    assert pool.failures == 0  # reset once a replacement was ready
    assert len(live_replica_jobs(api)) == 2


def test_scale_down_to_one_and_back_to_two(api: PhalanxClient, serve: ServeClient) -> None:
    wait_for("2 ready replicas", lambda: ready(serve))
    before = live_replica_jobs(api)
    info = serve.scale(NAME, "aggregated", 1)
    assert info.pools[0].desired == 1
    assert [r.retiring for r in info.replicas] == [False, True]  # retiring ones listed last
    one = wait_for("1 ready replica", lambda: ready(serve, 1))
    (gone,) = before - {one.endpoints[0].job_id}
    wait_for("the extra replica cancelled", lambda: job_state(api, gone) == "CA")
    assert live_replica_jobs(api) == {one.endpoints[0].job_id}
    serve.scale(NAME, "aggregated", 2)
    two = wait_for("2 ready replicas", lambda: ready(serve))
    assert one.endpoints[0].job_id in {e.job_id for e in two.endpoints}
    assert serve.get(NAME).generation == 1  # scaling is not a new generation


def test_apply_with_a_changed_arg_rolls_out_without_a_gap(
    api: PhalanxClient, serve: ServeClient
) -> None:
    old = wait_for("2 ready replicas", lambda: ready(serve))
    same = serve.apply(spec())
    assert same.generation == 1  # the same spec changes nothing
    info = serve.apply(spec(args=[*ARGS, "--temp", "0"]))
    assert info.generation == 2
    fewest, answered = 2, 0
    deadline = time.monotonic() + 40
    while True:
        ep = serve.endpoints(NAME)
        fewest = min(fewest, len(ep.endpoints))
        assert ep.endpoints, "no ready replica during the rolling update"
        answer = complete(ep.endpoints[answered % len(ep.endpoints)].url, ep.engine_key)
        assert answer.status_code == 200, answer.text  # no request dropped while it rolls
        answered += 1
        if len(ep.endpoints) == 2 and all(e.generation == 2 for e in ep.endpoints):
            break
        assert time.monotonic() < deadline, "the rolling update did not finish"
        time.sleep(0.05)
    assert fewest >= 1
    for e in old.endpoints:
        wait_for(f"old replica {e.job_id} cancelled", cancelled(api, e.job_id))
    assert len(live_replica_jobs(api)) == 2


def test_only_the_owner_team_admins_and_admins_see_a_deployment(
    cluster: LocalCluster, api: PhalanxClient, serve: ServeClient
) -> None:
    api.create_user(UserCreate(name="bob", teams=["default"]))
    api.create_user(UserCreate(name="carol", teams=["default"], team_admin_of=["default"]))
    bob_token = api.create_token("bob").token
    carol_token = api.create_token("carol").token
    with cluster.client(bob_token) as bob_api:
        bob = ServeClient(bob_api)
        assert bob.list().deployments == []
        for call in (
            lambda: bob.get(NAME),
            lambda: bob.endpoints(NAME),
            lambda: bob.scale(NAME, "aggregated", 0),
            lambda: bob.delete(NAME),
        ):
            with pytest.raises(ApiError) as e:
                call()
            assert e.value.status == 404
        with pytest.raises(ApiError) as e:
            bob.apply(spec())
        assert e.value.status == 409  # the name is taken; bob's apply changed nothing
    with cluster.client(carol_token) as carol_api:
        carol = ServeClient(carol_api)
        assert [d.spec.name for d in carol.list().deployments] == [NAME]
        assert carol.endpoints(NAME).engine_key == serve.endpoints(NAME).engine_key
    assert len(serve.endpoints(NAME).endpoints) == 2


def test_routes_refuse_missing_node_and_step_tokens(
    cluster: LocalCluster, serve: ServeClient
) -> None:
    ep = wait_for("2 ready replicas", lambda: ready(serve))
    base = f"{cluster.head_url()}/v1/serve"
    ca = ssl.create_default_context(cafile=str(cluster.ca_file))
    node_token = (cluster.state_dir / "agent-127.0.0.2" / "node.token").read_text().strip()
    a, b = ep.endpoints
    step_a = replica_env(a.job_id)["PHALANX_STEP_TOKEN"]
    with httpx.Client(verify=ca, timeout=10) as http:

        def status(method: str, path: str, token: str | None, **kw: Any) -> int:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            return http.request(method, base + path, headers=headers, **kw).status_code

        for token, want in ((None, 401), (node_token, 403), (step_a, 401)):
            assert status("GET", "/deployments", token) == want
            assert status("GET", f"/deployments/{NAME}/endpoints", token) == want
            assert status("DELETE", f"/deployments/{NAME}", token) == want
            body = {"pool": "aggregated", "replicas": 0}
            assert status("POST", f"/deployments/{NAME}/scale", token, json=body) == want
        report = {"url": a.url, "ready": False, "job_id": b.job_id}
        assert status("POST", "/replicas/self", step_a, json=report) == 401  # not its job
        assert status("POST", "/replicas/self", node_token, json=report) == 401
        assert status("GET", "/replicas/self", step_a, params={"job_id": b.job_id}) == 401
        own = http.get(
            base + "/replicas/self",
            params={"job_id": a.job_id},
            headers={"Authorization": f"Bearer {step_a}"},
        )
        assert own.status_code == 200 and own.json()["engine_key"] == ep.engine_key
        elsewhere = {"url": "http://10.9.9.9:8000", "ready": True, "job_id": a.job_id}
        assert status("POST", "/replicas/self", step_a, json=elsewhere) == 403
    assert ready(serve) is not None  # nothing of that changed the deployment


def test_the_cli_applies_lists_and_shows(cluster: LocalCluster, tmp_path: Path) -> None:
    env = cluster.client_env()
    runner = CliRunner()
    current = spec(args=[*ARGS, "--temp", "0"]).model_dump(mode="json", exclude_defaults=True)
    file = tmp_path / "deploy.yaml"
    file.write_text(yaml.safe_dump(current))
    out = runner.invoke(app, ["serve", "apply", str(file)], env=env)
    assert out.exit_code == 0, out.output
    assert f"deployment {NAME} generation 2: aggregated 2/2 ready" in out.output
    out = runner.invoke(app, ["serve", "ls"], env=env)
    assert out.exit_code == 0 and NAME in out.output and "2/2" in out.output
    out = runner.invoke(app, ["serve", "show", NAME, "--json"], env=env)
    info = DeploymentInfo.model_validate_json(out.output)
    assert info.generation == 2 and len(info.replicas) == 2
    out = runner.invoke(app, ["serve", "show", "nope"], env=env)
    assert out.exit_code == 2 and out.output.startswith("error: ") and "Traceback" not in out.output
    out = runner.invoke(app, ["serve", "scale", NAME, "--replicas", "2"], env=env)
    assert out.exit_code == 0 and "2 wanted" in out.output
    args = ["serve", "scale", NAME, "--pool", "decode", "--replicas", "1"]
    out = runner.invoke(app, args, env=env)
    assert out.exit_code == 2
    assert out.output == f"error: deployment {NAME} has no decode pool (it has aggregated)\n"


def test_a_crashing_engine_is_replaced_with_backoff_and_the_reason_shown(
    cluster: LocalCluster, api: PhalanxClient, serve: ServeClient
) -> None:
    crash = DeploymentSpec(
        name="crash",
        engine="custom",
        model="none",
        engine_path="/bin/false",  # exits 1 at once: the wrapper fails, the job ends F
        pools=[PoolSpec(replicas=1)],
    )
    serve.apply(crash)

    def backing_off() -> DeploymentInfo | None:
        info = serve.get("crash")
        pool = info.pools[0]
        return info if pool.failures >= 2 and pool.backoff_until is not None else None

    info = wait_for("two failures and a backoff", backing_off)
    pool = info.pools[0]
    assert pool.last_failure is not None and "ended F (exit 1:0)" in pool.last_failure
    assert pool.ready == 0
    if time.time() < (pool.backoff_until or 0) - 0.5:
        live = {j.id for j in api.jobs(active=True).jobs if j.name.startswith("serve:crash:")}
        assert live == set()  # no replica is submitted while the pool backs off
    out = CliRunner().invoke(app, ["serve", "show", "crash"], env=cluster.client_env())
    assert "failure(s) in a row" in out.output and "last failure: replica job" in out.output
    serve.delete("crash")
    assert ready(serve) is not None  # the other deployment never noticed


def test_a_prefill_and_a_decode_pool_both_get_ready(
    api: PhalanxClient, serve: ServeClient, tmp_path: Path
) -> None:
    handoff = tmp_path / "handoff"
    handoff.mkdir()
    disagg = spec(replicas=1).model_copy(
        update={
            "name": "split",
            "handoff_dir": str(handoff),
            "pools": [
                PoolSpec(role="prefill", replicas=1, slots=2, args=ARGS),
                PoolSpec(role="decode", replicas=1, slots=2, args=ARGS),
            ],
        }
    )
    serve.apply(disagg)

    def both() -> Endpoints | None:
        ep = serve.endpoints("split")
        return ep if sorted(e.pool for e in ep.endpoints) == ["decode", "prefill"] else None

    ep = wait_for("a ready prefill and decode replica", both)
    for e in ep.endpoints:
        pid = engine_pid(e.url)
        assert pid is not None
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert argv[argv.index(b"--slot-save-path") + 1] == str(handoff).encode()
    info = serve.get("split")
    assert [(p.role, p.desired, p.ready) for p in info.pools] == [
        ("prefill", 1, 1),
        ("decode", 1, 1),
    ]
    serve.delete("split")
    for e in ep.endpoints:
        wait_for(f"replica {e.job_id} cancelled", cancelled(api, e.job_id))


def test_preempted_replicas_come_back_when_capacity_returns(
    api: PhalanxClient, serve: ServeClient
) -> None:
    before = wait_for("2 ready replicas", lambda: ready(serve))
    ids = {e.job_id for e in before.endpoints}
    big = JobSpec(
        name="big",
        command=["sleep", "300"],
        launcher="node",
        nodes=2,
        gpus_per_node=2,  # every GPU of the cluster: both replicas must go
        qos="high",
        workdir="/tmp",
    )
    (big_id,) = api.submit(big).job_ids
    wait_for("no ready replica", lambda: not serve.endpoints(NAME).endpoints)
    wait_for("the high-QOS job to run", lambda: job_state(api, big_id) == "R")
    assert {r.job_id: r.state for r in serve.get(NAME).replicas} == dict.fromkeys(ids, "PD")
    assert live_replica_jobs(api) == ids  # requeued, not replaced by new jobs
    api.cancel(big_id)
    after = wait_for("2 ready replicas again", lambda: ready(serve), timeout=60)
    assert {e.job_id for e in after.endpoints} == ids
    assert serve.get(NAME).pools[0].failures == 0  # a preemption is not a failure


def test_a_head_restart_keeps_the_replicas_without_duplicates(
    cluster: LocalCluster, api: PhalanxClient, serve: ServeClient
) -> None:
    before = wait_for("2 ready replicas", lambda: ready(serve, generation=2))
    jobs = live_replica_jobs(api)
    cluster.kill_head(signal.SIGKILL)
    cluster.restart_head()
    time.sleep(1.5)  # the controller's passes (every second) have looked at it
    after = wait_for("2 ready replicas", lambda: ready(serve, generation=2))
    assert {e.job_id for e in after.endpoints} == {e.job_id for e in before.endpoints}
    assert after.engine_key == before.engine_key
    assert live_replica_jobs(api) == jobs
    for e in after.endpoints:
        assert complete(e.url, after.engine_key).status_code == 200


def test_delete_cancels_every_replica(api: PhalanxClient, serve: ServeClient) -> None:
    ep = wait_for("2 ready replicas", lambda: ready(serve))
    serve.delete(NAME)
    for e in ep.endpoints:
        wait_for(f"replica {e.job_id} cancelled", cancelled(api, e.job_id))
        wait_for("its engine to exit", exited(e.url))
    with pytest.raises(ApiError) as err:
        serve.get(NAME)
    assert err.value.status == 404
    assert live_replica_jobs(api) == set()
