"""The process manager with real processes: exits, signals, escalation, groups, log files."""

from __future__ import annotations

import os
import signal
import stat
import sys
from collections.abc import Hashable, Iterator
from pathlib import Path

import pytest

from phalanx.agent.processes import ProcessManager, ProcState
from phalanx.testing.processes import pid_alive

from .helpers import wait_for


@pytest.fixture
def pm() -> Iterator[ProcessManager]:
    manager = ProcessManager()
    yield manager
    manager.stop_all(0.2)


def run(pm: ProcessManager, tmp_path: Path, script: str, key: Hashable = "k") -> ProcState:
    return pm.start(
        key,
        ["sh", "-c", script],
        env={"PATH": os.environ["PATH"], "X": "42"},
        cwd=str(tmp_path),
        stdout=tmp_path / "logs" / "out",
        stderr=tmp_path / "logs" / "err",
    )


def ended(pm: ProcessManager, key: Hashable = "k") -> ProcState:
    return wait_for(f"{key} to end", lambda: s if (s := pm.get(key)) and not s.running else None)


def test_exit_code_env_cwd_and_logs(pm: ProcessManager, tmp_path: Path) -> None:
    state = run(pm, tmp_path, 'echo "out $X $(pwd)"; echo err >&2; exit 3')
    assert state.pid is not None and state.running
    done = ended(pm)
    assert (done.exit_code, done.signal, done.shell_code) == (3, None, 3)
    assert done.ended_at is not None and done.ended_at >= done.started_at
    assert (tmp_path / "logs" / "out").read_text() == f"out 42 {tmp_path}\n"
    assert (tmp_path / "logs" / "err").read_text() == "err\n"
    assert not pid_alive(state.pid)  # reaped: not even a zombie


def test_own_process_group(pm: ProcessManager, tmp_path: Path) -> None:
    state = run(pm, tmp_path, "sleep 30")
    assert state.pid is not None
    assert os.getpgid(state.pid) == state.pid
    assert os.getsid(state.pid) == state.pid


def test_killed_by_signal(pm: ProcessManager, tmp_path: Path) -> None:
    run(pm, tmp_path, "kill -9 $$")
    done = ended(pm)
    assert (done.exit_code, done.signal, done.shell_code) == (None, 9, 137)


def test_on_change_reports_exit(tmp_path: Path) -> None:
    seen: list[Hashable] = []
    pm = ProcessManager(on_change=seen.append)
    try:
        run(pm, tmp_path, "exit 0", key=("rank", 1))
        wait_for("the exit callback", lambda: seen)
        assert seen == [("rank", 1)]
    finally:
        pm.stop_all(0.2)


def test_stop_terminates_whole_group(pm: ProcessManager, tmp_path: Path) -> None:
    run(pm, tmp_path, "sleep 30 & echo $! > child; wait")
    child = int(wait_for("the child pid", lambda: _read(tmp_path / "child")))
    assert pid_alive(child)
    pm.stop("k", grace_s=5.0)
    done = ended(pm)
    assert done.signal == signal.SIGTERM
    wait_for("the rank's child to die", lambda: not pid_alive(child))


def test_sigterm_ignored_escalates_to_sigkill(pm: ProcessManager, tmp_path: Path) -> None:
    run(pm, tmp_path, "trap '' TERM; sleep 30 & echo $! > child; echo ready; wait")
    wait_for("the trap", lambda: "ready" in (_read(tmp_path / "logs" / "out") or ""))
    child = int(wait_for("the child pid", lambda: _read(tmp_path / "child")))
    pm.stop("k", grace_s=0.3)
    done = ended(pm)
    assert done.signal == signal.SIGKILL
    wait_for("the child to be killed too", lambda: not pid_alive(child))


def test_stop_reaches_leftovers_of_an_exited_rank(pm: ProcessManager, tmp_path: Path) -> None:
    """A rank that exited but left a background child: stopping it kills the child."""
    run(pm, tmp_path, "sleep 30 & echo $! > child; exit 0")
    assert ended(pm).exit_code == 0
    child = int(wait_for("the child pid", lambda: _read(tmp_path / "child")))
    assert pid_alive(child)
    pm.stop("k", grace_s=5.0)
    wait_for("the leftover child to die", lambda: not pid_alive(child))


