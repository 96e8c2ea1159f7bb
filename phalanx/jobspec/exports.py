"""`--export`: which of the submit environment a job gets, without secrets."""

from __future__ import annotations

import re
from collections.abc import Mapping

from phalanx.jobspec.errors import JobSpecError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
# Set per job and per rank by the agent; a copy from the submit shell (say, a login node
# inside another job) would point the new job at the wrong ranks, GPUs or rendezvous.
_PER_JOB_PREFIXES = (
    "SLURM_", "PHALANX_", "TORCHELASTIC_", "PET_", "OMPI_COMM_WORLD_", "PMI_", "PMIX_",
)  # fmt: skip
_PER_JOB_NAMES = frozenset(
    {
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
        "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
        "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
    }
)  # fmt: skip
_KEPT_PHALANX = frozenset({"PHALANX_HEAD"})  # lets `phalanx` inside a job find the head
_NEVER = "PHALANX_TOKEN"  # the user's API credential is never stored with a job


def is_secret(name: str) -> bool:
    """Names that look like credentials: never copied from the submit environment."""
    upper = name.upper()
    return any(word in upper for word in _SECRET_WORDS) or upper.endswith("_KEY")


def is_per_job(name: str) -> bool:
    """Variables the agent sets for each job and rank (Slurm, Phalanx, torchrun, GPUs)."""
    if name in _KEPT_PHALANX:
        return False
    return name in _PER_JOB_NAMES or name.startswith(_PER_JOB_PREFIXES)


def export_env(export: str | None, environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The job's environment for `--export` (None: `ALL`), and warnings.

    `ALL`: the submit environment less secrets and per-job variables. `NONE`: nothing.
    A list (`ALL,FOO=bar`, `FOO,BAR=1`, `NONE,FOO`) adds `NAME=value` pairs and named
    variables taken from the submit environment; without `ALL` only those are exported,
    as in Slurm. A secret named explicitly is exported (the user asked for it), except
    PHALANX_TOKEN. Values cannot contain commas here; use the YAML `env` mapping for that.
    """
    items = ["ALL"] if export is None else [item.strip() for item in export.split(",")]
    upper = [item.upper() for item in items]
    if "ALL" in upper and "NONE" in upper:
        raise JobSpecError(f"--export={export}: ALL and NONE cannot be combined")
    warnings: list[str] = []
    env = _submit_environment(environ, warnings) if "ALL" in upper else {}
    for item in items:
        if item.upper() in {"ALL", "NONE"}:
            continue
        name, eq, value = item.partition("=")
        if not _NAME.fullmatch(name):
            raise JobSpecError(
                f"--export={export}: {item!r} is not NAME or NAME=value (names are letters, "
                "digits and _, not starting with a digit)"
            )
        if name == _NEVER:
            warnings.append(f"--export: {_NEVER} is never passed to jobs; dropped")
        elif eq:
            env[name] = value
        elif name in environ:
            env[name] = environ[name]
        else:
            warnings.append(f"--export: {name} is not set in the submit environment; skipped")
    return env, warnings


def _submit_environment(environ: Mapping[str, str], warnings: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    secrets: list[str] = []
    for name, value in environ.items():
        # Shell function exports (BASH_FUNC_f%%) and other odd names cannot be job env.
        if not _NAME.fullmatch(name) or is_per_job(name):
            continue
        if is_secret(name):
            if name != _NEVER:
                secrets.append(name)
            continue
        env[name] = value
    if secrets:
        names = ",".join(sorted(secrets))
        warnings.append(
            f"not exported because they look like secrets: {names}; pass one on purpose "
            f"with --export=ALL,NAME"
        )
    return env
