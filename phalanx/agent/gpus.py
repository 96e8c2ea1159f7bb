"""GPU discovery and telemetry: NVML (nvidia-ml-py) on real machines, a fake provider elsewhere."""

from __future__ import annotations

import importlib
import logging
import uuid
from collections.abc import Callable, Collection
from types import ModuleType
from typing import Any, Protocol, TypeVar

from phalanx.api.models import GpuInfo, GpuTelemetry

log = logging.getLogger(__name__)

T = TypeVar("T")

# Stable namespace for fake GPU UUIDs, so a node keeps its GPU identities across restarts.
_FAKE_NAMESPACE = uuid.UUID("6f1c2a52-7d4e-4d7b-9a61-3c1f7e0c9b11")
_HINT = "to run this agent without GPUs, pass --fake-gpus N (and --gpu-model MODEL)"


class GpuError(RuntimeError):
    """GPUs cannot be discovered; the message tells the user what to do."""


class GpuProvider(Protocol):
    """Where the agent learns about its GPUs. Implementations never raise from telemetry()."""

    def inventory(self) -> list[GpuInfo]:
        """The node's GPUs, index order."""
        ...

    def telemetry(self) -> list[GpuTelemetry]:
        """Current readings per GPU; a reading the device cannot give is None."""
        ...

    def close(self) -> None:
        """Release the provider's resources (NVML handle)."""
        ...


class FakeProvider:
    """GPUs that do not exist, for machines without any (tests, laptops, CPU clusters).

    UUIDs derive from the node name and index, so they are stable across restarts.
    Utilization is 100% on a GPU that `busy()` names (a job's process holds it), else 0.
    """

    def __init__(
        self,
        count: int,
        model: str = "H100",
        memory_mb: int = 81559,
        *,
        node_name: str = "node",
        busy: Callable[[], Collection[int]] | None = None,
    ) -> None:
        if count < 0:
            raise GpuError(f"--fake-gpus must be 0 or more, got {count}")
        self.count = count
        self.model = model
        self.memory_mb = memory_mb
        self.node_name = node_name
        self.busy = busy

    def inventory(self) -> list[GpuInfo]:
        """Fake GPUs 0..count-1 with UUIDs stable for this node name."""
        return [
            GpuInfo(
                index=i,
                uuid=f"GPU-{uuid.uuid5(_FAKE_NAMESPACE, f'{self.node_name}/{i}')}",
                model=self.model,
                memory_mb=self.memory_mb,
            )
            for i in range(self.count)
        ]

    def telemetry(self) -> list[GpuTelemetry]:
        """Plausible readings: a held GPU looks busy and warm, an idle one cool."""
        held = set(self.busy()) if self.busy is not None else set()
        out = []
        for i in range(self.count):
            on = i in held
            out.append(
                GpuTelemetry(
                    index=i,
                    utilization_pct=100.0 if on else 0.0,
                    memory_used_mb=self.memory_mb // 2 if on else 0,
                    temperature_c=65.0 if on else 32.0,
                    power_w=550.0 if on else 70.0,
                )
            )
        return out

    def close(self) -> None:
        """Nothing to release."""


class NvmlProvider:
    """Real GPUs through NVML. Every query that fails degrades to None (logged once)."""

    def __init__(self) -> None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError as e:
            raise GpuError(f"nvidia-ml-py is not installed; {_HINT}") from e
        try:
            nvml.nvmlInit()
        except Exception as e:  # NVMLError subclasses: library missing, driver not loaded, …
            raise GpuError(f"no NVIDIA GPU driver found (NVML: {e}); {_HINT}") from e
        self._nvml: ModuleType = nvml
        self._warned: set[str] = set()
        self._closed = False
        count = self._query("device count", nvml.nvmlDeviceGetCount)
        self._handles: list[Any] = []
        for i in range(count or 0):
            handle = self._query(f"handle {i}", nvml.nvmlDeviceGetHandleByIndex, i)
            if handle is not None:
                self._handles.append(handle)

    def _query(self, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        """Call one NVML function; on any NVML error return None and log it once."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as e:
            kind = what.split(" ")[0]  # one log line per kind of query, not per GPU
            if kind not in self._warned:
                self._warned.add(kind)
                log.debug("NVML %s unavailable: %s", what, e)
            return None

    def inventory(self) -> list[GpuInfo]:
        """The GPUs NVML sees, with name, UUID and total memory (0 if unknown)."""
        nvml = self._nvml
        out = []
        for i, h in enumerate(self._handles):
            name = self._query("name", nvml.nvmlDeviceGetName, h)
            uid = self._query("uuid", nvml.nvmlDeviceGetUUID, h)
            mem = self._query("memory", nvml.nvmlDeviceGetMemoryInfo, h)
            out.append(
                GpuInfo(
                    index=i,
                    uuid=_text(uid) if uid is not None else f"GPU-unknown-{i}",
                    model=_text(name) if name is not None else "unknown",
                    memory_mb=int(mem.total) // (1024 * 1024) if mem is not None else 0,
                )
            )
        return out

    def telemetry(self) -> list[GpuTelemetry]:
        """Utilization (%), memory used (MiB), temperature (°C), power (W) per GPU."""
        nvml = self._nvml
        out = []
        for i, h in enumerate(self._handles):
            util = self._query("utilization", nvml.nvmlDeviceGetUtilizationRates, h)
            mem = self._query("memory", nvml.nvmlDeviceGetMemoryInfo, h)
            temp = self._query("temperature", nvml.nvmlDeviceGetTemperature, h, 0)  # 0: GPU die
            power = self._query("power", nvml.nvmlDeviceGetPowerUsage, h)  # milliwatts
            out.append(
                GpuTelemetry(
                    index=i,
                    utilization_pct=float(util.gpu) if util is not None else None,
                    memory_used_mb=int(mem.used) // (1024 * 1024) if mem is not None else None,
                    temperature_c=float(temp) if temp is not None else None,
                    power_w=float(power) / 1000.0 if power is not None else None,
                )
            )
        return out

    def close(self) -> None:
        """Shut NVML down (idempotent, never raises)."""
        if not self._closed:
            self._closed = True
            self._handles = []
            self._query("shutdown", self._nvml.nvmlShutdown)


def _text(value: object) -> str:
    """NVML returns bytes in older bindings and str in newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def detect(
    fake_gpus: int | None,
    model: str,
    *,
    node_name: str = "node",
    busy: Callable[[], Collection[int]] | None = None,
) -> GpuProvider:
    """The provider for this machine: fake GPUs if asked for, else NVML.

    Raises GpuError with an actionable message when there is no driver and no
    `--fake-gpus N` was given.
    """
    if fake_gpus is not None:
        return FakeProvider(fake_gpus, model, node_name=node_name, busy=busy)
    return NvmlProvider()
