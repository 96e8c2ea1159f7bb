"""TLS on the head's API: its own CA on first start, pinned by clients; operator
certificates; plain HTTP only where asked for, and never off loopback by default."""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import socket
import ssl
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from phalanx.client.api import ApiError, PhalanxClient
from phalanx.head import certs
from phalanx.local.cluster import LocalCluster, free_port
from phalanx.tls import TLSError, client_context
from tests.head.heads import PHALANX, HeadServer


@pytest.fixture
def heads() -> Iterator[list[HeadServer]]:
    started: list[HeadServer] = []
    yield started
    for head in started:
        head.stop()


def _start(heads: list[HeadServer], state: Path, *args: str) -> HeadServer:
    head = HeadServer(state, head_args=args)
    heads.append(head)
    head.start().wait_role("leader")
    return head


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_head_makes_its_ca_once_and_keeps_private_keys_private(tmp_path: Path) -> None:
    tls = certs.ensure_head_tls(tmp_path / "tls", ["127.0.0.1", "localhost"])
    assert tls.ca_file is not None
    assert _mode(tmp_path / "tls") == 0o700
    assert _mode(tmp_path / "tls" / certs.CA_KEY) == 0o600
    assert _mode(tls.keyfile) == 0o600
    ca_before, cert_before = tls.ca_file.read_bytes(), tls.certfile.read_bytes()

    again = certs.ensure_head_tls(tmp_path / "tls", ["127.0.0.1", "localhost"])

    assert again.ca_file is not None
    assert (again.ca_file.read_bytes(), again.certfile.read_bytes()) == (ca_before, cert_before)


def test_the_server_certificate_is_renewed_for_new_names_and_near_its_end(tmp_path: Path) -> None:
    first = certs.ensure_head_tls(tmp_path, ["127.0.0.1"])
    ca = first.ca_file.read_bytes() if first.ca_file else b""
    cert = first.certfile.read_bytes()

    named = certs.ensure_head_tls(tmp_path, ["127.0.0.1", "head.example"])
    san = x509.load_pem_x509_certificate(named.certfile.read_bytes()).extensions
    names = san.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "head.example" in names.get_values_for_type(x509.DNSName)
    named_cert = named.certfile.read_bytes()
    assert named_cert != cert

    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=certs.SERVER_DAYS - 10)
    renewed = certs.ensure_head_tls(tmp_path, ["127.0.0.1", "head.example"], now=later)
    assert renewed.certfile.read_bytes() != named_cert
    assert renewed.ca_file is not None and renewed.ca_file.read_bytes() == ca  # same CA


def test_a_key_that_does_not_match_the_certificate_is_refused(tmp_path: Path) -> None:
    one = certs.ensure_head_tls(tmp_path / "one", ["127.0.0.1"])
    two = certs.ensure_head_tls(tmp_path / "two", ["127.0.0.1"])
    with pytest.raises(TLSError, match="cannot use --tls-cert"):
        certs.operator_tls(one.certfile, two.keyfile, None)
    with pytest.raises(TLSError, match="cannot load"):
        client_context(str(tmp_path / "missing.crt"))


def test_clients_that_pin_the_ca_get_in_and_others_are_told_how(
    tmp_path: Path, heads: list[HeadServer]
) -> None:
    head = _start(heads, tmp_path / "head")
    assert head.url.startswith("https://")

    with head.client() as client:  # pins STATE_DIR/tls/ca.crt
        assert client.whoami().user == "admin"
    unpinned = PhalanxClient(head.url, head.admin_token, submit_retry_s=60)
    with unpinned, pytest.raises(ApiError, match=r"is not trusted.*PHALANX_CA_FILE"):
        unpinned.whoami()
    other = certs.ensure_head_tls(tmp_path / "other-ca", ["127.0.0.1"])
    assert other.ca_file is not None
    wrong = PhalanxClient(head.url, head.admin_token, ca=str(other.ca_file))
    with wrong, pytest.raises(ApiError, match="not trusted"):
        wrong.whoami()
    # Plain HTTP to the TLS port gets no answer from the API.
    with pytest.raises(httpx.HTTPError):
        httpx.get(head.url.replace("https://", "http://") + "/healthz", timeout=5)


def test_a_restarted_head_serves_the_same_ca(tmp_path: Path, heads: list[HeadServer]) -> None:
    head = _start(heads, tmp_path / "head")
    ca = head.ca_file.read_bytes()

    head.restart()

    assert head.ca_file.read_bytes() == ca
    with head.client() as client:  # the pinned CA still works
        assert client.whoami().user == "admin"


def test_the_head_serves_an_operator_certificate(tmp_path: Path, heads: list[HeadServer]) -> None:
    issued = certs.ensure_head_tls(tmp_path / "corp-ca", ["127.0.0.1"])
    assert issued.ca_file is not None
    args = ("--tls-cert", str(issued.certfile), "--tls-key", str(issued.keyfile))
    head = HeadServer(tmp_path / "head", head_args=(*args, "--tls-ca", str(issued.ca_file)))
    heads.append(head)
    head.start()

    with PhalanxClient(head.url, None, ca=str(issued.ca_file)) as client:
        client_ok = _eventually_healthy(client)
    assert client_ok
    assert not (tmp_path / "head" / "tls").exists()  # no CA of its own was made


