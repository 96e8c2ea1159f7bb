"""`phalanx serve bench` / `serve calibrate` refuse bad input with one line, no traceback."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from phalanx.cli.main import app
from phalanx.local.cluster import free_port


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["serve", "calibrate", "--url", "U", "--model", "m", "--lengths", "1,x"],
            "--lengths must be comma-separated integers",
        ),
        (
            ["serve", "calibrate", "--url", "U", "--model", "m", "--batches", "9"],
            "batch sizes must be in [1, slots=4]",
        ),
        (["serve", "calibrate", "--url", "nope", "--model", "m"], "url must start with http://"),
        (
            ["serve", "calibrate", "--url", "U", "--model", "m", "--lengths", "0"],
            "needs 1 to 32 integers",
        ),
        (
            ["serve", "calibrate", "--url", "U", "--model", "m"],
            "a calibration request failed: ConnectError",
        ),
        (["serve", "bench", "--url", "ftp://x", "--model", "m"], "url must start with http://"),
        (
            ["serve", "bench", "--url", "U", "--model", "m", "--trace-time"],
            "--trace-time needs a trace workload",
        ),
        (
            ["serve", "bench", "--url", "U", "--model", "m", "--slo-tpot-ms", "0"],
            "--slo-tpot-ms must be a positive number",
        ),
        (
            ["serve", "bench", "--url", "U", "--model", "m", "--token-file", "/nonexistent"],
            "--token-file /nonexistent: cannot read it",
        ),
    ],
)
def test_bad_input_is_one_line(args: list[str], message: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    out = CliRunner().invoke(app, [url if a == "U" else a for a in args])
    assert out.exit_code == 2, out.output
    assert out.output.startswith("error: ") and message in out.output, out.output
    assert out.output.count("\n") == 1, out.output  # one line, nothing after it
