"""Python client for the Phalanx head's REST API, and the client config file."""

from phalanx.client.api import ApiError, HeadUnreachable, PhalanxClient, new_idempotency_key
from phalanx.client.config import ClientConfig, ConfigError, config_path, resolve, save

__all__ = [
    "ApiError",
    "ClientConfig",
    "ConfigError",
    "HeadUnreachable",
    "PhalanxClient",
    "config_path",
    "new_idempotency_key",
    "resolve",
    "save",
]
