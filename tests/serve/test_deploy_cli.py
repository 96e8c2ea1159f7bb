"""`phalanx serve apply FILE`: a bad deployment file is one line naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from phalanx.cli.main import app

GOOD = """\
name: chat
engine: llama.cpp
model: /models/m.gguf
engine_path: /opt/llama-server
pools:
  - replicas: 2
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("replicas: 2", "replicas: -1"), "pools.0.replicas"),
        (GOOD.replace("replicas: 2", "replicas: lots"), "pools.0.replicas"),
        (GOOD.replace("engine: llama.cpp", "engine: tgi"), "engine"),
        (GOOD.replace("name: chat", "name: Chat_1"), "name"),
        (GOOD.replace("model: /models/m.gguf\n", ""), "model"),
        (GOOD + "colour: blue\n", "colour"),
        (GOOD.replace("  - replicas: 2", "  - role: prefill"), "one `aggregated` pool"),
        ("name: [unclosed\n", "not valid YAML"),
        ("- just\n- a list\n", "expected a mapping"),
    ],
)
def test_a_bad_file_is_one_error_line_naming_the_field(
    tmp_path: Path, text: str, expected: str
) -> None:
    file = tmp_path / "deploy.yaml"
    file.write_text(text)
    env = {"PHALANX_HEAD": "http://127.0.0.1:9", "PHALANX_TOKEN": "x"}
    out = CliRunner().invoke(app, ["serve", "apply", str(file)], env=env)
    assert out.exit_code == 2
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {file}"), out.output
    assert expected in lines[0]


def test_a_missing_file_is_one_error_line(tmp_path: Path) -> None:
    out = CliRunner().invoke(app, ["serve", "apply", str(tmp_path / "nope.yaml")])
    assert out.exit_code == 2 and out.output.startswith("error: ") and "No such file" in out.output
    assert "Traceback" not in out.output
