"""`phalanx serve router --deployment D` without --head/--token-file takes the client
context's head and token, as every `phalanx` command; with none, one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from phalanx.cli.main import app
from phalanx.cli.serve_router import _from_context


def test_a_router_with_no_head_and_no_context_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("PHALANX_HEAD", "PHALANX_TOKEN", "PHALANX_CONTEXT", "PHALANX_CA_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PHALANX_CONFIG_DIR", str(tmp_path))
    r = CliRunner().invoke(app, ["serve", "router", "--deployment", "smol"])
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: ") and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_a_router_takes_the_head_from_the_context_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("PHALANX_HEAD", "PHALANX_TOKEN", "PHALANX_CONTEXT", "PHALANX_CA_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PHALANX_CONFIG_DIR", str(tmp_path))
    lab = {"head": "https://10.0.0.1:8265", "token": "t-lab", "ca": "/etc/lab-ca.pem"}
    config = {"current": "lab", "contexts": {"lab": lab}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert _from_context(None, None, None) == ("https://10.0.0.1:8265", "t-lab", "/etc/lab-ca.pem")
    # Flags (and $PHALANX_CA_FILE, passed in as `ca`) still win over the context.
    assert _from_context("https://h:1", None, "/ca.pem") == ("https://h:1", "t-lab", "/ca.pem")
