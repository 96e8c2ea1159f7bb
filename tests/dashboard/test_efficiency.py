"""The job page's efficiency card and chart history come from the telemetry store: a job
that keeps one of its two GPUs busy and leaves the other at 0% shows one idle GPU, the
store's note about it and both GPUs' utilisation since the job started."""

from __future__ import annotations

import html
import json
import re
import ssl
from pathlib import Path

import httpx

from phalanx.local import LocalCluster
from tests.e2e.helpers import job, sh, submit, wait_for


def test_the_job_page_shows_the_stores_efficiency_and_history(tmp_path: Path) -> None:
    agent_args = ["--telemetry-interval", "0.3", "--telemetry-ship", "0.3"]
    with LocalCluster(tmp_path, nodes=1, gpus_per_node=2, agent_args=agent_args) as cluster:
        api = cluster.client()
        work = tmp_path / "work"
        work.mkdir()
        spec = job(work, sh("sleep 4"), gpus_per_node=2, env={"PHALANX_FAKE_GPU_UTIL": "80,0"})
        job_id = submit(api, spec)
        wait_for("the job's stats to be final", lambda: api.job_stats(job_id).final or None, 90)
        stats = api.job_stats(job_id)
        assert (stats.gpus_total, stats.gpus_idle) == (2, 1)
        assert cluster.ca_file is not None
        verify = ssl.create_default_context(cafile=str(cluster.ca_file))
        with httpx.Client(base_url=cluster.url, verify=verify, timeout=30) as web:
            r = web.post("/ui/login", data={"token": cluster.admin_token, "next": "/ui/"})
            assert r.status_code == 303, r.text
            page = web.get(f"/ui/jobs/{job_id}").text
    card = page[page.index('id="efficiency"') :]
    assert re.search(r'id="eff-idle">1 of 2<', card)
    for note in stats.notes:
        assert html.escape(note) in card
    found = re.search(r'id="series-history" hidden data-series="([^"]*)"', page)
    assert found is not None
    history = json.loads(html.unescape(found.group(1)))
    columns = history["gpu"]["series"]
    assert len(columns) == 2 and len(history["gpu"]["t"]) >= 3
    busy, idle = (columns[k] for k in sorted(columns))
    assert max(v for v in busy if v is not None) >= 70
    assert {v for v in idle if v is not None} == {0.0}
