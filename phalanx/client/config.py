"""The client config file (`config.json`: named contexts of head URL + token + CA, one in use)
and flag > env > context resolution."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
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


CONTEXT_ENV = "PHALANX_CONTEXT"
DEFAULT_CONTEXT = "default"  # the name an old single-cluster config file's entry gets
_CONTEXT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_FIELDS = ("head", "token", "ca")


@dataclass
class Contexts:
    """The config file: named clusters (head URL, token, CA) and the one in use, like
    kubectl's contexts."""

    current: str | None = None
    contexts: dict[str, dict[str, str]] = field(default_factory=dict)


def check_context_name(name: str) -> str:
    """`name` if it is a valid context name, else ConfigError."""
    if not _CONTEXT_NAME.match(name):
        raise ConfigError(
            f"invalid context name {name!r}: 1–64 letters, digits, '_', '.', '@' or '-', "
            "starting with a letter or digit"
        )
    return name


def load_contexts(path: Path) -> Contexts:
    """The contexts stored in `path` (none if it does not exist). A file of the old single
    form (`{"head", "token", "ca"}`) reads as one context named "default", in use."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Contexts()
    except OSError as exc:
        raise ConfigError(f"cannot read the client config {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ConfigError(f'{path} must hold a JSON object {{"contexts": {{NAME: {{...}}}}}}')
    if "contexts" not in data:
        single = _entry(path, DEFAULT_CONTEXT, data)
        return Contexts(DEFAULT_CONTEXT, {DEFAULT_CONTEXT: single}) if single else Contexts()
    raw = data["contexts"]
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: 'contexts' must be an object of NAME: {{head, token, ca}}")
    current = data.get("current")
    if current is not None and not isinstance(current, str):
        raise ConfigError(f"{path}: 'current' must be a context name")
    return Contexts(current, {str(k): _entry(path, str(k), v) for k, v in raw.items()})


def _entry(path: Path, name: str, data: object) -> dict[str, str]:
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: context {name!r} must be an object {{head, token, ca}}")
    out: dict[str, str] = {}
    for key in _FIELDS:
        value = data.get(key)
        if value is None:
            continue
        if key == "head" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)  # several heads: ["http://h1:8265", "http://h2:8265"]
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{path}: {key!r} must be a non-empty string")
        out[key] = value
    return out


def load_file(path: Path, context: str | None = None) -> dict[str, str]:
    """The `head`, `token` and `ca` of context `context` (default: the one in use) in
    `path`; {} if the file does not exist or no context is in use. ConfigError if a
    context asked for by name is not there."""
    stored = load_contexts(path)
    name = context or stored.current
    if name is None:
        return {}
    if name not in stored.contexts:
        if context is None:
            return {}
        known = ", ".join(sorted(stored.contexts)) or "none"
        raise ConfigError(
            f"no context {name!r} in {path} (contexts: {known}; `phalanx context list`)"
        )
    return stored.contexts[name]


def write_contexts(stored: Contexts, path: Path | None = None) -> Path:
    """Write the config file readable by its owner only (0600; tokens are secrets)."""
    target = config_path() if path is None else path
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    # Create the temporary file 0600 from the start, so a token is never world-readable.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"current": stored.current, "contexts": stored.contexts}, f, indent=2)
            f.write("\n")
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def save_context(
    name: str,
    head: str,
    token: str,
    path: Path | None = None,
    ca: str | None = None,
    use: bool = True,
) -> Path:
    """Add or replace context `name` (the other contexts are kept) and, with `use`, make it
    the one in use."""
    check_context_name(name)
    target = config_path() if path is None else path
    stored = load_contexts(target)
    stored.contexts[name] = {"head": head, "token": token} | ({"ca": ca} if ca else {})
    if use or stored.current is None:
        stored.current = name
    return write_contexts(stored, target)


def save(head: str, token: str, path: Path | None = None, ca: str | None = None) -> Path:
    """Store head and token as the context "default", in use (see save_context)."""
    return save_context(DEFAULT_CONTEXT, head, token, path, ca)


def resolve(
    head: str | None = None,
    token: str | None = None,
    environ: Mapping[str, str] | None = None,
    context: str | None = None,
) -> ClientConfig:
    """Head URL(s) and token, each from the flag, else `PHALANX_HEAD`/`PHALANX_TOKEN`, else
    the config file's context in use. A context named by `context` (`--context`) or
    `PHALANX_CONTEXT` wins over those two variables (flags still win over it). Several
    heads are comma-separated (`URL1,URL2`) or, in the file, a list. The CA to pin comes
    from `PHALANX_CA_FILE`, else the context's `ca` (else the system's trust store).

    Raises ConfigError naming what is missing and how to provide it.
    """
    env = os.environ if environ is None else environ
    context = context or env.get(CONTEXT_ENV) or None
    path = config_path(env)
    if context is not None:
        stored = load_file(path, check_context_name(context))
        head = head or stored.get("head")
        token = token or stored.get("token")
        ca = env.get(CA_FILE_ENV) or stored.get("ca")
    else:
        head = head or env.get(HEAD_ENV) or None
        token = token or env.get(TOKEN_ENV) or None
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
            f"or `phalanx context add`)"
        )
    return ClientConfig(head=normalize_heads(head), token=token, ca=ca)


def normalize_heads(head: str) -> str:
    """`URL` or `URL1,URL2,…` without blanks and trailing slashes; ConfigError if a URL of
    the list is empty."""
    urls = [url.strip().rstrip("/") for url in head.split(",")]
    if not all(urls):
        raise ConfigError(f"head URL list {head!r} has an empty entry: expected URL1,URL2,…")
    return ",".join(urls)
