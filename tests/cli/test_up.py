"""`phalanx up` as a user runs it: a real process, Ctrl-C, nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from phalanx.client import PhalanxClient, resolve
from phalanx.local.cluster import free_port
from tests.cli.conftest import processes_mentioning


def test_up_writes_the_client_config_and_ctrl_c_stops_everything(
    tmp_path: Path, config_dir: Path
) -> None:
    state = tmp_path / "state"
    port = free_port()
    up = subprocess.Popen(
        [sys.executable, "-m", "phalanx", "up", "--nodes", "1", "--gpus-per-node", "2",
         "--state-dir", str(state), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert up.stdout is not None and up.stderr is not None
        lines = []
        for line in up.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C stops everything"):
                break
        out = "".join(lines)
        assert f"head https://127.0.0.1:{port}" in out, out + up.stderr.read()
        assert str(state / "head" / "admin.token") in out
        config = resolve()  # `phalanx up` pointed the client at the new cluster
        assert config.head == f"https://127.0.0.1:{port}"
        assert config.ca == str(state.resolve() / "head" / "tls" / "ca.crt")
        with PhalanxClient(config.head, config.token, ca=config.ca) as client:
            assert [n.name for n in client.nodes().nodes] == ["127.0.0.2"]
        assert len(processes_mentioning(str(state))) == 4  # up, head, agent, its lease guard

        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0
        deadline = time.monotonic() + 10
        while processes_mentioning(str(state)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_mentioning(str(state)) == []
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
