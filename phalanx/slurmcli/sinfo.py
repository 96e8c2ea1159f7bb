"""`sinfo`: partitions and nodes as Slurm 22.05 prints them. A partition is a Phalanx team
(as `sbatch -p` names one); every team may use every node, so each partition lists all
nodes, one line per node state (or per node with `-N`). `*` marks your default team."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from phalanx.api.models import NodeInfo
from phalanx.jobspec.errors import JobSpecError
from phalanx.jobspec.hostlist import expand
from phalanx.slurmcli import slurmjson
from phalanx.slurmcli.common import connect, die, options, run
from phalanx.slurmcli.fields import (
    FormatError,
    check_name,
    emit,
    host_list,
)
from phalanx.slurmcli.formats import Column, Spec, pad, parse_format

DEFAULT_FORMAT = "%9P %.5a %.10l %.6D %.6t %N"
LONG_FORMAT = "%9P %.5a %.10l %.10s %.4r %.8h %.10g %.6D %.11T %N"
NODE_FORMAT = "%N %.6D %.9P %6t"
NODE_LONG_FORMAT = "%N %.6D %.9P %.11T %4c %.8z %.6m %.8d %.6w %.8f %20E"
SUMMARY_FORMAT = "%9P %.5a %.10l %.16F %N"
MIN_FIELD = 9  # sinfo's MIN_PART_FIELD_SIZE and MIN_NODE_FIELD_SIZE
SHORT = "adeFhilM:n:No:O:p:rRsS:t:TvV"
LONG = [
    "all", "dead", "exact", "future", "help", "hide", "iterate=", "long", "clusters=",
    "nodes=", "Node", "format=", "Format=", "partition=", "responding", "list-reasons",
    "summarize", "sort=", "states=", "reservation", "usage", "verbose", "version",
    "noheader", "noconvert", "json", "yaml", "local", "federation",
]  # fmt: skip
# Node states: (compact, long, sort weight as slurmctld's enum: sinfo sorts by it, highest first)
STATES = {
    "idle": ("idle", "idle", 2),
    "mix": ("mix", "mixed", 5),
    "alloc": ("alloc", "allocated", 3),
    "drng": ("drng", "draining", 2),
    "drain": ("drain", "drained", 2),
    "down": ("down*", "down*", 1),
}
STATE_NAMES = {
    "idle": {"idle"}, "mix": {"mix"}, "mixed": {"mix"}, "alloc": {"alloc"},
    "allocated": {"alloc"}, "drng": {"drng"}, "draining": {"drng"},
    "drain": {"drain", "drng"}, "drained": {"drain"}, "down": {"down"},
    "responding": {"idle", "mix", "alloc", "drng", "drain"}, "no_respond": {"down"},
}  # fmt: skip
VALID_STATES = (
    "valid states: unknown,down,idle,allocated,?,mixed,future,drain,drained,draining,"
    "no_respond,reserved,perfctrs,cloud,completing,powering_down,powered_down,power_down,"
    "powering_up,fail,maint,reboot,reboot^,unknown"
)
_SLUG = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True, slots=True)
class Row:
    """One line: a partition and the nodes it groups (one node with `-N`)."""

    partition: str
    default: bool
    nodes: tuple[NodeInfo, ...]

    @property
    def state(self) -> str:
        return node_state(self.nodes[0])


def node_state(node: NodeInfo) -> str:
    """A node's Slurm state (a key of STATES) from its Phalanx state and GPUs in use."""
    if node.state == "down":
        return "down"
    if node.state == "drain":
        return "drng" if node.jobs else "drain"
    if node.state == "draining":
        return "drng"
    total = len(node.gpus)
    if node.gpus_used <= 0 and not node.jobs:
        return "idle"
    if total and node.gpus_used < total:
        return "mix"
    return "alloc"


def cpus_aiot(node: NodeInfo) -> tuple[int, int, int, int]:
    """Allocated/idle/other/total CPUs: Phalanx allocates GPUs and a node's CPUs follow
    them (a share per GPU in use); a down or drained node's CPUs are `other`."""
    total = node.cpus
    if node_state(node) in ("down", "drain"):
        return 0, 0, total, total
    gpus = len(node.gpus)
    busy = total if node.jobs else 0
    alloc = min(total, round(total * node.gpus_used / gpus)) if gpus else busy
    return alloc, total - alloc, 0, total


