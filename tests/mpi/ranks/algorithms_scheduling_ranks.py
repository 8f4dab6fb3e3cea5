"""Run under mpirun: which rows each algorithm trains on, on real ranks with rank 1 slowed 2x.

Usage: mpirun -np 2 python tests/mpi/ranks/algorithms_scheduling_ranks.py ALGORITHM [ALGORITHM ...]

Several algorithms run one after another in the same ranks (one start-up of TensorFlow and
Horovod), each on a fresh model.

Drives the real algorithm through one epoch of the tiny config; a spy around the batch
builder records the rows of every batch trained. Checks: every row of the epoch is used exactly
once across ranks (which rows, not only how many: a duplicated row and a dropped one would keep
the count). For adaptive (batch sizes pinned, so only scheduling decides who takes what): no
batch is under half the batch size, and the fast rank takes more batches in proportion to its
speed as measured in the same run (each rank's mean time from one batch to its next within a
window: every cost of a batch, the fixed ones included), so both ranks are busy for about as
long (batches x time a batch within 20%; an equal split would leave the fast rank busy for 1 /
speed of the slow one's time), where the speed ratio shows the 2x slowdown took effect (above
1.25). For auto
(windows of 256 rows, the other mode probed after two windows without it, so modes alternate):
every window's mode is the rule's (auto.choose_mode) from the rows/s the earlier windows
measured and allgathered.
"""

import numpy as np

from hvd_adaptive.config import load_config
from tests.harness.cases import each_case


