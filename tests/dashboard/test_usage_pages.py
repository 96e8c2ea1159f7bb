"""The dashboard's accounting and idle-GPU pages over plain HTTP against a real head process
(SQLite and PostgreSQL): what each viewer sees (the REST API's rules), the CSV download,
and bad input (a clear 4xx, never a 500). Flagged GPUs on a real cluster: test_browser.py."""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from phalanx.api.models import JobSpec, TeamSpec, UserCreate
from phalanx.api.usage import IdlePolicySpec
from phalanx.client.api import PhalanxClient
from tests.dashboard.test_http import browser
from tests.head.conftest import HeadProc, module_head

ROW = re.compile(r'<tr data-key="([^"]*)" data-period="([^"]*)">')


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def head(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HeadProc]:
    """A head without nodes: jobs stay queued until cancelled, and count as ended then."""
    yield from module_head(request, tmp_path_factory, "dashusage")


@dataclass(frozen=True)
class Crowd:
    """Two users in two teams, the team admin of the first, and each one's token."""

    alice: str  # team red
    bob: str  # team blue
    carol: str  # admin of team red, member of none
    red: str
    blue: str
    tokens: dict[str, str]


@pytest.fixture(scope="module")
def crowd(head: HeadProc) -> Crowd:
    """…each with one job submitted and cancelled (an ended job in this month's report),
    and team red on its own idle policy."""
    s = uuid.uuid4().hex[:6]
    red, blue = f"red_{s}", f"blue_{s}"
    alice, bob, carol = f"alice_{s}", f"bob_{s}", f"carol_{s}"
    with PhalanxClient(head.url, head.admin_token) as api:
        api.set_team(TeamSpec(name=red))
        api.set_team(TeamSpec(name=blue))
        api.create_user(UserCreate(name=alice, teams=[red]))
        api.create_user(UserCreate(name=bob, teams=[blue]))
        api.create_user(UserCreate(name=carol, team_admin_of=[red]))
        api.set_idle_policy(red, IdlePolicySpec(action="preempt", window_s=600, grace_s=120))
        tokens = {who: api.create_token(who).token for who in (alice, bob, carol)}
    for who, team in ((alice, red), (bob, blue)):
        with PhalanxClient(head.url, tokens[who]) as api:
            spec = JobSpec(command=["true"], workdir="/tmp", name=f"acct-{who}", team=team)
            api.cancel(api.submit(spec).job_ids[0])
    return Crowd(alice, bob, carol, red, blue, tokens)


def _rows(text: str) -> set[tuple[str, str]]:
    return set(ROW.findall(text))


def _month(head: HeadProc) -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m")


def test_the_report_defaults_to_this_month_by_team_and_shows_each_viewer_theirs(
    head: HeadProc, crowd: Crowd
) -> None:
    month = _month(head)
    with browser(head, head.admin_token) as admin:
        page = admin.get("/ui/accounting")
        assert page.status_code == 200, page.text
        assert f'value="{month}-01"' in page.text  # the form says what it reports
        rows = _rows(page.text)
        assert {(crowd.red, month), (crowd.blue, month)} <= rows
        row = re.search(rf'<tr data-key="{crowd.red}".*?</tr>', page.text, re.S)
        assert row is not None
        # Allocated, used and idle GPU·h, utilisation, jobs, failures, preemptions.
        cells = re.findall(r'<td class="n">([^<]*)</td>', row.group(0))
        assert cells == ["0.00", "0.00", "0.00", "–", "1", "0", "0"]
        by_user = admin.get("/ui/accounting?by=user&per=day")
        today = dt.datetime.now(dt.UTC).date().isoformat()
        assert {(crowd.alice, today), (crowd.bob, today)} <= _rows(by_user.text)
    with browser(head, crowd.tokens[crowd.alice]) as alice:
        page = alice.get("/ui/accounting?by=user")
        assert page.status_code == 200
        assert _rows(page.text) == {(crowd.alice, month)}  # her own only
        assert crowd.bob not in page.text
        teams = alice.get("/ui/accounting")
        assert _rows(teams.text) == {(crowd.red, month)}
    with browser(head, crowd.tokens[crowd.carol]) as carol:  # red's admin: red's rows
        page = carol.get("/ui/accounting?by=user")
        assert _rows(page.text) == {(crowd.alice, month)}
    with browser(head, crowd.tokens[crowd.bob]) as bob:
        page = bob.get("/ui/accounting?by=team")
        assert _rows(page.text) == {(crowd.blue, month)}


