"""Heterogeneity means the same for every algorithm (issue: fair heterogeneity, 67K+ labels).

With rank 1 slowed 4x in sleep mode, every algorithm's slowed rank must take about four times
as long per row of local computation (forward, backward, optimizer update) as the other rank,
and its communication must not be multiplied. Batch sizes are pinned so that per-row costs compare.
"""
import json
from pathlib import Path

import numpy as np
import pytest

from tests.harness.mpirun import explain, mpirun, records, train


# Steps of tens of milliseconds, so that the injected slowdown dominates timing noise.
WORKLOAD = ("data.synth.n_labels=5000", "model.hidden=[128]", "train.batch_size=128",
            "train.epochs=2", "train.window_samples=1024", "train.eval_every=2")
# A factor well apart from the two cores' contention (up to 1.5-1.8x on memory-bound copies).
SLOW = "hetero.slowdown={1: 4.0}"


def per_rank(rounds, key):
    return np.array([sum(rec["ranks"][i][key] for rec in rounds) for i in range(2)], float)


# Each algorithm's own settings (batch sizes pinned so that per-row costs compare).
ALGOS = {"sync": [], "local": [], "sma": [], "adaptive": ["adaptive.b_min=128"],
         "hogbatch": ["hogbatch.round_epochs=0.5"]}


@pytest.fixture(scope="module")
def accounts():
    """{algorithm: its rounds' per-rank records}: WORKLOAD with SLOW for every algorithm, one
    after another in one 2-rank job (tests/mpi/ranks/fairness_ranks.py)."""
    plan = {"sets": [*WORKLOAD, SLOW], "algorithms": ALGOS}
    p = mpirun(2, ["tests/mpi/ranks/fairness_ranks.py", json.dumps(plan)], timeout=300)
    assert p.returncode == 0, explain(p)
    out = {}
    for line in p.stdout.splitlines():
        if line.startswith("fairness "):
            _, name, rounds = line.split(" ", 2)
            out[name] = [{"ranks": ranks} for ranks in json.loads(rounds)]
    return out


@pytest.mark.parametrize("name", ALGOS)
def test_slowdown_multiplies_local_computation_only(accounts, name):
    assert name in accounts, f"no accounts for {name}: {sorted(accounts)}"
    rounds = accounts[name][1:]  # the first round includes warm-up effects
    rows, batches = per_rank(rounds, "samples"), per_rank(rounds, "batches")
    compute, comm = per_rank(rounds, "compute_s"), per_rank(rounds, "comm_s")
    slept = per_rank(rounds, "slowdown_s")
    # The injected time is (f - 1) x exactly the spans counted as local computation: a sleep
    # after communication or waiting would push it above, a span left unslowed below. (Sleeps
    # overrun by a fraction of a millisecond, which counts as computation: hence 15%.)
    assert slept[0] == 0 and slept[1] == pytest.approx(3.0 * (compute[1] - slept[1]), rel=0.15), \
        f"{name}: slept {slept[1]:.3f} s for {compute[1] - slept[1]:.3f} s of computation"
    if name in ("sync", "local", "sma"):
        # A span of local computation run outside Heterogeneity.compute is neither slowed nor
        # counted, so the check above misses it: its time lands in wait_s (the round's time no
        # field accounts for). The slowed rank is the last to reach every barrier here (sync:
        # each step's; local, sma: the merge's), so its own wait is only the barriers' latency:
        # 3-4% of its unslowed computation here, against 40% with sync's optimizer update
        # moved out of hetero.compute. (Adaptive and hogbatch schedule batches dynamically:
        # there the slowed rank can wait for up to one of the other's batches every window.)
        waited = per_rank(rounds, "wait_s")
        assert waited[1] < 0.15 * (compute[1] - slept[1]), \
            f"{name}: the slowed rank waited {waited[1]:.3f} s for {compute[1] - slept[1]:.3f} s of " \
            "counted computation: some local computation is outside hetero.compute"
    ratio = (compute[1] / rows[1]) / (compute[0] / rows[0])
    # 4x by construction, times the two cores' contention, which here is large: while the
    # slowed rank sleeps the other computes alone and up to twice as fast, so 4-9x is seen.
    # The machine's other load can make the fast rank the slower per row instead (3.13x seen
    # once in a fresh clone's suite); the exact factor is the check on slept above, and this
    # one asks only that the slowdown shows beyond that noise (1x without it).
    assert 2.5 < ratio < 12, f"{name}: slowed rank's compute per row is {ratio:.2f}x the other's"
    if name == "hogbatch":
        # Its pull and push are memory-bound copies that the slowed rank makes right after a
        # sleep, while the other rank computes: contention and cold caches make them up to ~4x
        # slower there, so only the accounting above (no sleep outside computation) is checked.
        return
    # Communication per step (sync) or per merge (local, sma, adaptive): collectives that both
    # ranks run at once.
    events = batches if name == "sync" else np.full(2, len(rounds))
    per_event = comm / events
    assert per_event[0] > 0 and per_event[1] < 2.5 * per_event[0], \
        f"{name}: communication per event {per_event.tolist()} s: the slowdown reached it"


