"""Usage errors are one `error: …` line, and `--help` is readable when piped (review minors
5, 7, 8 and 9)."""

from __future__ import annotations

import os
import re

import pytest

from tests.cli.conftest import invoke, run_cli


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("drain", "127.0.0.2"), "error: missing option '--reason' (see 'phalanx drain --help')"),
        (
            ("admin", "team", "set", "vision", "--quota", "-3"),
            "error: invalid value for '--quota': must be at least 0 "
            "(see 'phalanx admin team set --help')",
        ),
        (
            ("sim", "--synthetic", "10", "--trace", __file__),
            "error: give either --trace or --synthetic, not both (see 'phalanx sim --help')",
        ),
        (
            ("nodez",),
            "error: no such command 'nodez' (did you mean 'nodes'?) (see 'phalanx --help')",
        ),
        (
            ("submit", "--nodez", "2", "--", "true"),
            "error: no such option: --nodez (did you mean one of --nodelist, --nodes?) "
            "(see 'phalanx submit --help')",
        ),
        (
            ("queue", "extra"),
            "error: got unexpected extra argument(s) (extra) (see 'phalanx queue --help')",
        ),
    ],
)
def test_usage_errors_are_one_line(args: tuple[str, ...], line: str) -> None:
    result = invoke(*args)
    assert (result.exit_code, result.stderr, result.stdout) == (2, line + "\n", "")


def test_a_usage_error_of_the_installed_command_is_one_line() -> None:
    proc = run_cli("drain", "127.0.0.2")
    assert (proc.returncode, proc.stderr) == (
        2,
        "error: missing option '--reason' (see 'phalanx drain --help')\n",
    )


def test_submit_help_piped_names_every_option_in_full_with_its_kind() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TERMINAL_WIDTH", "COLUMNS")}
    proc = run_cli("submit", "--help", env=env)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    # At 80 columns Rich cut these to `--checkpoint-int…` and `--no-restart-on-fa…`.
    for name in (
        "--no-restart-on-failure",
        "--checkpoint-dir",
        "--preempt-grace",
        "--oversubscribe",
    ):
        assert name in text
    assert "…" not in text.replace("[FLAGS] -- CMD ARGS…", "").replace("VAR[=VALUE],…", "")

    def kind(option: str) -> str:
        """The type column of the option's row (`│ --nodes  -N  INTEGER  Number…`)."""
        row = re.search(rf"^│ {option} +(?:-[A-Za-z] +)?(\S+)", text, re.MULTILINE)
        assert row is not None, option
        return row.group(1)

    assert kind("--nodes") == "INTEGER"
    assert kind("--cpus-per-task") == "INTEGER"
    assert kind("--gpus-per-node") == "[TYPE:]INTEGER"
    assert kind("--mem") == "SIZE"
    assert kind("--time") == "TIME"
    assert "[{R|B}:]SIG[@SECONDS]" in text  # once taken for Rich markup and dropped
