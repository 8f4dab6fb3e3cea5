"""Run under mpirun: sync SGD on N ranks equals one-process SGD on the same global batches,
and distributed evaluation equals a one-process evaluation of the same model.

Usage: mpirun -np 2 python tests/mpi/ranks/sync_ranks.py CASE [CASE ...]
  CASE: PARTITION[:OPTIMIZER], PARTITION one of equal, timed, proportional, sharded (sgd by
  default); the cases run one after another in the same ranks.

The ranks train one epoch of the tiny config with the real Sync algorithm. `equal` takes sync's
fused step (one tf.function a step, its time all computation in the round records); the other
cases have rank 1 slowed 3x (sleep mode), so that the proportional partition splits every step
unevenly, and take the timed step (computation, allreduce and update apart, the allreduce's
seconds counted as communication); `timed` is the equal partition with `sync.step: timed`
(asked for, and required by the sleeps anyway). `sharded` is sync with that
partition and the sharded update of the output layer (each rank updates its rows of the layer and
of the optimizer state), as auto's gradient windows train. Rank 0 then replays the epoch in one process: for every step the same global
batch (the same rows of the epoch's permutation), the mean loss over it, the same optimizer
(plain SGD, or OPTIMIZER, e.g. adagrad, whose state must follow). Weights must agree within
float tolerance. Under the proportional partition every window's split must be the rule's
(balance.balanced_partition of the smoothed per-row and per-step costs, kept within the
deadband) computed from the allgathered figures of the window's round records.
Exit code 0 means every check held.
"""

import numpy as np

from hvd_adaptive.train.balance import balanced_partition, keep_within_deadband
from hvd_adaptive.config import load_config
from tests.harness.cases import each_case


