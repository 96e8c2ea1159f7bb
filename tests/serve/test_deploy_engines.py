"""Engine command lines (phalanx.serve.engines) and the controller's pure rules."""

from __future__ import annotations

from phalanx.api.serving import DeploymentSpec, PoolSpec
from phalanx.head.serving_control import MAX_BACKOFF_S, backoff_s, shape
from phalanx.serve.engines import NIXL_KV_CONFIG, engine_command, health_paths

KEY = "k3y-s3cret"


def deployment(engine: str, pools: list[PoolSpec], **kw: object) -> DeploymentSpec:
    fields: dict[str, object] = {
        "name": "chat",
        "engine": engine,
        "model": "/models/m.gguf",
        "engine_path": "/opt/llama-server",
        "pools": pools,
        **kw,
    }
    return DeploymentSpec.model_validate(fields)


def test_llama_cpp_reads_its_key_from_a_file_never_from_argv() -> None:
    spec = deployment("llama.cpp", [PoolSpec(slots=3, args=["-t", "1"])], served_model_name="m")
    launch = engine_command(
        spec, spec.pools[0], host="10.0.0.5", port=8123, key=KEY, key_file="/run/k"
    )
    assert launch.argv == (
        "/opt/llama-server", "-m", "/models/m.gguf", "--host", "10.0.0.5", "--port", "8123",
        "-np", "3", "--api-key-file", "/run/k", "--metrics", "--alias", "m", "-t", "1",
    )  # fmt: skip
    assert KEY not in " ".join(launch.argv) and dict(launch.env) == {}


def test_disaggregated_llama_cpp_pools_save_slots_to_the_handoff_dir() -> None:
    spec = deployment(
        "llama.cpp",
        [PoolSpec(role="prefill"), PoolSpec(role="decode")],
        handoff_dir="/shared/handoff",
    )
    for pool in spec.pools:
        argv = engine_command(spec, pool, host="h", port=1, key=KEY, key_file="/k").argv
        assert argv[argv.index("--slot-save-path") + 1] == "/shared/handoff"
        assert argv[argv.index("--alias") + 1] == "chat"  # default: the deployment's name


def test_vllm_gets_its_key_from_the_environment_and_nixl_for_disaggregation() -> None:
    agg = deployment("vllm", [PoolSpec(slots=8)], engine_path="/venv/bin/python", model="m")
    launch = engine_command(agg, agg.pools[0], host="h", port=9, key=KEY, key_file="/k")
    assert launch.argv[:3] == ("/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server")
    assert launch.argv[launch.argv.index("--max-num-seqs") + 1] == "8"
    assert "--kv-transfer-config" not in launch.argv and KEY not in launch.argv
    assert dict(launch.env) == {"VLLM_API_KEY": KEY}
    dis = deployment(
        "vllm", [PoolSpec(role="prefill"), PoolSpec(role="decode")], engine_path="/p", model="m"
    )
    launch = engine_command(
        dis, dis.pools[0], host="h", port=9, key=KEY, key_file="/k", side_channel_port=5600
    )
    config = launch.argv[launch.argv.index("--kv-transfer-config") + 1]
    assert config == NIXL_KV_CONFIG["prefill"] and '"kv_role": "kv_producer"' in config
    assert launch.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert launch.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "h"
    launch = engine_command(dis, dis.pools[1], host="h", port=9, key=KEY, key_file="/k")
    config = launch.argv[launch.argv.index("--kv-transfer-config") + 1]
    assert config == NIXL_KV_CONFIG["decode"] and '"kv_role": "kv_consumer"' in config


def test_custom_commands_get_their_placeholders_filled() -> None:
    spec = deployment(
        "custom",
        [PoolSpec(args=["--extra"])],
        engine_path="/bin/server",
        command=["serve", "{model}", "--bind={host}:{port}", "--key-file", "{key_file}"],
    )
    launch = engine_command(spec, spec.pools[0], host="h", port=7, key=KEY, key_file="/k")
    assert launch.argv == (
        "/bin/server", "serve", "/models/m.gguf", "--bind=h:7", "--key-file", "/k", "--extra",
    )  # fmt: skip
    assert launch.env["PHALANX_ENGINE_KEY"] == KEY
    assert health_paths("custom") == ("/health", "/v1/models")
    assert health_paths("llama.cpp") == ("/health",)


def test_replacements_back_off_exponentially_after_the_first() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 4)] == [0.0, 2.0, 4.0, 8.0]
    assert backoff_s(50) == MAX_BACKOFF_S


def test_replica_counts_and_slos_are_not_part_of_what_replicas_run() -> None:
    a = deployment("llama.cpp", [PoolSpec(replicas=2)])
    scaled = deployment("llama.cpp", [PoolSpec(replicas=5, min_replicas=1, max_replicas=9)])
    changed = deployment("llama.cpp", [PoolSpec(replicas=2, args=["-c", "4096"])])
    assert shape(a) == shape(scaled)
    assert shape(a) != shape(changed)
