"""What one synchronous step costs: the project's `sync` step against the plain Horovod script's,
interleaved in one job on the same rows, and the row-sparse operations behind the difference.

    mpirun -np 2 python -m hvd_adaptive.bench.step_cost --config configs/bench.yaml \\
        [--steps 20] [--blocks 30] [--parts] [--ops] [--set key=value ...]

Both steps are built in every rank of one job from the same config and data (the project's
`sync` through train/build.py, the script's through hvd_adaptive.bench.plain_horovod) and run
in alternating blocks of --steps steps on the same global batches, the block order swapped
every block, a barrier around each block; each step builds its batch as its training loop
does. Prints each step's milliseconds (median and quartiles over the blocks) and the ratio of
sync's block time over the script's, block by block: the machine's drift falls on both.

--parts also runs sync's timed step (gradient, barrier, allreduce, update) and prints where its
time goes. --ops times, on rank 0 alone with one thread, the row-sparse operations on a real
batch's rows: TensorFlow's scatter-subtract against the optimizer's row write (read, subtract,
write back), and the unsorted against the sorted segment sum of the input layer.

The step's learning rate is optim.lr, or 0.1 where it is auto (no probe runs: a step's cost
does not depend on the rate).
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np


def _quartiles(xs) -> str:
    q1, med, q3 = np.percentile(xs, [25, 50, 75])
    return f"{med:7.2f} (quartiles {q1:.2f}-{q3:.2f})"


def _op_costs(train, hidden: int, reps: int = 30) -> list[str]:
    """Milliseconds of the row-sparse operations on a 256-row batch of `train`, one thread."""
    from hvd_adaptive.tfload import tf
    from hvd_adaptive.data import make_batch
    from hvd_adaptive.model.network import _subtract_rows, row_sums

    rng = np.random.default_rng(1)
    b = make_batch(train, rng.choice(train.n_rows, min(256, train.n_rows), replace=False))
    ids, vals, seg = tf.constant(b.feat_ids), tf.constant(b.feat_vals), tf.constant(b.feat_seg)
    rows = tf.constant(np.unique(b.feat_ids))
    w = tf.Variable(tf.random.normal([train.n_features, hidden], seed=1) * 0.01)
    step = tf.random.normal([int(rows.shape[0]), hidden], seed=2) * 1e-6
    n = tf.constant(b.size, tf.int32)

    def timed(fn) -> float:
        fn().numpy()  # traced and run once first
        t0 = time.perf_counter()
        for _ in range(reps):
            out = fn()
        out.numpy()
        return 1000 * (time.perf_counter() - t0) / reps

    def done(_=None):
        return tf.constant(0.0)

    costs = {
        "scatter-subtract (TensorFlow)": tf.function(lambda: done(w.scatter_sub(tf.IndexedSlices(step, rows)))),
        "row write (read, subtract, write)": tf.function(lambda: done(_subtract_rows(w, rows, step))),
        "unsorted segment sum, input layer": tf.function(lambda: tf.reduce_sum(
            tf.math.unsorted_segment_sum(tf.gather(w, ids) * vals[:, None], seg, n))),
        "sorted segment sum, input layer": tf.function(lambda: tf.reduce_sum(
            row_sums(tf.gather(w, ids) * vals[:, None], seg, n))),
    }
    head = (f"row-sparse operations, one thread, a {b.size}-row batch: {int(rows.shape[0])} distinct "
            f"rows of {hidden} of the input layer, {len(b.feat_ids)} non-zeros")
    return [head] + [f"  {name:36s} {timed(fn):7.2f} ms" for name, fn in costs.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=None)
    ap.add_argument("--steps", type=int, default=20, help="steps a block")
    ap.add_argument("--blocks", type=int, default=30, help="blocks of each step, alternating")
    ap.add_argument("--parts", action="store_true", help="also time sync's timed step's parts")
    ap.add_argument("--ops", action="store_true", help="also time the row-sparse operations")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.blocks < 1:
        ap.error("--steps and --blocks: at least 1")

    from hvd_adaptive.config import load_config, model_for, resolve
    from hvd_adaptive.parallel import distributed

    cfg, _ = load_config(a.config, [*a.set, "train.algorithm=sync", "sync.partition=equal"],
                         extra_sections=("sweep",))
    c = distributed.init(cfg.train.threads)
    cfg = resolve(cfg, c.threads)
    from hvd_adaptive.tfload import tf
    import horovod.tensorflow as hvd
    from hvd_adaptive.bench import plain_horovod as ph
    from hvd_adaptive.data.loading import load_data, split_validation
    from hvd_adaptive.train.algorithms.base import RoundStats
    from hvd_adaptive.train.build import build_algorithm

    train, _ = load_data(cfg, c.is_root, c.comm.Barrier)
    train, _ = split_validation(cfg, train)
    cfg = dataclasses.replace(cfg, model=model_for(cfg.model, train.n_features, train.n_labels,
                                                   train.nnz_a_row))
    lr = 0.1 if cfg.optim.lr == "auto" else float(cfg.optim.lr)
    bs, n = cfg.train.batch_size, c.size
    if bs * n > train.n_rows:
        raise SystemExit(f"train.batch_size {bs} x {n} ranks is more than the {train.n_rows} training rows")

    def build(step: str):
        cfg_s = dataclasses.replace(cfg, sync=dataclasses.replace(cfg.sync, step=step))
        algo = build_algorithm(cfg_s, c, train)
        algo.setup()
        algo.trace()
        algo.set_lr(lr)
        return algo

    with tf.device(c.device):
        steps = {"sync": build("fused")}
        if a.parts:
            steps["sync, timed"] = build("timed")
        plain = ph.PlainHorovod(cfg, train.n_features, train.n_labels, train.label_frequencies())
        hvd.broadcast_variables([*plain.net.ordered, *plain.opt.slots], root_rank=0)
        plain.step(*ph.batch(train, np.arange(min(8, train.n_rows))))
        plain.opt.lr.assign(lr)

    perm = np.random.default_rng(cfg.train.seed).permutation(train.n_rows)
    at = [0]

    def mine() -> np.ndarray:
        """This rank's part of the next global batch of the shared permutation."""
        if at[0] + bs * n > len(perm):
            at[0] = 0
        rows = perm[at[0]: at[0] + bs * n]
        at[0] += bs * n
        return np.array_split(rows, n)[c.rank]

    stats = {name: RoundStats(epoch=0.0, batch_size=bs, lr=lr) for name in steps}

    def project(name):
        def run() -> None:
            for _ in range(a.steps):
                steps[name].step(mine(), 1.0 / n, stats[name])
        return run

    def script() -> None:
        loss = None
        for _ in range(a.steps):
            loss = plain.step(*ph.batch(train, mine()))
        loss.numpy()

    runs = {**{name: project(name) for name in steps}, "plain script": script}
    ms = {name: [] for name in runs}
    for block in range(a.blocks):
        order = list(runs) if block % 2 == 0 else list(runs)[::-1]
        for name in order:
            c.comm.Barrier()
            t0 = time.perf_counter()
            runs[name]()
            c.comm.Barrier()
            ms[name].append(1000 * (time.perf_counter() - t0) / a.steps)
    if c.is_root:
        print(f"{n} ranks, {bs} rows a rank a step, {train.n_labels} labels ({cfg.model.output} "
              f"output), {a.blocks} blocks of {a.steps} steps each, interleaved; ms a step:")
        for name, xs in ms.items():
            print(f"  {name:14s} {_quartiles(xs)}")
        ratio = np.array(ms["sync"]) / np.array(ms["plain script"])
        print(f"  sync / plain script, block by block: {_quartiles(ratio).strip()}")
        if a.parts:
            s = stats["sync, timed"]
            per = {k: 1000 * v / max(s.batches, 1) for k, v in
                   (("gradient", s.extra.get("grad_s", 0.0)), ("allreduce", s.comm_s),
                    ("update", s.extra.get("update_s", 0.0)), ("batch building", s.batch_s))}
            print("  sync's timed step, ms a step (rank 0): " +
                  ", ".join(f"{k} {v:.2f}" for k, v in per.items()))
        if a.ops:
            with tf.device("/CPU:0"):
                # the row-sparse layer's width: the input layer's, or a linear model's labels
                width = cfg.model.hidden[0] if cfg.model.hidden else train.n_labels
                print("\n".join(_op_costs(train, width)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
