"""The GPU grid's cells as one HTML string: 8,000 GPUs on a page are 8,000 cells, which a
template loop renders several times slower than this join (bench/dashboard.py)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from markupsafe import Markup

from phalanx.head.dashboard.cluster import BUSY_PCT, GpuCell


def cells_html(cells: Sequence[GpuCell]) -> Markup:
    """One `<i class="gpu …">` per GPU (one node's): its utilisation level as the class
    (GpuCell.level), whether it is busy, the job holding it, and the hover text
    (GpuCell.title); computed inline, the node's and each user's name escaped once."""
    if not cells:
        return Markup("")
    node = escape(cells[0].node)
    users: dict[str, str] = {}
    out = []
    for c in cells:
        util = c.utilization_pct
        if c.node_state == "down":
            level, shown = "down", "no reading" if util is None else f"{util:.0f}%"
        elif util is None:
            level, shown = "nodata", "no reading"
        else:
            level, shown = f"u{round(min(100.0, max(0.0, util)) / 10)}", f"{util:.0f}%"
        title = f"{node} GPU {c.index} · {shown}"
        if c.memory_used_mb is not None:
            title += f" · {c.memory_used_mb}/{c.memory_mb} MiB"
        busy = "1" if util is not None and util >= BUSY_PCT else "0"
        if c.job_id is None:
            out.append(
                f'<i class="gpu {level}" data-gpu="{node}:{c.index}" data-busy="{busy}"'
                f' title="{title} · free"></i>'
            )
            continue
        user = c.user or "?"
        if user not in users:
            users[user] = escape(user)
        out.append(
            f'<i class="gpu {level} held" data-gpu="{node}:{c.index}" data-busy="{busy}"'
            f' data-job="{c.job_id}" title="{title} · job {c.job_id} ({users[user]})"></i>'
        )
    return Markup("".join(out))
