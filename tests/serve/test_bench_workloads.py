"""serve.bench workloads and trace readers, against the real traces in ../shared/traces."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

import pytest

from phalanx.serve.bench import traces
from phalanx.serve.bench.workloads import WorkloadSpec, block_text, build


def test_mooncake_trace_is_read_whole() -> None:
    rows = traces.load("mooncake")
    assert len(rows) == 12_031
    first = rows[0]
    assert (first.time_s, first.input_tokens, first.output_tokens) == (0.0, 6758, 500)
    assert first.hash_ids[:3] == (0, 1, 2) and len(first.hash_ids) == 14
    # The README's figures: average input 12,035 and output 343 tokens, one hour.
    assert statistics.mean(r.input_tokens for r in rows) == pytest.approx(12_035, rel=0.01)
    assert statistics.mean(r.output_tokens for r in rows) == pytest.approx(343, rel=0.01)
    assert 3400 < rows[-1].time_s <= 3600  # sampled from one hour
    assert all(a.time_s <= b.time_s for a, b in itertools.pairwise(rows))
    # One hash id per 512-token block.
    assert all(len(r.hash_ids) == -(-r.input_tokens // 512) for r in rows[:500])


@pytest.mark.parametrize(("name", "count"), [("azure-conv", 19_366), ("azure-code", 8_819)])
def test_azure_traces_are_read_whole(name: str, count: int) -> None:
    rows = traces.load(name)
    assert len(rows) == count
    assert rows[0].time_s == 0.0
    assert 3000 < rows[-1].time_s < 3700  # one hour
    assert all(r.output_tokens >= 1 and r.input_tokens >= 1 for r in rows)
    assert traces.load(name, limit=5) == rows[:5]


def test_malformed_traces_name_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "t.jsonl"
    bad.write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n{oops\n'
    )
    with pytest.raises(traces.TraceError, match=r"t.jsonl:2: not JSON"):
        traces.load_mooncake(bad)
    bad.write_text('{"timestamp": 0, "input_length": 0, "output_length": 1}\n')
    with pytest.raises(traces.TraceError, match=r"t.jsonl:1: input_length must be an integer >= 1"):
        traces.load_mooncake(bad)
    csv = tmp_path / "t.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,x,1\n")
    with pytest.raises(traces.TraceError, match=r"t.csv:2: bad row"):
        traces.load_azure(csv)
    csv.write_text("a,b\n")
    with pytest.raises(traces.TraceError, match="expected the header"):
        traces.load_azure(csv)
    with pytest.raises(traces.TraceError, match="cannot read trace"):
        traces.load_azure(tmp_path / "missing.csv")
    with pytest.raises(traces.TraceError, match="unknown trace"):
        traces.load("sharegpt")


def test_random_lengths_and_poisson_arrivals() -> None:
    reqs = build(
        WorkloadSpec(
            name="random", num=2000, rate=8.0, input_len=100, output_len=10, range_ratio=0.5, seed=1
        )
    )
    assert all(50 <= r.prompt_len <= 150 and 5 <= r.max_tokens <= 15 for r in reqs)
    assert all(len(r.prompt.split()) == r.prompt_len for r in reqs)
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(reqs)]
    assert statistics.mean(gaps) == pytest.approx(1 / 8.0, rel=0.08)
    assert statistics.stdev(gaps) == pytest.approx(1 / 8.0, rel=0.1)  # exponential: sd = mean
    assert build(WorkloadSpec(name="random", num=5, seed=1)) == build(
        WorkloadSpec(name="random", num=5, seed=1)
    )
    assert {r.arrival_s for r in build(WorkloadSpec(name="random", num=5))} == {0.0}  # rate inf


def test_prefix_workload_repeats_its_prefixes() -> None:
    reqs = build(WorkloadSpec(name="prefix", num=8, input_len=40, prefix_len=30, num_prefixes=2))
    heads = [" ".join(r.prompt.split()[:30]) for r in reqs]
    assert heads[0] == heads[2] == heads[4] != heads[1] == heads[3]
    assert {len(r.prompt.split()) for r in reqs} == {40}


def test_mooncake_prompts_keep_the_prefix_structure() -> None:
    scale = 0.05  # a 512-token block becomes 26 words
    rows = traces.load("mooncake", limit=40)
    reqs = build(
        WorkloadSpec(name="mooncake", num=40, scale=scale, trace_time=True, time_scale=0.5)
    )
    per_block = round(512 * scale)
    for row, req in zip(rows, reqs, strict=True):
        assert req.prompt_len == round(row.input_tokens * scale) == len(req.prompt.split())
        assert req.max_tokens == max(1, round(row.output_tokens * scale))
        assert req.arrival_s == pytest.approx(row.time_s * 0.5)
        first = " ".join(req.prompt.split()[:per_block])
        assert first == block_text(row.hash_ids[0], per_block)
    # Rows 0 and 1 share block 0 and nothing after it.
    w0, w1 = reqs[0].prompt.split(), reqs[1].prompt.split()
    assert w0[:per_block] == w1[:per_block]
    assert w0[per_block : 2 * per_block] != w1[per_block : 2 * per_block]


def test_azure_lengths_are_scaled_and_bad_specs_refused() -> None:
    rows = traces.load("azure-code", limit=10)
    reqs = build(WorkloadSpec(name="azure-code", num=10, scale=0.1, rate=2.0))
    assert [r.prompt_len for r in reqs] == [max(1, round(r.input_tokens * 0.1)) for r in rows]
    for bad, message in [
        (dict(name="random", trace_time=True), "needs a trace workload"),
        (dict(name="mooncake", trace_time=True, rate=1.0), "not both"),
        (dict(rate=-1.0), "rate must be"),
        (dict(scale=0.0), "scale must be"),
        (dict(num=0), "num must be"),
        (dict(name="sharegpt"), "unknown workload"),
    ]:
        with pytest.raises(ValueError, match=message):
            WorkloadSpec(**bad)  # type: ignore[arg-type]