def check_guided(c) -> None:
    """The guided tail (adaptive.guided). First SharedCounter.claims alone on each rank
    (COMM_SELF: one claimer, so the sizes follow the rule exactly): claims of 100 with parts=4
    and smallest=10 cover the budget in order, none exceeds max(10, rows left / 4) by more than
    the half-claim a claim absorbs, and they shrink to the smallest; with parts=1 all are 100.
    Then the real adaptive SGD on both ranks, batch sizes pinned at 64 (b_min 64), equal speeds:
    every row of the epoch once, windows end in claims under the batch (the guided tail), and
    each rank's merge weight is its rows / batch over all ranks' (a claim counts as its part)."""
    from mpi4py import MPI

    from hvd_adaptive.parallel.distributed import SharedCounter

    counter = SharedCounter(MPI.COMM_SELF)
    for window, parts in enumerate((4, 1)):  # both slots start at zero
        got = list(counter.claims(window, 1000, lambda: 100, parts=parts, smallest=10))
        assert [x for lo, hi in got for x in range(lo, hi)] == list(range(1000)), got
        sizes = [hi - lo for lo, hi in got]
        if parts == 1:
            assert sizes == [100] * 10, sizes
            continue
        for (lo, hi), size in zip(got, sizes):
            cap = max(10, -(-(1000 - lo) // 4))
            assert size <= min(100, cap) or (hi == 1000 and size < 1.5 * cap), (lo, hi, got)
        assert sizes[0] == 100 and sizes[-1] < 20 and sizes == sorted(sizes, reverse=True), sizes
    counter.free()

    cfg, _ = load_config("configs/tiny.yaml", [
        "train.algorithm=adaptive", "train.epochs=1", "adaptive.warmup_epochs=0",
        "adaptive.b_min=64", "adaptive.guided=true"])
    import tensorflow as tf
    from hvd_adaptive.train.algorithms import base, hogbatch
    from hvd_adaptive.data import load_data
    from tests.harness.real_algorithm import RowSpy, build

    spy = RowSpy(base, hogbatch)
    train, _ = load_data(cfg, c.is_root, c.comm.Barrier)
    with tf.device(c.device):
        algo = build(cfg, c, train)
        c.comm.Barrier()
        spy.recording = True
        while (stats := algo.run_round()) is not None:
            # A claim counts as its rows / batch in the merge weights (all ranks batch 64 here).
            got = np.array(c.comm.allgather((stats.weight, stats.samples / stats.batch_size)))
            assert np.allclose(got[:, 0], got[:, 1] / got[:, 1].sum(), atol=1e-6), got
        spy.recording = False
        spy.restore()
    everyone = c.comm.gather(np.concatenate(spy.used), root=0)
    sizes = np.concatenate(c.comm.allgather([len(u) for u in spy.used]))
    if c.is_root:
        rows = np.sort(np.concatenate(everyone))
        assert np.array_equal(rows, np.arange(train.n_rows)), "guided: rows lost or repeated"
        b = cfg.train.batch_size
        # (A claim racing another for a window's last rows can be smaller than the rule's.)
        assert (sizes < b).sum() >= 2, f"guided: no claim under the batch of {b}: {sizes}"
        print(f"guided ok: claims alone shrink as rows run out; adaptive's batches {sorted(sizes)}",
              flush=True)


def check(name: str, c) -> None:
    if name == "guided":
        return check_guided(c)
    cfg, _ = load_config("configs/tiny.yaml", [
        f"train.algorithm={name}", "train.epochs=1", "train.window_samples=1024",
        "hetero.slowdown={1: 2.0}", "adaptive.warmup_epochs=0", "adaptive.b_min=64",
        "adaptive.guided=false",  # the papers' whole-batch claims (case guided: the guided tail)
        "hogbatch.round_epochs=0.25",
        *(["train.window_samples=256", "auto.probe_every=2", "auto.averaging_cost=1.5",
           "auto.shard_update=true"] if name == "auto" else []),
        # Steps of several ms (the tiny config's take about 1.5 ms on a fast host), so that the
        # windows' start and end, not the speeds, do not decide the split.
        *(["data.synth.n_labels=2000", "model.hidden=[256]", "data.synth.n_train=4000",
           "train.window_samples=2048"] if name == "adaptive" else [])])
    import tensorflow as tf
    from hvd_adaptive.train.algorithms import base, hogbatch
    from hvd_adaptive.data import load_data
    from tests.harness.real_algorithm import RowSpy, build

    spy = RowSpy(base, hogbatch)
    train, _ = load_data(cfg, c.is_root, c.comm.Barrier)
    with tf.device(c.device):
        algo = build(cfg, c, train)
        c.comm.Barrier()  # as the trainer's calibration allgather: start the clock together
        spy.recording = True
        windows, modes, marks = [], [], [0]
        while (stats := algo.run_round()) is not None:
            marks.append(len(spy.times))
            windows.append(c.comm.allgather(stats.batches))
            modes.append(c.comm.allgather((stats.extra.get("mode"), stats.extra.get("mode_rows_s"))))
        spy.recording = False
        spy.restore()
    everyone = c.comm.gather(np.concatenate(spy.used), root=0)
    smallest = c.comm.gather(min(len(u) for u in spy.used), root=0)
    # This rank's time from one batch to its next, within windows (a merge lies between windows).
    gaps = np.concatenate([np.zeros(0)] + [np.diff(spy.times[a:b]) for a, b in zip(marks, marks[1:])])
    periods = c.comm.gather(float(np.mean(gaps)) if gaps.size else float("nan"), root=0)
    if c.is_root:
        rows = np.sort(np.concatenate(everyone))
        assert np.array_equal(rows, np.arange(train.n_rows)), \
            f"{name}: rows lost or repeated in the epoch ({len(rows)} used of {train.n_rows})"
        if name == "adaptive":
            # 2,000 rows in windows of 1,024: the last window leaves 16 rows after 15 batches of
            # 64, which the last claim must take with it instead of training a 16-row batch.
            assert min(smallest) >= 32, f"a batch of {min(smallest)} rows (under half of 64)"
            fast, slow = np.sum(windows, axis=0)
            speed = periods[1] / periods[0]  # how much faster rank 0 ran a batch, this run
            busy = fast * periods[0] / (slow * periods[1])  # rank 0's busy time over rank 1's
            explain = (f"fast rank {fast} batches, slow rank {slow} ({windows}); a batch every "
                       f"{periods[0] * 1e3:.1f} / {periods[1] * 1e3:.1f} ms; busy ratio {busy:.2f}")
            assert speed > 1.25, f"the slowdown did not take effect: {explain}"
            assert 0.8 <= busy <= 1.25, f"not in proportion to speed {speed:.2f}: {explain}"
        if name == "auto":
            from hvd_adaptive.train.balance import choose_mode

            rates, last, seen = {"grad": None, "avg": None}, {}, []
            for i, per_rank in enumerate(modes):
                assert len(set(per_rank)) == 1, f"window {i}: ranks disagree {per_rank}"
                mode, rate = per_rank[0]
                want = choose_mode(i, rates, last, cfg.auto.averaging_cost, cfg.auto.probe_every)
                assert mode == want, f"window {i}: ran {mode}, the rule says {want} ({rates}, {last})"
                rates[mode] = rate if rates[mode] is None else 0.5 * rates[mode] + 0.5 * rate
                last[mode] = i
                seen.append(mode)
            switches = sum(a != b for a, b in zip(seen, seen[1:]))
            assert switches >= 3, f"modes {seen}: gradient and averaging windows should alternate"
        print(f"scheduling ok ({name}): {train.n_rows} rows once each; window batches {windows}; "
              f"a batch every {' / '.join(f'{p * 1e3:.1f}' for p in periods)} ms", flush=True)


if __name__ == "__main__":
    from hvd_adaptive.parallel.distributed import exit_process

    exit_process(each_case(check))
