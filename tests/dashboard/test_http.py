"""The dashboard over plain HTTP against a real head process (SQLite and PostgreSQL): who
may sign in, the session cookie, CSRF, pagination and filters, and hostile input (an
answer in 4xx, never a 500)."""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from phalanx.api.models import JobSpec, TeamSpec, UserCreate
from phalanx.client.api import PhalanxClient
from phalanx.head.dashboard.session import COOKIE
from tests.head.conftest import HeadProc, module_head

VENDOR = Path(__file__).resolve().parents[2] / "phalanx/head/dashboard/static/vendor"
ROW = re.compile(r'id="job-(\d+)"')


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def head(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HeadProc]:
    """A head without nodes: its jobs stay queued until cancelled (then they have ended)."""
    yield from module_head(request, tmp_path_factory, "dash")


@dataclass(frozen=True)
class Pair:
    """Two users of different teams with their tokens, and a team each."""

    alice: str
    bob: str
    alice_token: str
    bob_token: str
    red: str


@pytest.fixture(scope="module")
def pair(head: HeadProc) -> Pair:
    suffix = uuid.uuid4().hex[:6]
    red, blue = f"red_{suffix}", f"blue_{suffix}"
    with PhalanxClient(head.url, head.admin_token) as api:
        api.set_team(TeamSpec(name=red))
        api.set_team(TeamSpec(name=blue))
        api.create_user(UserCreate(name=f"alice_{suffix}", teams=[red]))
        api.create_user(UserCreate(name=f"bob_{suffix}", teams=[blue]))
        return Pair(
            alice=f"alice_{suffix}",
            bob=f"bob_{suffix}",
            alice_token=api.create_token(f"alice_{suffix}").token,
            bob_token=api.create_token(f"bob_{suffix}").token,
            red=red,
        )


@contextmanager
def browser(head: HeadProc, token: str | None = None) -> Iterator[httpx.Client]:
    """A cookie-keeping client, signed in with `token` through the login form."""
    with httpx.Client(base_url=head.url, timeout=30) as client:
        if token is not None:
            r = client.post("/ui/login", data={"token": token, "next": "/ui/"})
            assert r.status_code == 303, r.text
        yield client


def csrf_of(client: httpx.Client) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', client.get("/ui/teams").text)
    assert found is not None
    return found.group(1)


def spec(name: str, **fields: object) -> JobSpec:
    return JobSpec(command=["true"], workdir="/tmp", name=name, **fields)  # type: ignore[arg-type]


def test_every_page_and_stream_needs_a_session(head: HeadProc) -> None:
    with browser(head) as anon:
        for path in (
            "/ui/", "/ui/nodes", "/ui/jobs?scope=ended", "/ui/queue", "/ui/teams",
            "/ui/health", "/ui/accounting", "/ui/idle", "/ui/jobs/1", "/ui/jobs/1/series",
            "/ui/live/overview", "/ui/live/jobs/1/log",
        ):  # fmt: skip
            r = anon.get(path)
            assert r.status_code == 303, path
            assert r.headers["location"].startswith("/ui/login?next=/ui/"), path
        for path in ("/ui/jobs/1/cancel", "/ui/nodes/n1/drain", "/ui/logout"):
            assert anon.post(path, data={"csrf": "0" * 64}).status_code == 401, path
        # A stale or made-up cookie is no session either.
        anon.cookies.set(COOKIE, "phx_made-up", domain="127.0.0.1", path="/ui")
        assert anon.get("/ui/").status_code == 303
        login = anon.get("/ui/login")
        assert login.status_code == 200 and 'name="token"' in login.text


def test_the_session_cookie_is_httponly_strict_and_limited_to_the_dashboard(
    head: HeadProc, pair: Pair
) -> None:
    with browser(head) as client:
        r = client.post("/ui/login", data={"token": pair.alice_token, "next": "/ui/jobs"})
        assert r.status_code == 303 and r.headers["location"] == "/ui/jobs"
        cookie = r.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE}=")
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
        assert "Secure" not in cookie  # plain HTTP here; tests/dashboard/test_browser: TLS
        # The cookie lives no longer than the token: 90 days unless the head says else.
        max_age = int(re.search(r"Max-Age=(\d+)", cookie).group(1))  # type: ignore[union-attr]
        assert 89 * 86400 < max_age <= 90 * 86400
        page = client.get("/ui/jobs")
        assert page.status_code == 200 and pair.alice in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-frame-options"] == "DENY"