def gres(node: NodeInfo) -> str:
    if not node.gpus:
        return "(null)"
    model = _SLUG.sub("_", node.gpus[0].model.lower()).strip("_")
    return f"gpu:{model}:{len(node.gpus)}" if model else f"gpu:{len(node.gpus)}"


def main(argv: list[str]) -> int:
    return run("sinfo", _sinfo, argv)


def _sinfo(argv: list[str]) -> int:
    opts = options("sinfo", argv, SHORT, LONG)
    fmt: str | None = None
    by_node = long = noheader = summarize = as_json = False
    partitions: set[str] = set()
    names: set[str] = set()
    states: set[str] | None = None
    try:
        for flag, value in opts:
            if flag in ("-V", "--version"):
                print(slurmjson.VERSION_LINE)
                return 0
            if flag in ("--help", "--usage"):
                print(USAGE)
                return 0
            if flag in ("-o", "--format"):
                fmt = value
            elif flag in ("-O", "--Format"):
                raise FormatError("-O/--Format is not supported by Phalanx's sinfo; use -o")
            elif flag in ("-N", "--Node"):
                by_node = True
            elif flag in ("-l", "--long"):
                long = True
            elif flag in ("-h", "--noheader"):
                noheader = True
            elif flag in ("-s", "--summarize"):
                summarize = True
            elif flag in ("-p", "--partition"):
                partitions |= {check_name(p, "partition") for p in value.split(",") if p}
            elif flag in ("-n", "--nodes"):
                names |= set(expand(value[:4096]))
            elif flag in ("-t", "--states"):
                states = _states(value)
            elif flag == "--json":
                as_json = True
            elif flag in ("-i", "--iterate", "-R", "--list-reasons", "-T", "--reservation"):
                raise FormatError(f"{flag} is not supported by Phalanx's sinfo")
    except (FormatError, JobSpecError) as exc:
        die(str(exc))
    with connect() as client:
        me = client.whoami()
        teams = sorted(t.name for t in client.teams().teams)
        nodes = sorted(client.nodes().nodes, key=lambda n: n.name)
    default = me.default_team or (teams[0] if len(teams) == 1 else None)
    if partitions:
        teams = [t for t in teams if t in partitions]
    if names:
        nodes = [n for n in nodes if n.name in names]
    if states is not None:
        nodes = [n for n in nodes if node_state(n) in states]
    if as_json:
        emit([json.dumps(_json(teams, default, nodes), indent=2)])
        return 0
    if fmt is None:
        if summarize:
            fmt = SUMMARY_FORMAT
        elif by_node:
            fmt = NODE_LONG_FORMAT if long else NODE_FORMAT
        else:
            fmt = LONG_FORMAT if long else DEFAULT_FORMAT
    specs = parse_format(fmt)
    for spec in specs:
        if spec.letter and spec.letter not in COLUMN_LETTERS:
            # Slurm's sinfo prints this one without its `sinfo: error:` prefix.
            print(f"Invalid node format specification: {spec.letter}", file=sys.stderr)
    rows = _rows(teams, default, nodes, specs, by_node, summarize)
    lines = []
    if long and not noheader:
        lines.append(time.strftime("%a %b %d %H:%M:%S %Y"))
    part_width = max([MIN_FIELD] + [len(r.partition) + r.default for r in rows])
    node_width = max([MIN_FIELD] + [len(host_list([n.name for n in r.nodes])) for r in rows])
    widths: dict[str, int] = {}
    if fmt in _DEFAULTS:  # sinfo sizes these two columns to fit in its own formats
        widths["P"] = part_width
        if fmt in (NODE_FORMAT, NODE_LONG_FORMAT):
            widths["N"] = node_width
    columns = _columns()
    if not noheader:
        lines.append(_render(specs, columns, None, widths))
    lines.extend(_render(specs, columns, row, widths) for row in rows)
    emit(lines)
    return 0


