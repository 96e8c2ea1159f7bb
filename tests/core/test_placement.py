"""Phase 4 — gang, topology-aware placement: single-node best fit; gangs into the tightest
rack, then block, then the whole cluster; all of a gang or nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from phalanx.core import ClusterState, JobRequest, Node, Placement, ReasonCode, schedule
from phalanx.core.placement import Constraints, domain_of, place
from phalanx.testing import job, node, run_job
from tests.core.helpers import Case, Running, check


def _busy(name: str, gpus: int, job_id: int) -> Running:
    """A running filler job holding `gpus` GPUs of node `name` (no time limit)."""
    return Running(job(job_id, team="filler", gpus=gpus), on={name: gpus})


def _topology(*racks: tuple[str, str, int]) -> list[Node]:
    """(block, rack, node count) per rack; nodes are named <rack>n<k> with 8 GPUs."""
    return [node(f"{r}n{k}", 8, rack=r, block=b) for b, r, count in racks for k in range(count)]


# b0: r0 (3 nodes), r1 (2 nodes); b1: r2 (2 nodes), r3 (1 node).
TOPO = _topology(("b0", "r0", 3), ("b0", "r1", 2), ("b1", "r2", 2), ("b1", "r3", 1))
FLAT = [node("n0"), node("n1"), node("n2"), node("n3")]
MIXED = [node("h0"), node("a0", gpu_model="A100"), node("h1"), node("a1", gpu_model="A100")]


@dataclass(frozen=True)
class PlaceCase:
    nodes: Sequence[Node]
    request: JobRequest
    expect: Sequence[str] | None  # node names in rank order, or None: it must not start
    domain: str | None = None
    busy: Sequence[Running] = ()
    down: Sequence[str] = ()


def _gang(nodes: int, gpus: int = 8, **kw: Any) -> JobRequest:
    return replace(job(1, nodes=nodes, gpus=gpus), **kw)


CASES: dict[str, PlaceCase] = {
    "single-best-fit-smallest-free-that-fits": PlaceCase(
        FLAT,
        job(1, gpus=3),
        ["n2"],
        "node",
        busy=[_busy("n1", 4, 90), _busy("n2", 5, 91), _busy("n3", 6, 92)],
    ),
    "single-best-fit-exact-fit": PlaceCase(
        FLAT,
        job(1, gpus=2),
        ["n3"],
        "node",
        busy=[_busy("n1", 4, 90), _busy("n2", 5, 91), _busy("n3", 6, 92)],
    ),
    "single-full-node-on-an-empty-node": PlaceCase(
        FLAT, job(1, gpus=8), ["n1"], "node", busy=[_busy("n0", 1, 90)]
    ),
    "single-best-fit-ties-go-to-lowest-index": PlaceCase(
        FLAT,
        job(1, gpus=4),
        ["n1"],
        busy=[_busy("n3", 4, 90), _busy("n1", 4, 91), _busy("n2", 4, 92)],
    ),
    "single-skips-down-node": PlaceCase(
        FLAT, job(1, gpus=3), ["n1"], busy=[_busy("n1", 4, 90), _busy("n2", 5, 91)], down=["n2"]
    ),
    "single-skips-excluded-node": PlaceCase(
        FLAT,
        replace(job(1, gpus=3), exclude_nodes=frozenset({"n2"})),
        ["n1"],
        busy=[_busy("n1", 4, 90), _busy("n2", 5, 91)],
    ),
    "single-gpu-model-wins-over-fit": PlaceCase(
        MIXED,
        replace(job(1, gpus=1), gpu_model="A100"),
        ["a1"],
        busy=[_busy("h0", 7, 90), _busy("a0", 8, 91)],
    ),
    "single-any-model-best-fit-across-models": PlaceCase(
        MIXED, job(1, gpus=1), ["a0"], busy=[_busy("h0", 6, 90), _busy("a0", 7, 91)]
    ),
    "single-does-not-fit-anywhere": PlaceCase(
        FLAT,
        job(1, gpus=5),
        None,
        busy=[_busy(n, 4, 90 + k) for k, n in enumerate(["n0", "n1", "n2", "n3"])],
    ),
    "gang-tightest-rack-first-of-equals": PlaceCase(TOPO, _gang(2), ["r1n0", "r1n1"], "rack"),
    "gang-tightest-rack-counts-only-free-nodes": PlaceCase(
        TOPO, _gang(2), ["r2n0", "r2n1"], "rack", busy=[_busy("r1n0", 1, 90)]
    ),
    "gang-only-rack-big-enough": PlaceCase(TOPO, _gang(3), ["r0n0", "r0n1", "r0n2"], "rack"),
    "gang-best-fit-inside-rack": PlaceCase(
        [node("n0"), node("n1"), node("n2")],
        _gang(2, gpus=4),
        ["n1", "n2"],
        "rack",
        busy=[_busy("n1", 4, 90), _busy("n2", 2, 91)],
    ),
    "gang-spans-tightest-block": PlaceCase(
        TOPO, _gang(3), ["r2n0", "r2n1", "r3n0"], "block", busy=[_busy("r0n0", 1, 90)]
    ),
    "gang-spans-cluster-when-no-block-holds-it": PlaceCase(
        TOPO,
        _gang(5),
        ["r0n1", "r0n2", "r1n0", "r1n1", "r2n0"],
        "cluster",
        busy=[_busy("r0n0", 1, 90)],
    ),
    "gang-whole-cluster": PlaceCase(TOPO, _gang(8), [n.name for n in TOPO], "cluster"),
    "gang-all-or-nothing-one-node-short": PlaceCase(
        TOPO, _gang(8), None, busy=[_busy("r3n0", 1, 90)]
    ),
    "gang-per-node-share-must-fit-each-node": PlaceCase(
        FLAT,
        _gang(3, gpus=5),
        None,
        busy=[_busy("n0", 4, 90), _busy("n1", 4, 91)],
    ),
    "gang-partial-nodes": PlaceCase(
        FLAT,
        _gang(3, gpus=4),
        ["n0", "n1", "n2"],
        "rack",
        busy=[_busy("n0", 4, 90), _busy("n1", 4, 91), _busy("n2", 4, 92)],
    ),
    "gang-gpu-model": PlaceCase(MIXED, _gang(2, gpu_model="A100"), ["a0", "a1"], "rack"),
    "gang-gpu-model-not-enough": PlaceCase(
        MIXED, _gang(2, gpu_model="A100"), None, busy=[_busy("a1", 1, 90)]
    ),
    "gang-skips-excluded-and-down": PlaceCase(
        FLAT,
        _gang(2, exclude_nodes=frozenset({"n0"})),
        ["n2", "n3"],
        "rack",
        down=["n1"],
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_placement_table(case: PlaceCase) -> None:
    state, decisions = check(
        Case(nodes=case.nodes, queue=[case.request], running=case.busy, down=case.down)
    )
    if case.expect is None:
        assert decisions.starts == ()
        assert decisions.reason_for(case.request).code is ReasonCode.RESOURCES
        return
    (start,) = decisions.starts
    assert state.node_names(start.placement) == tuple(case.expect)
    for slot in range(len(start.placement.slots)):
        assert len(start.placement.gpu_indices(slot)) == case.request.gpus_per_node
    if case.domain is not None:
        assert domain_of(state, start.placement) == case.domain


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (job(1, gpus=16), ("needs 16 GPUs on one node", "largest node has 8")),
        (job(1, nodes=9), ("needs 9 nodes × 1 GPUs", "only 8 node(s)")),
        (replace(job(1), gpu_model="B200"), ("needs B200 GPUs", "H100")),
    ],
    ids=["more-gpus-than-any-node", "more-nodes-than-the-cluster", "unknown-gpu-model"],
)
def test_infeasible_jobs(request_: JobRequest, words: tuple[str, ...]) -> None:
    check(
        Case(
            nodes=TOPO,
            queue=[request_],
            starts={},
            reasons={1: (ReasonCode.INFEASIBLE, words)},
        )
    )


def test_down_nodes_make_a_gang_wait_for_them() -> None:
    check(
        Case(
            nodes=FLAT,
            queue=[_gang(4)],
            down=["n3"],
            starts={},
            reasons={
                1: (
                    ReasonCode.NODES_UNAVAILABLE,
                    ("only 3 node(s) with ≥8 GPUs are up, 1 more down or drained",),
                )
            },
        )
    )


def test_picks_the_lowest_free_gpu_indices() -> None:
    state = ClusterState([node("n0")])
    run_job(state, job(90, gpus=3), {"n0": 3})
    state.submit(job(1, gpus=2), 0.0)
    (start,) = schedule(state, 1.0).starts
    assert start.placement == Placement(((0, 0b11000),))
    assert start.placement.gpu_indices(0) == (3, 4)


def test_several_jobs_in_one_cycle_never_share_gpus() -> None:
    state = ClusterState(FLAT)
    for k in range(1, 9):
        state.submit(job(k, gpus=3 + k % 3), float(k))
    decisions = schedule(state, 10.0)
    used = [0] * len(FLAT)
    for start in decisions.starts:
        for n, mask in start.placement.slots:
            assert used[n] & mask == 0
            used[n] |= mask
    assert len(decisions.starts) >= 4


def test_constraints_limit_gpus_per_node() -> None:
    state = ClusterState(FLAT)
    limits = Constraints(limits={0: 1, 1: 3, 2: 0, 3: 0})
    assert place(state, job(1, gpus=3), limits) == Placement(((1, 0b111),))
    assert place(state, job(1, gpus=4), limits) is None
    assert place(state, _gang(2, gpus=1), limits) is not None
    assert place(state, _gang(3, gpus=1), limits) is None
    both = Constraints(limits={0: 8}, excluded=frozenset({0, 1}))
    assert place(state, _gang(2), both) == Placement(((2, 255), (3, 255)))
    assert place(state, _gang(3), both) is None


def test_domain_names() -> None:
    state = ClusterState(TOPO)
    idx = state.node_index
    assert domain_of(state, Placement(((idx["r0n0"], 1),))) == "node"
    assert domain_of(state, Placement(((idx["r0n0"], 1), (idx["r0n1"], 1)))) == "rack"
    assert domain_of(state, Placement(((idx["r0n0"], 1), (idx["r1n1"], 1)))) == "block"
    assert domain_of(state, Placement(((idx["r0n0"], 1), (idx["r2n1"], 1)))) == "cluster"