def test_the_csv_download_is_the_rest_reports_csv(head: HeadProc, crowd: Crowd) -> None:
    query = "by=user&per=day"
    with browser(head, crowd.tokens[crowd.carol]) as carol:
        page = carol.get(f"/ui/accounting?{query}")
        link = re.search(r'<a href="([^"]+)" id="csv"', page.text)
        assert link is not None
        got = carol.get(link.group(1).replace("&amp;", "&"))
    assert got.status_code == 200
    assert got.headers["content-type"].startswith("text/csv")
    assert got.headers["content-disposition"].startswith("attachment; filename=")
    since = re.search(r'name="since" value="([\d-]+)"', page.text)
    until = re.search(r'name="until" value="([\d-]+)"', page.text)
    assert since is not None and until is not None
    with httpx.Client(base_url=head.url, timeout=30) as rest:
        auth = {"Authorization": f"Bearer {crowd.tokens[crowd.carol]}"}
        params = {"by": "user", "per": "day", "format": "csv"}
        params.update(since=since.group(1), until=until.group(1))
        expected = rest.get("/v1/reports/usage", params=params, headers=auth)
    assert expected.status_code == 200
    assert got.text == expected.text
    table = list(csv.reader(io.StringIO(got.text)))
    assert table[0][:2] == ["period", "user"]
    assert {r[1] for r in table[1:]} == {crowd.alice}


def test_bad_report_ranges_are_explained_on_the_page(head: HeadProc, crowd: Crowd) -> None:
    with browser(head, crowd.tokens[crowd.alice]) as alice:
        for query, says in (
            ("since=2026-03-01&until=2026-02-01", "must be before until"),
            ("since=2026-02-30", "is not a day"),
            ("since=1990-01-01&until=2026-01-01", "at most 3700 days"),
        ):
            r = alice.get(f"/ui/accounting?{query}")
            assert r.status_code == 422, query
            error = re.search(r'id="report-error">([^<]*)<', r.text)
            assert error is not None and says in error.group(1), (query, r.text[:500])
            assert 'id="report-form"' in r.text  # the form, to fix it
            csv_answer = alice.get(f"/ui/accounting.csv?{query}")
            assert csv_answer.status_code == 422, query


@pytest.mark.parametrize(
    "path",
    [
        "/ui/accounting?by=node", "/ui/accounting?per=week", "/ui/accounting?since=yesterday",
        "/ui/accounting?since=2026-1-1", "/ui/accounting?until=2026-01-01%00",
        "/ui/accounting?since=" + "9" * 200, "/ui/accounting?until=20260101",
        "/ui/accounting.csv?by=%27;DROP", "/ui/accounting.csv?per=year",
    ],
)  # fmt: skip
def test_hostile_report_parameters_are_refused(head: HeadProc, path: str) -> None:
    with browser(head, head.admin_token) as admin:
        r = admin.get(path)
        assert r.status_code in (400, 422), (path, r.status_code, r.text[:300])


def test_the_idle_page_shows_the_policies_of_the_viewers_teams(
    head: HeadProc, crowd: Crowd
) -> None:
    with browser(head, head.admin_token) as admin:
        page = admin.get("/ui/idle")
        assert page.status_code == 200
        assert f'id="policy-{crowd.red}"' in page.text and f'id="policy-{crowd.blue}"' in page.text
        red = re.search(rf'<tr id="policy-{crowd.red}">(.*?)</tr>', page.text, re.S)
        assert red is not None
        assert re.findall(r"<td[^>]*>([^<]*)</td>", red.group(1))[:5] == [
            crowd.red, "1%", "10m00s", "preempt", "2m00s",
        ]  # fmt: skip
        assert "no GPU is flagged idle" in page.text  # no node: nothing allocated
    for who, mine, other in (
        (crowd.alice, crowd.red, crowd.blue),
        (crowd.bob, crowd.blue, crowd.red),
        (crowd.carol, crowd.red, crowd.blue),
    ):
        with browser(head, crowd.tokens[who]) as client:
            page = client.get("/ui/idle")
            assert page.status_code == 200
            assert f'id="policy-{mine}"' in page.text, who
            assert f'id="policy-{other}"' not in page.text, who
            assert "no GPU of yours is flagged idle" in page.text
            with client.stream("GET", "/ui/live/idle") as live:
                lines = live.iter_lines()
                assert next(lines).startswith("retry:")
                assert next(x for x in lines if x.startswith("event:")) == "event: fragment"
                data = []
                for line in lines:  # the fragment: data lines up to a blank one
                    if line == "":
                        break
                    data.append(line)
                fragment = "\n".join(data)
                assert f'id="policy-{mine}"' in fragment and other not in fragment


def test_the_overview_counts_flagged_idle_gpus(head: HeadProc, crowd: Crowd) -> None:
    with browser(head, crowd.tokens[crowd.alice]) as alice:
        page = alice.get("/ui/")
        assert re.search(r'id="gpus-flagged-idle">0<', page.text)
