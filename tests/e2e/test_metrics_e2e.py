"""Per-GPU series and dcgm-exporter job-mapping files on a real cluster: a head and two
agents (processes, 2 fake GPUs each) started with --hpc-job-mapping-dir and
--metrics-token-file; a job runs, and the files, the agent's /metrics and the head's
/v1/metrics/gpus follow it."""

from __future__ import annotations

import secrets
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from phalanx.client.api import PhalanxClient
from phalanx.local import LocalCluster
from tests.e2e.helpers import final_log, job, py, sh, submit, wait_for, wait_state

Sample = tuple[str, dict[str, str], float]


@pytest.fixture(scope="module")
def mapped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path, str]]:
    """A cluster whose agents keep job-mapping files under maps/<node> and accept a scrape
    token from a file."""
    root = tmp_path_factory.mktemp("metrics-e2e").resolve()
    token = secrets.token_urlsafe(32)
    token_file = root / "scrape.token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    maps = root / "maps"
    args = ["--hpc-job-mapping-dir", f"{maps}/%n", "--metrics-token-file", str(token_file)]
    with LocalCluster(root / "cluster", nodes=2, gpus_per_node=2, agent_args=args) as cluster:
        yield cluster, maps, token


def samples(text: str) -> list[Sample]:
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def promtool_ok(text: str) -> None:
    tool = shutil.which("promtool")
    assert tool is not None, "promtool is missing: apt-get install prometheus"
    done = subprocess.run(
        [tool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, (done.stdout, done.stderr)


def files(maps: Path, node: str) -> dict[str, str]:
    """A node's job-mapping directory: file name → content."""
    return {p.name: p.read_text() for p in sorted((maps / node).iterdir())}


def test_a_running_job_labels_its_gpus_everywhere(
    mapped: tuple[LocalCluster, Path, str], tmp_path: Path
) -> None:
    cluster, maps, scrape_token = mapped
    workdir = tmp_path.resolve()
    nodes = cluster.addresses
    idle = {"0": "", "1": ""}
    # Before any job: a file per GPU, empty.
    wait_for("empty mapping files", lambda: all(files(maps, n) == idle for n in nodes) or None)
    with cluster.client() as api:
        job_id = submit(
            api,
            job(workdir, sh("sleep 300"), gpus_per_node=2, env={"PHALANX_FAKE_GPU_UTIL": "100"}),
        )
        info = wait_state(api, job_id, "R")
        node = next(n.name for n in api.nodes().nodes if job_id in n.jobs)
        other = next(n for n in nodes if n != node)
        want = {"0": f"{job_id}\n", "1": f"{job_id}\n"}
        wait_for("the job in its GPUs' files", lambda: files(maps, node) == want or None)
        assert files(maps, other) == idle
        for entry in (maps / node).iterdir():
            assert entry.stat().st_mode & 0o777 == 0o644

        agent_url = next(n.agent_url for n in api.nodes().nodes if n.name == node)
        _agent_scrape(cluster, agent_url, scrape_token, job_id, info.user, info.team)
        _head_scrape(cluster, api, node, job_id, info.user)

        api.cancel(job_id)
        wait_state(api, job_id, "CA")
        wait_for("files emptied", lambda: files(maps, node) == idle or None)


def _agent_scrape(
    cluster: LocalCluster, url: str, token: str, job_id: int, user: str, team: str
) -> None:
    ca = cluster.ca_file
    verify = ssl.create_default_context(cafile=str(ca)) if ca is not None else True
    with httpx.Client(base_url=url, verify=verify, timeout=30) as agent:
        assert agent.get("/metrics").status_code == 401
        assert agent.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
        r = agent.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        promtool_ok(r.text)
        # The scrape token opens /metrics only.
        logs = agent.get(f"/v1/logs/{job_id}", headers={"Authorization": f"Bearer {token}"})
        assert logs.status_code == 401
    util = [s for s in samples(r.text) if s[0] == "phalanx_gpu_utilization_ratio"]
    assert len(util) == 2
    for _name, labels, value in util:
        assert labels["job"] == str(job_id) and labels["user"] == user
        assert labels["team"] == team and labels["uuid"].startswith("GPU-")
        assert value == 1.0  # the fake GPUs of a running rank are busy


def _head_scrape(
    cluster: LocalCluster, api: PhalanxClient, node: str, job_id: int, user: str
) -> None:
    def busy() -> list[Sample] | None:
        util = [
            s
            for s in samples(api.metrics_text("/v1/metrics/gpus"))
            if s[0] == "phalanx_gpu_utilization_ratio" and s[1]["node"] == node
        ]
        ok = len(util) == 2 and all(s[1]["job"] == str(job_id) and s[2] == 1.0 for s in util)
        return util if ok else None

    util = wait_for("the head's per-GPU series to show the job", busy)
    assert {s[1]["user"] for s in util} == {user}
    everything = {
        (s[1]["node"], s[1]["gpu"]) for s in samples(api.metrics_text("/v1/metrics/gpus"))
    }
    assert len(everything) == 4
    shards = []
    for k in range(2):
        text = api.metrics_text("/v1/metrics/gpus", params={"shard": k, "of": 2})
        promtool_ok(text)
        shards.append({(s[1]["node"], s[1]["gpu"]) for s in samples(text)})
    assert shards[0] | shards[1] == everything and not shards[0] & shards[1]
    head = {(s[0], tuple(sorted(s[1].items()))): s[2] for s in samples(api.metrics_text())}
    assert head[("phalanx_gpus", (("state", "allocated"),))] == 2
    assert head[("phalanx_gpus", (("state", "idle"),))] == 2


REPORTER = (
    "from phalanx.train.report import Progress, Reporter\n"
    "import time\n"
    "r = Reporter(0, 0, printer=print)\n"
    "for step in (5, 6):\n"
    "    r.report(Progress(rank=0, step=step, loss=1.0, tokens_per_s=None, mfu=None,\n"
    "                      time=time.time(), checkpoint_s=2.5, checkpoint_step=5))\n"
    "r.close()\n"
    "time.sleep(300)\n"
)


def test_a_jobs_checkpoint_report_reaches_the_heads_histogram(
    mapped: tuple[LocalCluster, Path, str], tmp_path: Path
) -> None:
    cluster, _maps, _token = mapped
    with cluster.client() as api:
        job_id = submit(api, job(tmp_path.resolve(), py(REPORTER)))
        info = wait_state(api, job_id, "R")
        labels = (("qos", info.qos), ("team", info.team))

        def last_step() -> int | None:
            progress = api.job(job_id).progress
            return progress[0].step if progress and progress[0].step == 6 else None

        wait_for("both reports", last_step)  # both name the same checkpoint (step 5)
        found = {(s[0], tuple(sorted(s[1].items()))): s[2] for s in samples(api.metrics_text())}
        assert found[("phalanx_job_checkpoint_duration_seconds_count", labels)] == 1
        assert found[("phalanx_job_checkpoint_duration_seconds_sum", labels)] == 2.5
        api.cancel(job_id)
        wait_state(api, job_id, "CA")


STEP_TOKEN_SCRAPE = (
    "import os, ssl, httpx\n"
    "pem = os.environ.get('PHALANX_CA_PEM')\n"
    "verify = ssl.create_default_context(cadata=pem) if pem else True\n"
    "url = os.environ['PHALANX_AGENT_URLS'].split(',')[0]\n"
    "token = os.environ['PHALANX_STEP_TOKEN']\n"
    "r = httpx.get(url + '/metrics', headers={'Authorization': 'Bearer ' + token}, verify=verify)\n"
    "print('status', r.status_code)\n"
)


def test_a_jobs_step_token_cannot_scrape_its_agent(
    mapped: tuple[LocalCluster, Path, str], tmp_path: Path
) -> None:
    """The per-GPU series name every job's user and team: a job's own credential, which
    opens its srun steps on that agent, does not open /metrics."""
    cluster, _maps, _token = mapped
    with cluster.client() as api:
        job_id = submit(api, job(tmp_path.resolve(), py(STEP_TOKEN_SCRAPE)))
        wait_state(api, job_id, ["CD"])
        assert "status 401" in final_log(api, job_id)
