"""The client config: flag > environment > file, a 0600 file, clear errors."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from phalanx.client.config import ConfigError, config_path, resolve, save
from tests.cli.conftest import run_cli


def test_save_writes_owner_only_file(config_dir: Path) -> None:
    path = save("http://127.0.0.1:8265", "secret-token")
    assert path == config_dir / "config.json" == config_path()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = json.loads(path.read_text())
    assert stored == {"head": "http://127.0.0.1:8265", "token": "secret-token"}


def test_flag_beats_environment_beats_file(config_dir: Path) -> None:
    save("http://file:1/", "file-token")
    assert resolve() == resolve(environ={"PHALANX_CONFIG_DIR": str(config_dir)})
    from_file = resolve()
    assert (from_file.head, from_file.token) == ("http://file:1", "file-token")
    env = {"PHALANX_CONFIG_DIR": str(config_dir), "PHALANX_HEAD": "http://env:2"}
    mixed = resolve(environ=env)
    assert (mixed.head, mixed.token) == ("http://env:2", "file-token")
    env["PHALANX_TOKEN"] = "env-token"
    flagged = resolve(head="http://flag:3", environ=env)
    assert (flagged.head, flagged.token) == ("http://flag:3", "env-token")
    both = resolve(head="http://flag:3", token="flag-token", environ=env)
    assert (both.head, both.token) == ("http://flag:3", "flag-token")


def test_nothing_configured_says_what_to_do(config_dir: Path) -> None:
    with pytest.raises(ConfigError, match="phalanx up") as info:
        resolve()
    assert "--head" in str(info.value) and "--token" in str(info.value)
    with pytest.raises(ConfigError, match="no token"):
        resolve(head="http://127.0.0.1:1")


def test_broken_config_file_is_named(config_dir: Path) -> None:
    config_dir.mkdir(parents=True)
    (config_dir / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"config\.json is not valid JSON"):
        resolve()
    (config_dir / "config.json").write_text('{"head": 5, "token": "x"}')
    with pytest.raises(ConfigError, match="'head' must be a non-empty string"):
        resolve()


def test_cli_without_config_or_head_exits_2_with_one_line(config_dir: Path) -> None:
    proc = run_cli("queue")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: no head URL and no token configured")
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_unreachable_head_is_a_clear_error(config_dir: Path) -> None:
    from phalanx.local.cluster import free_port

    url = f"http://127.0.0.1:{free_port()}"
    proc = run_cli("nodes", "--head", url, env={"PHALANX_TOKEN": "t"})
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: cannot reach head at {url}")
    assert "Traceback" not in proc.stderr
