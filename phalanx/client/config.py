"""The client config file (`config.json`: head URL + token) and flag > env > file resolution."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import typer

from phalanx.tls import CA_FILE_ENV

CONFIG_DIR_ENV = "PHALANX_CONFIG_DIR"
HEAD_ENV = "PHALANX_HEAD"
TOKEN_ENV = "PHALANX_TOKEN"


class ConfigError(Exception):
    """The client config is missing, unreadable or incomplete; the message says what to do."""


@dataclass(frozen=True)
class ClientConfig:
    """Where the head is and the API token to use with it. `head` may list several heads,
    comma-separated (a leader and its standbys); PhalanxClient takes the string as is."""

    head: str
    token: str
    ca: str | None = None  # the CA certificate file to pin (a head with its own CA)

    @property
    def heads(self) -> list[str]:
        """Each head URL of `head`, in order."""
        return self.head.split(",")


def config_dir(environ: Mapping[str, str] | None = None) -> Path:
    """`$PHALANX_CONFIG_DIR`, else the per-user app dir (`~/.config/phalanx` on Linux)."""
    env = os.environ if environ is None else environ
    value = env.get(CONFIG_DIR_ENV)
    return Path(value) if value else Path(typer.get_app_dir("phalanx"))


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    """The client config file: `config_dir()/config.json`."""
    return config_dir(environ) / "config.json"


def load_file(path: Path) -> dict[str, str]:
    """The `head`, `token` and `ca` stored in `path`; {} if the file does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read the client config {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ConfigError(f'{path} must hold a JSON object {{"head": URL, "token": TOKEN}}')
    out: dict[str, str] = {}
    for key in ("head", "token", "ca"):
        value = data.get(key)
        if value is None:
            continue
        if key == "head" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)  # several heads: ["http://h1:8265", "http://h2:8265"]
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{path}: {key!r} must be a non-empty string")
        out[key] = value
    return out


def save(head: str, token: str, path: Path | None = None, ca: str | None = None) -> Path:
    """Write the config file readable by its owner only (0600; the token is a secret).
    `ca`: the CA certificate file the client pins (the head's own CA)."""
    target = config_path() if path is None else path
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    # Create the temporary file 0600 from the start, so the token is never world-readable.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            data = {"head": head, "token": token} | ({"ca": ca} if ca else {})
            json.dump(data, f, indent=2)
            f.write("\n")
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def resolve(
    head: str | None = None,
    token: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> ClientConfig:
    """Head URL(s) and token, each from the flag, else `PHALANX_HEAD`/`PHALANX_TOKEN`, else
    the file. Several heads are comma-separated (`URL1,URL2`) or, in the file, a list.
    The CA to pin comes from `PHALANX_CA_FILE`, else the file's `ca` (else the system's
    trust store).

    Raises ConfigError naming what is missing and how to provide it.
    """
    env = os.environ if environ is None else environ
    head = head or env.get(HEAD_ENV) or None
    token = token or env.get(TOKEN_ENV) or None
    path = config_path(env)
    ca = env.get(CA_FILE_ENV) or None
    if head is None or token is None or ca is None:
        stored = load_file(path)
        head = head or stored.get("head")
        token = token or stored.get("token")
        ca = ca or stored.get("ca")
    missing = [name for name, value in (("head URL", head), ("token", token)) if not value]
    if missing or head is None or token is None:
        raise ConfigError(
            f"no {' and no '.join(missing)} configured: run `phalanx up` to start a local "
            f"cluster, or pass --head URL --token-file FILE (or set {HEAD_ENV}/{TOKEN_ENV}, "
            f"or write {path})"
        )
    return ClientConfig(head=normalize_heads(head), token=token, ca=ca)


def normalize_heads(head: str) -> str:
    """`URL` or `URL1,URL2,…` without blanks and trailing slashes; ConfigError if a URL of
    the list is empty."""
    urls = [url.strip().rstrip("/") for url in head.split(",")]
    if not all(urls):
        raise ConfigError(f"head URL list {head!r} has an empty entry: expected URL1,URL2,…")
    return ",".join(urls)
