"""--export: the job's environment, without secrets or another job's variables."""

from __future__ import annotations

from phalanx.jobspec import SubmitOptions, build_spec

SUBMIT_ENV = {
    "HOME": "/home/ada",
    "PATH": "/usr/bin:/bin",
    "KEYBOARD": "us",  # contains KEY, but is not a *_KEY name
    "PHALANX_HEAD": "http://127.0.0.1:8265",
    "PHALANX_TOKEN": "phx_secret",
    "PHALANX_JOB_ID": "12",
    "HF_TOKEN": "hf_secret",
    "WANDB_API_KEY": "wb_secret",
    "DB_PASSWORD": "pw",
    "my_ssh_key": "k",
    "GIT_CREDENTIALS": "c",
    "LDAP_PASSWD": "p",
    "CLIENT_SECRET_FILE": "s",
    "SLURM_JOB_ID": "99",
    "SLURM_NODELIST": "n[1-2]",
    "RANK": "3",
    "LOCAL_RANK": "3",
    "WORLD_SIZE": "8",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "BASH_FUNC_module%%": "() { :; }",
}
SECRETS = (
    "CLIENT_SECRET_FILE,DB_PASSWORD,GIT_CREDENTIALS,HF_TOKEN,LDAP_PASSWD,WANDB_API_KEY,my_ssh_key"
)


def _env(export: str | None) -> tuple[dict[str, str], list[str]]:
    spec, warnings = build_spec(
        SubmitOptions(export=export), command=["x"], script=None, cwd="/", environ=SUBMIT_ENV
    )
    return spec.env, warnings


def test_default_is_all_without_secrets_and_per_job_variables() -> None:
    env, warnings = _env(None)
    assert env == {
        "HOME": "/home/ada",
        "PATH": "/usr/bin:/bin",
        "KEYBOARD": "us",
        "PHALANX_HEAD": "http://127.0.0.1:8265",
    }
    assert warnings == [
        f"not exported because they look like secrets: {SECRETS}; pass one on purpose with "
        "--export=ALL,NAME"
    ]
    assert not any(value in w for w in warnings for value in ("hf_secret", "wb_secret", "pw"))
    assert _env("ALL") == (env, warnings)


def test_none_exports_nothing() -> None:
    assert _env("NONE") == ({}, [])
    assert _env("none")[0] == {}


def test_all_plus_assignments_and_named_secrets() -> None:
    env, _ = _env("ALL,FOO=bar,HF_TOKEN,EMPTY=")
    assert env["FOO"] == "bar"
    assert env["EMPTY"] == ""
    assert env["HF_TOKEN"] == "hf_secret"  # named on purpose: exported
    assert "PATH" in env and "SLURM_JOB_ID" not in env


def test_a_list_without_all_exports_only_what_it_names() -> None:
    env, warnings = _env("PATH,BAR=1,MISSING")
    assert env == {"PATH": "/usr/bin:/bin", "BAR": "1"}
    assert warnings == ["--export: MISSING is not set in the submit environment; skipped"]
    assert _env("NONE,BAR=2")[0] == {"BAR": "2"}


def test_phalanx_token_is_never_exported() -> None:
    env, warnings = _env("ALL,PHALANX_TOKEN")
    assert "PHALANX_TOKEN" not in env
    assert "--export: PHALANX_TOKEN is never passed to jobs; dropped" in warnings
    env, _ = _env("PHALANX_TOKEN=abc")
    assert env == {}
