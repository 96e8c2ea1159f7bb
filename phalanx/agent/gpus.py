"""GPU discovery, telemetry and faults: NVML (nvidia-ml-py) on real machines, or fake GPUs."""

from __future__ import annotations

import importlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from phalanx.api.models import FaultInjection, GpuInfo, GpuTelemetry
from phalanx.api.xid import describe

log = logging.getLogger(__name__)

T = TypeVar("T")
FaultKind = Literal["xid", "ecc_uncorrectable", "row_remap_failure", "gpu_lost"]

# Stable namespace for fake GPU UUIDs, so a node keeps its GPU identities across restarts.
_FAKE_NAMESPACE = uuid.UUID("6f1c2a52-7d4e-4d7b-9a61-3c1f7e0c9b11")
_HINT = "to run this agent without GPUs, pass --fake-gpus N (and --gpu-model MODEL)"
# NVML constants (nvml.h; part of its ABI, the same in every binding).
_XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
_GPU_IS_LOST, _TIMEOUT, _NOT_SUPPORTED, _FUNCTION_NOT_FOUND = 15, 10, 3, 13
_UNCORRECTED, _VOLATILE = 1, 0  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC
_MAX_EVENTS_PER_POLL = 64  # an XID storm must not keep the poll from the counters


class GpuError(RuntimeError):
    """GPUs cannot be discovered; the message tells the user what to do."""


class FaultRejected(ValueError):
    """An injected fault names a GPU this node does not have, or is inconsistent."""


@dataclass(frozen=True)
class GpuFault:
    """A GPU fault a provider saw, before the agent numbers it (health.EventQueue)."""

    gpu: int | None  # GPU index; None: the node as a whole
    kind: FaultKind
    code: int | None  # the XID number (kind "xid")
    message: str
    time: float  # unix seconds


class GpuProvider(Protocol):
    """Where the agent learns about its GPUs. Implementations never raise from telemetry()
    or health_events()."""

    def inventory(self) -> list[GpuInfo]:
        """The node's GPUs, index order."""
        ...

    def telemetry(self) -> list[GpuTelemetry]:
        """Current readings per GPU; a reading the device cannot give is None."""
        ...

    def health_events(self, timeout_s: float) -> list[GpuFault]:
        """Faults seen since the last call, waiting up to `timeout_s` for one (a monitor
        thread calls this in a loop); empty when there are none."""
        ...

    def close(self) -> None:
        """Release the provider's resources (NVML handle)."""
        ...

    def device_files(self) -> dict[int, Path]:
        """GPU index → its device file (/dev/nvidiaN), which a job's cgroup lets it open
        only for its own GPUs; empty when there are none to guard."""
        ...


@dataclass(frozen=True)
class FakeLoad:
    """What a job makes a fake GPU it holds show (agent/fakeload.py reads it from the job):
    utilisation in %, None for the default (busy: ~95% with small deterministic noise),
    and memory used as a % of the GPU's, None for the default (follows utilisation)."""

    utilization_pct: float | None = None
    memory_pct: float | None = None


# Board power of each model at full load (TDP, W); an unknown model gets DEFAULT_TDP_W.
TDP_W = {"H100": 700.0, "H200": 700.0, "B200": 1000.0, "A100": 400.0, "L40S": 350.0, "L4": 72.0}
DEFAULT_TDP_W = 400.0
IDLE_W = 65.0  # a GPU doing nothing
BUSY_PCT = 95.0  # a held GPU whose job declares nothing
_NOISE_PCT = 2.0  # ± around BUSY_PCT, the same sequence every run


