"""Heterogeneity: the one place that makes a rank slower than its hardware is.

Two modes (config `hetero.mode`), the same for every algorithm:

- ``sleep`` (simulated): a slowed rank with factor f sleeps (f - 1) x the time of each span of
  its *local computation*: a batch's forward and backward pass and the optimizer update. Every
  algorithm runs that span through `Heterogeneity.compute`, and nothing else: batch building,
  allreduces, allgathers, shared-memory copies and waiting are never multiplied. A slower
  device runs its own computation slower; its network is not necessarily slower.
- ``cpu_quota`` (real): the slowed rank's whole process is put in a cgroup with a CPU quota of
  threads / f cores (cgroup v1 ``cpu.cfs_quota_us``, v2 ``cpu.max``), as a slower machine
  would be: its communication and waiting slow down too. Needs root (or a delegated cgroup);
  where the quota cannot be set, start-up fails with a clear error rather than run unslowed.

``hetero.cores`` (cpu_quota mode) is a cluster profile: rank i's process gets cores[i] CPUs'
worth of time in its own cgroup, so four ranks at half a core fit two cores without contending
(`check_profile` refuses a profile the ranks' nodes cannot hold).

Every quota's cgroup is removed when its rank exits, also when the rank is killed: a small
watcher process outside the cgroup removes it once the rank is gone (`CpuQuota.watch`).

``hetero.schedule`` changes the factors with training progress (sleep mode): each window
takes the phase its first row falls in.

``hetero.jitter`` adds a random wait, uniform in [0, jitter] x the span's time, on every rank
(sleep mode only): batch times that vary as sparse batches do.
"""
from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from hvd_adaptive.config import HeteroConfig

CGROUP_ROOT = Path(os.environ.get("HVD_ADAPTIVE_CGROUP_ROOT", "/sys/fs/cgroup"))
# The quota's accounting period. A rank that used its quota stalls until the period ends: with
# the kernel's usual 100 ms a quarter-core rank stopped for 75 ms at a time while the others
# waited in collectives for it, and communication took a large share of the run; at 10 ms the
# stalls are short, as on a machine that is evenly slower (docs/history/, "What the ranks lost
# to Horovod's cycle and to the quota's period").
PERIOD_US = 10_000
MIN_QUOTA_US = 1_000  # the kernel refuses less


