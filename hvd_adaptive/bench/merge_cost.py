"""Times the merge under MPI: the weighted merge (merge.Merge) against a plain Horovod allreduce
of the same values, in each wire type.

Usage:
  mpirun -np 2 python -m hvd_adaptive.bench.merge_cost --config configs/bench.yaml --repeats 20
  mpirun -np 8 python -m hvd_adaptive.bench.merge_cost --config configs/bench_quick.yaml --touched 0.076 \
      --core 0.25 --dtypes float32 float16
Builds the model of the config's shape, then alternates the collectives and reports medians.
Without --touched the merge runs dense (merge.sparse off: a fresh model has no touched rows to
select) and without row normalization: the local scaling by each rank's weight is what it adds
to the plain sum. With --touched F every rank marks a random fraction F of the input layer's
rows and of the labels (its own, by rank) before each call, and the merge runs as adaptive SGD
makes it: sparse, rows normalized; the plain allreduce then sends the union's rows of the input
layer and every other variable whole (at 8 ranks, F = 0.076 gives a union of about 47% of the
rows, as in the scaling benchmark's windows).
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
    ap.add_argument("--touched", type=float, default=None,
                    help="fraction of rows each rank marks (sparse, row-normalized merge)")
    ap.add_argument("--core", type=float, default=None,
                    help="each rank in its own cgroup CPU quota of this many cores (as the "
                         "scaling benchmark's ranks; needs root)")
    ap.add_argument("--dtypes", nargs="+", default=None, choices=("float32", "float16"),
                    help="wire types to time (default: the config's merge.dtype)")
    a = ap.parse_args(argv)
    if a.touched is not None and not 0 < a.touched <= 1:
        ap.error(f"--touched: a fraction in (0, 1], got {a.touched}")

    from hvd_adaptive.parallel import distributed
    from hvd_adaptive.config import load_config, model_for
    from hvd_adaptive.data import preset

    cfg, _ = load_config(a.config, extra_sections=("sweep",))
    s = cfg.data.synth
    spec = preset(s.preset, scale=s.scale, **{k: getattr(s, k) for k in ("n_features", "n_labels")
                                              if getattr(s, k) is not None})
    c = distributed.init(cfg.train.threads)
    if a.core is not None:  # a cluster profile of equal ranks, entered as the trainer does
        import os
        from hvd_adaptive.config import HeteroConfig
        from hvd_adaptive.train.hetero import Heterogeneity

        profile = HeteroConfig(mode="cpu_quota", cores=[a.core] * c.size)
        h = Heterogeneity(profile, c.rank)
        h.start(c.threads, tag=f"merge{c.rank}-{os.getpid()}")
        if c.is_root:
            print(f"rank 0's quota as its cgroup holds it: {h.quota.cores_set():g} cores", flush=True)
        c.comm.Barrier()  # every rank in its quota before any times
    import numpy as np
    from hvd_adaptive.tfload import tf
    import horovod.tensorflow as hvd
    from hvd_adaptive.parallel.merge import Merge
    from hvd_adaptive.train.build import build_model

    sparse = a.touched is not None
    dtypes = a.dtypes or [cfg.merge.dtype]
    rng = np.random.default_rng(c.rank)
    with tf.device(c.device):
        # The model for the preset's shape, as a run on its data chooses it.
        cfg = dataclasses.replace(cfg, model=model_for(cfg.model, spec.n_features, spec.n_labels,
                                                       spec.nnz_mean))
        # The sampled loss's frequency sampler needs label counts; the merge's cost does not
        # depend on them, so every label counts once.
        model = build_model(cfg, spec.n_features, spec.n_labels,
                            label_freq=np.ones(spec.n_labels, np.int64))
        merges = {d: Merge(model, None, dataclasses.replace(cfg.merge, sparse=sparse, dtype=d),
                           sparse, c.comm, label_norm=sparse) for d in dtypes}
        weight = (1.0 + c.rank) / (c.size * (c.size + 1) / 2)  # unequal, summing to 1 over ranks
        first = model.variables_list[0]
        wires = {"float32": tf.float32, "float16": tf.float16}

        def plain(dtype):
            @tf.function(autograph=False)
            def run(tensors):
                out = hvd.grouped_allreduce(tensors, op=hvd.Sum, name=f"plain_{dtype}")
                return [tf.reduce_sum(o[:1]) for o in out]
            return run

        plains = {d: plain(d) for d in dtypes}

        def mark():
            """This rank's random rows; returns the plain allreduce's tensors (the union's rows
            of the input layer, every other variable whole)."""
            if not sparse:
                return None
            masks = model.touched.masks
            model.touched.clear()
            for kind, m in enumerate(masks):
                n = int(m.shape[0])
                ids = rng.choice(n, max(1, int(a.touched * n)), replace=False)
                model.touched.mark(kind, tf.constant(ids, tf.int64))
            mine = np.packbits(masks[0].numpy())
            union = np.empty_like(mine)
            from mpi4py import MPI
            c.comm.Allreduce(mine, union, op=MPI.BOR)
            rows = np.flatnonzero(np.unpackbits(union, count=int(masks[0].shape[0])))
            return rows, [tf.gather(first, rows)] + [tf.identity(v) for v in model.variables_list[1:]]

        times = {f"merge {d}": [] for d in dtypes} | {f"plain {d}": [] for d in dtypes}
        union_rows = []
        for i in range(a.repeats + 2):
            for d in dtypes:
                marked = mark()
                tensors = ([tf.cast(t, wires[d]) for t in marked[1]] if sparse else
                           [tf.cast(v, wires[d]) for v in model.variables_list])
                c.comm.Barrier()
                t0 = time.perf_counter()
                merges[d](weight)
                t1 = time.perf_counter()
                c.comm.Barrier()
                t2 = time.perf_counter()
                plains[d](tensors)
                t3 = time.perf_counter()
                if i >= 2:  # the first calls trace the functions
                    times[f"merge {d}"].append(t1 - t0)
                    times[f"plain {d}"].append(t3 - t2)
                    if sparse:
                        union_rows.append(len(marked[0]))
    if c.is_root:
        n = sum(int(tf.size(v)) for v in model.variables_list)
        what = (f"sparse merge, each rank marking {a.touched:g} of the rows, union "
                f"{statistics.median(union_rows) / int(first.shape[0]):.0%} of the input layer"
                if sparse else "dense merge")
        where = f", {a.core:g} core a rank" if a.core is not None else ""
        print(f"{what}; model of {n / 1e6:.1f} M parameters on {c.size} ranks{where}, {a.repeats} repeats "
              f"(medians, ms):")
        for d in dtypes:
            mw, mp = statistics.median(times[f"merge {d}"]), statistics.median(times[f"plain {d}"])
            print(f"  {d}: weighted merge {mw * 1e3:.1f}, plain allreduce {mp * 1e3:.1f}, "
                  f"ratio {mw / mp:.3f}, merge's bytes a rank "
                  f"{merges[d].last_bytes / 2**20:.1f} MB ({merges[d].last_bytes})")
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    from hvd_adaptive.parallel.distributed import exit_process

    exit_process(main())
