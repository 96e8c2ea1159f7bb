"""The command line (and environment) that starts a deployment's engine in one replica.

Phalanx never imports an engine: the replica wrapper (phalanx.serve.replica) runs the argv
built here as its child. The engine's API key never goes on the command line (a node's
process table is world-readable): llama-server reads it from a 0600 file
(`--api-key-file`), vLLM from its environment (`VLLM_API_KEY`), a custom engine from
`PHALANX_ENGINE_KEY` or the `{key_file}` placeholder (`{key}` works too, at that cost).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from phalanx.api.serving import DeploymentSpec, Engine, PoolSpec

# vLLM's KV connector for disaggregated pools (prefill → decode over NIXL): prefill
# replicas produce KV, decode replicas consume it (vLLM 0.32 deprecates `kv_both` there).
NIXL_KV_CONFIG = {
    role: json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role})
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer"))
}
KEY_ENV = "PHALANX_ENGINE_KEY"  # a custom engine's key
VLLM_KEY_ENV = "VLLM_API_KEY"
NIXL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
# Where the decode replica reaches the prefill replica's NIXL side channel: vLLM puts it in
# the prefill answer's kv_transfer_params (default `localhost`: one node only).
NIXL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"


@dataclass(frozen=True)
class EngineLaunch:
    """What the wrapper starts: `argv`, with `env` added to its own environment."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


def served_model_name(spec: DeploymentSpec) -> str:
    """The name clients put in the OpenAI `model` field."""
    return spec.served_model_name or spec.name


def engine_command(
    spec: DeploymentSpec,
    pool: PoolSpec,
    *,
    host: str,
    port: int,
    key: str,
    key_file: str,
    side_channel_port: int | None = None,
) -> EngineLaunch:
    """The engine's argv and extra environment for one replica of `pool` listening on
    `host:port` with API key `key` (written by the caller to `key_file`, mode 0600).
    `side_channel_port`: vLLM's NIXL side channel, for prefill/decode pools."""
    disaggregated = pool.role != "aggregated"
    name = served_model_name(spec)
    if spec.engine == "llama.cpp":
        argv = [spec.engine_path, "-m", spec.model, "--host", host, "--port", str(port)]
        argv += ["-np", str(pool.slots), "--api-key-file", key_file, "--metrics"]
        argv += ["--alias", name]
        if disaggregated and spec.handoff_dir:
            argv += ["--slot-save-path", spec.handoff_dir]
        return EngineLaunch(tuple([*argv, *pool.args]))
    if spec.engine == "vllm":
        argv = [spec.engine_path, "-m", "vllm.entrypoints.openai.api_server"]
        argv += ["--model", spec.model, "--host", host, "--port", str(port)]
        argv += ["--served-model-name", name, "--max-num-seqs", str(pool.slots)]
        env = {VLLM_KEY_ENV: key}
        if disaggregated:
            argv += ["--kv-transfer-config", NIXL_KV_CONFIG[pool.role]]
            env[NIXL_HOST_ENV] = host
            if side_channel_port is not None:
                env[NIXL_PORT_ENV] = str(side_channel_port)
        return EngineLaunch(tuple([*argv, *pool.args]), env)
    values = {
        "{host}": host,
        "{port}": str(port),
        "{model}": spec.model,
        "{key}": key,
        "{key_file}": key_file,
    }
    argv = [spec.engine_path, *(_fill(a, values) for a in spec.command), *pool.args]
    return EngineLaunch(tuple(argv), {KEY_ENV: key})


def _fill(arg: str, values: Mapping[str, str]) -> str:
    for placeholder, value in values.items():
        arg = arg.replace(placeholder, value)
    return arg


def health_paths(engine: Engine) -> tuple[str, ...]:
    """Where the engine says it is ready (200), in the order the wrapper asks."""
    if engine == "custom":
        return ("/health", "/v1/models")
    return ("/health",)
