"""Usage reports, idle flags and idle-GPU policies through a real head process (SQLite and
PostgreSQL) and the real CLI: who sees which rows, CSV, bad input; and the rollup's replay
of the job event log on both databases."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner, Result

from phalanx.api.usage import IdleGpuList, IdlePolicyInfo, UsageReport
from phalanx.cli.main import app
from phalanx.head import db
from phalanx.head.accounting import Rollup, Scope, report
from phalanx.head.migrate import upgrade
from phalanx.testing.postgres import PostgresServer
from tests.head.conftest import HeadProc

JOB = {"command": ["sleep", "60"], "workdir": "/tmp"}


def cli(head: HeadProc, *args: str, token: str | None = None) -> Result:
    env = {"PHALANX_HEAD": head.url, "PHALANX_TOKEN": token or head.admin_token}
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


def _user(head: HeadProc, name: str, teams: list[str], admin_of: list[str] | None = None) -> str:
    admin = head.client()
    for team in teams:
        admin.put(f"/v1/teams/{team}", json={"name": team}).raise_for_status()
    body = {"name": name, "teams": teams, "team_admin_of": admin_of or []}
    assert admin.post("/v1/users", json=body).status_code == 201
    token: str = admin.post("/v1/tokens", json={"user": name}).json()["token"]
    return token


def _cancelled_jobs(client: httpx.Client, n: int, team: str) -> list[int]:
    """Submit `n` jobs (no agent runs them) and cancel them: each ends, counted."""
    ids = []
    for _ in range(n):
        r = client.post("/v1/jobs", json={**JOB, "team": team})
        assert r.status_code == 201, r.text
        ids.append(r.json()["job_ids"][0])
    for i in ids:
        assert client.post(f"/v1/jobs/{i}/cancel").status_code == 200
    return ids


def _jobs_by(report: dict[str, object], keys: set[str]) -> dict[str, int]:
    rows = UsageReport.model_validate(report).rows
    out: dict[str, int] = {}
    for r in rows:
        if r.key in keys:
            out[r.key] = out.get(r.key, 0) + r.jobs
    return out


def test_each_role_sees_only_its_rows_in_json_and_csv(head: HeadProc) -> None:
    ann = _user(head, "ann", ["red"])
    bob = _user(head, "bob", ["blue"])
    carl = _user(head, "carl", ["blue"], admin_of=["blue"])
    _cancelled_jobs(head.client(ann), 2, "red")
    _cancelled_jobs(head.client(bob), 3, "blue")
    people = {"ann", "bob", "carl"}
    q = {"by": "user", "per": "month"}

    every = head.client().get("/v1/reports/usage", params=q)
    assert every.status_code == 200, every.text
    assert _jobs_by(every.json(), people) == {"ann": 2, "bob": 3}
    as_ann = head.client(ann).get("/v1/reports/usage", params=q).json()
    assert {r["key"] for r in as_ann["rows"]} == {"ann"}
    assert as_ann["total"]["jobs"] == 2
    as_bob = head.client(bob).get("/v1/reports/usage", params=q).json()
    assert {r["key"] for r in as_bob["rows"]} == {"bob"}
    as_carl = head.client(carl).get("/v1/reports/usage", params=q).json()  # blue's admin
    assert _jobs_by(as_carl, people) == {"bob": 3}
    assert {r["key"] for r in as_carl["rows"]} <= {"bob", "carl"}
    # By team, a plain user's view of a team is their own part of it.
    by_team = head.client(ann).get("/v1/reports/usage", params={"by": "team"}).json()
    assert [(r["key"], r["jobs"]) for r in by_team["rows"]] == [("red", 2)]
    assert by_team["rows"][0]["period"] == dt.datetime.now(dt.UTC).date().isoformat()

    text = head.client(ann).get("/v1/reports/usage", params={**q, "format": "csv"})
    assert text.headers["content-type"].startswith("text/csv")
    table = list(csv.reader(io.StringIO(text.text)))
    assert table[0] == [
        "period",
        "user",
        "alloc_gpu_hours",
        "util_gpu_hours",
        "idle_gpu_hours",
        "utilization_pct",
        "jobs",
        "failures",
        "preemptions",
    ]
    assert [(row[1], row[6], row[7]) for row in table[1:]] == [("ann", "2", "0")]

    printed = cli(head, "report", "--by", "user", "--per", "month", "--csv", token=ann)
    assert printed.exit_code == 0, printed.stderr
    assert printed.stdout == text.text
    shown = cli(head, "report", "--by", "team", token=carl)
    assert shown.exit_code == 0, shown.stderr
    assert "blue" in shown.stdout and "red" not in shown.stdout
    as_json = cli(head, "report", "--json", "--by", "user", token=bob)
    assert UsageReport.model_validate_json(as_json.stdout).total.jobs == 3


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"since": "2026-02-30"}, "since: '2026-02-30' is not a day"),
        ({"since": "yesterday"}, "since"),
        ({"by": "node"}, "by"),
        ({"per": "week"}, "per"),
        ({"format": "xml"}, "format"),
        ({"since": "2026-03-02", "until": "2026-03-01"}, "must be before until"),
        ({"since": "1990-01-01", "until": "2026-01-01"}, "at most 3700 days"),
    ],
)
def test_bad_report_requests_are_422(head: HeadProc, params: dict[str, str], words: str) -> None:
    r = head.client().get("/v1/reports/usage", params=params)
    assert r.status_code == 422, r.text
    assert words in r.json()["detail"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["report", "--by", "node"], "error: --by: 'node' is not one of user, team, qos"),
        (["report", "--per", "week"], "error: --per: 'week' is not one of day, month"),
        (["report", "--since", "2026-13-01"], "error: --since: '2026-13-01' is not a day of"),
        (["report", "--until", "soon"], "error: --until: 'soon' is not a day"),
        (["report", "--since", "2026-03", "--until", "2026-02"], "error: since (2026-03-01)"),
        (["admin", "team", "idle-policy", "default", "--window", "soon"], "error: --window"),
        (["admin", "team", "idle-policy", "default", "--window", "5s"], "at least 10 seconds"),
        (["admin", "team", "idle-policy", "default", "--action", "nap"], "error: --action"),
        (["admin", "team", "idle-policy", "nope", "--action", "cancel"], "no team 'nope'"),
        (["idle", "0"], "error:"),
    ],
)
def test_bad_cli_input_is_one_line(head: HeadProc, args: list[str], words: str) -> None:
    result = cli(head, *args)
    assert result.exit_code == 2, result.stdout
    assert words in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_idle_policy_is_set_by_admins_and_shown_to_all(head: HeadProc) -> None:
    dana = _user(head, "dana", ["green"])
    admin = head.client()
    path = "/v1/teams/green/idle-policy"
    shown = IdlePolicyInfo.model_validate(head.client(dana).get(path).json())
    assert (shown.action, shown.window_s, shown.grace_s, shown.default) == (
        "notify",
        1800.0,
        600.0,
        True,
    )
    body = {"action": "preempt", "window_s": 900, "grace_s": 60, "threshold_pct": 5}
    assert head.client(dana).put(path, json=body).status_code == 403
    r = admin.put(path, json=body)
    assert r.status_code == 200, r.text
    assert IdlePolicyInfo.model_validate(r.json()).default is False
    listed = admin.get("/v1/idle-policies").json()["policies"]
    green = next(p for p in listed if p["team"] == "green")
    assert (green["action"], green["window_s"], green["threshold_pct"]) == ("preempt", 900, 5)
    assert admin.put("/v1/teams/nope/idle-policy", json=body).status_code == 404
    for bad in (
        {**body, "action": "explode"},
        {**body, "window_s": 5},
        {**body, "grace_s": -1},
        {**body, "threshold_pct": 101},
        {**body, "colour": "red"},
    ):
        refused = admin.put(path, json=bad)
        assert refused.status_code == 422, bad
    out = cli(head, "admin", "team", "idle-policy", "green", "--action", "cancel", "--grace", "2m")
    assert out.exit_code == 0, out.stderr
    assert "team green: GPUs at ≤ 5% for 15m are flagged, then cancel after 2m" in out.stdout
    reset = cli(head, "admin", "team", "idle-policy", "green", "--reset")
    assert "(default)" in reset.stdout
    assert IdlePolicyInfo.model_validate(admin.get(path).json()).default is True
    # A team deleted takes its policy along: made again, it starts on the default.
    assert admin.put(path, json=body).status_code == 200
    assert admin.delete("/v1/teams/green").status_code == 204
    assert admin.get(path).status_code == 404
    admin.put("/v1/teams/green", json={"name": "green"}).raise_for_status()
    assert IdlePolicyInfo.model_validate(admin.get(path).json()).default is True


def test_idle_gpu_lists_respect_who_may_see_the_job(head: HeadProc) -> None:
    erin = _user(head, "erin", ["gold"])
    fred = _user(head, "fred", ["gold"])
    job = head.client(erin).post("/v1/jobs", json={**JOB, "team": "gold"}).json()["job_ids"][0]
    mine = head.client(erin).get(f"/v1/jobs/{job}/idle-gpus")
    assert mine.status_code == 200 and IdleGpuList.model_validate(mine.json()).gpus == []
    assert head.client(fred).get(f"/v1/jobs/{job}/idle-gpus").status_code == 403
    assert head.client().get("/v1/jobs/2147483647/idle-gpus").status_code == 404
    assert head.client(fred).get("/v1/idle-gpus").json() == {"gpus": []}
    assert httpx.get(head.url + "/v1/idle-gpus").status_code == 401
    assert httpx.get(head.url + "/v1/reports/usage").status_code == 401
    listed = cli(head, "idle", token=erin)
    assert listed.exit_code == 0 and "no idle GPUs" in listed.stderr
    head.client(erin).post(f"/v1/jobs/{job}/cancel")


# ---------------------------------------------------------------------------- the rollup
@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    if request.param == "postgresql":
        pg: PostgresServer = request.getfixturevalue("postgres")
        url = pg.new_database("usage_rollup")
    else:
        url = f"sqlite:///{tmp_path / 'x.db'}"
    e = db.make_engine(url)
    upgrade(e)
    yield e
    e.dispose()


def _at(text: str) -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()


def _job(conn: sa.Connection, job_id: int, user: str, team: str, gpus: int) -> None:
    spec = {"command": ["x"], "workdir": "/w", "nodes": 1, "gpus_per_node": gpus}
    conn.execute(
        sa.insert(db.jobs).values(
            id=job_id,
            name="j",
            user=user,
            team=team,
            qos="normal",
            priority=0,
            state="PD",
            spec_json=json.dumps(spec),
            submit_time=0.0,
        )
    )


def _move(conn: sa.Connection, t: str, job_id: int, was: str, to: str, message: str = "") -> None:
    conn.execute(
        sa.insert(db.events).values(
            time=_at(t), job_id=job_id, kind="k", message=message, from_state=was, to_state=to
        )
    )


def test_the_rollup_replays_the_event_log_and_resumes_after_a_restart(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        _job(conn, 1, "ann", "red", 8)
        _job(conn, 2, "bob", "blue", 2)
        _move(conn, "2026-03-31 22:00", 1, "PD", "R")
        _move(conn, "2026-04-01 02:00", 1, "R", "CG")
        _move(conn, "2026-04-01 02:00", 1, "CG", "F")
        _move(conn, "2026-04-01 10:00", 2, "PD", "R")
        _move(conn, "2026-04-01 11:00", 2, "R", "PR", "preempted for job 9")
        _move(conn, "2026-04-01 11:30", 2, "PR", "CG")
        _move(conn, "2026-04-01 11:30", 2, "CG", "PD")
        _move(conn, "2026-04-01 12:00", 2, "PD", "R")
    rollup = Rollup(engine)
    rollup.load()
    sums = {("2026-04-01", "bob", "blue", "normal"): [1800.0, 600.0]}
    assert rollup.flush(_at("2026-04-01 13:00"), sums) == 8
    # Another head (a restart) carries on from the cursor: job 2 still runs.
    again = Rollup(engine)
    again.load()
    with engine.begin() as conn:
        _move(conn, "2026-04-02 12:00", 2, "R", "CG")
        _move(conn, "2026-04-02 12:00", 2, "CG", "CD")
    assert again.flush(_at("2026-04-03 00:00"), {}) == 2
    with engine.connect() as conn:
        days = report(conn, "user", "day", "2026-03-01", "2026-05-01", None)
        months = report(conn, "team", "month", "2026-03-01", "2026-05-01", None)
        anns = report(conn, "user", "day", "2026-03-01", "2026-05-01", Scope("ann", frozenset()))
        # An admin's report reads the one-dimension rows; a team admin of every team reads
        # the full rows: the same numbers.
        everyone = Scope("nobody", frozenset({"red", "blue"}))
        for by in ("user", "team", "qos"):
            for per in ("day", "month"):
                whole = report(conn, by, per, "2026-03-01", "2026-05-01", None)
                scoped = report(conn, by, per, "2026-03-01", "2026-05-01", everyone)
                assert whole == scoped, (by, per)
    got = {(r["period"], r["key"]): r for r in days}
    assert sorted(got) == [
        ("2026-03-31", "ann"),
        ("2026-04-01", "ann"),
        ("2026-04-01", "bob"),
        ("2026-04-02", "bob"),
    ]
    assert got[("2026-03-31", "ann")]["alloc_gpu_hours"] == 16.0  # 8 GPUs × 2 h before midnight
    assert got[("2026-04-01", "ann")]["alloc_gpu_hours"] == 16.0
    assert (got[("2026-04-01", "ann")]["jobs"], got[("2026-04-01", "ann")]["failures"]) == (1, 1)
    bob1 = got[("2026-04-01", "bob")]
    # 10:00–11:30 and 12:00–24:00 on 2 GPUs; the samples' sums as given.
    assert bob1["alloc_gpu_hours"] == 2 * (1.5 + 12.0)
    assert (bob1["util_gpu_hours"], bob1["idle_gpu_hours"]) == (0.5, 600 / 3600)
    assert bob1["utilization_pct"] == pytest.approx(100 * 0.5 / 27.0)
    assert (bob1["preemptions"], bob1["jobs"]) == (1, 0)
    bob2 = got[("2026-04-02", "bob")]
    assert (bob2["alloc_gpu_hours"], bob2["jobs"], bob2["failures"]) == (24.0, 1, 0)
    assert [(r["period"], r["key"], r["alloc_gpu_hours"]) for r in months] == [
        ("2026-03", "red", 16.0),
        ("2026-04", "blue", 51.0),
        ("2026-04", "red", 16.0),
    ]
    assert {r["key"] for r in anns} == {"ann"}
