"""`phalanx slurm-pool` and `phalanx agent --on-sigterm`: bad flags are one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from phalanx.cli.main import app


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.stderr


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "join.token"
    path.write_text("phx_join_x\n")
    path.chmod(0o600)
    return path


POOL = ["slurm-pool", "--head", "https://127.0.0.1:1", "--gpus-per-node", "2"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--min", "3", "--max", "2"], "--min 3 is more than --max 2"),
        (
            ["--time", "1:00:00", "--leave-before", "60", "--leave-grace", "90"],
            "--leave-grace 90 must be less than --leave-before 60",
        ),
        (["--state-root", "relative/dir"], "--state-root must be an absolute path"),
        (["--name", "a b"], "--name 'a b': letters, digits, - and _ only"),
        (["--sbatch-arg", "account=ml"], "--sbatch-arg: 'account=ml' is not an option"),
        (["--agent-arg=--x\n#SBATCH --y"], "--agent-arg"),
        (["--phalanx-command", "   "], "--phalanx-command is empty"),
        (["--address", "iface:a b"], "--address 'iface:a b': not an interface name"),
    ],
)
def test_bad_pool_flags_are_one_line_errors(
    token_file: Path, flags: list[str], message: str
) -> None:
    code, err = invoke(*POOL, "--join-token-file", str(token_file), *flags)
    assert code == 2
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_the_join_token_file_must_be_readable_absolute_and_not_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    code, err = invoke(*POOL, "--join-token-file", str(empty))
    assert code == 2 and f"the join token file {empty} is empty" in err
    code, err = invoke(*POOL, "--join-token-file", str(tmp_path / "missing"))
    assert code == 2 and "cannot read the join token file" in err
    code, err = invoke(*POOL, "--join-token-file", "join.token")
    assert code == 2 and "must be an absolute path" in err


def test_the_agent_refuses_an_unknown_on_sigterm(token_file: Path) -> None:
    code, err = invoke(
        "agent",
        "--head",
        "https://127.0.0.1:1",
        "--address",
        "127.0.0.1",
        "--token-file",
        str(token_file),
        "--on-sigterm",
        "pause",
    )
    assert code == 2 and "--on-sigterm must be `stop` or `leave` (got 'pause')" in err