def test_only_a_users_api_token_signs_in(head: HeadProc) -> None:
    with browser(head) as client:
        cases = {
            head.join_token: "node or join credential",
            "phx_" + "x" * 43: "unknown or revoked token",
            "x" * 300: "not a Phalanx API token",
            "phx_\x1b[31mred": "not a Phalanx API token",
            "": "not a Phalanx API token",
        }
        for token, says in cases.items():
            r = client.post("/ui/login", data={"token": token})
            assert r.status_code == 401, token
            assert says in r.text, (token, r.text)
            assert COOKIE not in r.headers.get("set-cookie", "")
        json_type = {"content-type": "application/json"}
        as_json = client.post("/ui/login", content=b"{}", headers=json_type)
        assert as_json.status_code == 400
        assert client.post("/ui/login", data={"token": "x" * 20_000}).status_code == 413
        form = {"content-type": "application/x-www-form-urlencoded"}
        bad_utf8 = client.post("/ui/login", content=b"token=%ff\xff", headers=form)
        assert bad_utf8.status_code == 400


def test_after_sign_in_only_our_own_pages_are_a_destination(head: HeadProc, pair: Pair) -> None:
    with browser(head) as client:
        for asked, lands in (
            ("/ui/queue?page=2", "/ui/queue?page=2"),
            ("//evil.example/ui/", "/ui/"),
            ("https://evil.example/", "/ui/"),
            ("/ui/\\evil.example", "/ui/"),
            ("/v1/jobs", "/ui/"),
        ):
            r = client.post("/ui/login", data={"token": pair.alice_token, "next": asked})
            assert r.headers["location"] == lands, asked


def test_state_changing_posts_need_this_sessions_csrf_token_and_our_origin(
    head: HeadProc, pair: Pair
) -> None:
    with PhalanxClient(head.url, pair.alice_token) as api:
        job_id = api.submit(spec("csrf-target")).job_ids[0]
    with browser(head, pair.alice_token) as alice, browser(head, pair.bob_token) as bob:
        token = csrf_of(alice)
        assert token != csrf_of(bob)
        path = f"/ui/jobs/{job_id}/cancel"
        assert alice.post(path).status_code == 403
        assert alice.post(path, data={"csrf": "0" * 64}).status_code == 403
        assert alice.post(path, data={"csrf": csrf_of(bob)}).status_code == 403
        evil = {"origin": "https://evil.example"}
        assert alice.post(path, data={"csrf": token}, headers=evil).status_code == 403
        with PhalanxClient(head.url, pair.alice_token) as api:
            assert api.job(job_id).job.state == "PD"
        # Bob, with his own session's token: not his job (a 403 page, nothing changes).
        assert bob.post(path, data={"csrf": csrf_of(bob)}).status_code == 403
        # The header works as well as the field (what a script would send).
        done = alice.post(path, headers={"x-csrf-token": token})
        assert done.status_code == 303 and done.headers["location"] == f"/ui/jobs/{job_id}"
        with PhalanxClient(head.url, pair.alice_token) as api:
            assert api.job(job_id).job.state == "CA"


def test_admin_actions_are_refused_to_plain_users(head: HeadProc, pair: Pair) -> None:
    with browser(head, pair.bob_token) as bob:
        nodes = bob.get("/ui/nodes")
        assert nodes.status_code == 200 and "Drain" not in nodes.text
        for action in ("drain", "resume"):
            r = bob.post(f"/ui/nodes/n1/{action}", data={"csrf": csrf_of(bob), "reason": "x"})
            assert r.status_code == 403, action
    with browser(head, head.admin_token) as admin:
        r = admin.post("/ui/nodes/no-such-node/drain", data={"csrf": csrf_of(admin)})
        assert r.status_code == 404 and "no node" in r.text
        long = {"csrf": csrf_of(admin), "reason": "r" * 501}
        assert admin.post("/ui/nodes/n1/drain", data=long).status_code == 422


