"""The GPU grid's cells as one HTML string: 8,000 GPUs on a page are 8,000 cells, which a
template loop renders several times slower than this join (bench/dashboard.py)."""

from __future__ import annotations

from collections.abc import Iterable
from html import escape

from markupsafe import Markup

from phalanx.head.dashboard.cluster import GpuCell


def cells_html(cells: Iterable[GpuCell]) -> Markup:
    """One `<i class="gpu …">` per GPU: its utilisation level as the class, whether it is
    busy, the job holding it, and the hover text (where, how busy, whose job)."""
    out = []
    for c in cells:
        held = c.job_id is not None
        kind = f"gpu {c.level} held" if held else f"gpu {c.level}"
        out.append(
            f'<i class="{kind}" data-gpu="{escape(c.node)}:{c.index}"'
            f' data-busy="{1 if c.busy else 0}"'
            + (f' data-job="{c.job_id}"' if held else "")
            + f' title="{escape(c.title)}"></i>'
        )
    return Markup("".join(out))
