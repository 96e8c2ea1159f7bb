"""`GET /v1/jobs?ids=…` (what sacct -j and squeue -j ask for) and the fields Slurm's tools
read, against a real head on SQLite and PostgreSQL: live and ended jobs, arrays by their
id, bounded input, and who cancelled a job."""

from __future__ import annotations

from typing import Any

import httpx

from tests.head.conftest import HeadProc

JOB = {"command": ["true"], "workdir": "/tmp"}


def _submit(admin: httpx.Client, **fields: Any) -> list[int]:
    r = admin.post("/v1/jobs", json={**JOB, **fields})
    assert r.status_code in (200, 201), r.text
    ids: list[int] = r.json()["job_ids"]
    return ids


def _table(admin: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    r = admin.get("/v1/jobs", params={"format": "table", **params})
    assert r.status_code == 200, r.text
    body = r.json()
    return [dict(zip(body["columns"], row, strict=True)) for row in body["rows"]]


def test_ids_name_live_and_ended_jobs_and_whole_arrays(head: HeadProc) -> None:
    with head.client() as admin:
        (plain,) = _submit(admin, name="plain", mem_mb=2048, cpus_per_task=3)
        array = _submit(admin, name="arr", array={"indices": [1, 2, 3], "max_parallel": 2})
        (ended,) = _submit(admin, name="gone")
        (other,) = _submit(admin, name="other")
        assert admin.post(f"/v1/jobs/{ended}/cancel").status_code == 200

        rows = _table(admin, active="true", ended="true", ids=f"{plain},{array[0]},{ended}")
        assert sorted(r["id"] for r in rows) == sorted([plain, *array, ended])
        assert other not in {r["id"] for r in rows}
        by_id = {r["id"]: r for r in rows}
        assert (by_id[plain]["mem_mb"], by_id[plain]["cpus_per_task"]) == (2048, 3)
        assert {by_id[i]["array_max_parallel"] for i in array} == {2}
        assert by_id[ended]["state"] == "CA"
        assert by_id[ended]["cancelled_by"] == "admin"
        assert by_id[plain]["cancelled_by"] is None

        # Only ended ones: the database's query honours the ids too.
        rows = _table(admin, ended="true", ids=f"{ended},{plain}")
        assert [r["id"] for r in rows] == [ended]
        # An array task's own id names that task only.
        rows = _table(admin, active="true", ids=str(array[1]))
        assert [r["id"] for r in rows] == [array[1]]
        for job in (plain, *array, other):
            admin.post(f"/v1/jobs/{job}/cancel")


def test_ids_are_bounded_and_well_formed(head: HeadProc) -> None:
    with head.client() as admin:
        for bad in ("", "1,,2", "x", "1;2", "-1", "12345678901", ",".join(["1"] * 401)):
            r = admin.get("/v1/jobs", params={"ids": bad})
            assert r.status_code == 422, (bad[:40], r.text)
        assert admin.get("/v1/jobs", params={"ids": ",".join(["7"] * 400)}).status_code == 200


def test_whoami_names_the_default_team(head: HeadProc) -> None:
    with head.client() as admin:
        r = admin.post(
            "/v1/users",
            json={"name": "sq-carol", "teams": ["default"], "default_team": "default"},
        )
        assert r.status_code == 201, r.text
        token = admin.post("/v1/tokens", json={"user": "sq-carol"}).json()["token"]
    with head.client(token) as carol:
        me = carol.get("/v1/whoami").json()
    assert (me["user"], me["default_team"]) == ("sq-carol", "default")