def test_a_revoked_token_ends_the_session_and_sign_out_clears_the_cookie(
    head: HeadProc, pair: Pair
) -> None:
    with PhalanxClient(head.url, pair.alice_token) as api:
        issued = api.create_token(pair.alice, "short-lived")
    with browser(head, issued.token) as client:
        assert client.get("/ui/").status_code == 200
        with client.stream("GET", "/ui/live/jobs") as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("retry:")
            assert next(line for line in lines if line.startswith("event:")) == "event: fragment"
            next(line for line in lines if line == "")  # the page as it was: all of it read
            with PhalanxClient(head.url, pair.alice_token) as api:
                api.revoke_token(issued.id)
                api.submit(spec("a-change"))  # an update the open page would be sent
            rest = "\n".join(lines)  # the stream ends: no update after the revocation
        assert "Your session ended" in rest and "a-change" not in rest
        assert "event: signed-out" in rest
        assert client.get("/ui/").status_code == 303
    with browser(head, pair.alice_token) as client:
        out = client.post("/ui/logout", data={"csrf": csrf_of(client)})
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
        assert f'{COOKIE}=""' in out.headers["set-cookie"]
        assert "Max-Age=0" in out.headers["set-cookie"]
        assert client.get("/ui/").status_code == 303


def test_jobs_are_paginated_and_filtered_on_the_server(head: HeadProc, pair: Pair) -> None:
    tag = uuid.uuid4().hex[:6]
    with PhalanxClient(head.url, pair.alice_token) as api:
        ids = [api.submit(spec(f"pg-{tag}-{i}")).job_ids[0] for i in range(7)]
        for job_id in ids[:5]:
            api.cancel(job_id)
    live, ended = ids[5:], ids[:5]
    with browser(head, pair.alice_token) as alice:
        page = alice.get(f"/ui/jobs?name=pg-{tag}&per=1")
        assert [int(i) for i in ROW.findall(page.text)] == [live[1]]
        assert "page 1 of 2" in page.text
        beyond = alice.get(f"/ui/jobs?name=pg-{tag}&per=1&page=999")  # the last page
        assert [int(i) for i in ROW.findall(beyond.text)] == [live[0]]
        # Ended jobs: newest first, by keyset (`before`), each exactly once.
        seen: list[int] = []
        url = f"/ui/jobs?scope=ended&name=pg-{tag}&per=2"
        while True:
            page = alice.get(url)
            assert page.status_code == 200
            rows = [int(i) for i in ROW.findall(page.text)]
            assert len(rows) <= 2
            seen += rows
            more = re.search(r'href="(/ui/jobs\?[^"]*before=\d+)"', page.text)
            if more is None:
                break
            url = more.group(1).replace("&amp;", "&")
        assert seen == sorted(ended, reverse=True)
        only_ca = alice.get(f"/ui/jobs?scope=ended&name=pg-{tag}&state=CD")
        assert ROW.findall(only_ca.text) == []
        mine = alice.get(f"/ui/jobs?scope=ended&name=pg-{tag}&user={pair.alice}&team={pair.red}")
        assert len(ROW.findall(mine.text)) == 5
        like = alice.get("/ui/jobs?scope=ended&name=%25")  # a LIKE wildcard is a character
        assert like.status_code == 200 and ROW.findall(like.text) == []
    with browser(head, pair.bob_token) as bob:  # another team: sees none of them
        for scope in ("active", "ended"):
            assert ROW.findall(bob.get(f"/ui/jobs?scope={scope}&name=pg-{tag}").text) == []
        assert bob.get(f"/ui/jobs/{ids[0]}").status_code == 403
        assert bob.get(f"/ui/jobs/{ids[0]}/series").status_code == 403
        assert bob.get(f"/ui/live/jobs/{ids[5]}/log").status_code == 403


