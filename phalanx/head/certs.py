"""The head's TLS: a private CA and server certificate made on first start, or the
operator's own certificate.

Keys are ECDSA P-256 (fast handshakes, small certificates). The CA key never leaves the
head's state directory (0600); the CA certificate is public and is what clients pin.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from phalanx.tls import TLSError

TLS_DIR = "tls"
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
SERVER_CERT = "head.crt"
SERVER_KEY = "head.key"

CA_DAYS = 3650
SERVER_DAYS = 397  # what browsers accept for a server certificate; renewed at start
RENEW_DAYS = 30  # a server certificate this close to its end is replaced at start


@dataclass(frozen=True)
class ServerTLS:
    """The files uvicorn serves with, and the CA certificate clients should pin (None when
    the operator's certificate is signed by a CA the clients already trust)."""

    certfile: Path
    keyfile: Path
    ca_file: Path | None


@dataclass(frozen=True)
class TLSRequest:
    """How the head was asked to serve TLS: the operator's certificate and key (with the CA
    that signed them, if clients should pin it), else its own CA's certificate for `names`."""

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    names: tuple[str, ...] = ()

    def resolve(self, state_dir: Path, host: str) -> ServerTLS:
        """The files to serve with, made or renewed where the head's own CA is used."""
        if self.cert is not None and self.key is not None:
            return operator_tls(self.cert, self.key, self.ca)
        names = list(dict.fromkeys([*default_names(host), *self.names]))
        return ensure_head_tls(state_dir / TLS_DIR, names)


class AgentSigner:
    """Signs agents' certificates with the head's CA at registration, so every client of an
    agent's API (the head, `srun` in jobs, other agents) checks it against the one CA it
    already pins. The names in the certificate are the head's choice (the node's registered
    name and address), never the request's."""

    def __init__(self, tls_dir: Path) -> None:
        try:
            self._ca = x509.load_pem_x509_certificate((tls_dir / CA_CERT).read_bytes())
            key = serialization.load_pem_private_key((tls_dir / CA_KEY).read_bytes(), password=None)
        except (OSError, ValueError) as e:
            raise TLSError(f"cannot read the head's CA in {tls_dir}: {e}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise TLSError(f"{tls_dir / CA_KEY}: expected an ECDSA key")
        self._key = key

    def sign(self, csr_pem: str, names: Sequence[str], now: datetime.datetime | None = None) -> str:
        """A server certificate for the key of `csr_pem` (whose signature must verify),
        valid for `names`; TLSError for a request that is not a valid CSR."""
        try:
            csr = x509.load_pem_x509_csr(csr_pem.encode())
        except ValueError as e:
            raise TLSError(f"not a PEM certificate request: {e}") from None
        if not csr.is_signature_valid:
            raise TLSError("the certificate request's signature does not verify")
        public = csr.public_key()
        if not isinstance(public, ec.EllipticCurvePublicKey):
            raise TLSError("the certificate request must carry an ECDSA key")
        cert = _server_certificate(public, self._ca, self._key, names, now or _now())
        return cert.public_bytes(serialization.Encoding.PEM).decode()


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def default_names(host: str) -> list[str]:
    """The names a head listening on `host` is reached by: the address itself, this
    machine's hostnames and loopback (a wildcard address stands for every one of them)."""
    names = [] if host in ("0.0.0.0", "::", "") else [host]
    names += [socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1", "::1"]
    return list(dict.fromkeys(n for n in names if n))


def ensure_head_tls(
    tls_dir: Path, names: Sequence[str], *, now: datetime.datetime | None = None
) -> ServerTLS:
    """The head's CA (made once) and a server certificate for `names` signed by it, made
    anew when missing, close to its end, or not covering every name. Private keys 0600."""
    now = now or _now()
    tls_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(tls_dir, 0o700)
    ca_cert_path, ca_key_path = tls_dir / CA_CERT, tls_dir / CA_KEY
    if not ca_cert_path.exists() or not ca_key_path.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _ca_certificate(key, now)
        _write(ca_key_path, _key_pem(key), 0o600)
        _write(ca_cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    try:
        ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    except (OSError, ValueError) as e:
        raise TLSError(f"cannot read the head's CA in {tls_dir}: {e}") from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TLSError(f"{ca_key_path}: expected an ECDSA key")
    cert_path, key_path = tls_dir / SERVER_CERT, tls_dir / SERVER_KEY
    if _needs_new(cert_path, key_path, ca_cert, names, now):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _server_certificate(key.public_key(), ca_cert, ca_key, names, now)
        _write(key_path, _key_pem(key), 0o600)
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return ServerTLS(certfile=cert_path, keyfile=key_path, ca_file=ca_cert_path)


def operator_tls(certfile: Path, keyfile: Path, ca_file: Path | None) -> ServerTLS:
    """The operator's own certificate and key, checked to load together now rather than
    when the first client connects."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as e:
        raise TLSError(f"cannot use --tls-cert {certfile} with --tls-key {keyfile}: {e}") from None
    return ServerTLS(certfile=certfile, keyfile=keyfile, ca_file=ca_file)


def fingerprint(ca_file: Path) -> str:
    """SHA-256 fingerprint of a certificate (AA:BB:…), to compare out of band."""
    cert = x509.load_pem_x509_certificate(ca_file.read_bytes())
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def _needs_new(
    cert_path: Path,
    key_path: Path,
    ca_cert: x509.Certificate,
    names: Iterable[str],
    now: datetime.datetime,
) -> bool:
    if not cert_path.exists() or not key_path.exists():
        return True
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return True
    covered = {str(v) for v in san.get_values_for_type(x509.IPAddress)}
    covered |= set(san.get_values_for_type(x509.DNSName))
    wanted = {str(_san(n).value) for n in names}
    return (
        cert.issuer != ca_cert.subject
        or not wanted <= covered
        or cert.not_valid_after_utc - now < datetime.timedelta(days=RENEW_DAYS)
    )


def _ca_certificate(key: ec.EllipticCurvePrivateKey, now: datetime.datetime) -> x509.Certificate:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Phalanx"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"Phalanx cluster CA {now:%Y-%m-%d}"),
        ]
    )
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _server_certificate(
    public: ec.EllipticCurvePublicKey,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    names: Sequence[str],
    now: datetime.datetime,
) -> x509.Certificate:
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SERVER_DAYS))
        .add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    """Replace `path` atomically, created with `mode` from the start."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
