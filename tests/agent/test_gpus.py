"""GPU providers: the fake one, and NVML degrading cleanly on a machine without a driver."""

from __future__ import annotations

import importlib.util

import pytest

from phalanx.agent.gpus import FakeProvider, GpuError, NvmlProvider, detect


def test_fake_inventory_is_stable_per_node() -> None:
    a = FakeProvider(2, "A100", 40960, node_name="n1").inventory()
    again = FakeProvider(2, "A100", 40960, node_name="n1").inventory()
    other = FakeProvider(2, node_name="n2").inventory()
    assert a == again
    assert [(g.index, g.model, g.memory_mb) for g in a] == [(0, "A100", 40960), (1, "A100", 40960)]
    assert len({g.uuid for g in a + other}) == 4
    assert all(g.uuid.startswith("GPU-") for g in a)


def test_fake_telemetry_follows_busy_gpus() -> None:
    busy = {1}
    gpus = detect(3, "H100", node_name="n1", busy=lambda: busy)
    readings = [gpus.telemetry() for _ in range(20)]
    held = [r[1].utilization_pct for r in readings]
    # Busy by default: 95% ± 2 with a noise that repeats run after run.
    assert all(u is not None and 93.0 <= u <= 97.0 for u in held)
    assert len(set(held)) > 1
    again = detect(3, "H100", node_name="n1", busy=lambda: busy)
    assert [again.telemetry()[1].utilization_pct for _ in range(20)] == held
    assert (
        {r[0].utilization_pct for r in readings}
        == {r[2].utilization_pct for r in readings}
        == {0.0}
    )
    busy.clear()
    assert [t.utilization_pct for t in gpus.telemetry()] == [0.0, 0.0, 0.0]
    assert [g.model for g in gpus.inventory()] == ["H100"] * 3
    gpus.close()


def test_fake_gpu_count_must_not_be_negative() -> None:
    with pytest.raises(GpuError, match="--fake-gpus"):
        FakeProvider(-1)


def _nvml_driver_present() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_without_nvml_detect_explains_fake_gpus() -> None:
    assert importlib.util.find_spec("pynvml") is not None
    if _nvml_driver_present():
        provider = NvmlProvider()  # a GPU machine: NVML works and answers
        assert all(
            t.index == g.index
            for t, g in zip(provider.telemetry(), provider.inventory(), strict=True)
        )
        provider.close()
        provider.close()
        return
    with pytest.raises(GpuError, match=r"pass --fake-gpus N") as e:
        detect(None, "H100")
    assert "NVML" in str(e.value)
    with pytest.raises(GpuError, match="no NVIDIA GPU driver found"):
        NvmlProvider()