_DEFAULTS = {DEFAULT_FORMAT, LONG_FORMAT, NODE_FORMAT, NODE_LONG_FORMAT, SUMMARY_FORMAT}
_AGGREGATED = frozenset("NDCAFn")  # summed or listed over a row's nodes, not grouped by


def _states(value: str) -> set[str]:
    out: set[str] = set()
    for word in value.lower().replace("&", ",").split(","):
        word = word.strip()
        if not word:
            continue
        if word not in STATE_NAMES:
            raise FormatError(f'Bad state string: "{word[:64]}"\nsinfo: error: {VALID_STATES}')
        out |= STATE_NAMES[word]
    return out


def _rows(
    teams: Sequence[str],
    default: str | None,
    nodes: Sequence[NodeInfo],
    specs: Sequence[Spec],
    by_node: bool,
    summarize: bool,
) -> list[Row]:
    """Group each partition's nodes into lines: by node (`-N`), not at all (`-s`), or by
    every printed field that is not summed or listed (as sinfo merges its records)."""
    rows: list[Row] = []
    columns = _columns()
    keyed = [s for s in specs if s.letter and s.letter not in _AGGREGATED and s.letter in columns]
    for team in teams:
        is_default = team == default
        if summarize:
            if nodes:
                rows.append(Row(team, is_default, tuple(nodes)))
            continue
        groups: dict[tuple[str, ...], list[NodeInfo]] = {}
        for node in nodes:
            probe = Row(team, is_default, (node,))
            key = (node.name,) if by_node else tuple(columns[s.letter].value(probe) for s in keyed)
            groups.setdefault(key, []).append(node)
        part_rows = [Row(team, is_default, tuple(g)) for g in groups.values()]
        if not by_node:
            part_rows.sort(key=lambda r: -STATES[r.state][2])
        rows.extend(part_rows)
    if by_node:
        rows.sort(key=lambda r: r.nodes[0].name)
    return rows


def _render(
    specs: Sequence[Spec], columns: dict[str, Column], row: Row | None, widths: dict[str, int]
) -> str:
    out: list[str] = []
    for spec in specs:
        if not spec.letter:
            out.append(spec.suffix)
            continue
        column = columns.get(spec.letter)
        if column is None:
            out.append(f"%{spec.letter}{spec.suffix}")
            continue
        width = widths.get(spec.letter, spec.width)
        text = column.header if row is None else column.value(row)
        out.append(pad(text, width, spec.right, column.cut) + spec.suffix)
    return "".join(out)


def _first(row: Row) -> NodeInfo:
    """A grouped field's value is its first node's (the group shares it)."""
    return row.nodes[0]


def _partition(row: Row) -> str:
    return row.partition + ("*" if row.default else "")


def _sum(row: Row, part: Callable[[NodeInfo], tuple[int, ...]]) -> str:
    totals = [sum(v) for v in zip(*(part(n) for n in row.nodes), strict=True)]
    return "/".join(str(t) for t in totals)


def _nodes_aiot(node: NodeInfo) -> tuple[int, int, int, int]:
    state = node_state(node)
    if state in ("down", "drain"):
        return 0, 0, 1, 1
    return (1, 0, 0, 1) if state in ("mix", "alloc", "drng") else (0, 1, 0, 1)


