"""The training loop shared by every algorithm: round -> account -> maybe evaluate -> log.

Only rank 0 writes (config.json, metrics.jsonl, summary.json in the run folder); metrics are
reduced over ranks before they are written. `wall_s` in the records is training time, with
evaluation time left out, so accuracy-against-time curves compare algorithms fairly.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Optional

import numpy as np
import tensorflow as tf

from hvd_adaptive import algorithms
from hvd_adaptive.config import Config
from hvd_adaptive.data import Dataset, load_dataset, make_batch, preset, synthesize
from hvd_adaptive.distributed import Cluster, allgather, allreduce_sum_np
from hvd_adaptive.metrics import METRIC_NAMES, finalize, metric_sums, most_frequent_label_p1
from hvd_adaptive.model import Optimizer, SparseMLP


def itstime(progress: float, every: float, last: float) -> bool:
    """Whether a periodic event due every `every` epochs fell between `last` and `progress`."""
    return math.floor(progress / every + 1e-9) > math.floor(last / every + 1e-9)


class RunLog:
    """Rank 0's files and progress lines; other ranks keep quiet."""

    def __init__(self, run_dir: Path, active: bool):
        self.dir, self.active = Path(run_dir), active
        self._fh = None
        if active:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.dir / "metrics.jsonl", "a", buffering=1)

    def record(self, **rec) -> None:
        if self._fh:
            self._fh.write(json.dumps(rec) + "\n")

    def say(self, msg: str) -> None:
        if self.active:
            print(msg, flush=True)

    def write_json(self, name: str, obj: dict) -> None:
        if self.active:
            tmp = self.dir / f".{name}.tmp"
            tmp.write_text(json.dumps(obj, indent=2) + "\n")
            os.replace(tmp, self.dir / name)

    def close(self) -> None:
        if self._fh:
            self._fh.close()


def load_data(cfg: Config, cluster: Cluster) -> tuple[Dataset, Dataset]:
    """Train and test sets on every rank: synthetic (same seed everywhere) or files.

    Rank 0 parses files first and writes the binary caches; the others then memory-map them,
    so ranks never race to build one cache.
    """
    d = cfg.data
    if d.train == "synthetic":
        s = d.synth
        overrides = {k: getattr(s, k) for k in ("n_train", "n_test", "n_features", "n_labels",
                                                 "nnz_mean", "labels_mean") if getattr(s, k) is not None}
        return synthesize(preset(s.preset, scale=s.scale, seed=s.seed, **overrides))

    def load() -> tuple[Dataset, Dataset]:
        train = load_dataset(d.train, fmt=d.format, cache_dir=d.cache_dir)
        test = load_dataset(d.test, fmt=d.format, cache_dir=d.cache_dir,
                            n_features=train.n_features, n_labels=train.n_labels)
        return train, test

    out = load() if cluster.is_root else None
    cluster.comm.Barrier()
    return out if out is not None else load()


def _topk_fn(model: SparseMLP, k: int = 5):
    @tf.function(input_signature=(tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.float32),
                                  tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)))
    def topk(ids, vals, seg, size):
        return tf.math.top_k(model.logits(ids, vals, seg, size), k=k).indices
    return topk


def evaluate(model: SparseMLP, test: Dataset, cluster: Cluster, rows: Optional[int],
             chunk: int = 2048, cache: dict = {}) -> dict:  # noqa: B006 - per-model tf.function cache
    """P@k and nDCG@k on the test set, rows spread over ranks, sums reduced by MPI."""
    fn = cache.get(id(model))
    if fn is None:
        fn = cache[id(model)] = _topk_fn(model, k=min(5, model.n_labels))
    n = min(rows or test.n_rows, test.n_rows)
    mine = np.arange(cluster.rank, n, cluster.size)
    names = ["rows", *METRIC_NAMES]
    acc = np.zeros(len(names))
    for i in range(0, len(mine), chunk):
        r = mine[i:i + chunk]
        b = make_batch(test, r)
        top = fn(tf.constant(b.feat_ids), tf.constant(b.feat_vals), tf.constant(b.feat_seg),
                 tf.constant(b.size, tf.int32)).numpy()
        sub = test.subset(r)
        s = metric_sums(top, sub.label_indptr, sub.label_indices)
        acc += np.array([s[k] for k in names])
    total = allreduce_sum_np(cluster.comm, acc)
    return finalize(dict(zip(names, total.tolist())))


