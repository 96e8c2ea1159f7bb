"""Tokens and who may do what: hashed bearer tokens, three roles, per-job access checks.

Tokens are 256-bit random strings, so a plain SHA-256 is the right hash for them (as for
GitHub or PyPI tokens): a slow password hash protects guessable secrets, these are not.
Only the hash is stored; the token itself is shown once.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

TOKEN_PREFIX = {"api": "phx_", "join": "phxj_", "node": "phxn_", "metrics": "phxm_"}
STEP_TOKEN_PREFIX = "phxs_"  # job-scoped (srun steps, progress); lives on the job, not in `tokens`
# "metrics": a scrape-only token (Prometheus): /metrics and the per-GPU series, nothing else.
TokenKind = Literal["api", "join", "node", "metrics"]

DAY_S = 86400.0
API_TOKEN_TTL_S = 90 * DAY_S  # default life of a user's API token (`phalanx head --token-ttl`)
JOIN_TOKEN_TTL_S = 1 * DAY_S  # default life of a join token, the first-start one included
ALWAYS_ALLOWED_QOS = frozenset({"low"})
DEFAULT_QOS = frozenset({"normal"})


def new_token(kind: TokenKind) -> str:
    return TOKEN_PREFIX[kind] + secrets.token_urlsafe(32)


def new_step_token() -> str:
    return STEP_TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def same_secret(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a user (with their teams and roles), an agent's node, or a joiner."""

    kind: TokenKind
    token_id: int
    user: str | None = None
    admin: bool = False
    teams: frozenset[str] = frozenset()
    admin_of: frozenset[str] = frozenset()
    default_team: str | None = None
    node: str | None = None
    expires: float | None = None  # unix seconds; None: never
    qos: frozenset[str] | None = None  # the user's own QOS allowance (None: not set)
    # A join token's bindings: node-name globs and address ranges (empty: any).
    single_use: bool = False
    bind_nodes: tuple[str, ...] = ()
    bind_addresses: tuple[str, ...] = ()

    @property
    def role(self) -> Literal["user", "team_admin", "admin"]:
        if self.admin:
            return "admin"
        return "team_admin" if self.admin_of else "user"

    def may_see_job(self, owner: str, team: str) -> bool:
        """Users see and act on their own jobs; team admins on their team's; admins on all."""
        return self.admin or owner == self.user or team in self.admin_of

    def may_submit_to(self, team: str) -> bool:
        return self.admin or team in self.teams or team in self.admin_of

    def may_use_qos(self, qos: str, team_qos: frozenset[str] | None) -> bool:
        """Admins use any QOS; others `low`, plus their own allowance if an admin set one,
        else their team's, else `normal` (the most specific allowance wins)."""
        if self.admin or qos in ALWAYS_ALLOWED_QOS:
            return True
        return qos in allowed_qos(self.qos, team_qos)


def allowed_qos(user_qos: frozenset[str] | None, team_qos: frozenset[str] | None) -> frozenset[str]:
    own = user_qos if user_qos is not None else team_qos
    return ALWAYS_ALLOWED_QOS | (own if own is not None else DEFAULT_QOS)


def check_cidrs(cidrs: Sequence[str]) -> list[str]:
    """The address ranges normalised (`10.0.0.0/8`, a bare address is a /32 or /128);
    ValueError names the first malformed one."""
    out = []
    for cidr in cidrs:
        try:
            out.append(str(ipaddress.ip_network(cidr.strip(), strict=False)))
        except ValueError:
            raise ValueError(f"{cidr!r} is not an address range (e.g. 10.0.0.0/8)") from None
    return out


def binding_refusal(who: Principal, name: str, address: str, peer: str | None) -> str | None:
    """Why a join token's bindings refuse registering node `name` at `address` from the TCP
    peer `peer` (None: they allow it)."""
    if who.bind_nodes and not any(fnmatch.fnmatchcase(name, p) for p in who.bind_nodes):
        return f"this join token is only for nodes {','.join(who.bind_nodes)}, not {name!r}"
    if who.bind_addresses:
        ranges = [ipaddress.ip_network(c) for c in who.bind_addresses]
        for what, value in (("address", address), ("connection's address", peer)):
            try:
                ip = ipaddress.ip_address(value or "")
            except ValueError:
                return (
                    f"this join token is bound to address ranges; the {what} {value!r} is not an IP"
                )
            if not any(ip in r for r in ranges):
                allowed = ",".join(who.bind_addresses)
                return f"this join token is only for addresses in {allowed}; the {what} is {ip}"
    return None


class AuthError(Exception):
    """401: no token, or one that is unknown, revoked or expired."""


class Forbidden(Exception):
    """403: a valid token that may not do this."""