def check(case: str, c) -> None:
    partition, _, optimizer = case.partition(":")
    optimizer = optimizer or "sgd"
    # Adagrad's accumulators start at 0, so a row's first step is lr x sign(g): for a gradient
    # of float-noise size the summation order of two processes decides it. eps 0.01 damps steps
    # of gradients far below it, so the comparison sees the update rule, not the noise.
    adagrad = ["optim.lr=0.1", "optim.eps=0.01"]
    opt_sets = {"sgd": ["optim.lr=0.5"], "adagrad": adagrad, "rowwise_adagrad": adagrad}[optimizer]
    algorithm = {"sharded": ["sync.partition=proportional", "sync.shard_update=true"],
                 "timed": ["sync.step=timed"]}.get(partition, [f"sync.partition={partition}"])
    fused = partition == "equal"
    cfg, _ = load_config("configs/tiny.yaml", [
        "train.algorithm=sync", *algorithm, "train.epochs=1",
        *([] if fused else ["hetero.slowdown={1: 3.0}"]), f"optim.name={optimizer}",
        *opt_sets,
        # Steps whose cost grows with their rows (a wider output layer): with the tiny
        # config's, the per-step costs dominate and the balanced split put the slowed rank at
        # sync.min_batch in every window, where the rule check could not tell right costs from
        # wrong ones (a per-row cost tripled on rank 1 passed).
        *(["data.synth.n_labels=2000", "model.hidden=[256]", "hetero.slowdown={1: 2.0}"]
          if partition == "proportional" else [])])
    import tensorflow as tf
    from hvd_adaptive.train.algorithms.base import chunks
    from hvd_adaptive.data import epoch_permutation, load_data, make_batch
    from hvd_adaptive.train.evaluation import Evaluator
    from hvd_adaptive.model.metrics import METRIC_NAMES, finalize, metric_sums
    from hvd_adaptive.model.network import Optimizer, SparseMLP, batch_tensors
    from tests.harness.real_algorithm import build

    train, test = load_data(cfg, c.is_root, c.comm.Barrier)
    algo = build(cfg, c, train)  # Sync: train.algorithm=sync
    model = algo.model
    splits, expected, got, comm = [], [], [], 0.0
    per_row = per_step = None
    while (stats := algo.run_round()) is not None:
        splits.append(c.comm.allgather(stats.samples))
        comm += stats.comm_s
        if algo.partition == "proportional":
            # The rule, from the round's own allgathered figures.
            figs = np.array(c.comm.allgather((stats.extra["grad_s"], stats.samples,
                                              stats.extra["update_s"], stats.batches)))
            row, step = figs[:, 0] / figs[:, 1], figs[:, 2] / np.maximum(figs[:, 3], 1)
            keep = cfg.sync.smoothing if per_row is not None else 0.0
            per_row = row if per_row is None else keep * per_row + (1 - keep) * row
            per_step = step if per_step is None else keep * per_step + (1 - keep) * step
            want = balanced_partition(cfg.train.batch_size * c.size, per_row, per_step,
                                      cfg.sync.min_batch)
            before = np.array(got[-1] if got else [cfg.train.batch_size] * c.size)
            expected.append(keep_within_deadband(before, want, cfg.sync.deadband * cfg.train.batch_size))
            got.append(algo.sizes.copy())
    if algo.partition == "proportional":
        np.testing.assert_array_equal(np.array(got), np.array(expected))
    # The fused step is one span, counted as computation; the timed step times its allreduce.
    assert (comm == 0.0) == fused, f"{partition}: {comm:.4f} s of communication counted"
    if partition == "sharded":
        assert algo.sharded is not None and algo.sharded.hi - algo.sharded.lo < model.layers[-1].shape[0]
    if fused:
        # Each rank's row-sparse gradients travel with their duplicated rows summed: the
        # allgathered slices hold the ranks' distinct rows, not one row a non-zero.
        _, grads = algo._gradient(*algo.batch(np.arange(16 * c.rank, 16 * c.rank + 16)),
                                  tf.constant(0.5))
        sent = [g for g in grads if isinstance(g, tf.IndexedSlices)]
        distinct = np.array(c.comm.allgather([len(np.unique(g.indices.numpy())) for g in sent]))
        assert any(int(g.indices.shape[0]) > d for g, d in zip(sent, distinct[c.rank])), \
            "no duplicated rows in the batch: the check would not see them summed"
        got_rows = [int(g.indices.shape[0]) for g in algo._allreduce(grads)
                    if isinstance(g, tf.IndexedSlices)]
        assert got_rows == distinct.sum(axis=0).tolist(), (got_rows, distinct)
    mine = [v.numpy() for v in model.variables_list]
    everyone = c.comm.gather(mine, root=0)

    # Distributed, blocked evaluation (rows spread over ranks, sums reduced), all rows and a prefix.
    # Blocked: a budget of 0.05 MB ranks the labels in blocks of a few dozen.
    blocked = Evaluator(model, memory_mb=0.05)
    assert blocked.block < model.n_labels, blocked.block
    dist = {rows: blocked(test, c, rows) for rows in (None, 300)}

    if c.is_root:
        for other in everyone[1:]:  # replicas identical
            for a, b in zip(everyone[0], other):
                np.testing.assert_array_equal(a, b)
        if partition not in ("equal", "timed"):
            late = np.array(splits[1:]).sum(axis=0)
            assert late[0] > 1.5 * late[1], f"the split never favoured the fast rank: {splits}"
        # One process, the same global batches.
        ref = SparseMLP(train.n_features, train.n_labels, cfg.model)
        opt = Optimizer.for_model(ref, cfg.optim)
        perm = epoch_permutation(train.n_rows, cfg.train.seed, 0)
        step_rows = cfg.train.batch_size * c.size
        s = cfg.train.window_samples
        for start in range(0, train.n_rows, s):
            end = min(start + s, train.n_rows)
            for lo, hi in chunks(end - start, step_rows):
                batch = batch_tensors(make_batch(train, perm[start + lo: start + hi]))
                with tf.GradientTape() as tape:
                    loss = ref.loss(*batch)
                opt.apply(tape.gradient(loss, ref.variables_list), ref.variables_list)
        for i, (a, b) in enumerate(zip(everyone[0], ref.variables_list)):
            np.testing.assert_allclose(a, b.numpy(), rtol=2e-4, atol=2e-5,
                                       err_msg=f"variable {i} differs from one-process SGD")
        # One-process, unblocked evaluation of the same model.
        for rows, got in dist.items():
            n = rows or test.n_rows
            b = make_batch(test, np.arange(n))
            logits = model.logits(tf.constant(b.feat_ids), tf.constant(b.feat_vals),
                                  tf.constant(b.feat_seg), tf.constant(b.size, tf.int32))
            top = tf.math.top_k(logits, k=5).indices.numpy()
            sums = metric_sums(top, test.label_indptr[:n + 1], test.label_indices)
            want = finalize({k: sums[k] for k in ["rows", *METRIC_NAMES]})
            for k in METRIC_NAMES:
                assert abs(got[k] - want[k]) < 1e-9, (rows, k, got[k], want[k])
        print(f"sync equivalence ok ({partition}, {optimizer}): {len(splits)} windows, rows per rank "
              f"{splits[-2]}", flush=True)


if __name__ == "__main__":
    from hvd_adaptive.parallel.distributed import exit_process

    exit_process(each_case(check))