def _columns() -> dict[str, Column]:
    def col(header: str, value: Callable[[Row], str], cut: bool = True) -> Column:
        return Column(header, value, cut)

    return {
        "a": col("AVAIL", lambda r: "up"),
        "A": col("NODES(A/I)", lambda r: _sum(r, lambda n: _nodes_aiot(n)[:2])),
        "c": col("CPUS", lambda r: str(_first(r).cpus)),
        "C": col("CPUS(A/I/O/T)", lambda r: _sum(r, cpus_aiot)),
        "d": col("TMP_DISK", lambda r: "0"),
        "D": col("NODES", lambda r: str(len(r.nodes))),
        "e": col("FREE_MEM", lambda r: "N/A"),
        "E": col("REASON", lambda r: _first(r).reason or "none"),
        "f": col("AVAIL_FEATURES", lambda r: _features(_first(r))),
        "F": col("NODES(A/I/O/T)", lambda r: _sum(r, _nodes_aiot)),
        "g": col("GROUPS", lambda r: "all"),
        "G": col("GRES", lambda r: gres(_first(r))),
        "h": col("OVERSUBSCRIBE", lambda r: "NO"),
        "l": col("TIMELIMIT", lambda r: "infinite"),
        "m": col("MEMORY", lambda r: str(_first(r).memory_mb)),
        "n": col("HOSTNAMES", lambda r: ",".join(n.name for n in r.nodes), cut=False),
        "N": col("NODELIST", lambda r: host_list([n.name for n in r.nodes]), cut=False),
        "o": col("NODE_ADDR", lambda r: _first(r).address),
        "O": col("CPU_LOAD", lambda r: "N/A"),
        "P": col("PARTITION", _partition),
        "r": col("ROOT", lambda r: "no"),
        "R": col("PARTITION", lambda r: r.partition),
        "s": col("JOB_SIZE", lambda r: "1-infinite"),
        "t": col("STATE", lambda r: STATES[r.state][0]),
        "T": col("STATE", lambda r: STATES[r.state][1]),
        "w": col("WEIGHT", lambda r: "1"),
        "z": col("S:C:T", lambda r: f"{_first(r).cpus}:1:1"),  # a node given as CPUs only
    }


COLUMN_LETTERS = frozenset(_columns())


def _features(node: NodeInfo) -> str:
    if not node.labels:
        return "(null)"
    return ",".join(f"{k}={v}" for k, v in sorted(node.labels.items()))


# openapi v0.0.38's node `state` is the base state; draining and not responding are flags.
_BASE_STATE = {
    "idle": "idle", "mix": "mixed", "alloc": "allocated", "drng": "allocated",
    "drain": "idle", "down": "down",
}  # fmt: skip


def _json(teams: Sequence[str], default: str | None, nodes: Sequence[NodeInfo]) -> dict[str, Any]:
    """`sinfo --json`: openapi v0.0.38's `nodes[]` and `partitions[]` (the fields given)."""
    meta = slurmjson.squeue([], 0.0)["meta"]
    out_nodes = []
    for node in nodes:
        alloc, idle, _other, total = cpus_aiot(node)
        state = node_state(node)
        out_nodes.append(
            {
                "name": node.name,
                "hostname": node.name,
                "address": node.address,
                "state": _BASE_STATE[state],
                "state_flags": (["DRAIN"] if state in ("drain", "drng") else [])
                + (["NOT_RESPONDING"] if state == "down" else []),
                "cpus": total,
                "alloc_cpus": alloc,
                "idle_cpus": idle,
                "real_memory": node.memory_mb,
                "gres": gres(node) if node.gpus else "",
                "gres_used": f"gpu:{node.gpus_used}" if node.gpus else "",
                "partitions": list(teams),
                "reason": node.reason or "",
                "features": _features(node) if node.labels else "",
            }
        )
    names = [n.name for n in nodes]
    parts = [
        {
            "name": team,
            "nodes": host_list(names) if names else "",
            "total_nodes": len(nodes),
            "total_cpus": sum(n.cpus for n in nodes),
            "state": "UP",
            "flags": ["default"] if team == default else [],
            "maximum_time": None,
        }
        for team in teams
    ]
    return {**{"meta": meta, "errors": []}, "nodes": out_nodes, "partitions": parts}


USAGE = """Usage: sinfo [OPTIONS]
  -h, --noheader        no headers
  -l, --long            long output
  -N, --Node            one line per node
  -n, --nodes=NODES     only these nodes (a hostlist)
  -o, --format=FORMAT   %-field format (see man sinfo)
  -p, --partition=LIST  partitions (Phalanx teams)
  -s, --summarize       one line per partition, NODES(A/I/O/T)
  -t, --states=LIST     node states (idle, mix, alloc, drain, drng, down)
      --json            openapi v0.0.38 JSON (see docs/slurm.md)
  -V, --version         version"""
