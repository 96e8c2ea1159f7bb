"""Cluster layouts: uniform clusters, per-VC clusters, the VC list syntax and YAML files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from phalanx.core.model import Node, Team
from phalanx.sim.layout import (
    ClusterLayout,
    LayoutError,
    load_yaml,
    parse_vc_nodes,
    per_vc,
    uniform,
)
from phalanx.sim.workload import read_philly

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"


def test_uniform_topology() -> None:
    layout = uniform(70, gpus_per_node=4, nodes_per_rack=16, racks_per_block=2, name="c")
    assert (layout.name, len(layout.nodes), layout.gpus, layout.teams) == ("c", 70, 280, ())
    assert len({n.name for n in layout.nodes}) == 70
    assert layout.nodes[0].name == "n0000" and layout.nodes[-1].name == "n0069"
    racks = Counter(n.rack for n in layout.nodes)
    assert racks == {"r0": 16, "r1": 16, "r2": 16, "r3": 16, "r4": 6}
    assert [n.block for n in layout.nodes[::16]] == ["b0", "b0", "b1", "b1", "b2"]
    assert all(n.gpus == 4 and n.gpu_model == "H100" for n in layout.nodes)


def test_uniform_scales_to_100k_gpus() -> None:
    layout = uniform(12_500, prefix="gpu-")
    assert layout.gpus == 100_000
    assert layout.nodes[-1] == Node("gpu-12499", 8, rack="r390", block="b48")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"nodes": 0}, "nodes must be ≥ 1"),
        ({"nodes": 2, "gpus_per_node": 0}, "gpus_per_node must be ≥ 1"),
        ({"nodes": 2, "gpus_per_node": 63}, "GPU count must be 0..62"),
        ({"nodes": 2, "nodes_per_rack": 0}, "nodes_per_rack must be ≥ 1"),
        ({"nodes": 2, "racks_per_block": 0}, "racks_per_block must be ≥ 1"),
    ],
)
def test_uniform_rejects_bad_shapes(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(LayoutError, match=match):
        uniform(**kwargs)


def test_layout_rejects_duplicate_names() -> None:
    node = Node("n0", 8)
    with pytest.raises(LayoutError, match=r"duplicate node names \['n0'\]"):
        ClusterLayout("c", (node, node))
    with pytest.raises(LayoutError, match=r"duplicate team names \['a'\]"):
        ClusterLayout("c", (node,), (Team("a"), Team("a", quota=8)))


def test_parse_vc_nodes_keeps_order() -> None:
    parsed = parse_vc_nodes(" 6214e9=64, 7f04ca = 32,103959=8 ")
    assert parsed == {"6214e9": 64, "7f04ca": 32, "103959": 8}
    assert list(parsed) == ["6214e9", "7f04ca", "103959"]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "VC list is empty"),
        (" , ", "VC list is empty"),
        ("6214e9", r"'6214e9' is not NAME=NODES"),
        ("=4", r"'=4' is not NAME=NODES"),
        ("a=1,,b=2", r"'' is not NAME=NODES"),
        ("a=x", r"a: node count 'x' is not an integer"),
        ("a=2.5", r"a: node count '2.5' is not an integer"),
        ("a=0", "a: node count must be positive, got 0"),
        ("a=-3", "a: node count must be positive, got -3"),
        ("a=1,b=2,a=3", "a is listed twice"),
    ],
)
def test_parse_vc_nodes_errors(text: str, match: str) -> None:
    with pytest.raises(LayoutError, match=match):
        parse_vc_nodes(text)


def test_per_vc_builds_independent_clusters() -> None:
    clusters = per_vc({"6214e9": 3, "7f04ca": 2}, gpus_per_node=4, nodes_per_rack=2)
    assert list(clusters) == ["6214e9", "7f04ca"]
    big = clusters["6214e9"]
    assert big.name == "6214e9" and big.teams == (Team("6214e9"),)
    assert [(n.name, n.rack, n.gpus) for n in big.nodes] == [
        ("6214e9-n0000", "r0", 4),
        ("6214e9-n0001", "r0", 4),
        ("6214e9-n0002", "r1", 4),
    ]
    assert clusters["7f04ca"].gpus == 8
    with pytest.raises(LayoutError, match="nodes must be ≥ 1"):
        per_vc({"a": 0})


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"no trace folder at {TRACES}")
def test_per_vc_covers_every_philly_team() -> None:
    clusters = per_vc(parse_vc_nodes("7f04ca=2,e13805=4"))
    trace = read_philly(TRACES / "philly_pollux" / "philly.csv", vcs=clusters)
    assert {j.team for j in trace.jobs} == set(clusters)
    for job in trace.jobs:  # every job fits its VC's cluster (largest: 16 and 32 GPUs)
        assert job.gpus <= clusters[job.team].gpus


def dump(tmp_path: Path, data: Any, name: str = "layout.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_yaml_cluster_round_trip(tmp_path: Path) -> None:
    spec = {
        "name": "research",
        "nodes": 40,
        "gpus_per_node": 4,
        "nodes_per_rack": 8,
        "racks_per_block": 2,
        "gpu_model": "A100",
        "teams": [
            {"name": "vision", "quota": 64, "cohort": "lab", "borrowing_limit": 16},
            {"name": "speech", "quota": 32, "cohort": "lab", "borrowing_limit": None},
            {"name": "infra", "weight": 2},
        ],
    }
    layout = load_yaml(dump(tmp_path, spec))
    expected = uniform(40, 4, 8, 2, "A100", name="research")
    assert isinstance(layout, ClusterLayout)
    assert layout.nodes == expected.nodes
    assert layout.teams == (
        Team("vision", quota=64, cohort="lab", borrowing_limit=16),
        Team("speech", quota=32, cohort="lab"),
        Team("infra", weight=2.0),
    )
    assert layout.name == "research"


def test_yaml_defaults_and_name_from_file(tmp_path: Path) -> None:
    layout = load_yaml(dump(tmp_path, {"nodes": 3}, "small.yaml"))
    assert layout == ClusterLayout("small", uniform(3).nodes)


def test_yaml_vcs_round_trip(tmp_path: Path) -> None:
    vcs = {"6214e9": 4, "11cb48": 2, "103959": 1}
    spec = {"vcs": vcs, "gpus_per_node": 4, "nodes_per_rack": 2}
    text = yaml.safe_dump(spec)
    assert "'103959'" in text  # safe_dump quotes a name YAML would read as a number
    assert load_yaml(dump(tmp_path, spec)) == per_vc(vcs, 4, 2)
    as_string = {"vcs": "6214e9=4,11cb48=2,103959=1", "gpus_per_node": 4, "nodes_per_rack": 2}
    assert load_yaml(dump(tmp_path, as_string)) == per_vc(vcs, 4, 2)


def test_yaml_unquoted_hex_vc_names_stay_strings(tmp_path: Path) -> None:
    path = tmp_path / "vcs.yaml"
    path.write_text("vcs: {6214e9: 2, 11cb48: 1, 0e4a51: 1}\n", encoding="utf-8")
    clusters = load_yaml(path)
    assert isinstance(clusters, dict)
    assert list(clusters) == ["6214e9", "11cb48", "0e4a51"]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("nodes: 4\ngpu_per_node: 4\n", "unknown key 'gpu_per_node'"),
        ('nodes: "4"\n', "nodes must be int, got '4'"),
        ("nodes: true\n", "nodes must be int, got True"),
        ("nodes: 4\ngpu_model: 100\n", "gpu_model must be str"),
        ("nodes: 0\n", "nodes must be ≥ 1"),
        ("nodes: 2\ngpus_per_node: 64\n", "GPU count must be 0..62"),
        ("gpus_per_node: 8\n", "missing `nodes:`"),
        ("nodes: 4\nvcs: {a: 1}\n", "not both"),
        ("- nodes: 4\n", "expected a mapping"),
        ("", "expected a mapping"),
        ("nodes: [4\n", "not valid YAML"),
        ("nodes: 2\nteams: {name: a}\n", "teams must be list"),
        ("nodes: 2\nteams: [a]\n", r"teams\[0\]: a team must be a mapping"),
        ("nodes: 2\nteams: [{name: a, qouta: 3}]\n", r"teams\[0\]: unknown key 'qouta'"),
        ("nodes: 2\nteams: [{quota: 3}]\n", r"teams\[0\]: team needs a name"),
        ("nodes: 2\nteams: [{name: a, quota: 1.5}]\n", "quota must be int"),
        ("nodes: 2\nteams: [{name: a}, {name: b, quota: -1}]\n", r"teams\[1\]: quota must be ≥ 0"),
        ("nodes: 2\nteams: [{name: a, weight: 0}]\n", "weight must be > 0"),
        ("nodes: 2\nteams: [{name: a}, {name: a}]\n", r"duplicate team names \['a'\]"),
        ("vcs: {103959: 2}\n", "VC name 103959 must be a string; quote"),
        ("vcs: {a: 0}\n", "a: node count must be > 0"),
        ("vcs: {a: 2}\nracks_per_block: 2\n", "unknown key 'racks_per_block'"),
        ("vcs: {}\n", "no VCs listed"),
        ("vcs: [a, b]\n", "vcs must be dict or str"),
        ('vcs: "a=1,a=2"\n', "a is listed twice"),
    ],
)
def test_yaml_errors(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(LayoutError, match=match):
        load_yaml(path)


def test_yaml_missing_file(tmp_path: Path) -> None:
    with pytest.raises(LayoutError, match=r"absent\.yaml: cannot read"):
        load_yaml(tmp_path / "absent.yaml")
