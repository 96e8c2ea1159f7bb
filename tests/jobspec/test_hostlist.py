"""Slurm hostlist expressions, by table and by round trip."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from phalanx.jobspec import JobSpecError, hostlist


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("rack[1-2]-node[1-2]", ["rack1-node1", "rack1-node2", "rack2-node1", "rack2-node2"]),
        ("127.0.0.[2-3]", ["127.0.0.2", "127.0.0.3"]),
        ("127.0.0.2,127.0.0.[5,7]", ["127.0.0.2", "127.0.0.5", "127.0.0.7"]),
        ("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"]),
        ("login", ["login"]),
        ("a, b", ["a", "b"]),
        ("", []),
    ],
)
def test_expand(expr: str, names: list[str]) -> None:
    assert hostlist.expand(expr) == names


@pytest.mark.parametrize(
    ("names", "expr"),
    [
        (["node01", "node02", "node03", "node04", "node07"], "node[01-04,07]"),
        (["127.0.0.2", "127.0.0.3", "127.0.0.4"], "127.0.0.[2-4]"),
        (["n9", "n10", "n11"], "n[9-11]"),
        (["n09", "n10"], "n[09-10]"),
        (["n1", "n01"], "n1,n01"),  # different widths are different names
        (["b2", "a1", "a2"], "b2,a[1-2]"),  # rank order is kept, not sorted
        (["n3", "n1"], "n3,n1"),
        (["login", "login"], "login,login"),
        (["node7"], "node7"),
        (["n" + "9" * 40, "n" + "9" * 40], "n" + "9" * 40 + ",n" + "9" * 40),
        ([], ""),
    ],
)
def test_compress(names: list[str], expr: str) -> None:
    assert hostlist.compress(names) == expr
    assert hostlist.expand(expr) == names


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("n[1-3", "without a matching ']'"),
        ("n1-3]", "without a matching '['"),
        ("n[[1]]", "nested"),
        ("n[3-1]", "runs backwards"),
        ("n[a-b]", "bad range"),
        ("n[]", "bad range"),
        ("a,,b", "empty entry"),
        ("n[0-99999999999]", "more than"),
        ("n[1-" + "9" * 5000 + "]", "bad range"),
    ],
)
def test_expand_rejects(expr: str, message: str) -> None:
    with pytest.raises(JobSpecError, match=re.escape(message)) as err:
        hostlist.expand(expr)
    assert expr in str(err.value)


@pytest.mark.parametrize("name", ["", "a b", "n[1]", "a,b"])
def test_compress_rejects_bad_names(name: str) -> None:
    with pytest.raises(JobSpecError, match="invalid host name"):
        hostlist.compress(["ok1", name])


_names = st.builds(
    lambda prefix, digits: prefix + digits,
    st.sampled_from(["node", "gpu-", "127.0.0.", "rack1-n", "login", "", "x"]),
    st.one_of(st.just(""), st.integers(0, 300).map(str), st.integers(0, 300).map("{:03d}".format)),
).filter(bool)


@given(st.lists(_names, max_size=40))
def test_round_trip_from_names(names: list[str]) -> None:
    assert hostlist.expand(hostlist.compress(names)) == names


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=200, unique=True).map(sorted))
def test_sorted_numbers_compress_to_one_bracket(numbers: list[int]) -> None:
    names = [f"node{n:04d}" for n in numbers]
    expr = hostlist.compress(names)
    assert expr.count("[") == (1 if len(names) > 1 else 0)
    assert hostlist.expand(expr) == names


_ranges = st.tuples(st.integers(0, 50), st.integers(0, 5), st.integers(1, 3)).map(
    lambda t: f"{t[0]:0{t[2]}d}-{t[0] + t[1]:0{t[2]}d}" if t[1] else f"{t[0]:0{t[2]}d}"
)
_exprs = st.builds(
    lambda prefix, groups, suffix: prefix + "".join(f"[{g}]" for g in groups) + suffix,
    st.sampled_from(["n", "127.0.0.", "rack"]),
    st.lists(st.lists(_ranges, min_size=1, max_size=3).map(",".join), min_size=1, max_size=2),
    st.sampled_from(["", "-ib"]),
)


@given(_exprs)
def test_round_trip_from_expressions(expr: str) -> None:
    names = hostlist.expand(expr)
    assert hostlist.expand(hostlist.compress(names)) == names
