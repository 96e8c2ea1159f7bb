"""Live updates over Server-Sent Events: "something changed" and the fragments it pushes.

The control thread bumps `ControlThread.changes` after each committed transaction (and a
progress report bumps it too). One watcher task per head polls that counter every
POLL_S (an integer read: no lock, nothing on the control thread's path) and wakes every
open stream; each stream renders its page's fragment for its own viewer and sends it
only if it differs from what that browser already shows. A stream renders at most once
per MIN_GAP_S, so a busy cluster (a heartbeat commit every few milliseconds) costs each
open page a bounded number of renders, and a change is on screen within
POLL_S + MIN_GAP_S + a render: well under the 1 s target.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import HTTPException, Request

from phalanx.head.control import ControlThread
from phalanx.head.dashboard.session import still_signed_in

POLL_S = 0.1
MIN_GAP_S = 0.25
# A stream waits at least this many times its last render before rendering again, so a
# big page (8,000 GPUs) on a busy cluster costs an open browser at most ~1/GAP_FACTOR of
# a core, while a small one still follows within MIN_GAP_S.
GAP_FACTOR = 10
KEEPALIVE_S = 15.0  # a comment line so proxies and browsers keep the stream open
RETRY_MS = 2000  # how soon a browser reconnects a dropped stream
SIGNED_OUT = '<p class="error">Your session ended: <a href="/ui/login">sign in again</a>.</p>'
# Open streams per head (pages and log tails together); past it a new one gets 503 and
# its browser retries RETRY_MS later. Each costs a task and, while it changes, renders.
MAX_STREAMS = 512


class ChangeFeed:
    """Wakes waiters when the control thread's change counter moves."""

    def __init__(self, control: ControlThread) -> None:
        self.control = control
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.waiters = 0
        self.streams = 0  # open SSE streams (admit/leave)

    def admit(self) -> None:
        """503 when MAX_STREAMS are open (a stream counts itself while it runs: `counted`)."""
        if self.streams >= MAX_STREAMS:
            raise HTTPException(
                503,
                f"the head serves {MAX_STREAMS} live views already: try again shortly",
                headers={"Retry-After": "5"},
            )

    async def counted(self, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        """`chunks`, counted among the open streams while they flow."""
        self.streams += 1
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            self.streams -= 1

    @property
    def version(self) -> int:
        return self.control.changes

    def _ensure_watching(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        seen = self.version
        while self.waiters > 0:
            await asyncio.sleep(POLL_S)
            now = self.version
            if now != seen:
                seen = now
                event, self._event = self._event, asyncio.Event()
                event.set()
        self._task = None

    async def wait(self, seen: int, timeout: float) -> bool:
        """Until the version differs from `seen` (True) or `timeout` passes (False)."""
        if self.version != seen:
            return True
        self.waiters += 1
        try:
            self._ensure_watching()
            event = self._event
            try:
                await asyncio.wait_for(event.wait(), timeout)
            except TimeoutError:
                return self.version != seen
            return True
        finally:
            self.waiters -= 1


def message(event: str, data: str) -> str:
    """One SSE message: every line of `data` its own `data:` line."""
    lines = data.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return f"event: {event}\n" + "".join(f"data: {line}\n" for line in lines) + "\n"


async def fragments(
    request: Request,
    feed: ChangeFeed,
    event: str,
    render: Callable[[], Awaitable[str]],
) -> AsyncIterator[str]:
    """The stream of one page's fragment: sent when it changes, at most every MIN_GAP_S."""
    async for chunk in feed.counted(_fragments(request, feed, event, render)):
        yield chunk


async def _fragments(
    request: Request,
    feed: ChangeFeed,
    event: str,
    render: Callable[[], Awaitable[str]],
) -> AsyncIterator[str]:
    yield f"retry: {RETRY_MS}\n\n"
    last_digest = b""
    seen = -1
    while not await request.is_disconnected():
        version = feed.version
        if version != seen:
            if not still_signed_in(request):
                yield message(event, SIGNED_OUT)
                yield message("signed-out", "")
                return
            seen = version
            started = time.perf_counter()
            html = await render()
            took = time.perf_counter() - started
            digest = hashlib.blake2b(html.encode(), digest_size=16).digest()
            if digest != last_digest:
                last_digest = digest
                yield message(event, html)
            await asyncio.sleep(max(MIN_GAP_S, GAP_FACTOR * took))
            continue
        if not await feed.wait(seen, KEEPALIVE_S):
            yield ": keepalive\n\n"


SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