def test_missing_workdir_fails_cleanly(pm: ProcessManager, tmp_path: Path) -> None:
    state = pm.start(
        "k",
        ["true"],
        env={},
        cwd=str(tmp_path / "nope"),
        stdout=tmp_path / "o",
        stderr=tmp_path / "e",
    )
    assert (state.pid, state.running, state.exit_code) == (None, False, 1)
    assert "working directory" in (tmp_path / "e").read_text()
    assert str(tmp_path / "nope") in (tmp_path / "e").read_text()


def test_command_not_found_and_not_executable(pm: ProcessManager, tmp_path: Path) -> None:
    out, err = tmp_path / "o", tmp_path / "e"
    missing = pm.start(
        "a", ["no-such-cmd-xyz"], env={"PATH": "/bin"}, cwd=str(tmp_path), stdout=out, stderr=err
    )
    assert missing.exit_code == 127
    script = tmp_path / "s.sh"
    script.write_text("#!/bin/sh\n")
    denied = pm.start("b", [str(script)], env={}, cwd=str(tmp_path), stdout=out, stderr=err)
    assert denied.exit_code == 126
    errors = (tmp_path / "e").read_text()
    assert "no-such-cmd-xyz: command not found" in errors
    assert "permission denied" in errors


def test_one_file_for_both_streams(pm: ProcessManager, tmp_path: Path) -> None:
    log = tmp_path / "both.log"
    pm.start(
        "k",
        [sys.executable, "-c", "import sys; print('a', flush=True); print('b', file=sys.stderr)"],
        env={},
        cwd=str(tmp_path),
        stdout=log,
        stderr=log,
    )
    ended(pm)
    assert log.read_text() == "a\nb\n"


def test_stop_all_leaves_nothing(tmp_path: Path) -> None:
    pm = ProcessManager()
    pids = []
    for i in range(3):
        state = run(pm, tmp_path, "trap '' TERM; sleep 30", key=i)
        assert state.pid is not None
        pids.append(state.pid)
    pm.stop_all(0.3)
    assert [p for p in pids if pid_alive(p)] == []
    assert all(not s.running for s in pm.states().values())


def test_under_a_shim_it_ends_the_same_and_leaves_its_status(
    pm: ProcessManager, tmp_path: Path
) -> None:
    status = tmp_path / "procs" / "k.status"
    state = pm.start(
        "k",
        ["sh", "-c", "echo $$ > pid; trap 'exit 4' TERM; sleep 30 & wait"],
        env={"PATH": os.environ["PATH"]},
        cwd=str(tmp_path),
        stdout=tmp_path / "out",
        stderr=tmp_path / "err",
        status=status,
    )
    assert state.pid is not None and state.shim is not None and state.shim != state.pid
    # The job process itself leads its session and process group; the shim is outside.
    assert int(wait_for("its pid", lambda: _read(tmp_path / "pid"))) == state.pid
    assert os.getpgid(state.pid) == os.getsid(state.pid) == state.pid
    assert os.getpgid(state.shim) != state.pid
    assert stat.S_IMODE(status.stat().st_mode) == 0o600
    pm.send_signal("k", signal.SIGTERM)  # to the job's group: the shim is not in it
    done = ended(pm)
    assert (done.exit_code, done.signal) == (4, None)
    assert status.read_text() == "exit 4\n"
    assert not pid_alive(state.shim)

    killed = pm.start(
        "killed",
        ["sh", "-c", "kill -9 $$"],
        env={"PATH": os.environ["PATH"]},
        cwd=str(tmp_path),
        stdout=tmp_path / "out",
        stderr=tmp_path / "err",
        status=tmp_path / "procs" / "killed.status",
    )
    assert killed.shim is not None
    done = ended(pm, "killed")
    assert (done.exit_code, done.signal) == (None, 9)  # as without a shim
    assert (tmp_path / "procs" / "killed.status").read_text() == "signal 9\n"


def test_under_a_shim_a_command_that_cannot_start_fails_as_without(
    pm: ProcessManager, tmp_path: Path
) -> None:
    missing = pm.start(
        "a",
        ["no-such-cmd-xyz"],
        env={"PATH": "/bin"},
        cwd=str(tmp_path),
        stdout=tmp_path / "o",
        stderr=tmp_path / "e",
        status=tmp_path / "a.status",
    )
    assert (missing.pid, missing.exit_code) == (None, 127)
    assert "no-such-cmd-xyz: command not found" in (tmp_path / "e").read_text()


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None
