"""Job notifications (head/notify.py): the real control loop on a fake clock (HeadLoop)
posting to a real HTTP receiver on 127.0.0.1 — what is posted and when (after the commit,
never for a rolled-back batch), that a slow or failing receiver never holds the loop up,
the bounds (retries, queue cap) — and a real head refusing URLs its admin did not allow."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from phalanx.api.models import JobSpec, UserCreate
from phalanx.head import lifecycle
from phalanx.head.control import HeadError
from phalanx.head.mirror import Settings, Tx
from phalanx.head.notify import Notifier, parse_allow, refusal
from phalanx.testing.headloop import HeadLoop
from tests.head.conftest import start_head, stop_head
from tests.head.heads import wait_for

SETTINGS = Settings(heartbeat_s=1.0, tick_s=0.5, hang_timeout_s=0.0)


class Receiver:
    """A webhook receiver: records each POST (path, JSON body) and answers `status` (per
    path); a path in `hold` waits until `release()`."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.status: dict[str, int] = {}
        self.hold: set[str] = set()
        self._released = threading.Event()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver._lock:
                    receiver.posts.append((self.path, body))
                if self.path in receiver.hold:
                    receiver._released.wait(30)
                self.send_response(receiver.status.get(self.path, 204))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def release(self) -> None:
        self._released.set()

    def got(self, path: str) -> list[dict[str, Any]]:
        with self._lock:
            return [body for p, body in self.posts if p == path]

    def close(self) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _loop(tmp_path: Path, node: bool = True, **notifier: Any) -> tuple[HeadLoop, Notifier]:
    """A head on a fake clock (with one 8-GPU node, unless not `node`: jobs stay pending)
    whose commits feed a started Notifier."""
    loop = HeadLoop(tmp_path / "head", SETTINGS)
    if node:
        loop.join("n1", gpus=8)
    n = Notifier(("127.0.0.1",), backoff_s=0.01, **notifier)
    n.start()
    loop.control.on_moves = n.collect
    return loop, n


def _settled(n: Notifier, total: int) -> None:
    """Wait until `total` deliveries have been posted or given up."""

    def done() -> bool:
        c = n.counts()
        return c.sent + c.failed + c.dropped >= total and c.queued == 0

    wait_for(f"{total} notifications", done)


def test_each_event_a_job_asked_for_is_posted(tmp_path: Path, receiver: Receiver) -> None:
    loop, n = _loop(tmp_path)
    url = receiver.url
    everything = loop.submit(notify_url=f"{url}/all", notify_on=["BEGIN", "END", "FAIL", "REQUEUE"])
    fails = loop.submit(notify_url=f"{url}/default")  # END, the default, covers failures
    requeued = loop.submit(notify_url=f"{url}/requeue", notify_on=["REQUEUE"])
    ok_but_fail_only = loop.submit(notify_url=f"{url}/fail-only", notify_on=["FAIL"])
    silent = loop.submit(notify_url=f"{url}/none", notify_on=[])
    loop.advance(2)
    for job in (everything, ok_but_fail_only, silent):
        loop.exit(job, 0)
    loop.exit(fails, 0, code=1)
    loop.exit(requeued, 0, code=75)  # asks to be requeued: it runs again
    loop.advance(3)
    assert loop.state(requeued) == "R"
    loop.exit(requeued, 0)
    loop.advance(3)
    _settled(n, 4)
    n.stop()
    begin, end = receiver.got("/all")
    assert (begin["event"], begin["state"], begin["exit_code"]) == ("BEGIN", "R", None)
    assert (end["event"], end["state"], end["exit_code"]) == ("END", "CD", "0:0")
    assert (end["job_id"], end["user"], end["team"], end["epoch"]) == (
        everything,
        "alice",
        "default",
        1,
    )
    [failed] = receiver.got("/default")
    assert (failed["event"], failed["state"], failed["exit_code"]) == ("FAIL", "F", "1:0")
    [again] = receiver.got("/requeue")
    assert (again["event"], again["state"], again["restart_count"]) == ("REQUEUE", "PD", 1)
    assert receiver.got("/fail-only") == [] and receiver.got("/none") == []
    assert n.counts().sent == 4 and n.counts().failed == 0


