"""Cluster layouts for the simulator: uniform clusters, per-VC clusters and their YAML files.

A layout file is YAML in one of two forms. One cluster (every key but `nodes` optional;
`name` defaults to the file's stem, and each team needs only `name`):

    name: research
    nodes: 512                # servers
    gpus_per_node: 8
    nodes_per_rack: 32
    racks_per_block: 8
    gpu_model: H100
    teams:
      - {name: vision, quota: 1024, cohort: research, borrowing_limit: 256}
      - {name: speech, quota: 512, cohort: research}
      - {name: infra, weight: 2.0}

Or one independent cluster per Philly virtual cluster (VC), each with one team named after
the VC; quote VC names, since YAML would read `103959` as a number:

    vcs: {"6214e9": 64, "11cb48": 32, "103959": 8}   # or the string "6214e9=64,11cb48=32"
    gpus_per_node: 8
    nodes_per_rack: 32

Nodes are named <prefix><index> (n0000, n0001, …; "<vc>-n0000" per VC), racks r<k> and
blocks b<k>, counting from 0 in node order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from phalanx.core.model import Node, Team
from phalanx.testing.builders import cluster_nodes


class LayoutError(ValueError):
    """A layout description is unusable; the message names the file and key."""


@dataclass(frozen=True, slots=True)
class ClusterLayout:
    """A named cluster: its nodes (in topology order) and its teams (may be empty)."""

    name: str
    nodes: tuple[Node, ...]
    teams: tuple[Team, ...] = ()

    def __post_init__(self) -> None:
        for kind, names in (("node", [n.name for n in self.nodes]), ("team", self.team_names)):
            if len(set(names)) != len(names):
                dupes = sorted(x for x, k in Counter(names).items() if k > 1)
                raise LayoutError(f"layout {self.name}: duplicate {kind} names {dupes[:5]}")

    @property
    def team_names(self) -> list[str]:
        return [t.name for t in self.teams]

    @property
    def gpus(self) -> int:
        """Total GPUs over all nodes."""
        return sum(n.gpus for n in self.nodes)


def uniform(
    nodes: int,
    gpus_per_node: int = 8,
    nodes_per_rack: int = 32,
    racks_per_block: int = 8,
    gpu_model: str = "H100",
    name: str = "cluster",
    prefix: str = "n",
) -> ClusterLayout:
    """`nodes` identical servers of `gpus_per_node` GPUs in racks of `nodes_per_rack` and
    blocks of `racks_per_block` racks; no teams."""
    for key, value, low in (
        ("nodes", nodes, 1),
        ("gpus_per_node", gpus_per_node, 1),
        ("nodes_per_rack", nodes_per_rack, 1),
        ("racks_per_block", racks_per_block, 1),
    ):
        if value < low:
            raise LayoutError(f"layout {name}: {key} must be ≥ {low}, got {value}")
    try:
        built = cluster_nodes(
            nodes,
            gpus_per_node=gpus_per_node,
            nodes_per_rack=nodes_per_rack,
            racks_per_block=racks_per_block,
            gpu_model=gpu_model,
            prefix=prefix,
        )
    except ValueError as e:  # Node rejects GPU counts above 62 (bitmask width)
        raise LayoutError(f"layout {name}: {e}") from None
    return ClusterLayout(name, tuple(built))


def parse_vc_nodes(text: str) -> dict[str, int]:
    """Parse "6214e9=64,7f04ca=32" into {"6214e9": 64, "7f04ca": 32}, in the given order.

    Whitespace around names and counts is ignored. Raises LayoutError on a missing `=`,
    an empty name, a count that is not a positive integer, or a VC named twice.
    """
    out: dict[str, int] = {}
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise LayoutError("VC list is empty; expected e.g. '6214e9=64,7f04ca=32'")
    for item in items:
        vc, eq, count = (part.strip() for part in item.partition("="))
        if not eq or not vc:
            raise LayoutError(f"VC list: {item!r} is not NAME=NODES (e.g. '6214e9=64')")
        try:
            nodes = int(count)
        except ValueError:
            raise LayoutError(f"VC list: {vc}: node count {count!r} is not an integer") from None
        if nodes <= 0:
            raise LayoutError(f"VC list: {vc}: node count must be positive, got {nodes}")
        if vc in out:
            raise LayoutError(f"VC list: {vc} is listed twice")
        out[vc] = nodes
    return out


def per_vc(
    vc_nodes: Mapping[str, int], gpus_per_node: int = 8, nodes_per_rack: int = 32
) -> dict[str, ClusterLayout]:
    """One independent cluster per VC, each with one team named after the VC and no quota:
    Philly's VCs shared one physical cluster under quotas, so this is the simplification
    of replaying each VC on capacity of its own. Node names carry the VC ("6214e9-n0000"),
    so they stay unique if the clusters are ever merged. uniform() checks each count."""
    out: dict[str, ClusterLayout] = {}
    for vc, nodes in vc_nodes.items():
        base = uniform(nodes, gpus_per_node, nodes_per_rack, name=vc, prefix=f"{vc}-n")
        out[vc] = ClusterLayout(vc, base.nodes, (Team(vc),))
    return out


_CLUSTER_KEYS = {
    "name": str,
    "nodes": int,
    "gpus_per_node": int,
    "nodes_per_rack": int,
    "racks_per_block": int,
    "gpu_model": str,
    "teams": list,
}
_VC_KEYS = {"vcs": (dict, str), "gpus_per_node": int, "nodes_per_rack": int}
_TEAM_KEYS = {
    "name": str,
    "quota": int,
    "cohort": str,
    "borrowing_limit": int,
    "weight": float,
}


def _check_keys(where: str, data: Mapping[Any, Any], allowed: Mapping[str, Any]) -> None:
    """Reject unknown keys and values of the wrong type (bool is not an int here; an int is a
    float; None means "not set" only where the field allows it)."""
    for key, value in data.items():
        if key not in allowed:
            raise LayoutError(
                f"{where}: unknown key {key!r} (expected one of {', '.join(allowed)})"
            )
        kinds = allowed[key] if isinstance(allowed[key], tuple) else (allowed[key],)
        ok = isinstance(value, kinds) and not isinstance(value, bool)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            names = " or ".join(k.__name__ for k in kinds)
            raise LayoutError(f"{where}: {key} must be {names}, got {value!r}")


def _team(where: str, data: Any) -> Team:
    if not isinstance(data, dict):
        raise LayoutError(f"{where}: a team must be a mapping with at least `name`, got {data!r}")
    _check_keys(where, {k: v for k, v in data.items() if v is not None}, _TEAM_KEYS)
    if "name" not in data:
        raise LayoutError(f"{where}: team needs a name")
    for key in ("quota", "borrowing_limit"):
        if data.get(key) is not None and data[key] < 0:
            raise LayoutError(f"{where}: {key} must be ≥ 0, got {data[key]}")
    weight = data.get("weight")
    if weight is not None and weight <= 0:
        raise LayoutError(f"{where}: weight must be > 0, got {weight}")
    return Team(
        name=data["name"],
        quota=data.get("quota"),
        cohort=data.get("cohort"),
        borrowing_limit=data.get("borrowing_limit"),
        weight=None if weight is None else float(weight),
    )


def load_yaml(path: Path) -> ClusterLayout | dict[str, ClusterLayout]:
    """Read a layout file (format in the module docstring): a `nodes:` file gives one
    ClusterLayout, a `vcs:` file a dict of them keyed by VC name."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise LayoutError(f"{path}: cannot read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise LayoutError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise LayoutError(f"{path}: expected a mapping with `nodes:` or `vcs:` at the top")
    if "vcs" in data and "nodes" in data:
        raise LayoutError(f"{path}: give either `nodes:` (one cluster) or `vcs:`, not both")
    if "vcs" in data:
        _check_keys(str(path), data, _VC_KEYS)
        vcs = data["vcs"]
        if isinstance(vcs, str):
            vc_nodes = parse_vc_nodes(vcs)
        else:
            vc_nodes = {}
            for vc, nodes in vcs.items():
                if not isinstance(vc, str):
                    raise LayoutError(
                        f"{path}: vcs: VC name {vc!r} must be a string; quote VC names so "
                        "YAML keeps them as written"
                    )
                if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes <= 0:
                    raise LayoutError(f"{path}: vcs: {vc}: node count must be > 0, got {nodes!r}")
                vc_nodes[vc] = nodes
        if not vc_nodes:
            raise LayoutError(f"{path}: vcs: no VCs listed")
        try:
            return per_vc(vc_nodes, data.get("gpus_per_node", 8), data.get("nodes_per_rack", 32))
        except LayoutError as e:
            raise LayoutError(f"{path}: {e}") from None
    if "nodes" not in data:
        raise LayoutError(f"{path}: missing `nodes:` (or `vcs:` for one cluster per VC)")
    _check_keys(str(path), data, _CLUSTER_KEYS)
    name = data.get("name", path.stem)
    teams = tuple(_team(f"{path}: teams[{i}]", t) for i, t in enumerate(data.get("teams", [])))
    try:
        base = uniform(
            data["nodes"],
            data.get("gpus_per_node", 8),
            data.get("nodes_per_rack", 32),
            data.get("racks_per_block", 8),
            data.get("gpu_model", "H100"),
            name=name,
        )
        return ClusterLayout(name, base.nodes, teams)
    except LayoutError as e:
        raise LayoutError(f"{path}: {e}") from None
