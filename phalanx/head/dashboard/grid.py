"""The GPU grid's cells as one HTML string: 8,000 GPUs on a page are 8,000 cells, which a
template loop renders several times slower than this join (bench/dashboard.py)."""

from __future__ import annotations

import datetime as dt
from html import escape

from markupsafe import Markup

from phalanx.head.dashboard.cluster import BUSY_PCT, NodeRow


def cells_html(row: NodeRow) -> Markup:
    """One `<i class="gpu …">` per GPU of the node: its utilisation level as the class
    (`u0`…`u10` in tenths, `nodata` without a fresh reading, `down`), whether it is busy,
    the job holding it, and the hover text (where, how busy, whose job). A GPU that
    idle-GPU detection flagged (allocated, idle for its team's window) has the class `idle`,
    `data-idle="1"` and "idle since …" in its hover text."""
    node = escape(row.name)
    down = row.state == "down"
    users: dict[str, str] = {}
    out = []
    for gpu in row.gpus:
        sample = row.readings.get(gpu.index)
        util = None if sample is None else sample.utilization_pct
        shown = "no reading" if util is None else f"{util:.0f}%"
        if down:
            level = "down"
        elif util is None:
            level = "nodata"
        else:
            level = f"u{round(min(100.0, max(0.0, util)) / 10)}"
        title = f"{node} GPU {gpu.index} · {shown}"
        if sample is not None and sample.memory_used_mb is not None:
            title += f" · {sample.memory_used_mb}/{gpu.memory_mb} MiB"
        busy = "1" if util is not None and util >= BUSY_PCT else "0"
        holder = row.holders.get(gpu.index)
        if holder is None:
            out.append(
                f'<i class="gpu {level}" data-gpu="{node}:{gpu.index}" data-busy="{busy}"'
                f' title="{title} · free"></i>'
            )
            continue
        job_id, user = holder
        if user is None:
            whose = "another team's"
        elif user in users:
            whose = users[user]
        else:
            whose = users[user] = escape(user)
        title += f" · job {job_id} ({whose})"
        idle_since = row.idle.get(gpu.index)
        if idle_since is None:
            out.append(
                f'<i class="gpu {level} held" data-gpu="{node}:{gpu.index}" data-busy="{busy}"'
                f' data-job="{job_id}" title="{title}"></i>'
            )
        else:
            out.append(
                f'<i class="gpu {level} held idle" data-gpu="{node}:{gpu.index}"'
                f' data-busy="{busy}" data-job="{job_id}" data-idle="1"'
                f' title="{title} · flagged idle, idle since {_clock(idle_since)}"></i>'
            )
    return Markup("".join(out))


def _clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
