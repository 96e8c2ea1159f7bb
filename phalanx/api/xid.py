"""Which GPU health events drain a node, which fail only the job on that GPU (NVIDIA XIDs)."""

from __future__ import annotations

from typing import Literal

Action = Literal["drain", "fail_job", "ignore"]

# XIDs that mean the GPU (or its links) needs a reset, a reboot or a repair: no new job may
# land on the node until an admin looks at it. After NVIDIA's XID catalog ("Resolution
# bucket": RESET_GPU, RESTART_BM, CONTACT_SUPPORT) for A100/H100/B200-class GPUs.
CRITICAL_XIDS: frozenset[int] = frozenset(
    {
        46,  # GPU stopped processing (GSP/firmware)
        48,  # double-bit ECC error (DBE)
        61,  # internal micro-controller breakpoint/warning
        62,  # internal micro-controller halt
        63,  # row remapping / page retirement recorded: a GPU reset is needed to apply it
        64,  # row remapping / page retirement failed
        74,  # NVLink error
        79,  # GPU has fallen off the bus
        92,  # high single-bit ECC error rate
        95,  # uncontained ECC error: every process on the GPU is affected
        119,  # GSP RPC timeout
        120,  # GSP error
        140,  # unrecovered ECC error
        154,  # GPU recovery action changed: the driver asks for a reset/reboot/drain
    }
)

# XIDs caused by (or confined to) the program running on the GPU: the job on that GPU
# fails (and may restart elsewhere), the node stays in service.
APPLICATION_XIDS: frozenset[int] = frozenset(
    {
        13,  # graphics engine exception (illegal instruction, out-of-range address, …)
        31,  # GPU memory page fault (illegal memory access)
        43,  # GPU stopped processing: the channel was reset after an application fault
        45,  # preemptive cleanup after a previous error (a process was killed)
        69,  # graphics engine class error
        94,  # contained ECC error: only the process that touched the memory is affected
    }
)

_XID_NAMES: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    46: "GPU stopped processing",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "row remapping recorded (GPU reset needed)",
    64: "row remapping failed",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
    154: "GPU recovery action changed",
}

_KIND_NAMES = {
    "ecc_uncorrectable": "uncorrectable ECC error",
    "row_remap_failure": "row remapping failure",
    "gpu_lost": "GPU lost",
}


def classify(kind: str, code: int | None) -> Action:
    """What the head does with a GPU health event (`GpuHealthEvent.kind` and `.code`).

    - `"drain"`: the node is unhealthy (a CRITICAL_XIDS XID, an uncorrectable ECC error, a
      row-remap failure or pending remap, a lost GPU): stop placing jobs on it.
    - `"fail_job"`: an APPLICATION_XIDS XID: fail the job that holds that GPU.
    - `"ignore"`: any other XID (informational, or not known to be actionable): recorded,
      nothing else. An XID event without a code is ignored too.

    Uncorrectable ECC counts drain even though XID 94 alone would not: the counter does not
    say whether the error was contained, so the safe reading is taken.
    """
    if kind in _KIND_NAMES:
        return "drain"
    if kind != "xid" or code is None:
        return "ignore"
    if code in CRITICAL_XIDS:
        return "drain"
    if code in APPLICATION_XIDS:
        return "fail_job"
    return "ignore"


def describe(kind: str, code: int | None) -> str:
    """A short human name of an event: `XID 79 (GPU has fallen off the bus)`, `GPU lost`."""
    if kind == "xid":
        if code is None:
            return "XID (no code)"
        name = _XID_NAMES.get(code)
        return f"XID {code} ({name})" if name else f"XID {code}"
    return _KIND_NAMES.get(kind, kind)