def test_a_rolled_back_batch_posts_nothing(tmp_path: Path, receiver: Receiver) -> None:
    loop, n = _loop(tmp_path, node=False)
    job = loop.submit(notify_url=f"{receiver.url}/x")  # no node: it stays PD

    def cancel_then_fail(tx: Tx) -> None:
        lifecycle.cancel(loop.mirror, tx, loop.mirror.jobs[job], tx.now, "alice")
        raise RuntimeError("a bug after the move: the batch is rolled back")

    with pytest.raises(HeadError):
        loop.op(cancel_then_fail)
    assert loop.state(job) == "PD"
    loop.cancel(job)  # this one commits: its END is the only post
    _settled(n, 1)
    n.stop()
    [ended] = receiver.got("/x")
    assert (ended["event"], ended["state"]) == ("END", "CA")


def test_a_receiver_that_hangs_never_holds_up_the_control_loop(
    tmp_path: Path, receiver: Receiver
) -> None:
    loop, n = _loop(tmp_path, workers=1)
    receiver.hold.add("/slow")
    job = loop.submit(notify_url=f"{receiver.url}/slow", notify_on=["BEGIN", "END"])
    loop.advance(2)
    wait_for("the receiver to hold the BEGIN post", lambda: receiver.got("/slow"))
    loop.exit(job, 0)
    loop.advance(3)  # the loop runs on: the job ends while its BEGIN post still hangs
    assert loop.state(job) == "CD"
    assert n.counts().sent == 0 and n.counts().queued == 1  # END waits its turn
    receiver.release()
    _settled(n, 2)
    n.stop()
    assert [p["event"] for p in receiver.got("/slow")] == ["BEGIN", "END"]


def test_a_failing_receiver_is_retried_then_counted(tmp_path: Path, receiver: Receiver) -> None:
    loop, n = _loop(tmp_path, node=False, tries=3)
    receiver.status = {"/busy": 503, "/gone": 404}
    busy = loop.submit(notify_url=f"{receiver.url}/busy")
    gone = loop.submit(notify_url=f"{receiver.url}/gone")
    nobody = loop.submit(notify_url="http://127.0.0.1:9/closed")  # nothing listens there
    loop.cancel(busy)
    loop.cancel(gone)
    loop.cancel(nobody)
    _settled(n, 3)
    n.stop()
    assert len(receiver.got("/busy")) == 3  # 5xx: tried again, up to `tries`
    assert len(receiver.got("/gone")) == 1  # 4xx: the receiver said no; not again
    assert (n.counts().sent, n.counts().failed) == (0, 3)
    assert loop.control.loop_errors == 0


def test_the_queue_is_capped(tmp_path: Path, receiver: Receiver) -> None:
    loop, n = _loop(tmp_path, node=False, workers=1, max_queue=1)
    receiver.hold.add("/held")
    jobs = [loop.submit(notify_url=f"{receiver.url}/held") for _ in range(3)]
    loop.cancel(jobs[0])
    wait_for("the first post to be in flight", lambda: receiver.got("/held"))

    def cancel_both(tx: Tx) -> None:  # one commit, two moves: one queued, one dropped
        for j in jobs[1:]:
            lifecycle.cancel(loop.mirror, tx, loop.mirror.jobs[j], tx.now, "alice")

    loop.op(cancel_both)
    assert (n.counts().queued, n.counts().dropped) == (1, 1)
    receiver.release()
    _settled(n, 3)
    n.stop()
    assert (n.counts().sent, n.counts().dropped) == (2, 1)


