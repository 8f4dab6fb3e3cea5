"""Times the merge under MPI: the weighted merge (merge.Merge, dense) vs a plain Horovod allreduce
of the same tensors.

Usage:
  mpirun -np 2 python -m hvd_adaptive.bench_merge --config configs/bench.yaml --repeats 20
Builds the model of the config's shape, then alternates the two collectives and reports medians.
The merge runs dense (merge.sparse off: a fresh model has no touched rows to select) with the
config's merge.dtype, and without row normalization: the local scaling by each rank's weight is
what it adds to the plain sum.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=None)
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)

    from hvd_adaptive import distributed
    from hvd_adaptive.config import load_config
    from hvd_adaptive.data import preset

    cfg, _ = load_config(a.config, extra_sections=("sweep",))
    s = cfg.data.synth
    spec = preset(s.preset, scale=s.scale, **{k: getattr(s, k) for k in ("n_features", "n_labels")
                                              if getattr(s, k) is not None})
    c = distributed.init(cfg.train.threads)
    from hvd_adaptive.tfload import tf
    import horovod.tensorflow as hvd
    from hvd_adaptive.merge import Merge
    from hvd_adaptive.model import SparseMLP

    with tf.device(c.device):
        model = SparseMLP(spec.n_features, spec.n_labels, cfg.model)
        merge = Merge(model, None, dataclasses.replace(cfg.merge, sparse=False), False, c.comm)
        weight = (1.0 + c.rank) / (c.size * (c.size + 1) / 2)  # unequal, summing to 1 over ranks

        @tf.function(autograph=False)
        def plain_sum():
            tensors = [tf.identity(v) for v in model.variables_list]
            for v, s in zip(model.variables_list, hvd.grouped_allreduce(tensors, op=hvd.Sum,
                                                                         name="plain_sum")):
                v.assign(s)

        weighted, plain = [], []
        for i in range(a.repeats + 2):
            c.comm.Barrier()
            t0 = time.perf_counter()
            merge(weight)
            t1 = time.perf_counter()
            c.comm.Barrier()
            t2 = time.perf_counter()
            plain_sum()
            t3 = time.perf_counter()
            if i >= 2:  # the first calls trace the functions
                weighted.append(t1 - t0)
                plain.append(t3 - t2)
    if c.is_root:
        n = sum(int(tf.size(v)) for v in model.variables_list)
        mw, mp = statistics.median(weighted), statistics.median(plain)
        print(f"merge of {n / 1e6:.1f} M parameters on {c.size} ranks, {a.repeats} repeats: "
              f"weighted merge median {mw * 1e3:.1f} ms, plain allreduce median {mp * 1e3:.1f} ms, "
              f"ratio {mw / mp:.3f}")
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    from hvd_adaptive.distributed import exit_process

    exit_process(main())