class FakeProvider:
    """GPUs that do not exist, for machines without any (tests, laptops, CPU clusters).

    UUIDs derive from the node name and index, so they are stable across restarts.
    A GPU held by a job shows the job's FakeLoad (`load()`: GPU index → load; see
    agent/fakeload.py for how a job declares or drives it), ~95% busy by default; a GPU
    nobody holds is at 0% and idle power. Memory, power and temperature follow
    utilisation; `energy_j` integrates power over time like NVML's total-energy counter.
    Faults come only from `inject()` (`POST /v1/faults` on the agent).
    """

    def __init__(
        self,
        count: int,
        model: str = "H100",
        memory_mb: int = 81559,
        *,
        node_name: str = "node",
        busy: Callable[[], Collection[int]] | None = None,
        load: Callable[[], Mapping[int, FakeLoad]] | None = None,
        device_dir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if count < 0:
            raise GpuError(f"--fake-gpus must be 0 or more, got {count}")
        self.count = count
        self.model = model
        self.memory_mb = memory_mb
        self.node_name = node_name
        self.busy = busy
        self.load = load
        self.device_dir = device_dir  # where nvidia0… live (tests: mknod'ed in a temp dir)
        self.tdp_w = TDP_W.get(model.upper(), DEFAULT_TDP_W)
        self._faults: list[GpuFault] = []
        self._fault_added = threading.Condition()
        self._clock = clock
        self._energy_lock = threading.Lock()
        self._energy = [0.0] * count  # J per GPU since this provider started
        self._power = [IDLE_W] * count  # W per GPU at the last reading
        self._last = clock()
        self._readings = 0  # drives the deterministic noise

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

    def device_files(self) -> dict[int, Path]:
        """`<device_dir>/nvidiaN` for each fake GPU, with --fake-gpu-dev-dir; else none."""
        if self.device_dir is None:
            return {}
        return {i: self.device_dir / f"nvidia{i}" for i in range(self.count)}

    def _loads(self) -> dict[int, FakeLoad]:
        """GPU index → the load of the job holding it (absent: nobody holds it)."""
        if self.load is not None:
            return dict(self.load())
        if self.busy is not None:
            return {i: FakeLoad() for i in self.busy()}
        return {}

    def telemetry(self) -> list[GpuTelemetry]:
        """Believable readings: utilisation from the holder's load, the rest following it."""
        try:
            loads = self._loads()
        except Exception:  # never raise from telemetry: a broken hook reads as all idle
            log.exception("fake GPU load hook failed")
            loads = {}
        out = []
        with self._energy_lock:
            now = self._clock()
            dt, self._last = max(0.0, now - self._last), now
            self._readings += 1
            for i in range(self.count):
                self._energy[i] += self._power[i] * dt  # the power since the last reading
                util, mem_pct = _fake_levels(loads.get(i), i, self._readings)
                held = i in loads
                power = IDLE_W + (self.tdp_w - IDLE_W) * util / 100.0
                self._power[i] = power
                out.append(
                    GpuTelemetry(
                        index=i,
                        utilization_pct=util,
                        memory_used_mb=round(self.memory_mb * mem_pct / 100.0) if held else 0,
                        temperature_c=round(32.0 + 0.4 * util, 1),
                        power_w=round(power, 1),
                        energy_j=round(self._energy[i], 3),
                    )
                )
        return out

    def inject(self, fault: FaultInjection) -> None:
        """Record `fault` to be reported by health_events() as if NVML had seen it.

        Raises FaultRejected for a GPU index this node does not have, an XID without its
        code, or a code on another kind of fault."""
        if fault.gpu is not None and fault.gpu >= self.count:
            have = f"GPUs 0-{self.count - 1}" if self.count else "no GPUs"
            raise FaultRejected(f"this node has {have}; there is no GPU {fault.gpu}")
        if fault.kind == "xid" and fault.code is None:
            raise FaultRejected("an xid fault needs its code (the XID number, e.g. 79)")
        if fault.kind != "xid" and fault.code is not None:
            raise FaultRejected(f"code is the XID number; a {fault.kind} fault has none")
        message = f"{describe(fault.kind, fault.code)}: {fault.message}"
        with self._fault_added:
            self._faults.append(GpuFault(fault.gpu, fault.kind, fault.code, message, time.time()))
            self._fault_added.notify_all()

    def health_events(self, timeout_s: float) -> list[GpuFault]:
        """The injected faults not reported yet, waiting up to `timeout_s` for one."""
        with self._fault_added:
            self._fault_added.wait_for(lambda: bool(self._faults), timeout=timeout_s)
            out, self._faults = self._faults, []
        return out

    def close(self) -> None:
        """Nothing to release."""


class NvmlProvider:
    """Real GPUs through NVML. Every query that fails degrades to None (logged once).

    Faults: XIDs through NVML's event API (nvmlEventTypeXidCriticalError), growth of the
    volatile uncorrectable ECC count (its value at start-up is the baseline), row remapping
    failed or pending (nvmlDeviceGetRemappedRows), and NVML_ERROR_GPU_IS_LOST from any
    query. Uncorrectable ECC is read from the counter rather than from
    nvmlEventTypeDoubleBitEccError, which would report the same error twice. `nvml` is the
    `pynvml` module (a stand-in in tests); None imports it.
    """

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as e:
                raise GpuError(f"nvidia-ml-py is not installed; {_HINT}") from e
        try:
            nvml.nvmlInit()
        except Exception as e:  # NVMLError subclasses: library missing, driver not loaded, …
            raise GpuError(f"no NVIDIA GPU driver found (NVML: {e}); {_HINT}") from e
        self._nvml: Any = nvml
        self._warned: set[str] = set()
        self._closed = False
        self._lock = threading.Lock()  # the fault state below: telemetry runs in another thread
        self._unsupported: set[tuple[str, int]] = set()  # (query, GPU) not worth asking again
        self._lost: set[int] = set()
        self._lost_faults: list[GpuFault] = []
        self._ecc: dict[int, int] = {}  # GPU → volatile uncorrectable ECC count last read
        self._remap: dict[int, tuple[bool, bool]] = {}  # GPU → (pending, failed) last read
        count = self._query("device count", nvml.nvmlDeviceGetCount)
        self._handles: list[tuple[int, Any]] = []  # (NVML index, handle)
        for i in range(count or 0):
            handle = self._query("handle", nvml.nvmlDeviceGetHandleByIndex, i, gpu=i)
            if handle is not None:
                self._handles.append((i, handle))
        self._events = self._register_xid_events()
        for i, h in self._handles:
            self._ecc_fault(i, h)  # the baseline: errors from before the agent started

    def _query(
        self,
        what: str,
        fn: Callable[..., T],
        *args: Any,
        gpu: int | None = None,
        level: int = logging.DEBUG,
    ) -> T | None:
        """Call one NVML function; on any NVML error return None and log it once (at
        `level`, DEBUG by default). GPU_IS_LOST on a query about GPU `gpu` records a
        gpu_lost fault; NOT_SUPPORTED marks (what, gpu) as not worth asking again."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as e:
            code = getattr(e, "value", None)
            if gpu is not None and code == _GPU_IS_LOST:
                self._gpu_lost(gpu, what)
            elif gpu is not None and code in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
                self._unsupported.add((what, gpu))
            kind = what.split(" ")[0]  # one log line per kind of query, not per GPU
            if kind not in self._warned:
                self._warned.add(kind)
                log.log(level, "NVML %s unavailable: %s", what, e)
            return None

    def _gpu_lost(self, gpu: int, what: str) -> None:
        with self._lock:
            if gpu in self._lost:
                return
            self._lost.add(gpu)
            message = f"GPU lost: NVML answers 'GPU is lost' (while reading {what})"
            self._lost_faults.append(GpuFault(gpu, "gpu_lost", None, message, time.time()))

    def inventory(self) -> list[GpuInfo]:
        """The GPUs NVML sees, with name, UUID and total memory (0 if unknown)."""
        nvml = self._nvml
        out = []
        for i, h in self._handles:
            name = self._query("name", nvml.nvmlDeviceGetName, h, gpu=i)
            uid = self._query("uuid", nvml.nvmlDeviceGetUUID, h, gpu=i)
            mem = self._query("memory", nvml.nvmlDeviceGetMemoryInfo, h, gpu=i)
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
        """Utilization (%), memory used (MiB), temperature (°C), power (W) and energy since
        the driver loaded (J; Volta and later) per GPU; what a GPU cannot tell is None."""
        nvml = self._nvml
        out = []
        for i, h in self._handles:
            util = self._query("utilization", nvml.nvmlDeviceGetUtilizationRates, h, gpu=i)
            mem = self._query("memory", nvml.nvmlDeviceGetMemoryInfo, h, gpu=i)
            temp = self._query("temperature", nvml.nvmlDeviceGetTemperature, h, 0, gpu=i)  # die
            power = self._query("power", nvml.nvmlDeviceGetPowerUsage, h, gpu=i)  # milliwatts
            energy = self._energy_mj(i, h)
            out.append(
                GpuTelemetry(
                    index=i,
                    utilization_pct=float(util.gpu) if util is not None else None,
                    memory_used_mb=int(mem.used) // (1024 * 1024) if mem is not None else None,
                    temperature_c=float(temp) if temp is not None else None,
                    power_w=float(power) / 1000.0 if power is not None else None,
                    energy_j=float(energy) / 1000.0 if energy is not None else None,
                )
            )
        return out

    def _energy_mj(self, i: int, h: Any) -> int | None:
        """GPU i's total energy counter (mJ), None where unsupported (asked once)."""
        what = "energy"
        get = getattr(self._nvml, "nvmlDeviceGetTotalEnergyConsumption", None)
        if get is None or (what, i) in self._unsupported:
            return None
        value = self._query(what, get, h, gpu=i)
        return None if value is None else int(value)

    # ------------------------------------------------------------------ faults
    def health_events(self, timeout_s: float) -> list[GpuFault]:
        """XID events (waiting up to `timeout_s` for one), then the ECC and row-remap
        readings of every GPU not lost, then GPUs found lost."""
        faults = self._wait_xids(timeout_s)
        for i, h in self._handles:
            if i not in self._lost:
                faults += [f for f in (self._ecc_fault(i, h), self._remap_fault(i, h)) if f]
        with self._lock:
            faults += self._lost_faults
            self._lost_faults = []
        return faults

    def _register_xid_events(self) -> Any:
        """An NVML event set with every GPU that supports XID events; None if none does."""
        nvml, warn = self._nvml, logging.WARNING
        events = self._query("XID event set", nvml.nvmlEventSetCreate, level=warn)
        if events is None:
            return None
        registered = 0
        for i, h in self._handles:
            types = self._query(
                "XID types", nvml.nvmlDeviceGetSupportedEventTypes, h, gpu=i, level=warn
            )
            if types is not None and int(types) & _XID_EVENT:
                done = self._query("XID register", _register, nvml, h, events, gpu=i, level=warn)
                registered += done is not None
        if not registered:
            log.warning("no GPU here reports XID events through NVML: XIDs are not reported")
            self._query("XID free", nvml.nvmlEventSetFree, events)
            return None
        return events

    def _wait_xids(self, timeout_s: float) -> list[GpuFault]:
        """XIDs from the event set: wait up to `timeout_s` for the first, then take what is
        already queued. Without an event set (unsupported), just wait."""
        nvml = self._nvml
        if self._events is None:
            time.sleep(timeout_s)
            return []
        out: list[GpuFault] = []
        timeout_ms = max(0, int(timeout_s * 1000))
        for _ in range(_MAX_EVENTS_PER_POLL):
            try:
                data = nvml.nvmlEventSetWait(self._events, timeout_ms)
            except nvml.NVMLError as e:
                if getattr(e, "value", None) != _TIMEOUT:
                    if "XID wait" not in self._warned:
                        self._warned.add("XID wait")
                        log.warning("waiting for NVML XID events failed: %s", e)
                    if not out:
                        time.sleep(timeout_s)  # keep the monitor's pace on a failing wait
                break
            timeout_ms = 0  # after the first event, only take what is already there
            gpu = self._query("index", nvml.nvmlDeviceGetIndex, data.device)
            code = int(data.eventData)
            out.append(GpuFault(gpu, "xid", code, describe("xid", code), time.time()))
        return out

    def _ecc_fault(self, i: int, h: Any) -> GpuFault | None:
        """A fault when GPU i's volatile uncorrectable ECC count grew since the last read."""
        what = "ECC count"
        get = getattr(self._nvml, "nvmlDeviceGetTotalEccErrors", None)  # old bindings lack it
        if get is None or (what, i) in self._unsupported:
            return None
        count = self._query(what, get, h, _UNCORRECTED, _VOLATILE, gpu=i, level=logging.WARNING)
        if count is None:
            return None
        before, self._ecc[i] = self._ecc.get(i), int(count)
        if before is None or count <= before:
            return None
        message = f"uncorrectable ECC errors: {count - before} new, {count} since the driver loaded"
        return GpuFault(i, "ecc_uncorrectable", None, message, time.time())

    def _remap_fault(self, i: int, h: Any) -> GpuFault | None:
        """A fault when GPU i's row remapping starts failing or a remap becomes pending."""
        what = "row remapping"
        get = getattr(self._nvml, "nvmlDeviceGetRemappedRows", None)  # old bindings lack it
        if get is None or (what, i) in self._unsupported:
            return None
        rows = self._query(what, get, h, gpu=i, level=logging.WARNING)
        if rows is None:
            return None
        _corrected, _uncorrected, pending, failed = rows
        before = self._remap.get(i, (False, False))
        self._remap[i] = (bool(pending), bool(failed))
        if failed and not before[1]:
            message = "row remapping failed: no spare rows left (the GPU needs repair)"
        elif pending and not before[0]:
            message = "row remapping pending: reset the GPU to apply it"
        else:
            return None
        return GpuFault(i, "row_remap_failure", None, message, time.time())

    def device_files(self) -> dict[int, Path]:
        """/dev/nvidia<minor> of each GPU (the minor number from NVML; the index if NVML
        cannot tell)."""
        out = {}
        get_minor = getattr(self._nvml, "nvmlDeviceGetMinorNumber", None)
        for i, h in self._handles:
            minor = None if get_minor is None else self._query("minor", get_minor, h, gpu=i)
            out[i] = Path(f"/dev/nvidia{i if minor is None else int(minor)}")
        return out

    def close(self) -> None:
        """Shut NVML down (idempotent, never raises). Stop calling health_events() first."""
        if not self._closed:
            self._closed = True
            self._handles = []
            if self._events is not None:
                self._query("XID free", self._nvml.nvmlEventSetFree, self._events)
                self._events = None
            self._query("shutdown", self._nvml.nvmlShutdown)


def _register(nvml: Any, handle: Any, events: Any) -> bool:
    """Add one GPU's XID events to the event set (True: NVML's own call returns None)."""
    nvml.nvmlDeviceRegisterEvents(handle, _XID_EVENT, events)
    return True


def _text(value: object) -> str:
    """NVML returns bytes in older bindings and str in newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def detect(
    fake_gpus: int | None,
    model: str,
    *,
    node_name: str = "node",
    busy: Callable[[], Collection[int]] | None = None,
    load: Callable[[], Mapping[int, FakeLoad]] | None = None,
    device_dir: Path | None = None,
) -> GpuProvider:
    """The provider for this machine: fake GPUs if asked for, else NVML.

    Raises GpuError with an actionable message when there is no driver and no
    `--fake-gpus N` was given.
    """
    if fake_gpus is not None:
        return FakeProvider(
            fake_gpus, model, node_name=node_name, busy=busy, load=load, device_dir=device_dir
        )
    return NvmlProvider()


def _fake_levels(load: FakeLoad | None, index: int, reading: int) -> tuple[float, float]:
    """(utilisation %, memory %) of a fake GPU: 0/0 when nobody holds it; the job's
    declared values as they are; by default busy with a small noise that depends only on
    the GPU and the reading's number (so runs repeat)."""
    if load is None:
        return 0.0, 0.0
    if load.utilization_pct is not None:
        util = min(100.0, max(0.0, load.utilization_pct))
    else:
        wobble = ((index * 7919 + reading * 104729) % 1000) / 1000.0  # 0 ≤ wobble < 1
        util = round(BUSY_PCT + _NOISE_PCT * (2 * wobble - 1), 1)
    if load.memory_pct is not None:
        mem = min(100.0, max(0.0, load.memory_pct))
    else:
        mem = 10.0 + 0.8 * util  # a context plus a working set that grows with the work
    return util, mem
