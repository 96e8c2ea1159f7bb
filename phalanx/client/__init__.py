"""Python client for the Phalanx head's REST API, and the client config file."""

from phalanx.client.api import ApiError, PhalanxClient
from phalanx.client.config import ClientConfig, ConfigError, config_path, resolve, save

__all__ = [
    "ApiError",
    "ClientConfig",
    "ConfigError",
    "PhalanxClient",
    "config_path",
    "resolve",
    "save",
]
