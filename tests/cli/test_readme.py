"""The README's quick start, run verbatim: its `phalanx up` block in the background and each
line of its steps block in bash, against a fresh state dir and client config, each step's
output checked. A step added to the README without an expectation here fails the test, so
the two cannot drift apart."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
STEP_TIMEOUT_S = 180.0

# Each quick-start command (without its comment) → patterns its stdout+stderr must match.
EXPECTED: dict[str, list[str]] = {
    "phalanx nodes": [r"127\.0\.0\.2\s+up\s+0/4", r"127\.0\.0\.3\s+up\s+0/4"],
    "phalanx submit -N 2 --gpus-per-node 2 -- python -m phalanx.local.demo_workload": [
        r"Submitted job 1\b"
    ],
    "phalanx queue": [r"JOBID", r"\n\s*1\s"],
    "phalanx logs 1 -f": [r"step 10/150 loss", r"done: 150 steps"],
    "phalanx show 1": [r"127\.0\.0\.2", r"127\.0\.0\.3", r"demo_workload"],
    "phalanx history": [r"\n\s*1\s.*\bCD\b"],
    'phalanx drain 127.0.0.2 --reason "bad fan"': [r"node 127\.0\.0\.2: drain"],
    "phalanx resume 127.0.0.2": [r"node 127\.0\.0\.2: up"],
    "phalanx local kill-node 127.0.0.3": [r"killed node 127\.0\.0\.3"],
    "phalanx local start-node 127.0.0.3": [r"started node 127\.0\.0\.3 again"],
    "phalanx admin team set vision --quota 8": [r"team vision: quota 8 GPUs"],
    "phalanx admin user add alice --team vision": [r"user alice created"],
    "phalanx admin token create alice": [r"^phx_\S+\n", r"token \d+ for alice"],
    "phalanx token list": [r"\balice\b"],
}
# Steps whose output depends on the cluster catching up (a job leaving CG after its ranks
# end): run again, as a user would, until they match or the step's time runs out.
EVENTUALLY = {"phalanx history"}


def _block(marker: str) -> list[str]:
    """The command lines of the ```bash block after `<!-- quickstart:MARKER`."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"<!-- quickstart:{marker}")
    body = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    assert body is not None, f"no bash block after quickstart:{marker}"
    return [line for line in body.group(1).splitlines() if line.strip()]


def _command(line: str) -> str:
    return re.sub(r"\s+#\s.*$", "", line).strip()


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHALANX_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PHALANX_CONFIG_DIR"] = str(tmp_path / "config")
    env["PHALANX_UP_PORT"] = "0"  # the documented default port may be taken on this machine
    return env


def test_readme_quick_start_runs_verbatim(tmp_path: Path) -> None:
    (up_line,) = _block("up")
    steps = _block("steps")
    missing = [_command(s) for s in steps if _command(s) not in EXPECTED]
    assert not missing, f"README quick-start steps without an expectation here: {missing}"
    work = tmp_path / "work"
    work.mkdir()
    env = _env(tmp_path)
    up = subprocess.Popen(
        ["bash", "-c", f"exec {up_line}"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []

    def read() -> None:
        assert up.stdout is not None
        lines.extend(up.stdout)

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while not any(line.startswith("Ctrl-C stops everything") for line in lines):
            assert up.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.1)
        for line in steps:
            command = _command(line)
            deadline = time.monotonic() + STEP_TIMEOUT_S
            while True:
                proc = subprocess.run(
                    ["bash", "-c", line],
                    cwd=work,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=STEP_TIMEOUT_S,
                    check=False,
                )
                output = proc.stdout + proc.stderr
                ok = proc.returncode == 0 and all(
                    re.search(p, output, re.M) for p in EXPECTED[command]
                )
                if ok or command not in EVENTUALLY or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert ok, f"`{line}` (exit {proc.returncode}):\n{output}\n--- up:\n{''.join(lines)}"
        assert up.poll() is None, "".join(lines)
        assert "killed node 127.0.0.3" in "".join(lines)  # `up` said so, and went on
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)
            try:
                up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
    assert up.returncode == 0, "".join(lines)
