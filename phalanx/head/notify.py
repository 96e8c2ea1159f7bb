"""Job notifications (Slurm's --mail-type, as webhooks): which state moves a job asked to
hear of, POSTed as JSON after they are committed, off the control thread, bounded, and
only to the URLs the head's admin allows (docs/control-plane.md#job-notifications)."""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import httpx

from phalanx.api import models as m
from phalanx.api import version
from phalanx.core import JobState, JobTransition
from phalanx.head.mirror import Settings, Tx
from phalanx.head.records import JobRecord

log = logging.getLogger("phalanx.head")

# Who may be posted to when the admin says nothing (`phalanx head --notify-allow`): this
# machine only. A notification is the head's request from inside the cluster's network,
# to a URL a user chose; anything else (a chat gateway, a CI hook) the admin names.
DEFAULT_ALLOW: tuple[str, ...] = Settings().notify_allow  # 127.0.0.1, localhost, [::1]
NOTHING = "none"  # `--notify-allow none`: no notifications at all

TIMEOUT_S = 5.0  # per POST: connect, send, answer
TRIES = 4  # a delivery is tried this often (5xx, 408, 429 or no answer), then dropped
BACKOFF_S = 1.0  # before the 2nd try; doubled before each next one
MAX_QUEUE = 10_000  # deliveries waiting; past it new ones are dropped (counted)
WORKERS = 4  # POSTs in flight at once: one slow receiver does not hold up the others
_RETRY_STATUS = frozenset({408, 429})
_FAILED_ENDS = frozenset(
    {JobState.FAILED, JobState.TIMEOUT, JobState.NODE_FAIL, JobState.OUT_OF_MEMORY}
)


@dataclass(frozen=True, slots=True)
class AllowRule:
    """One `--notify-allow` entry: a host (any http(s) URL to it), or a URL prefix whose
    scheme, host, port and leading path segments a URL must match."""

    host: str  # lower case; an IPv6 address without brackets
    scheme: str | None = None  # None: http or https
    port: int | None = None  # None: any (a bare host) or the scheme's default (a URL)
    path: str = ""  # a prefix of whole segments ("" or "/hooks")

    def matches(self, url: httpx.URL) -> bool:
        if url.host != self.host or (self.scheme is not None and url.scheme != self.scheme):
            return False
        if self.scheme is not None and _port(url) != (self.port or _DEFAULT_PORT[self.scheme]):
            return False
        if not self.path:
            return True
        path = url.path
        return path == self.path or path.startswith(self.path.rstrip("/") + "/")


_DEFAULT_PORT = {"http": 80, "https": 443}


def _port(url: httpx.URL) -> int:
    return url.port or _DEFAULT_PORT.get(url.scheme, 0)


@functools.lru_cache(maxsize=8)
def parse_allow(entries: tuple[str, ...]) -> tuple[AllowRule, ...]:
    """The rules of `--notify-allow` entries (`none` alone: no rule). ValueError names a
    malformed entry."""
    if tuple(e.strip().lower() for e in entries) == (NOTHING,):
        return ()
    rules = []
    for entry in entries:
        text = entry.strip()
        if "://" not in text:
            bracketed = text.startswith("[") and text.endswith("]")  # an IPv6 address
            try:
                host = httpx.URL(f"http://{text}/").host
            except httpx.InvalidURL:
                host = ""
            if not host or any(c in text for c in "/?#@") or (":" in text and not bracketed):
                raise ValueError(
                    f"--notify-allow {entry!r}: give a host name or address "
                    "(hooks.example.com, 10.0.0.5, [::1]) or a URL prefix "
                    "(https://hooks.example.com/phalanx)"
                )
            rules.append(AllowRule(host=host))
            continue
        try:
            url = httpx.URL(text)
        except httpx.InvalidURL as e:
            raise ValueError(f"--notify-allow {entry!r}: not a URL ({e})") from None
        if url.scheme not in _DEFAULT_PORT or not url.host or url.query or url.fragment:
            raise ValueError(
                f"--notify-allow {entry!r}: a URL prefix is http(s)://HOST[:PORT][/PATH], "
                "without query or fragment"
            )
        path = "" if url.path in ("", "/") else url.path
        rules.append(AllowRule(host=url.host, scheme=url.scheme, port=url.port, path=path))
    return tuple(rules)


