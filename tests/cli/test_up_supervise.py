"""`phalanx up` keeps the local cluster going when a process dies, as a real cluster would,
and `phalanx local …` kills and starts nodes and the head on purpose: real processes."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.api.models import JobDetail, NodeList
from tests.cli.conftest import run_cli

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


class Up:
    """A `phalanx up` process whose stdout is collected by a thread."""

    def __init__(self, state: Path, *args: str) -> None:
        self.state = state
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "phalanx", "up", "--state-dir", str(state), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 90) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.output())
            if match:
                return match
            assert self.proc.poll() is None, f"up exited {self.proc.returncode}:\n{self.output()}"
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} in `up`'s output:\n{self.output()}")

    def local(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli("local", *args, "--state-dir", str(self.state))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def up(tmp_path: Path, config_dir: Path) -> Iterator[Up]:
    running = Up(tmp_path / "state", "--nodes", "2", "--gpus-per-node", "1", "--port", "0")
    try:
        running.wait_for("Ctrl-C stops everything")
        yield running
    finally:
        running.stop()


def _cli_json(*args: str) -> str:
    proc = run_cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _job(job_id: int) -> JobDetail:
    return JobDetail.model_validate_json(_cli_json("show", str(job_id)))


def _node_states() -> dict[str, str]:
    return {n.name: n.state for n in NodeList.model_validate_json(_cli_json("nodes")).nodes}


def _until(what: str, probe: object, timeout: float = 90) -> None:
    assert callable(probe)
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_up_survives_node_and_head_deaths(up: Up, tmp_path: Path) -> None:
    out = up.output()
    # Every process with its pid, address and log.
    for name in ("head", "agent 127.0.0.2", "agent 127.0.0.3"):
        assert re.search(rf"{re.escape(name)}\s+pid \d+", out), out
    assert str(up.state / "logs" / "agent-127.0.0.2.log") in out
    ps = up.local("ps")
    assert ps.returncode == 0 and ps.stdout.count("running") == 3, ps.stdout + ps.stderr
    # The agent's log is timestamped and says when it joined.
    log = (up.state / "logs" / "agent-127.0.0.2.log").read_text()
    joined = [line for line in log.splitlines() if "registered with the head" in line]
    assert joined and TIMESTAMP.match(joined[0]), log

    submitted = run_cli("submit", "-J", "long", "--", "sleep", "600", cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout.split("Submitted job ")[1].split()[0])
    _until("job running", lambda: _job(job_id).job.state == "R")
    first = _job(job_id).job.placement[0].node
    other = next(a for a in ("127.0.0.2", "127.0.0.3") if a != first)

    # A node killed on purpose: `up` goes on, the job is requeued on the other node.
    killed = up.local("kill-node", first)
    assert killed.returncode == 0 and f"killed node {first}" in killed.stdout, killed.stderr
    _until(
        "job moved",
        lambda: (j := _job(job_id).job).state == "R" and j.placement[0].node == other,
    )
    assert up.proc.poll() is None
    assert _node_states()[first] == "down"
    restarted = up.local("start-node", first)
    assert restarted.returncode == 0, restarted.stderr
    _until("node back", lambda: _node_states()[first] == "up")

    # The head killed: `up` says so and restarts it; the running job is not disturbed.
    epoch = _job(job_id).job.epoch
    assert up.local("kill-head").returncode == 0
    up.wait_for(r"head \(pid \d+\) exited with code -9; restarting it")
    up.wait_for(r"head restarted: pid \d+")
    job = _job(job_id).job
    assert (job.state, job.epoch) == ("R", epoch)

    # An agent that dies by itself (not on request) is reported as a failed node.
    pid = int(re.search(rf"agent {re.escape(first)}\s+pid (\d+)", up.local("ps").stdout)[1])  # type: ignore[index]
    os.kill(pid, signal.SIGKILL)
    up.wait_for(
        rf"agent {re.escape(first)} \(pid {pid}\) exited with code -9: node {first} has failed"
    )

    # A new node joins.
    added = up.local("add-node")
    assert added.returncode == 0 and "added node 127.0.0.4" in added.stdout, added.stderr
    _until("new node up", lambda: _node_states().get("127.0.0.4") == "up")

    bad = up.local("start-node", "10.9.9.9")
    assert bad.returncode == 2 and bad.stderr.startswith("error: no node '10.9.9.9'")
    assert run_cli("cancel", str(job_id)).returncode == 0
    up.stop()
    assert up.proc.returncode == 0, up.output()
    assert not (up.state / "up.json").exists()


def test_local_commands_without_up_say_so(tmp_path: Path) -> None:
    proc = run_cli("local", "kill-node", "127.0.0.2", "--state-dir", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: no `phalanx up` is running on the state dir")


def test_port_in_use_is_one_clear_line(tmp_path: Path, config_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli(
            "up", "--nodes", "1", "--state-dir", str(tmp_path / "s"), "--port", str(port)
        )
    assert proc.returncode == 2
    error = [line for line in proc.stderr.splitlines() if line]
    assert len(error) == 1, proc.stderr
    assert "address already in use" in error[0].lower() and "--port 0" in error[0]
    assert "alembic" not in proc.stderr.lower()
