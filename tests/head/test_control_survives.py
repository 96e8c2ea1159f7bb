"""An unexpected exception in one operation (or in the clock) never stops the control loop:
it is rolled back with its batch, the mirror is rebuilt from the database, the operation is
answered 500, the others run and are committed once (issue 12)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from phalanx.head import clock, db
from phalanx.head.control import ControlThread, HeadError
from phalanx.head.migrate import upgrade
from phalanx.head.mirror import Settings, Tx


@pytest.fixture
def control(tmp_path: Path) -> Iterator[ControlThread]:
    engine = db.make_engine(db.default_url(tmp_path))
    upgrade(engine)
    control = ControlThread(engine, Settings())
    control.load()
    control.start()
    try:
        yield control
    finally:
        control.stop()
        engine.dispose()


def event_kinds(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(db.events.c.kind).order_by(db.events.c.id)).scalars())


def in_one_batch(control: ControlThread, *fns: Any) -> list[Future[Any]]:
    """Queue `fns` while the control thread is busy, so they run in one transaction."""
    inside, go_on = threading.Event(), threading.Event()

    def hold(tx: Tx) -> None:
        inside.set()
        go_on.wait(10)

    control.submit_op(hold)
    assert inside.wait(10)
    futures = [control.submit_op(fn) for fn in fns]
    go_on.set()
    return futures


def test_an_operation_that_raises_is_rolled_back_alone(control: ControlThread) -> None:
    ids_before = control.mirror.next_job_id

    def good(kind: str) -> Any:
        def op(tx: Tx) -> str:
            tx.event(1.0, kind, "committed")
            return kind

        return op

    def poisoned(tx: Tx) -> None:
        control.mirror.next_job_id = 10**6  # a half-made change to the mirror…
        tx.event(1.0, "poisoned", "must not be committed")  # …and to the database
        raise RuntimeError("a bug, or input nobody foresaw")

    first, bad, last = in_one_batch(control, good("first"), poisoned, good("last"))
    assert first.result(10) == "first" and last.result(10) == "last"
    with pytest.raises(HeadError) as refused:
        bad.result(10)
    assert refused.value.status == 500
    assert control.loop_errors == 1
    assert event_kinds(control.engine) == ["first", "last"]  # once each, nothing of the bad op
    assert control.mirror.next_job_id == ids_before  # rebuilt from the database
    assert control.call(good("after"), timeout=10) == "after"  # the loop goes on


def test_a_clock_that_raises_is_survived(
    control: ControlThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = clock.tick
    calls = []

    def tick(*args: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in the clock")
        real(*args)

    monkeypatch.setattr(clock, "tick", tick)

    def probe(tx: Tx) -> int:
        return len(calls)

    deadline = 40  # ticks every 0.5 s: wait for the failing tick and one more
    for _ in range(deadline):
        if control.call(probe, timeout=10) >= 2:
            break
        threading.Event().wait(0.25)
    assert len(calls) >= 2 and control.loop_errors == 1