def _eventually_healthy(client: PhalanxClient) -> bool:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            return client.health().status == "ok"
        except ApiError:
            time.sleep(0.1)
    return False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--host", "0.0.0.0", "--plain-http"], "would send tokens readable over the network"),
        (["--tls-cert", "/nonexistent.crt"], "--tls-cert and --tls-key go together"),
        (["--plain-http", "--tls-name", "x"], "drop the --tls-* options"),
        (["--tls-ca", "/etc/hostname"], "without --tls-cert the head makes its own"),
    ],
)
def test_unsafe_or_inconsistent_tls_settings_are_refused(
    tmp_path: Path, args: list[str], message: str
) -> None:
    done = subprocess.run(
        [*PHALANX, "head", "--state-dir", str(tmp_path / "head"), "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_an_operator_key_that_does_not_fit_stops_the_head_with_one_line(tmp_path: Path) -> None:
    one = certs.ensure_head_tls(tmp_path / "one", ["127.0.0.1"])
    two = certs.ensure_head_tls(tmp_path / "two", ["127.0.0.1"])
    args = ["--tls-cert", str(one.certfile), "--tls-key", str(two.keyfile)]
    done = subprocess.run(
        [*PHALANX, "head", "--state-dir", str(tmp_path / "head"), "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot use --tls-cert" in done.stderr and "Traceback" not in done.stderr


class _Tap:
    """A TCP relay on loopback that keeps every byte the client sent through it."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self.sent = bytearray()
        self._target = target_port
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._target))
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        try:
            while data := src.recv(65536):
                if record:
                    self.sent += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._server.close()


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain-http"])
def test_the_token_crosses_the_wire_readable_only_without_tls(
    tmp_path: Path, heads: list[HeadServer], tls: bool
) -> None:
    head = _start(heads, tmp_path / "head", *(() if tls else ("--plain-http",)))
    tap = _Tap(head.port)
    try:
        url = f"{'https' if tls else 'http'}://127.0.0.1:{tap.port}"
        ca = str(head.ca_file) if tls else None
        with PhalanxClient(url, head.admin_token, ca=ca) as client:
            assert client.whoami().user == "admin"
    finally:
        tap.close()
    assert len(tap.sent) > 0
    # The same check both ways, so the plain run shows the tap would have seen it.
    assert (head.admin_token.encode() in tap.sent) is not tls


# ------------------------------------------------------------------ the agents' API
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A head with its own CA and one agent that pins it (as `phalanx up` starts them)."""
    with LocalCluster(tmp_path_factory.mktemp("tls"), nodes=1, gpus_per_node=1) as running:
        yield running


def test_agents_serve_their_api_with_a_certificate_the_head_signed_for_their_address(
    cluster: LocalCluster,
) -> None:
    assert cluster.ca_file is not None
    with cluster.client() as api:
        (node,) = api.nodes().nodes
    assert node.agent_url.startswith("https://127.0.0.2:")
    port = int(node.agent_url.rsplit(":", 1)[1])
    # Verified against the cluster's CA, for the node's own address.
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    with (
        socket.create_connection(("127.0.0.2", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.2") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    cert = x509.load_der_x509_certificate(der)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.2"]
    # Another address is not in it, and plain HTTP gets no answer from the API.
    with (
        socket.create_connection(("127.0.0.2", port), timeout=10) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        context.wrap_socket(raw, server_hostname="127.0.0.9")
    with pytest.raises(httpx.HTTPError):
        httpx.get(node.agent_url.replace("https://", "http://") + "/healthz", timeout=5)


def test_logs_and_srun_reach_the_agents_over_tls(cluster: LocalCluster, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -N 1\nsrun echo step-over-tls\n")
    env = {**os.environ, **cluster.client_env(), "PHALANX_CONFIG_DIR": str(tmp_path / "cfg")}
    done = subprocess.run(
        [*PHALANX, "submit", str(script), "--chdir", str(tmp_path), "--wait"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    match = re.search(r"Submitted job (\d+)", done.stdout)
    assert match, done.stdout
    logs = subprocess.run(
        [*PHALANX, "logs", match.group(1)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert logs.returncode == 0, logs.stderr  # the head read it from the agent over TLS
    assert "step-over-tls" in logs.stdout


def test_a_certificate_request_that_is_not_one_is_refused_and_joins_nothing(
    cluster: LocalCluster,
) -> None:
    assert cluster.ca_file is not None
    body = {
        "name": "forger",
        "address": "127.0.0.77",
        "agent_url": "https://127.0.0.77:1",
        "agent_secret": "x" * 32,
        "cpus": 1,
        "memory_mb": 1,
        "gpus": [],
        "csr": "-----BEGIN CERTIFICATE REQUEST-----\nnot one\n-----END CERTIFICATE REQUEST-----\n",
    }
    r = httpx.post(
        cluster.url + "/v1/agent/register",
        json=body,
        headers={"Authorization": f"Bearer {cluster.join_token}"},
        verify=client_context(str(cluster.ca_file)),
        timeout=10,
    )
    assert r.status_code == 422 and "csr" in r.text, r.text
    with cluster.client() as api:
        assert [n.name for n in api.nodes().nodes] == ["127.0.0.2"]


def test_an_agent_that_pins_a_ca_refuses_a_head_that_cannot_sign_for_it(
    tmp_path: Path, heads: list[HeadServer]
) -> None:
    head = _start(heads, tmp_path / "head", "--plain-http")
    ca = certs.ensure_head_tls(tmp_path / "some-ca", ["127.0.0.1"]).ca_file
    argv = [*PHALANX, "agent", "--head", head.url, "--address", "127.0.0.61"]
    argv += ["--name", "n61", "--fake-gpus", "1", "--state-dir", str(tmp_path / "agent")]
    argv += ["--ca-file", str(ca)]
    done = subprocess.run(
        argv,
        env={**os.environ, "PHALANX_JOIN_TOKEN": head.join_token},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "did not sign this agent's API certificate" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