def refusal(allow: Sequence[str], url: str) -> str | None:
    """Why the head will not post to `url` (None: it will). The URL is parsed as the head
    will send it (httpx), so what is checked is where the request goes."""
    rules = parse_allow(tuple(allow))
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as e:
        return f"notify_url {url!r} is not a valid URL: {e}"
    if parsed.scheme not in _DEFAULT_PORT or not parsed.host:
        return f"notify_url {url!r} must be an http(s) URL with a host"
    if not rules:
        return "this head posts no job notifications (its admin allows none: --notify-allow)"
    if any(rule.matches(parsed) for rule in rules):
        return None
    allowed = ", ".join(allow)
    return (
        f"the head may not post notifications to {url!r} (allowed: {allowed}); an admin "
        "adds hosts or URL prefixes with `phalanx head --notify-allow`"
    )


def event_of(move: JobTransition) -> m.NotifyEvent | None:
    """The notification a job's move is (None: one nobody asks for, like R → CG)."""
    to = move.to_state
    if to is JobState.RUNNING and move.from_state is JobState.PENDING:
        return "BEGIN"
    if to is JobState.PENDING:
        return "REQUEUE"
    if to.terminal:
        return "FAIL" if to in _FAILED_ENDS else "END"
    return None


def wanted(spec: m.JobSpec, event: m.NotifyEvent) -> bool:
    """Whether the job asked for `event`: END (the default) covers every end, FAIL too."""
    chosen = spec.notify_on if spec.notify_on is not None else ["END"]
    return event in chosen or (event == "FAIL" and "END" in chosen)


def payload(move: JobTransition, rec: JobRecord, event: m.NotifyEvent) -> bytes:
    """The JSON body posted for `move` of job `rec` (as it is after the commit)."""
    ended = move.to_state.terminal
    return (
        m.JobNotification(
            event=event,
            job_id=rec.id,
            name=rec.name,
            user=rec.user,
            team=rec.team,
            state=move.to_state.value,  # JobState's values are the wire codes
            exit_code=rec.exit_code if ended else None,
            reason=rec.reason if event != "BEGIN" else None,
            message=move.reason,
            epoch=move.epoch,
            restart_count=rec.restart_count,
            time=move.time,
            array_job_id=rec.array_job_id,
            array_task_id=rec.array_task_id,
        )
        .model_dump_json()
        .encode()
    )


@dataclass(frozen=True, slots=True)
class Delivery:
    job_id: int
    event: str
    url: str
    body: bytes


