"""The Grafana dashboard in deploy/grafana names only series that exist: every metric in
every panel's and variable's PromQL is one the head's /metrics or the per-GPU exposition
really writes, with labels those series really carry."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from phalanx.api.gpumetrics import GpuRow, render
from phalanx.head.metrics import HeadMetrics
from phalanx.head.mirror import Settings
from phalanx.testing.headloop import HeadLoop

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "phalanx.json"
PROMQL_WORDS = {
    "sum", "avg", "max", "min", "count", "rate", "increase", "histogram_quantile", "vector",
    "by", "without", "or", "and", "unless", "label_values",
}  # fmt: skip
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def real_series(tmp_path: Path) -> tuple[set[str], set[str]]:
    """(sample names, label names) a head and the per-GPU exposition write, after a job
    started, was preempted, requeued and ended on a real control loop."""
    loop = HeadLoop(tmp_path, Settings(tick_s=0.5, heartbeat_s=1.0, hang_timeout_s=0.0))
    metrics = HeadMetrics(loop.mirror, loop.control.lock)
    loop.control.on_committed.append(metrics.observe)
    try:
        loop.join("n1")
        victim = loop.submit(qos="low")
        loop.advance(2)
        boss = loop.submit(qos="high", preemptible=False)
        loop.advance(2)
        loop.exit(victim, 0)
        loop.advance(2)
        loop.exit(boss, 0)
        loop.advance(2)
        texts = [metrics.exposition().decode()]
    finally:
        loop.close()
    texts.append(render([GpuRow("n1", 0, "GPU-0", 80, 50.0, 40, 50.0, 300.0, 1.0, 7, "u", "t")]))
    names: set[str] = set()
    labels: set[str] = set()
    for text in texts:
        for family in text_string_to_metric_families(text):
            names.update(family.name + s for s in SUFFIXES.get(family.type, ("",)))
            for sample in family.samples:
                labels.update(sample.labels)
    return names, labels


def expressions(dashboard: dict[str, Any]) -> list[str]:
    out = []
    for panel in dashboard["panels"]:
        out += [t["expr"] for t in panel.get("targets", [])]
        for inner in panel.get("panels", []):
            out += [t["expr"] for t in inner.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            out.append(query["query"])
    return out


def parts(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression uses."""
    labels: set[str] = set()
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        labels.update(x.strip() for x in group.split(",") if x.strip())
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        labels.update(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", matchers))
    bare = re.sub(r'"[^"]*"', "", expr)  # strings
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", bare)  # matchers, ranges
    bare = re.sub(r"\b(by|without)\s*\([^)]*\)", "", bare)
    label_values = re.findall(r"label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)", bare)
    labels.update(label for _, label in label_values)
    bare = re.sub(r"label_values\(\s*(\w+)\s*,\s*\w+\s*\)", r"\1", bare)
    words = set(re.findall(r"\b[a-zA-Z_:][\w:]*\b", bare)) - PROMQL_WORDS
    return words, labels


def test_every_expression_names_real_series(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    names, labels = real_series(tmp_path)
    exprs = expressions(dashboard)
    assert len(exprs) >= 20
    used_names: set[str] = set()
    for expr in exprs:
        metric_names, label_names = parts(expr)
        assert metric_names, expr
        assert metric_names <= names, (expr, sorted(metric_names - names))
        assert label_names <= labels, (expr, sorted(label_names - labels))
        used_names |= metric_names
    # Every family the head and the per-GPU exposition write has a panel.
    families = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in names}
    shown = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in used_names}
    assert families - shown == set()


def test_the_dashboard_is_importable(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