def test_the_queue_shows_reasons_and_a_begin_times_estimated_start(
    head: HeadProc, pair: Pair
) -> None:
    begin = time.time() + 7200
    with PhalanxClient(head.url, pair.alice_token) as api:
        later = api.submit(spec("later", begin_time=begin)).job_ids[0]
    try:
        with browser(head, pair.alice_token) as alice:
            queue = alice.get("/ui/queue").text
            row = re.search(rf'<tr id="queued-{later}">.*?</tr>', queue, re.S)
            assert row is not None
            stamp = time.strftime("%Y-%m-%d %H:%M", time.gmtime(begin))
            assert stamp in row.group(0)
            assert "no nodes have joined" in queue or "BeginTime" in row.group(0)
            teams = alice.get("/ui/teams").text
            assert f'id="team-{pair.red}"' in teams
    finally:
        with PhalanxClient(head.url, pair.alice_token) as api:
            api.cancel(later)


@pytest.mark.parametrize(
    "path",
    [
        "/ui/jobs?per=0", "/ui/jobs?per=201", "/ui/jobs?page=0", "/ui/jobs?page=-1",
        "/ui/jobs?page=99999999999999999999", "/ui/jobs?before=0", "/ui/jobs?before=2147483648",
        "/ui/jobs?scope=all", "/ui/jobs?state=XX", "/ui/jobs?state=r", "/ui/jobs?user=a%00b",
        "/ui/jobs?user=" + "u" * 129, "/ui/jobs?team=a/b", "/ui/jobs?name=a%00b",
        "/ui/jobs?name=%1b[2J", "/ui/nodes?state=broken", "/ui/nodes?per=1001",
        "/ui/nodes?q=%00", "/ui/health?kind=DROP%20TABLE", "/ui/health?before=abc",
        "/ui/queue?per=100000", "/ui/jobs/0", "/ui/jobs/2147483648", "/ui/jobs/abc",
        "/ui/jobs/1?rank=-1", "/ui/jobs/1?log=secret", "/ui/live/jobs/1/log?rank=99999999",
        "/ui/live/jobs?state=ZZ", "/ui/live/nodes?per=0",
    ],
)  # fmt: skip
def test_hostile_query_parameters_are_refused_never_a_server_error(
    head: HeadProc, path: str
) -> None:
    with browser(head, head.admin_token) as admin:
        r = admin.get(path)
        assert r.status_code in (400, 422), (path, r.status_code, r.text[:300])


def test_unknown_and_gone_objects_are_404s(head: HeadProc) -> None:
    with browser(head, head.admin_token) as admin:
        assert admin.get("/ui/jobs/2147483647").status_code == 404
        assert admin.get("/ui/static/../../etc/passwd").status_code == 404
        assert admin.get("/ui/static/nothing.js").status_code == 404
        assert admin.get("/ui/nodes?state=down&q=zzz").status_code == 200


def test_the_vendored_libraries_are_served_as_pinned(head: HeadProc) -> None:
    """Each file VENDORED.md lists is there, has the sha256 it records, and is what the
    head serves (no CDN: the pages load only these)."""
    table = (VENDOR / "VENDORED.md").read_text()
    pinned = re.findall(r"^\| (\S+) \| \S+ \| [\d.]+ \| [^|]+ \| ([0-9a-f]{64}) \|$", table, re.M)
    assert len(pinned) == 4
    with browser(head) as anon:
        for name, digest in pinned:
            body = (VENDOR / name).read_bytes()
            assert hashlib.sha256(body).hexdigest() == digest, name
            served = anon.get(f"/ui/static/vendor/{name}")
            assert served.status_code == 200 and served.content == body
        for licence in ("htmx.LICENSE", "htmx-ext-sse.LICENSE", "uPlot.LICENSE"):
            assert anon.get(f"/ui/static/vendor/{licence}").status_code == 200
    with browser(head, head.admin_token) as admin:
        page = admin.get("/ui/").text
        assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing from elsewhere
