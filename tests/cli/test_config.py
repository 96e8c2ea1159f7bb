"""The client config: flag > environment > file, a 0600 file, clear errors."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest

from phalanx import __version__
from phalanx.client.api import FIRST_CONTACT_RETRY_S
from phalanx.client.config import (
    ConfigError,
    config_path,
    load_contexts,
    resolve,
    save,
    save_context,
)
from tests.cli.conftest import invoke, run_cli


def test_save_writes_owner_only_file(config_dir: Path) -> None:
    path = save("http://127.0.0.1:8265", "secret-token")
    assert path == config_dir / "config.json" == config_path()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = json.loads(path.read_text())
    assert stored == {
        "current": "default",
        "contexts": {"default": {"head": "http://127.0.0.1:8265", "token": "secret-token"}},
    }


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


def test_an_old_single_cluster_file_still_works_and_becomes_a_context(config_dir: Path) -> None:
    config_dir.mkdir(parents=True)
    (config_dir / "config.json").write_text('{"head": "http://old:1", "token": "old-token"}')
    assert resolve().head == "http://old:1"
    save_context("local", "http://new:2", "new-token")
    stored = load_contexts(config_path())
    assert stored.current == "local" and sorted(stored.contexts) == ["default", "local"]
    assert stored.contexts["default"] == {"head": "http://old:1", "token": "old-token"}


def test_contexts_list_use_add_remove_and_context_per_command(
    config_dir: Path, tmp_path: Path
) -> None:
    token = tmp_path / "tok"
    token.write_text("prod-token\n")
    save_context("local", "http://127.0.0.1:1", "local-token")
    added = invoke(
        "context",
        "add",
        "prod",
        "--head",
        "http://prod:8265/",
        "--token-file",
        str(token),
        "--no-use",
    )
    assert added.exit_code == 0, added.stderr
    assert resolve().head == "http://127.0.0.1:1"  # still the local one
    assert resolve(context="prod") == resolve(
        environ={"PHALANX_CONTEXT": "prod", "PHALANX_CONFIG_DIR": str(config_dir)}
    )
    assert (resolve(context="prod").head, resolve(context="prod").token) == (
        "http://prod:8265",
        "prod-token",
    )
    listed = invoke("context", "list").stdout
    assert re.search(r"\*\s+local\s+http://127.0.0.1:1", listed) and "prod" in listed
    assert "prod-token" not in listed and "local-token" not in listed

    # --context before or after the command picks the cluster; a missing one is one line.
    for args in (
        ("--context", "nope", "queue"),
        ("queue", "--context", "nope"),
        ("queue", "--context=nope"),
    ):
        proc = run_cli(*args)
        assert proc.returncode == 2
        assert proc.stderr.startswith("error: no context 'nope'") and "local, prod" in proc.stderr
    unreachable = run_cli("nodes", "--context", "prod")
    assert "http://prod:8265" in unreachable.stderr  # it went to prod's head

    assert invoke("context", "use", "prod").exit_code == 0
    assert resolve().head == "http://prod:8265"
    assert invoke("context", "use", "nope").exit_code == 2
    assert invoke("context", "remove", "prod").exit_code == 0
    assert sorted(load_contexts(config_path()).contexts) == ["local"]
    bad = invoke("context", "add", "no spaces", "--head", "http://x:1", "--token-file", str(token))
    assert bad.exit_code == 2 and "invalid context name" in bad.stderr


def test_version_and_completion_options() -> None:
    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"phalanx {__version__}"
    # Typer detects the shell from the parent processes (shellingham), which fails under a
    # parent that is no shell (nohup, some CI runners); its own switch takes the named one.
    no_detect = {"SHELL": "/bin/bash", "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    shown = run_cli("--show-completion", "bash", env=no_detect)
    assert shown.returncode == 0 and "complete" in shown.stdout, shown.stderr
    assert "--install-completion" in run_cli("--help").stdout


def test_typo_d_head_fails_without_the_long_retry(config_dir: Path, tmp_path: Path) -> None:
    from phalanx.local.cluster import free_port

    env = {"PHALANX_TOKEN": "t"}
    run = ("--", "true")
    # A name that does not resolve: no retry at all.
    unknown = run_cli(
        "submit", "--head", "http://no-such-head.invalid:8265", *run, env=env, cwd=tmp_path
    )
    assert unknown.returncode == 2
    assert "unknown host 'no-such-head.invalid'" in unknown.stderr
    assert "trying the submit again" not in unknown.stderr
    # Nothing listening, never reached: a short retry (a head restarting), said up front.
    url = f"http://127.0.0.1:{free_port()}"
    refused = run_cli("submit", "--head", url, *run, env=env, cwd=tmp_path)
    assert refused.returncode == 2 and f"cannot reach head at {url}" in refused.stderr
    assert f"trying the submit again for up to {FIRST_CONTACT_RETRY_S:.0f}s" in refused.stderr
    # An unclosed IPv6 bracket is named as such.
    bracket = run_cli("queue", "--head", "http://[::1", env=env)
    assert bracket.returncode == 2
    assert bracket.stderr.startswith("error: invalid head URL 'http://[::1': an IPv6 address")