def train(cfg: Config, run_dir: Path, cluster: Cluster) -> dict:
    """Trains with the configured algorithm; returns the summary (identical on every rank)."""
    log = RunLog(run_dir, cluster.is_root)
    log.write_json("config.json", cfg.to_dict())
    t_load = time.perf_counter()
    train_ds, test_ds = load_data(cfg, cluster)
    if train_ds.n_rows < cluster.size:
        raise ValueError(f"{train_ds.source}: {train_ds.n_rows} training rows for {cluster.size} ranks")
    base_p1 = most_frequent_label_p1(train_ds.label_frequencies(), test_ds.label_indptr,
                                     test_ds.label_indices)
    log.say(f"data: {train_ds.n_rows} train / {test_ds.n_rows} test rows, {train_ds.n_features} "
            f"features, {train_ds.n_labels} labels ({time.perf_counter() - t_load:.1f} s); "
            f"most-frequent-label P@1 {base_p1:.4f}")
    with tf.device(cluster.device):
        model = SparseMLP(train_ds.n_features, train_ds.n_labels, cfg.model)
        opt = Optimizer(model.variables_list, cfg.optim)
        algo = algorithms.build(algorithms.Context(cfg, cluster, model, opt, train_ds))
        algo.setup()
        algo.trace()
        rates = allgather(cluster.comm, algo.calibrate(cfg.train.batch_size))
        log.say(f"{cfg.train.algorithm} on {cluster.size} rank(s), {cluster.device}, "
                f"{cluster.threads} thread(s) each; standalone rows/s per rank: "
                + ", ".join(f"{r:.0f}" for r in rates))
        log.record(event="start", algorithm=cfg.train.algorithm, ranks=cluster.size,
                   standalone_rates=rates, baseline_p_at_1=base_p1, time=time.time())
        return _loop(cfg, cluster, algo, test_ds, log, rates, base_p1)


