"""Run under mpirun: adaptive SGD's dynamic scheduling on real ranks, rank 1 slowed 2x.

Drives the real Adaptive algorithm through one epoch, recording the rows each rank trains on.
Batch sizes are pinned (b_min = b_max) so that only scheduling decides who takes what.
Checks: every row of the epoch is used exactly once across ranks, and the fast rank takes
clearly more batches than the slow one.
"""
import sys

import numpy as np

from hvd_adaptive import distributed
from hvd_adaptive.config import load_config


def main() -> int:
    cfg, _ = load_config("configs/tiny.yaml", [
        "train.algorithm=adaptive", "train.epochs=1", "train.window_samples=1024",
        "hetero.slowdown={1: 2.0}", "adaptive.warmup_epochs=0", "adaptive.b_min=64"])
    c = distributed.init(threads=1)
    import tensorflow as tf
    from hvd_adaptive.algorithms import Context
    from hvd_adaptive.algorithms.adaptive import Adaptive
    from hvd_adaptive.model import Optimizer, SparseMLP
    from hvd_adaptive.trainer import load_data

    class Recording(Adaptive):
        used: list = []

        def local_step(self, rows, stats):
            self.used.append(np.array(rows))
            super().local_step(rows, stats)

    train, _ = load_data(cfg, c)
    with tf.device(c.device):
        model = SparseMLP(train.n_features, train.n_labels, cfg.model)
        algo = Recording(Context(cfg, c, model, Optimizer(model.variables_list, cfg.optim), train))
        algo.setup()
        algo.trace()
        c.comm.Barrier()  # as the trainer's calibration allgather: start the clock together
        windows = []
        while (stats := algo.run_round()) is not None:
            windows.append(c.comm.allgather(stats.batches))
    everyone = c.comm.gather(np.concatenate(algo.used), root=0)
    if c.is_root:
        rows = np.sort(np.concatenate(everyone))
        assert np.array_equal(rows, np.arange(train.n_rows)), "rows lost or repeated in the epoch"
        fast, slow = np.sum(windows, axis=0)
        assert fast >= 1.5 * slow, f"fast rank {fast} batches, slow rank {slow}: {windows}"
        print(f"scheduling ok: {train.n_rows} rows once each; window batches {windows}")
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
