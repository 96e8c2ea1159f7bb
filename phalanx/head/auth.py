"""Tokens and who may do what: hashed bearer tokens, three roles, per-job access checks.

Tokens are 256-bit random strings, so a plain SHA-256 is the right hash for them (as for
GitHub or PyPI tokens): a slow password hash protects guessable secrets, these are not.
Only the hash is stored; the token itself is shown once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Literal

TOKEN_PREFIX = {"api": "phx_", "join": "phxj_", "node": "phxn_"}
STEP_TOKEN_PREFIX = "phxs_"  # job-scoped (srun steps, progress); lives on the job, not in `tokens`
TokenKind = Literal["api", "join", "node"]


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


class AuthError(Exception):
    """401: no token, or one that is unknown or revoked."""


class Forbidden(Exception):
    """403: a valid token that may not do this."""