def _loop(cfg, cluster, algo, test_ds, log, rates, base_p1) -> dict:
    wall = samples = 0.0
    last_progress, last_say, rnd = 0.0, -1e9, 0
    totals = np.zeros((cluster.size, 4))  # samples, batches, compute_s, wait_s per rank
    evals: list[dict] = []

    def do_eval(progress: float) -> None:
        m = evaluate(algo.eval_model(), test_ds, cluster, cfg.train.eval_rows)
        norm = float(np.sqrt(sum(float(tf.reduce_sum(v * v)) for v in algo.eval_model().variables_list)))
        if hasattr(algo, "on_eval"):
            algo.on_eval(norm)
        rec = dict(event="eval", wall_s=round(wall, 4), epoch=round(progress, 4), samples=int(samples),
                   **{k: round(v, 5) for k, v in m.items()}, weight_norm=round(norm, 4))
        evals.append(rec)
        log.record(**rec)
        log.say(f"eval  epoch {progress:6.2f} | {wall:7.1f} s | P@1 {m['p_at_1']:.4f} "
                f"P@3 {m['p_at_3']:.4f} P@5 {m['p_at_5']:.4f} | nDCG@5 {m['ndcg_at_5']:.4f}")

    while True:
        t0 = time.perf_counter()
        stats = algo.run_round()
        if stats is None:
            break
        dt = time.perf_counter() - t0
        info = allgather(cluster.comm, (vars(stats), dt))
        wall += info[0][1]  # rank 0's clock is the run's clock
        ranks = [i[0] for i in info]
        samples += sum(r["samples"] for r in ranks)
        totals += [[r["samples"], r["batches"], r["compute_s"], r["wait_s"]] for r in ranks]
        loss = sum(r["loss_sum"] for r in ranks) / max(sum(r["samples"] for r in ranks), 1)
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss became {loss} at epoch {stats.epoch:.3f} (round {rnd}); "
                                     "lower optim.lr or check the data")
        log.record(event="round", round=rnd, epoch=round(stats.epoch, 4), wall_s=round(wall, 4),
                   samples=int(samples), loss=round(loss, 5),
                   ranks=[{"rank": i, "batch_size": r["batch_size"], "batches": r["batches"],
                           "samples": r["samples"], "compute_s": round(r["compute_s"], 4),
                           "wait_s": round(r["wait_s"], 4), "weight": round(r["weight"], 5),
                           "lr": r["lr"], **r["extra"]} for i, r in enumerate(ranks)])
        rnd += 1
        if time.perf_counter() - last_say >= cfg.train.log_every_s:
            last_say = time.perf_counter()
            log.say(f"train epoch {stats.epoch:6.2f} | {wall:7.1f} s | loss {loss:.4f} | "
                    f"{samples / max(wall, 1e-9):8.0f} rows/s | batch "
                    + "/".join(str(r["batch_size"]) for r in ranks))
        out_of_time = cfg.train.time_budget_s is not None and wall >= cfg.train.time_budget_s
        if itstime(stats.epoch, cfg.train.eval_every, last_progress) and not out_of_time:
            do_eval(stats.epoch)
        last_progress = stats.epoch
        if out_of_time:
            log.say(f"time budget of {cfg.train.time_budget_s} s reached")
            break
    if not evals or evals[-1]["epoch"] != round(last_progress, 4):
        do_eval(last_progress)
    summary = _summary(cfg, cluster, algo, evals, totals, wall, samples, rates, base_p1)
    # Fingerprints of every rank's replica: equal where the algorithm keeps replicas equal.
    summary["replica_fingerprints"] = allgather(cluster.comm, _fingerprint(algo.model))
    log.write_json("summary.json", summary)
    log.say(f"done: P@1 {summary['final']['p_at_1']:.4f} P@3 {summary['final']['p_at_3']:.4f} "
            f"P@5 {summary['final']['p_at_5']:.4f} after {wall:.1f} s of training "
            f"(baseline P@1 {base_p1:.4f}); cluster efficiency {summary['efficiency']:.2f}")
    log.close()
    return summary


def _fingerprint(model: SparseMLP) -> list[float]:
    return [float(tf.reduce_sum(v)) + float(tf.reduce_sum(v * v)) for v in model.variables_list]


def _summary(cfg, cluster, algo, evals, totals, wall, samples, rates, base_p1) -> dict:
    per_rank = [{"rank": i, "samples": int(t[0]), "batches": int(t[1]), "compute_s": round(t[2], 3),
                 "wait_s": round(t[3], 3), "busy_fraction": round(t[2] / max(wall, 1e-9), 4),
                 "standalone_rate": round(rates[i], 1)} for i, t in enumerate(totals)]
    return {
        "algorithm": cfg.train.algorithm, "ranks": cluster.size, "train_wall_s": round(wall, 3),
        "samples": int(samples), "rows_per_s": round(samples / max(wall, 1e-9), 1),
        # Samples per second achieved over what the ranks could do alone, added up.
        "efficiency": round(samples / max(wall, 1e-9) / max(sum(rates), 1e-9), 4),
        "baseline_p_at_1": base_p1, "final": {k: v for k, v in evals[-1].items() if k != "event"},
        "best_p_at_1": max(e["p_at_1"] for e in evals), "per_rank": per_rank,
        "algorithm_state": algo.state(),
    }