@pytest.mark.parametrize(
    ("allow", "url", "allowed"),
    [
        (("127.0.0.1",), "http://127.0.0.1:8080/hook", True),
        (("127.0.0.1",), "https://127.0.0.1/hook", True),
        (("127.0.0.1",), "http://127.0.0.1.evil.example/hook", False),
        (("127.0.0.1",), "http://127.0.0.1@evil.example/", False),  # user info, not the host
        (("127.0.0.1",), "http://evil.example#@127.0.0.1", False),
        (("127.0.0.1",), "http://10.0.0.1/", False),
        (("127.0.0.1",), "http://169.254.169.254/latest/meta-data", False),
        (("[::1]",), "http://[::1]:9/x", True),
        (("localhost",), "http://LOCALHOST/x", True),
        (("https://hooks.example/phx",), "https://hooks.example/phx/job", True),
        (("https://hooks.example/phx",), "https://hooks.example/phx", True),
        (("https://hooks.example/phx",), "https://hooks.example/phxother", False),
        (("https://hooks.example/phx",), "https://hooks.example/phx/../admin", False),
        (("https://hooks.example/phx",), "http://hooks.example/phx/job", False),
        (("https://hooks.example/phx",), "https://hooks.example:8443/phx/job", False),
        (("http://10.0.0.5:8080",), "http://10.0.0.5:8080/anything", True),
        (("http://10.0.0.5:8080",), "http://10.0.0.5/anything", False),
        (("none",), "http://127.0.0.1/x", False),
    ],
)
def test_only_urls_the_admin_allows(allow: tuple[str, ...], url: str, allowed: bool) -> None:
    assert (refusal(allow, url) is None) == allowed, refusal(allow, url)


@pytest.mark.parametrize("entry", ["a:80", "http://x/?q=1", "ftp://x", "a/b", "user@host", ""])
def test_a_malformed_allow_entry_is_refused(entry: str) -> None:
    with pytest.raises(ValueError, match="--notify-allow"):
        parse_allow((entry,))


def test_a_head_refuses_urls_its_admin_did_not_allow(tmp_path: Path) -> None:
    head = start_head(tmp_path / "head", None, "notify_allow=('hooks.example',)")
    try:
        admin = head.client()
        spec = JobSpec(command=["true"], workdir="/tmp", env={"K": "v"})
        refused = admin.post(
            "/v1/jobs", json={**spec.model_dump(), "notify_url": "http://127.0.0.1:9/x"}
        )
        assert refused.status_code == 422
        assert "may not post notifications to 'http://127.0.0.1:9/x'" in refused.json()["detail"]
        good = {
            **spec.model_dump(),
            "notify_url": "https://hooks.example/k3y",
            "notify_on": ["END"],
        }
        r = admin.post("/v1/jobs", json=good)
        assert r.status_code == 201, r.text
        job_id = r.json()["job_ids"][0]
        # A teammate sees the job, not its webhook (a chat hook's URL is its key).
        assert (
            admin.post(
                "/v1/users", json=UserCreate(name="bob", teams=["default"]).model_dump()
            ).status_code
            == 201
        )
        bob_token = admin.post("/v1/tokens", json={"user": "bob"}).json()["token"]
        seen = head.client(bob_token).get(f"/v1/jobs/{job_id}").json()
        assert seen["spec"]["notify_url"] is None and seen["env_hidden"]
        assert admin.get(f"/v1/jobs/{job_id}").json()["spec"]["notify_url"] == good["notify_url"]
        health = httpx.get(head.url + "/healthz").json()
        assert health["notifications"] == {"sent": 0, "failed": 0, "dropped": 0, "queued": 0}
    finally:
        stop_head(head.proc)


def test_submit_in_the_loop_checks_the_allow_list(tmp_path: Path) -> None:
    loop = HeadLoop(tmp_path / "head", Settings(notify_allow=("none",)))
    with pytest.raises(HeadError, match="posts no job notifications"):
        loop.submit(notify_url="http://127.0.0.1/x")
