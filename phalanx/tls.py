"""TLS on the client side: trust exactly the cluster's CA (the CLI, agents and jobs), and
which addresses count as this machine only (where plain HTTP may be allowed)."""

from __future__ import annotations

import ipaddress
import ssl

CA_FILE_ENV = "PHALANX_CA_FILE"  # the CLI and agents: a file holding the CA certificate
CA_PEM_ENV = "PHALANX_CA_PEM"  # jobs: the CA certificate itself (no file to share)


class TLSError(Exception):
    """TLS cannot be set up as asked; the message says what to fix."""


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or `localhost`) is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def client_context(ca: str | None) -> ssl.SSLContext | bool:
    """What httpx should verify the head against: a context trusting only the CA in `ca`
    (a file path, or the PEM text itself), or the system's trust store when `ca` is None."""
    if not ca:
        return True
    try:
        if "-----BEGIN CERTIFICATE-----" in ca:
            return ssl.create_default_context(cadata=ca)
        return ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as e:
        where = "the CA certificate given" if "BEGIN" in ca else ca
        raise TLSError(f"cannot load {where}: {e}") from None
