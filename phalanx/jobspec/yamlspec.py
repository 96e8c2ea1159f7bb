"""YAML job files: JobSpec field names, plus the friendly Slurm-style forms."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import yaml

from phalanx.api.models import JobSpec
from phalanx.jobspec.build import assemble
from phalanx.jobspec.errors import JobSpecError
from phalanx.jobspec.options import SubmitOptions
from phalanx.jobspec.wording import did_you_mean


class _Loader(yaml.SafeLoader):
    """Safe YAML without YAML 1.1's traps for job files: `1:00:00` stays the text of a
    time limit (not the base-60 number 3600), `010` stays "010" (not octal 8), and a key
    given twice is an error instead of the last one silently winning."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Hashable] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                line = key_node.start_mark.line + 1
                raise JobSpecError(f"YAML line {line}: key {key!r} is given twice")
            if isinstance(key, Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_INT, re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"), list("-+0123456789"))
_Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)?\.[0-9_]+(?:[eE][-+][0-9]+)?$"),
    list("-+.0123456789"),
)


def _text(key: str, value: Any) -> str:
    """Strings as they are; whole numbers as their digits (`nodes: 2`, `mem: 4096`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise JobSpecError(f"{key}: expected text or a whole number, got {value!r}")


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise JobSpecError(f"{key}: expected true or false, got {value!r}")
    return value


def _text_or_list(key: str, value: Any) -> str:
    """`export: [ALL, FOO=1]`, `exclude: [n1, n2]`, `array: [1, 3]`: Slurm's comma list."""
    if isinstance(value, list):
        return ",".join(_text(key, item) for item in value)
    return _text(key, value)


# YAML key → SubmitOptions field and how to read the value.
_OPTION_KEYS: dict[str, tuple[str, Callable[[str, Any], str | bool]]] = {
    "name": ("job_name", _text), "job_name": ("job_name", _text),
    "launcher": ("launcher", _text), "nodes": ("nodes", _text), "ntasks": ("ntasks", _text),
    "ntasks_per_node": ("ntasks_per_node", _text), "gres": ("gres", _text),
    "gpus": ("gpus", _text), "gpus_per_node": ("gpus_per_node", _text),
    "gpus_per_task": ("gpus_per_task", _text), "cpus_per_task": ("cpus_per_task", _text),
    "mem": ("mem", _text), "time": ("time", _text), "team": ("partition", _text),
    "partition": ("partition", _text), "qos": ("qos", _text), "account": ("account", _text),
    "output": ("output", _text), "error": ("error", _text),
    "dependency": ("dependency", _text), "requeue": ("requeue", _flag),
    "exclusive": ("exclusive", _flag), "workdir": ("workdir", _text),
    "chdir": ("workdir", _text), "export": ("export", _text_or_list),
    "gpu_model": ("constraint", _text), "constraint": ("constraint", _text),
    "exclude": ("exclude", _text_or_list), "exclude_nodes": ("exclude", _text_or_list),
    "nodelist": ("nodelist", _text_or_list), "begin": ("begin", _text),
    "max_restarts": ("max_restarts", _text),
    "restart_on_failure": ("restart_on_failure", _flag),
    "checkpoint_dir": ("checkpoint_dir", _text), "preempt_signal": ("preempt_signal", _text),
    "preempt_grace": ("preempt_grace", _text), "hang_timeout": ("hang_timeout", _text),
    "notify_url": ("notify_url", _text), "mail_type": ("mail_type", _text_or_list),
    "mail_user": ("mail_user", _text),
}  # fmt: skip
# Keys taken in JobSpec's own wire form, checked by JobSpec itself.
_WIRE_KEYS = {
    "mem_mb", "time_limit_s", "env", "dependencies", "dependency_any", "preemptible",
    "preempt_grace_s", "hang_timeout_s", "notify_on",
}  # fmt: skip
_RUN_KEYS = {"command", "script"}
_SAME = [  # spellings of one thing: give one of each
    {"name", "job_name"}, {"time", "time_limit_s"}, {"mem", "mem_mb"},
    {"team", "partition"}, {"gpu_model", "constraint"}, {"workdir", "chdir"},
    {"dependency", "dependencies"}, {"exclude", "exclude_nodes"},
    {"preempt_grace", "preempt_grace_s"}, {"hang_timeout", "hang_timeout_s"},
    {"mail_type", "notify_on"},
]  # fmt: skip
ALLOWED_KEYS = frozenset({*_OPTION_KEYS, *_WIRE_KEYS, *_RUN_KEYS, "array", "signal"})


def load_yaml(text: str, *, cwd: str, environ: Mapping[str, str]) -> tuple[JobSpec, list[str]]:
    """Read a YAML job file into a JobSpec, and warnings, through the same path as flags.

    Keys are JobSpec field names (`-` may be written for `_`), or Slurm-style friendly
    forms: `time: "1-00:00:00"`, `mem: 4G`, `gres: gpu:h100:4`, `dependency: afterok:12`,
    `array: "0-3%2"`, `signal: B:USR1@120`, `preempt_grace: "2:00"`, `partition`, `export`,
    `exclude`, …
    `command` is a list or a string (split like a shell); `script` is the script's text.
    `env` is added on top of what `export` (default ALL) selects.
    """
    try:
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader: builds no objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise JobSpecError(f"invalid YAML{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise JobSpecError(f"invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise JobSpecError("a YAML job file must be a mapping of keys to values, e.g. nodes: 2")
    data = {str(key).replace("-", "_"): value for key, value in data.items()}
    unknown = sorted(set(data) - ALLOWED_KEYS)
    if unknown:
        named = ", ".join(key + did_you_mean(key, ALLOWED_KEYS) for key in unknown)
        raise JobSpecError(
            f"unknown key(s) in the YAML job file: {named}; allowed keys: "
            + ", ".join(sorted(ALLOWED_KEYS))
        )
    for same in _SAME:
        given = sorted(same & set(data))
        if len(given) > 1:
            raise JobSpecError(f"give only one of {' and '.join(given)}: they mean the same")
    opts = SubmitOptions()
    extras: dict[str, Any] = {key: data[key] for key in _WIRE_KEYS & set(data)}
    for key, value in data.items():
        if key in _OPTION_KEYS:
            field, read = _OPTION_KEYS[key]
            setattr(opts, field, read(key, value))
        elif key in ("array", "signal"):
            if isinstance(value, dict):
                extras[key] = value  # the wire form: {indices: [...], max_parallel: 2}
            else:
                setattr(opts, key, _text_or_list(key, value))
    if "env" in extras:
        extras["env"] = _env(extras["env"])
    return assemble(
        opts,
        command=_command(data.get("command")),
        script=_script(data.get("script")),
        cwd=cwd,
        environ=environ,
        extras=extras,
    )


def _command(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise JobSpecError(f"command: cannot split {value!r}: {exc}") from None
    if isinstance(value, list) and all(isinstance(item, str | int | float) for item in value):
        return [item if isinstance(item, str) else str(item) for item in value]
    raise JobSpecError("command: give a list of arguments or one string, e.g. [python, train.py]")


def _script(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise JobSpecError("script: give the script's text, e.g. with `script: |`")


def _env(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise JobSpecError("env: give a mapping of NAME: value")
    env: dict[str, str] = {}
    for name, item in value.items():
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise JobSpecError(f"env: the value of {name} must be text or a number, got {item!r}")
        env[str(name)] = item if isinstance(item, str) else str(item)
    return env
