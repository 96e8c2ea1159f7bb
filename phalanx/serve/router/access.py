"""Who may use the deployment, and how fast: Phalanx tokens checked against the head's
`GET /v1/whoami` (answers cached briefly, keyed by the token's hash: tokens are never kept
or logged in the clear), and per-team token buckets."""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from phalanx.api.models import WhoAmI

OK_TTL_S = 20.0  # a valid token's identity is reused this long
BAD_TTL_S = 3.0  # a refused token is refused without asking the head this long
STALE_OK_S = 300.0  # while the head cannot be reached, a known token stays valid this long
MAX_ENTRIES = 50_000


class HeadUnreachable(Exception):
    """The head could not answer whether a token is valid."""


# token → its identity, None when the head refuses it; HeadUnreachable otherwise.
WhoAmIFetch = Callable[[str], Awaitable[WhoAmI | None]]


@dataclass(frozen=True, slots=True)
class Audience:
    """The deployment's owner and team: they, the team's members and admins, and cluster
    admins may call it."""

    owner: str | None = None
    team: str | None = None

    def allows(self, who: WhoAmI) -> bool:
        if who.role == "admin" or (self.owner is not None and who.user == self.owner):
            return True
        return self.team is not None and (self.team in who.teams or self.team in who.admin_of)

    def team_of(self, who: WhoAmI) -> str:
        """The team a caller's requests count against for rate limits."""
        if self.team is not None and (self.team in who.teams or self.team in who.admin_of):
            return self.team
        return who.default_team or (sorted(who.teams)[0] if who.teams else f"user:{who.user}")


@dataclass(slots=True)
class _Entry:
    who: WhoAmI | None
    at: float


class TokenCache:
    """`who(token)`: the caller's identity (None: not a valid token), asking the head at
    most once per token per TTL; concurrent first requests share one call."""

    def __init__(self, fetch: WhoAmIFetch, clock: Callable[[], float] = time.monotonic) -> None:
        self.fetch = fetch
        self.clock = clock
        self._entries: dict[bytes, _Entry] = {}
        self._pending: dict[bytes, asyncio.Future[WhoAmI | None]] = {}

    async def who(self, token: str) -> WhoAmI | None:
        key = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        entry = self._entries.get(key)
        now = self.clock()
        if entry is not None and now - entry.at < (OK_TTL_S if entry.who else BAD_TTL_S):
            return entry.who
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[WhoAmI | None] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            try:
                who = await self.fetch(token)
            except HeadUnreachable:
                if entry is not None and entry.who is not None and now - entry.at < STALE_OK_S:
                    future.set_result(entry.who)
                    return entry.who
                raise
            if len(self._entries) >= MAX_ENTRIES:
                self._expire(now)
            self._entries[key] = _Entry(who, self.clock())
            future.set_result(who)
            return who
        except BaseException as e:
            if not future.done():
                future.set_exception(e if isinstance(e, Exception) else HeadUnreachable())
                future.exception()  # retrieved: no "never retrieved" warning
            raise
        finally:
            del self._pending[key]

    def _expire(self, now: float) -> None:
        for key in [k for k, e in self._entries.items() if now - e.at >= OK_TTL_S]:
            del self._entries[key]
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.clear()


class RateLimits:
    """A token bucket per team: `rate` requests per second, bursts of up to `rate` (at
    least 1). Teams without their own limit get `default` (None: unlimited)."""

    def __init__(
        self,
        limits: dict[str, float],
        default: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for team, rate in [*limits.items(), ("default", default or 1.0)]:
            if not rate > 0 or math.isinf(rate):
                raise ValueError(f"the rate limit of {team} must be a positive number")
        self.limits = dict(limits)
        self.default = default
        self.clock = clock
        self._buckets: dict[str, list[float]] = {}  # team → [tokens, at]

    def take(self, team: str) -> float | None:
        """None when the request may go; else the seconds until it could (Retry-After)."""
        rate = self.limits.get(team, self.default)
        if rate is None:
            return None
        burst = max(1.0, rate)
        now = self.clock()
        bucket = self._buckets.get(team)
        if bucket is None:
            if len(self._buckets) >= MAX_ENTRIES:
                self._buckets.clear()  # all would refill to full anyway in a second or so
            bucket = self._buckets[team] = [burst, now]
        tokens = min(burst, bucket[0] + (now - bucket[1]) * rate)
        bucket[1] = now
        if tokens >= 1.0:
            bucket[0] = tokens - 1.0
            return None
        bucket[0] = tokens
        return (1.0 - tokens) / rate