def test_proportional_partition_balances_local_computation(tmp_path):
    # The first split comes from the standalone rates: time them for the default 2 s, not
    # tiny.yaml's 0.2 s (a fresh-clone run here once split 143/113 from 0.2 s on a busy machine).
    # Four epochs (8 windows of 4 steps): the split, smoothed (sync.smoothing 0.5), moves from
    # the standalone rates to the windows' own timings over the first windows; two epochs left
    # only windows 3-4 to judge, and on a host with ~15 ms steps one run read 37% apart there.
    train(2, tmp_path / "prop", *WORKLOAD, "hetero.slowdown={1: 2.0}", "train.algorithm=sync",
          "sync.partition=proportional", "train.calibrate_s=2", "train.epochs=4")
    first = records(tmp_path / "prop", "round")[0]
    # The split starts from the standalone rates measured before the clock (on_calibrated), so
    # the very first window already gives the slowed rank the smaller share.
    assert first["ranks"][0]["batch_size"] > 1.3 * first["ranks"][1]["batch_size"], first["ranks"]
    rounds = records(tmp_path / "prop", "round")[4:]  # re-measured after every window
    rows, compute = per_rank(rounds, "samples"), per_rank(rounds, "compute_s")
    assert rows[0] > 1.5 * rows[1], f"the fast rank should take more of each step: {rows}"
    # An equal split would leave the slowed rank computing about twice as long.
    assert abs(compute[0] - compute[1]) / compute.max() < 0.35, \
        f"local computation per window should be balanced: {compute} s"


def test_cpu_quota_mode_slows_the_whole_rank_for_real(tmp_path):
    # A real cgroup CPU quota of half a core on rank 1 (root on these machines and in CI):
    # its standalone speed, measured the same way for every rank, must fall to about half.
    run = tmp_path / "quota"
    # Four epochs: 7 windows counted, the rows summed over all 7. Batches of 32 (32 claims a
    # window, not 8 as with 128, which once read 1.21x in CI). 512 hidden units: with WORKLOAD's
    # 128 a window took 0.12-0.13 s on a faster host (a dozen of the quota's 10 ms periods) and
    # the split read 1.19 once in a fresh clone (1.41-1.89 in 3 runs alone); with 512 a window
    # takes 0.37-0.39 s and the split read 1.53-1.74 in 3 runs.
    s = train(2, run, *WORKLOAD, "hetero.slowdown={1: 2.0}", "train.algorithm=adaptive",
              "hetero.mode=cpu_quota", "train.threads=1", "train.epochs=4",
              "train.calibrate_s=2", "train.batch_size=32", "model.hidden=[512]")
    fast, slow = s["per_rank"][0]["standalone_rate"], s["per_rank"][1]["standalone_rate"]
    # 2x, blurred by the two cores' contention and the quota's periods within a 2 s
    # measurement: 1.50-2.36 in 10 runs here under the quota, once 4.64 and once 1.19 (in
    # full-suite runs of fresh clones), 0.70-1.08 in 4 without it: 1.15 lies between. The upper
    # bound catches a quota far harsher than asked.
    assert 1.15 < fast / slow < 6.0, f"standalone rows/s {fast} and {slow} under a 2x quota"
    rows = per_rank(records(run, "round")[1:], "samples")
    # The fast rank's rows over the slow one's: 1.34-1.85 in 8 runs here under the quota,
    # 0.96-1.14 in 3 runs of the same workload without it; 1.25 lies between.
    assert rows[0] > 1.25 * rows[1], f"dynamic scheduling should give the fast rank more rows: {rows}"
    assert not list(Path("/sys/fs/cgroup/cpu").glob("hvd_adaptive-rank*")), \
        "the run left its cgroup behind"
