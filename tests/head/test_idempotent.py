"""Idempotent submits against a real head: one key, one job — across users, ends, restarts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from phalanx.api.models import ArraySpec, JobSpec, UserCreate
from phalanx.client.api import PhalanxClient
from phalanx.head import db
from phalanx.testing.postgres import PostgresServer
from tests.head.heads import HeadServer, wait_for

JOB = {"command": ["true"], "workdir": "/tmp"}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def head(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HeadServer]:
    db_url = None
    if request.param == "postgresql":
        pg: PostgresServer = request.getfixturevalue("postgres")
        db_url = pg.new_database("idempotent")
    server = HeadServer(tmp_path_factory.mktemp("idem") / "head", db_url).start()
    try:
        server.wait_role("leader")
        yield server
    finally:
        server.stop()


def _http(head: HeadServer, token: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token or head.admin_token}"}
    return httpx.Client(base_url=head.url, headers=headers, timeout=30)


def _post(client: httpx.Client, key: str, **fields: object) -> httpx.Response:
    return client.post(
        "/v1/jobs", json={**JOB, **fields}, headers={b"Idempotency-Key": key.encode()}
    )


def _rows(head: HeadServer, name: str) -> list[tuple[int, str | None]]:
    """(id, client_token) of every job named `name`, straight from the database."""
    engine = db.make_engine(head.db_url or db.default_url(head.state_dir))
    try:
        with engine.connect() as conn:
            query = select(db.jobs.c.id, db.jobs.c.client_token).where(db.jobs.c.name == name)
            return [(r.id, r.client_token) for r in conn.execute(query.order_by(db.jobs.c.id))]
    finally:
        engine.dispose()


def test_the_same_key_twice_gives_the_same_job(head: HeadServer) -> None:
    with _http(head) as admin:
        first = _post(admin, "same-1", name="same-1")
        assert first.status_code == 201, first.text
        again = _post(admin, "same-1", name="same-1")
        assert again.status_code == 200, again.text
        assert again.json() == first.json()
        # A repeat is answered by its key alone (the spec of a repeat is not looked at).
        other_spec = _post(admin, "same-1", name="other-spec", command=["false"])
        assert other_spec.status_code == 200 and other_spec.json() == first.json()
        fresh = _post(admin, "same-2", name="same-1")
        assert fresh.status_code == 201 and fresh.json()["job_ids"] != first.json()["job_ids"]
    (job_id,) = first.json()["job_ids"]
    assert _rows(head, "same-1") == [(job_id, "same-1"), (job_id + 1, "same-2")]
    assert _rows(head, "other-spec") == []


def test_an_array_keeps_its_key_on_its_first_task(head: HeadServer) -> None:
    with _http(head) as admin:
        first = _post(admin, "array-1", name="arr", array={"indices": [0, 1, 2]})
        assert first.status_code == 201, first.text
        again = _post(admin, "array-1", name="arr", array={"indices": [0, 1, 2]})
        assert again.status_code == 200 and again.json() == first.json()
    ids = first.json()["job_ids"]
    assert len(ids) == 3 and first.json()["array_job_id"] == ids[0]
    assert _rows(head, "arr") == [(ids[0], "array-1"), (ids[1], None), (ids[2], None)]


def test_keys_belong_to_their_user(head: HeadServer) -> None:
    with head.client() as admin:
        admin.create_user(UserCreate(name="keyuser", teams=["default"]))
        token = admin.create_token("keyuser").token
    with _http(head) as admin_http, _http(head, token) as user_http:
        mine = _post(user_http, "shared-key", name="keys")
        theirs = _post(admin_http, "shared-key", name="keys")
        assert (mine.status_code, theirs.status_code) == (201, 201), (mine.text, theirs.text)
        assert mine.json()["job_ids"] != theirs.json()["job_ids"]
        assert _post(user_http, "shared-key", name="keys").json() == mine.json()
    assert len(_rows(head, "keys")) == 2


@pytest.mark.parametrize("key", ["", "a b", "k" * 129, "\u00e9moji", "semi;colon"])
def test_a_malformed_key_is_refused_and_creates_nothing(head: HeadServer, key: str) -> None:
    with _http(head) as admin:
        r = admin.post(
            "/v1/jobs", json={**JOB, "name": "badkey"}, headers={b"Idempotency-Key": key.encode()}
        )
    assert r.status_code == 422, r.text
    assert "Idempotency-Key must be 1 to 128 characters" in r.json()["detail"]
    assert _rows(head, "badkey") == []


def test_an_ended_job_is_still_found_by_its_key(head: HeadServer) -> None:
    with _http(head) as admin, head.client() as api:
        first = _post(admin, "ended-1", name="ended")
        (job_id,) = first.json()["job_ids"]
        api.cancel(job_id)
        wait_for("the job to end", lambda: api.job(job_id).job.state == "CA")
        again = _post(admin, "ended-1", name="ended")
        assert again.status_code == 200 and again.json() == first.json()
    assert _rows(head, "ended") == [(job_id, "ended-1")]


def test_keys_survive_a_head_crash(head: HeadServer) -> None:
    with _http(head) as admin, head.client() as api:
        live = _post(admin, "crash-live", name="crash").json()
        ended = _post(admin, "crash-ended", name="crash").json()
        api.cancel(ended["job_ids"][0])
        wait_for("the job to end", lambda: api.job(ended["job_ids"][0]).job.state == "CA")
    head.restart()  # SIGKILL: the new head rebuilds its state from the database
    with _http(head) as admin:
        assert _post(admin, "crash-live", name="crash").json() == live
        assert _post(admin, "crash-ended", name="crash").json() == ended
        new = _post(admin, "crash-new", name="crash")
        assert new.status_code == 201
    ids = [live["job_ids"][0], ended["job_ids"][0], new.json()["job_ids"][0]]
    assert [i for i, _ in _rows(head, "crash")] == ids


def test_the_client_sends_one_key_per_submit(head: HeadServer, tmp_path: Path) -> None:
    spec = JobSpec(command=["true"], workdir=str(tmp_path), name="client-keys")
    with PhalanxClient(head.url, head.admin_token) as api:
        keyed = api.submit(spec, idempotency_key="client-key-1")
        assert api.submit(spec, idempotency_key="client-key-1") == keyed
        one, two = api.submit(spec), api.submit(spec)  # a fresh key each: two jobs
        array = api.submit(spec.model_copy(update={"array": ArraySpec(indices=[3, 4])}))
    assert len({keyed.job_ids[0], one.job_ids[0], two.job_ids[0], *array.job_ids}) == 5
    rows = _rows(head, "client-keys")
    assert len(rows) == 5 and sum(1 for _, token in rows if token) == 4


def test_a_job_count_never_grows_from_repeats(head: HeadServer) -> None:
    engine = db.make_engine(head.db_url or db.default_url(head.state_dir))
    try:
        with engine.connect() as conn:
            before = conn.execute(select(func.count()).select_from(db.jobs)).scalar_one()
        with _http(head) as admin:
            answers = {str(_post(admin, "repeat-me", name="rep").json()) for _ in range(20)}
        with engine.connect() as conn:
            after = conn.execute(select(func.count()).select_from(db.jobs)).scalar_one()
    finally:
        engine.dispose()
    assert len(answers) == 1 and after == before + 1
