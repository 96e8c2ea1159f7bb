"""TLS for the agent's own API: a key made at start, a certificate the head signs with its
CA at registration, served from then on (renewed at every registration)."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

KEY_FILE = "agent.key"
CERT_FILE = "agent.crt"


class AgentTLS:
    """The agent's TLS identity. `context` is what its API serves with: it holds no
    certificate until `install` (a handshake before registration fails, and nobody has the
    agent's URL before then)."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "tls"
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2

    def csr(self, name: str) -> str:
        """A certificate request for this agent's key (PEM); the head decides the names."""
        request = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .sign(self._key, hashes.SHA256())
        )
        return request.public_bytes(serialization.Encoding.PEM).decode()

    def install(self, cert_pem: str) -> None:
        """Serve `cert_pem` (signed by the head) from the next handshake on. The files are
        written 0600 for load_cert_chain, which reads only files."""
        key_path, cert_path = self.dir / KEY_FILE, self.dir / CERT_FILE
        key = self._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        for path, data in ((key_path, key), (cert_path, cert_pem.encode())):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        self.context.load_cert_chain(cert_path, key_path)