def quota_period_us(cores: float) -> int:
    """The period for a quota of `cores`: PERIOD_US, longer where the quota would fall below the
    kernel's 1 ms minimum (under a tenth of a core)."""
    return max(PERIOD_US, -(-MIN_QUOTA_US * 1_000_000 // int(round(cores * 1_000_000))))


class Heterogeneity:
    """This rank's slowdown, applied to spans of local computation.

    Args:
        cfg: The `hetero` config section.
        rank: This rank (keys of `cfg.slowdown`).
    """

    def __init__(self, cfg: HeteroConfig, rank: int):
        self.mode = cfg.mode
        self.rank = rank
        self.factor = float(cfg.slowdown.get(rank, 1.0))
        self.cores = cfg.cores
        self.schedule = cfg.schedule
        self.jitter = cfg.jitter
        self.rng = np.random.default_rng(1000 + rank)
        self.quota: Optional[CpuQuota] = None
        self.injected_s = 0.0  # seconds slept so far (sleep mode), for the round records

    @property
    def sleeps(self) -> bool:
        return self.mode == "sleep" and (self.factor > 1.0 or self.jitter > 0)

    def at_epoch(self, epoch: float) -> None:
        """Takes the slowdown of `hetero.schedule`'s phase at training progress `epoch` (called
        at the start of every window, so every algorithm is slowed on the same rows)."""
        for phase in self.schedule:
            if epoch + 1e-12 >= phase.from_epoch:
                self.factor = float(phase.slowdown.get(self.rank, 1.0))

    def compute(self, fn: Callable[..., Any], *args) -> tuple[Any, float]:
        """Runs `fn(*args)`, a span of local computation, slowed as configured.

        `fn` returns a tensor or a tuple whose first element is a tensor (the loss); reading it
        waits for the span to finish (kernels may run asynchronously on a GPU).

        Returns:
            (fn's result, seconds the span took including the injected slowdown).
        """
        t0 = time.perf_counter()
        out = fn(*args)
        first = out[0] if isinstance(out, (tuple, list)) else out
        if hasattr(first, "numpy"):
            first.numpy()
        if self.sleeps:
            self.delay(time.perf_counter() - t0)
        return out, time.perf_counter() - t0

    def delay(self, seconds: float) -> None:
        """Sleeps as a slowed rank would take longer for `seconds` of its own computation."""
        if self.mode != "sleep":
            return
        extra = (self.factor - 1.0) * seconds
        if self.jitter > 0:
            extra += self.rng.uniform(0, self.jitter) * seconds
        if extra > 0:
            time.sleep(extra)
            self.injected_s += extra

    def quota_cores(self, threads: int) -> Optional[float]:
        """This rank's CPU quota in cores: its entry of the profile (`hetero.cores`), or
        threads / factor for a rank slowed in cpu_quota mode; None without a quota."""
        if self.mode != "cpu_quota":
            return None
        if self.cores:
            return float(self.cores[self.rank])
        return threads / self.factor if self.factor > 1.0 else None

    def start(self, threads: int, tag: str) -> Optional[str]:
        """Applies the CPU quota in cpu_quota mode; returns a line describing it (or None)."""
        cores = self.quota_cores(threads)
        if cores is None:
            return None
        self.quota = CpuQuota(f"hvd_adaptive-{tag}", cores=cores)
        self.quota.watch(os.getpid())
        self.quota.enter(os.getpid())
        atexit.register(self.quota.remove)
        why = ("the cluster profile (hetero.cores)" if self.cores
               else f"a {self.factor:g}x slowdown of {threads} thread(s)")
        return f"cpu quota {self.quota.cores:.2f} core(s) ({self.quota.where}) for {why}"

    def state(self) -> dict:
        return {"rng": self.rng.bit_generator.state}

    def load_state(self, d: dict) -> None:
        self.rng.bit_generator.state = d["rng"]


def smallest_quota(cfg: HeteroConfig, threads: int) -> Optional[float]:
    """The smallest CPU quota (cores) any rank of this config gets (`Heterogeneity.quota_cores`
    of every rank the profile or the slowdown names), None without quotas. Known from the config
    before any rank starts, so every rank can take the same Horovod cycle
    (distributed.cycle_ms)."""
    ranks = range(len(cfg.cores)) if cfg.cores else cfg.slowdown.keys()
    quotas = [Heterogeneity(cfg, r).quota_cores(threads) for r in ranks]
    return min((q for q in quotas if q is not None), default=None)


class CpuQuota:
    """A cgroup limiting its processes to `cores` CPUs' worth of time (v1 or v2).

    Args:
        name: Folder name of the cgroup (under the cpu controller's root).
        cores: CPU time allowed per wall-clock second, in cores (e.g. 0.5).
        root: Where the cgroup file systems are mounted.
    """

    def __init__(self, name: str, cores: float, root: Path = CGROUP_ROOT):
        self.cores = cores
        v1 = root / "cpu"
        if (v1 / "cpu.cfs_quota_us").exists():
            self.version, self.root = 1, v1
        elif "cpu" in _read(root / "cgroup.controllers").split():
            self.version, self.root = 2, root
        else:
            raise RuntimeError(
                f"hetero.mode=cpu_quota: no writable cgroup CPU controller under {root} "
                "(cgroup v1 cpu/cpu.cfs_quota_us or v2 cgroup.controllers with 'cpu'); use "
                "hetero.mode=sleep")
        self.path = self.root / name
        self.where = str(self.path)
        _remove_stale(self.root, name.split("-")[0] + "-")
        period = quota_period_us(cores)
        quota = max(MIN_QUOTA_US, int(round(cores * period)))
        try:
            self.path.mkdir(exist_ok=True)
            if self.version == 1:
                (self.path / "cpu.cfs_period_us").write_text(str(period))
                (self.path / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                subtree = self.root / "cgroup.subtree_control"
                if "cpu" not in _read(subtree).split():
                    subtree.write_text("+cpu")
                (self.path / "cpu.max").write_text(f"{quota} {period}")
        except OSError as e:
            raise RuntimeError(f"hetero.mode=cpu_quota: cannot set a CPU quota in {self.path}: "
                               f"{e.strerror or e} (needs root or a delegated cgroup); use "
                               "hetero.mode=sleep") from None

    def enter(self, pid: int) -> None:
        """Moves a process (all its threads) into the cgroup."""
        try:
            (self.path / "cgroup.procs").write_text(str(pid))
        except OSError as e:
            raise RuntimeError(f"hetero.mode=cpu_quota: cannot move process {pid} into "
                               f"{self.path}: {e.strerror or e}") from None

    def watch(self, pid: int) -> None:
        """Starts a watcher, outside the cgroup and its creator's session, that removes the
        cgroup once process `pid` is gone: a rank killed by a signal runs no exit handler."""
        subprocess.Popen([sys.executable, "-c", _WATCHER, str(pid), str(self.path), str(self.root)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)

    def cores_set(self) -> float:
        """The quota as the cgroup holds it, in cores (read back from the kernel's file)."""
        if self.version == 1:
            quota, period = _read(self.path / "cpu.cfs_quota_us"), _read(self.path / "cpu.cfs_period_us")
        else:
            quota, period = _read(self.path / "cpu.max").split()
        return int(quota) / int(period)

    def pids(self) -> list[int]:
        return [int(x) for x in _read(self.path / "cgroup.procs").split()]

    def remove(self) -> None:
        """Moves remaining processes back to the root cgroup and deletes the folder."""
        if not self.path.exists():
            return
        for pid in self.pids():
            try:
                (self.root / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass
        try:
            self.path.rmdir()
        except OSError:
            pass


# Run as `python -c _WATCHER PID CGROUP ROOT` (standard library only: it starts in a blink and
# holds a few MB): waits for PID to end, then moves anything left to ROOT and removes CGROUP.
_WATCHER = """
import os, sys, time
pid, path, root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
while os.path.exists(path):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    except PermissionError:
        pass
    time.sleep(0.2)
try:
    for p in open(os.path.join(path, "cgroup.procs")).read().split():
        try:
            open(os.path.join(root, "cgroup.procs"), "w").write(p)
        except OSError:
            pass
    os.rmdir(path)
except OSError:
    pass
"""


def check_profile(cores: list[float], rank: int, size: int, node_cores: list[float]) -> None:
    """Refuses a cluster profile (`hetero.cores`) the job cannot hold.

    Args:
        cores: the profile, one entry per rank.
        rank, size: this rank and the job's size.
        node_cores: the profile's entries of the ranks on this rank's node.

    Raises:
        ConfigError: a profile of another length than the job, or more cores on a node than
            it has (`distributed.usable_cores`: what this process may run on).
    """
    from hvd_adaptive.config import ConfigError

    if not cores:
        return
    if len(cores) != size:
        raise ConfigError(f"hetero.cores: the profile has {len(cores)} entries for {size} "
                          f"rank(s): give one per rank, got {cores}")
    from hvd_adaptive.parallel.distributed import usable_cores

    have = usable_cores()
    if sum(node_cores) > have + 1e-9:
        raise ConfigError(f"hetero.cores: the ranks on rank {rank}'s node ask for "
                          f"{sum(node_cores):g} cores ({node_cores}) but the node has {have}")


def _remove_stale(root: Path, prefix: str) -> None:
    """Deletes empty cgroups of earlier runs that were killed before they could clean up
    (names end in the creating process's PID; a live creator's cgroup is left alone)."""
    for d in root.glob(prefix + "*"):
        pid = d.name.rsplit("-", 1)[-1]
        alive = pid.isdigit() and Path(f"/proc/{pid}").exists()
        if d.is_dir() and not alive and not _read(d / "cgroup.procs").split():
            try:
                d.rmdir()
            except OSError:
                pass


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
