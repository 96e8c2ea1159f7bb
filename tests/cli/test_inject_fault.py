"""`phalanx admin inject-fault` through a real head to a real agent process (fake GPUs)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from phalanx.api.models import UserCreate
from phalanx.local import LocalCluster
from tests.cli.conftest import invoke


def agent_log_line(cluster: LocalCluster, address: str, pattern: str) -> str:
    """Wait for the agent's log (its stderr) to report a GPU health event matching
    `pattern`: the agent logs each event as it queues it for its heartbeats."""
    log = cluster.log_dir / f"agent-{address}.log"
    deadline = time.monotonic() + 20
    while True:
        text = log.read_text(encoding="utf-8", errors="replace")
        found = re.search(rf"GPU health event seq=\d+ {pattern}.*", text)
        if found:
            return found.group(0)
        if time.monotonic() > deadline:
            raise AssertionError(f"no event matching {pattern!r} in {log}:\n{text[-3000:]}")
        time.sleep(0.05)


def test_an_injected_xid_is_reported_by_the_agent(
    cluster: LocalCluster, admin_env: dict[str, str]
) -> None:
    result = invoke(
        "admin",
        "inject-fault",
        "127.0.0.2",
        "--gpu",
        "1",
        "--xid",
        "79",
        "--message",
        "drill",
        env=admin_env,
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (
        "node 127.0.0.2: injected XID 79 (GPU has fallen off the bus) on GPU 1\n"
    )
    line = agent_log_line(cluster, "127.0.0.2", "gpu=1 kind=xid code=79")
    assert line.endswith(": XID 79 (GPU has fallen off the bus): drill")


def test_other_kinds_and_the_whole_node(cluster: LocalCluster, admin_env: dict[str, str]) -> None:
    result = invoke("admin", "inject-fault", "127.0.0.3", "--kind", "gpu-lost", env=admin_env)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "node 127.0.0.3: injected GPU lost on the node\n"
    agent_log_line(cluster, "127.0.0.3", "gpu=None kind=gpu_lost code=None")


def test_bad_requests_exit_2_with_one_line(
    cluster: LocalCluster, admin_env: dict[str, str]
) -> None:
    cases = [
        (["nope", "--xid", "79"], "error: no node 'nope'"),
        (
            ["127.0.0.2", "--gpu", "7", "--xid", "79"],
            "error: node 127.0.0.2: this node has GPUs 0-1; there is no GPU 7",
        ),
        (["127.0.0.2"], "error: give either --xid CODE or --kind ecc|row-remap|gpu-lost"),
        (
            ["127.0.0.2", "--xid", "79", "--kind", "ecc"],
            "error: give either --xid CODE or --kind ecc|row-remap|gpu-lost",
        ),
        (
            ["127.0.0.2", "--kind", "fire"],
            "error: --kind 'fire': expected one of ecc, row-remap, gpu-lost",
        ),
    ]
    for args, message in cases:
        result = invoke("admin", "inject-fault", *args, env=admin_env)
        assert (result.exit_code, result.stderr.strip()) == (2, message), args
        assert "Traceback" not in result.stderr

    with cluster.client() as client:
        client.create_user(UserCreate(name="bob", teams=["default"]))
        bob = client.create_token("bob").token
    result = invoke(
        "admin",
        "inject-fault",
        "127.0.0.2",
        "--xid",
        "13",
        env={**admin_env, "PHALANX_TOKEN": bob},
    )
    assert (result.exit_code, result.stderr.strip()) == (
        2,
        "error: this needs an admin token",
    )


def test_agent_refuses_bad_health_check_settings(tmp_path: Path) -> None:
    base = ["agent", "--head", "http://127.0.0.1:9", "--address", "127.0.0.2"]
    token_file = tmp_path / "join.token"
    token_file.write_text("x\n")
    base += ["--token-file", str(token_file)]
    missing = tmp_path / "missing.sh"
    result = invoke(*base, "--fake-gpus", "1", "--health-check", str(missing))
    assert (result.exit_code, result.stderr.strip()) == (
        2,
        f"error: --health-check {missing}: no such file",
    )
    result = invoke(*base, "--fake-gpus", "1", "--health-interval", "0")
    assert (result.exit_code, result.stderr.strip()) == (
        2,
        "error: --health-interval must be > 0 seconds, got 0",
    )


def test_agent_refuses_bad_telemetry_intervals(tmp_path: Path) -> None:
    token_file = tmp_path / "join.token"
    token_file.write_text("x\n")
    base = ["agent", "--head", "http://127.0.0.1:9", "--address", "127.0.0.2"]
    base += ["--token-file", str(token_file), "--fake-gpus", "1"]
    for flag, value in (("--telemetry-interval", "0"), ("--telemetry-ship", "99999")):
        result = invoke(*base, flag, value)
        assert result.exit_code == 2, result.stderr
        assert flag in result.stderr and "Traceback" not in result.stderr
