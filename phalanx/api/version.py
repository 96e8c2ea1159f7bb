"""The API version every request and answer carries, and when two of them can talk.

`Phalanx-Api-Version: MAJOR.MINOR` is set by the client, the agents and the head on every
request and every answer (docs/control-plane.md, "Versions and rolling upgrades"). A minor
release only adds optional fields, which readers of the machine wire ignore (`Lenient`
models): peers one minor apart talk as usual, so a cluster is upgraded one process at a
time. A different major is refused with an error naming both versions. A request without
the header (curl, a browser, a peer older than the header) is served: nothing it could
send means something else under this major.
"""

from __future__ import annotations

HEADER = "Phalanx-Api-Version"
API_VERSION = "1.0"  # MAJOR.MINOR of the wire types in phalanx.api.models


def parse(value: str) -> tuple[int, int] | None:
    """`MAJOR.MINOR` as two numbers; None if malformed."""
    major, sep, minor = value.strip().partition(".")
    if not sep or not major.isdigit() or not minor.isdigit() or len(value) > 20:
        return None
    return int(major), int(minor)


def mismatch(peer: str | None, *, me: str, them: str) -> str | None:
    """Why `peer` (a Phalanx-Api-Version value; None: the peer sent none) cannot talk to
    this process (`me`: "head", "agent", "client"; `them`: what the peer is), or None."""
    if peer is None:
        return None
    theirs, ours = parse(peer), parse(API_VERSION)
    assert ours is not None
    if theirs is None:
        return f"invalid {HEADER} header {peer[:40]!r} from the {them}: expected MAJOR.MINOR"
    if theirs[0] == ours[0]:
        return None
    older = them if theirs[0] < ours[0] else me
    return (
        f"Phalanx API version mismatch: this {me} speaks API {API_VERSION} and the {them} "
        f"speaks {peer.strip()}; different major versions cannot talk (upgrade the {older})"
    )


def headers() -> dict[str, str]:
    """The version header for a request or an answer."""
    return {HEADER: API_VERSION}