class Notifier:
    """Posts the notifications of committed transactions (`collect`, the control thread's
    after-commit hook: it only queues) from worker threads: each POST bounded by a timeout,
    retried with backoff, the queue capped; a failure is logged and counted, never raised."""

    def __init__(
        self,
        allow: Sequence[str] = DEFAULT_ALLOW,
        *,
        timeout_s: float = TIMEOUT_S,
        tries: int = TRIES,
        backoff_s: float = BACKOFF_S,
        max_queue: int = MAX_QUEUE,
        workers: int = WORKERS,
        verify: bool | str = True,
    ) -> None:
        self.allow = tuple(allow)
        parse_allow(self.allow)  # a bad entry fails here, at start, not at the first job
        self.tries = max(1, tries)
        self.backoff_s = backoff_s
        self._queue: queue.Queue[Delivery | None] = queue.Queue(maxsize=max_queue)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.sent = self.failed = self.dropped = 0
        self._client = httpx.Client(
            timeout=timeout_s, follow_redirects=False, verify=verify, headers=version.headers()
        )
        self._threads = [
            threading.Thread(target=self._work, name=f"phalanx-notify-{i}", daemon=True)
            for i in range(max(1, workers))
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the workers (what is still queued is dropped, and said so)."""
        self._stop.set()
        for _ in self._threads:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                break
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            if t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))
        left = self._queue.qsize()
        if left:
            log.warning("notifications: %d not delivered: the head is stopping", left)
        self._client.close()

    def counts(self) -> m.NotifyCounts:
        with self._lock:
            return m.NotifyCounts(
                sent=self.sent,
                failed=self.failed,
                dropped=self.dropped,
                queued=self._queue.qsize(),
            )

    # ------------------------------------------------------------------ control thread
    def collect(self, tx: Tx) -> None:
        """After `tx` committed: queue a delivery for each move a job asked to hear of.
        Runs on the control thread: builds the bodies (the records change after it
        returns) and never blocks: a full queue drops the delivery, counted."""
        for move in tx.moves:
            if not isinstance(move, JobTransition):
                continue
            rec = tx.moved_jobs.get(move.job_id)
            if rec is None or rec.spec.notify_url is None:
                continue
            event = event_of(move)
            if event is None or not wanted(rec.spec, event):
                continue
            self._enqueue(Delivery(rec.id, event, rec.spec.notify_url, payload(move, rec, event)))

    def _enqueue(self, d: Delivery) -> None:
        try:
            self._queue.put_nowait(d)
        except queue.Full:
            with self._lock:
                self.dropped += 1
            log.warning("notification %s of job %d dropped: the queue is full", d.event, d.job_id)

    # ------------------------------------------------------------------ workers
    def _work(self) -> None:
        while not self._stop.is_set():
            d = self._queue.get()
            if d is None:
                return
            try:
                ok = self._deliver(d)
            except Exception:  # a bug here must not end the worker
                log.exception("notification %s of job %d: unexpected error", d.event, d.job_id)
                ok = False
            with self._lock:
                if ok:
                    self.sent += 1
                else:
                    self.failed += 1

    def _deliver(self, d: Delivery) -> bool:
        """POST one notification, retrying what a retry may fix; whether it got a 2xx."""
        problem = refusal(self.allow, d.url)
        if problem is not None:  # allowed when submitted, not by this head's settings
            log.warning("notification %s of job %d not sent: %s", d.event, d.job_id, problem)
            return False
        delay = self.backoff_s
        why = ""
        for attempt in range(1, self.tries + 1):
            try:
                r = self._client.post(
                    d.url, content=d.body, headers={"Content-Type": "application/json"}
                )
            except httpx.HTTPError as e:
                why = f"{type(e).__name__}: {e}"
            else:
                if r.is_success:
                    return True
                why = f"HTTP {r.status_code}"
                if r.status_code < 500 and r.status_code not in _RETRY_STATUS:
                    break  # the receiver refused it: the same body would be refused again
            if attempt < self.tries and self._stop.wait(delay):
                break  # stopping: no more tries
            delay *= 2
        log.warning(
            "notification %s of job %d to %s failed: %s",
            d.event,
            d.job_id,
            _shown(d.url),
            why,
        )
        return False


def _shown(url: str) -> str:
    """A URL for the head's log: scheme, host and port only (the path or a user:password
    part may be a secret, as in chat webhooks)."""
    try:
        u = httpx.URL(url)
    except httpx.InvalidURL:
        return "(invalid URL)"
    port = f":{u.port}" if u.port else ""
    return f"{u.scheme}://{u.host}{port}/…"


def allow_entries(values: Iterable[str]) -> tuple[str, ...]:
    """`--notify-allow` values as the head keeps them (checked: ValueError)."""
    entries = tuple(v.strip() for v in values if v.strip())
    parse_allow(entries)
    return entries
