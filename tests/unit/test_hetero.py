"""Heterogeneity injection: the sleep rule, and a real cgroup CPU quota (issue: fair heterogeneity)."""
import os
import subprocess
import sys
import time

import pytest

from hvd_adaptive.config import HeteroConfig
from hvd_adaptive.train.hetero import CpuQuota, Heterogeneity


def busy(seconds: float) -> float:
    end = time.perf_counter() + seconds
    x = 0.0
    while time.perf_counter() < end:
        x += 1.0
    return x


def test_sleep_mode_multiplies_the_computed_span_only(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)  # record the requested extra time
    h = Heterogeneity(HeteroConfig(slowdown={1: 3.0}), rank=1)
    out, seconds = h.compute(lambda x: (x * 2,), 21)
    assert out == (42,)
    assert len(slept) == 1 and slept[0] == pytest.approx(2.0 * seconds, rel=0.5, abs=1e-3)
    slept.clear()
    _, span = h.compute(busy, 0.02)
    assert slept[0] == pytest.approx(2.0 * span, rel=0.05)  # (f - 1) x the span's own time
    fast = Heterogeneity(HeteroConfig(slowdown={1: 3.0}), rank=0)
    fast.compute(busy, 0.01)
    quota = Heterogeneity(HeteroConfig(slowdown={1: 3.0}, mode="cpu_quota"), rank=1)
    quota.compute(busy, 0.01)
    assert len(slept) == 1, "an unslowed rank and the cpu_quota mode must not sleep"


def test_jitter_is_random_within_its_bound(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    h = Heterogeneity(HeteroConfig(jitter=0.5), rank=0)
    spans = [h.compute(busy, 0.002)[1] for _ in range(20)]
    assert all(0 <= s <= 0.5 * t * 1.2 for s, t in zip(slept, spans))
    assert len(set(slept)) == len(slept) > 1


def test_quota_periods_are_short_and_keep_the_kernels_minimum():
    from hvd_adaptive.train.hetero import quota_period_us

    assert [quota_period_us(c) for c in (2, 0.25, 0.125, 0.1)] == [10_000] * 4
    assert quota_period_us(0.05) == 20_000  # 1 ms of quota, the least the kernel takes
    assert quota_period_us(0.01) == 100_000


def test_missing_cgroup_controller_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="no writable cgroup CPU controller.*hetero.mode=sleep"):
        CpuQuota("x", cores=0.5, root=tmp_path)


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_cpu_quota_really_slows_a_process_and_is_removed():
    # A real cgroup (this machine and CI run as root): a busy process inside a 0.25-core quota
    # gets about a quarter of a core, whatever else runs.
    q = CpuQuota(f"hvd_adaptive-test-{os.getpid()}", cores=0.25)
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        q.enter(child.pid)
        assert q.pids() == [child.pid]
        # Short accounting periods (10 ms): a throttled rank stalls briefly, not for 75 ms.
        assert (q.path / "cpu.cfs_period_us").read_text().strip() == "10000"
        assert q.cores_set() == 0.25
        c0, t0 = _cpu_seconds(child.pid), time.perf_counter()
        time.sleep(1.5)
        share = (_cpu_seconds(child.pid) - c0) / (time.perf_counter() - t0)
        assert 0.1 < share < 0.35, f"process got {share:.2f} cores under a 0.25-core quota"
    finally:
        child.kill()
        child.wait()
        q.remove()
    assert not q.path.exists()


def test_horovods_cycle_grows_as_the_slowest_ranks_quota_shrinks():
    """The cycle a config's ranks all take (hetero.smallest_quota -> distributed.cycle_ms): 5 ms
    at a core or more and without quotas, 5 ms / cores under them, at most 50 ms."""
    from hvd_adaptive.config import load_config
    from hvd_adaptive.parallel.distributed import cycle_ms
    from hvd_adaptive.train.hetero import smallest_quota

    def cycle(*overrides):
        cfg, _ = load_config("configs/tiny.yaml", list(overrides))
        return cycle_ms(smallest_quota(cfg.hetero, cfg.train.threads or 1))

    assert cycle() == 5.0  # no quota
    assert cycle("hetero.slowdown={1: 4.0}") == 5.0  # sleep mode: no quota either
    quota = ("hetero.mode=cpu_quota", "train.threads=1")
    assert cycle(*quota, "hetero.cores=[1.0, 2.0]") == 5.0
    assert cycle(*quota, "hetero.cores=[0.5, 0.25]") == 20.0
    assert cycle(*quota, "hetero.cores=[0.25, 0.0625]") == 50.0  # 80 ms, capped
    assert cycle(*quota, "hetero.slowdown={1: 2.0}") == 10.0  # 1 thread / 2
