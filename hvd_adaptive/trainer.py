"""The training loop shared by every algorithm: round -> account -> maybe evaluate -> maybe
checkpoint -> log.

Only rank 0 writes (config.json, metrics.jsonl, summary.json in the run folder); metrics are
reduced over ranks before they are written. `wall_s` in the records is training time, with
evaluation and checkpoint time left out, so accuracy-against-time curves compare algorithms
fairly. A resumed run (checkpoint.resume: auto) cuts metrics.jsonl back to where its checkpoint
was taken and continues the curve from there.

Test hook: HVD_ADAPTIVE_FAIL_AT_ROUND=<round> (and optionally HVD_ADAPTIVE_FAIL_RANK=<rank>;
default every rank) raises RuntimeError at the start of that round, to test fail-fast; with
HVD_ADAPTIVE_FAIL_KIND=nan it writes NaN into the model's input layer instead, to test the
non-finite guards.
"""
from __future__ import annotations

import math
import os
import resource
import time
from pathlib import Path
from typing import Optional

import numpy as np
import tensorflow as tf

from hvd_adaptive import algorithms
from hvd_adaptive.checkpoint import Checkpointer
from hvd_adaptive.config import Config, ConfigError
from hvd_adaptive.data import DataError, Dataset, load_dataset, preset, synthesize, synthesize_cached
from hvd_adaptive.distributed import Cluster, allgather
from hvd_adaptive.evaluation import Evaluator
from hvd_adaptive.hetero import Heterogeneity
from hvd_adaptive.metrics import inverse_propensities, most_frequent_label_p1
from hvd_adaptive.model import Optimizer, SparseMLP
from hvd_adaptive.runlog import RunLog


# Where a round's time goes (RoundStats), and the per-rank totals the summary keeps.
TIMES = ("batch_s", "compute_s", "comm_s", "sync_s", "wait_s")
TOTALS = ("samples", "batches", *TIMES)


def itstime(progress: float, every: float, last: float) -> bool:
    """Whether a periodic event due every `every` epochs fell between `last` and `progress`."""
    return math.floor(progress / every + 1e-9) > math.floor(last / every + 1e-9)


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
        spec = preset(s.preset, scale=s.scale, seed=s.seed, **overrides)
        say = _progress("generating synthetic data", cluster.is_root)
        if d.cache_dir is None:
            return synthesize(spec, say)
        # Rank 0 generates and writes the cache; the others then memory-map it.
        out = synthesize_cached(spec, d.cache_dir, say) if cluster.is_root else None
        cluster.comm.Barrier()
        return out if out is not None else synthesize_cached(spec, d.cache_dir)

    for key, path in (("data.train", d.train), ("data.test", d.test)):
        if not os.path.isfile(path):
            raise DataError(f"{path}: data file not found ({key})")

    def load() -> tuple[Dataset, Dataset]:
        train = load_dataset(d.train, fmt=d.format, cache_dir=d.cache_dir)
        test = load_dataset(d.test, fmt=d.format, cache_dir=d.cache_dir,
                            n_features=train.n_features, n_labels=train.n_labels)
        return train, test

    out = load() if cluster.is_root else None
    cluster.comm.Barrier()
    return out if out is not None else load()


def train(cfg: Config, run_dir: Path, cluster: Cluster) -> dict:
    """Trains with the configured algorithm; returns the summary (identical on every rank)."""
    log = RunLog(run_dir, cluster.is_root)
    log.write_json("config.json", cfg.to_dict())
    t_load = time.perf_counter()
    train_ds, test_ds = load_data(cfg, cluster)
    check_fits(cfg, train_ds, cluster.size)
    base_p1 = most_frequent_label_p1(train_ds.label_frequencies(), test_ds.label_indptr,
                                     test_ds.label_indices)
    log.say(f"data: {train_ds.n_rows} train / {test_ds.n_rows} test rows, {train_ds.n_features} "
            f"features, {train_ds.n_labels} labels ({time.perf_counter() - t_load:.1f} s); "
            f"most-frequent-label P@1 {base_p1:.4f}")
    hetero = Heterogeneity(cfg.hetero, cluster.rank)
    quota = hetero.start(cluster.threads, tag=f"rank{cluster.rank}-{os.getpid()}")
    if quota:  # every rank may print: only the slowed ones have a quota
        print(f"[rank {cluster.rank}] {quota}\n", end="", flush=True)
    with tf.device(cluster.device):
        model = SparseMLP(train_ds.n_features, train_ds.n_labels, cfg.model,
                          label_freq=train_ds.label_frequencies())
        opt = Optimizer(model.variables_list, cfg.optim)
        algo = algorithms.build(algorithms.Context(cfg, cluster, model, opt, train_ds, hetero))
        algo.setup()
        ckpt = Checkpointer(run_dir, cfg.checkpoint, cluster.comm, log.say)
        resumed = _restore(ckpt, algo, cfg, train_ds, log)
        algo.trace()
        rates = allgather(cluster.comm, algo.calibrate(cfg.train.batch_size))
        log.say(f"{cfg.train.algorithm} on {cluster.size} rank(s), {cluster.device}, "
                f"{cluster.threads} thread(s) each; standalone rows/s per rank: "
                + ", ".join(f"{r:.0f}" for r in rates))
        head = dict(algorithm=cfg.train.algorithm, ranks=cluster.size, standalone_rates=rates,
                    baseline_p_at_1=base_p1, time=time.time())
        if resumed:
            log.record(event="resume", round=resumed["round"], wall_s=resumed["wall"], **head)
        else:
            log.record(event="start", **head)
        return _loop(cfg, cluster, algo, test_ds, log, rates, base_p1, ckpt, resumed)


def _progress(what: str, active: bool, every_s: float = 10.0):
    """A progress callback (done, total) that prints at most every `every_s` seconds."""
    last = [time.perf_counter()]

    def say(done: int, total: int) -> None:
        if active and (time.perf_counter() - last[0] >= every_s or done == total) and total > 100_000:
            last[0] = time.perf_counter()
            print(f"{what}: {done:,} of {total:,} rows\n", end="", flush=True)
    return say


def check_fits(cfg: Config, train_ds: Dataset, ranks: int) -> None:
    """Set-up errors that would otherwise surface as hangs or odd numbers mid-run."""
    n, src = train_ds.n_rows, train_ds.source or "the synthetic training set"
    if n < ranks:
        raise DataError(f"{src}: only {n} training rows for {ranks} ranks; run at most {n} ranks")
    if cfg.train.batch_size > n:
        raise ConfigError(f"train.batch_size: {cfg.train.batch_size} is larger than the {n} "
                          f"training rows of {src}")


def _stream_key(cfg: Config, train_ds: Dataset) -> list:
    """What the window stream depends on: resuming skips windows, so these must not change."""
    return [cfg.train.seed, cfg.train.window_samples, train_ds.n_rows]


def _restore(ckpt: Checkpointer, algo, cfg: Config, train_ds: Dataset, log: RunLog) -> Optional[dict]:
    """Loads the newest good checkpoint into the algorithm; returns the loop's saved state."""
    found = ckpt.start()
    if found is None:
        return None
    state, manifest = found
    if state["trainer.stream"] != _stream_key(cfg, train_ds):
        raise ConfigError(
            f"{manifest['path']}: checkpoint was taken with [train.seed, train.window_samples, training "
            f"rows] = {state['trainer.stream']}, this run has {_stream_key(cfg, train_ds)}; "
            "resume with the same values or use another --run-dir")
    try:
        algo.load_state_dict(state)
    except ValueError as e:  # wrong algorithm or model shape: say which checkpoint
        raise ConfigError(f"{manifest['path']}: {e}") from None
    if algo.resized:
        n = manifest["ranks"]
        own = ("" if not (algo.slots_differ or algo.replicas_differ) else
               f"; rank r takes the per-rank state (optimizer, sma replica) of old rank r mod {n}")
        log.say(f"warning: checkpoint written by {n} ranks, resuming on {algo.cluster.size}: "
                f"per-rank batch sizes, shares and totals restart{own}")
    log.truncate(int(state["trainer.metrics_bytes"]))
    return {k[len("trainer."):]: v for k, v in state.items() if k.startswith("trainer.")}


def _save(ckpt: Checkpointer, algo, cfg: Config, log: RunLog, rounds: int, **loop_state) -> None:
    state = algo.state_dict()
    state.update({f"trainer.{k}": v for k, v in loop_state.items()})
    state["trainer.round"] = rounds
    state["trainer.stream"] = _stream_key(cfg, algo.ctx.train)
    state["trainer.metrics_bytes"] = log.size()  # rank 0's count is the one saved
    path = ckpt.save(rounds, state)
    log.say(f"checkpoint {path}")


def _failure_hook(rank: int) -> Optional[int]:
    """Test hook (see the module docstring): the round at which this rank must fail, if any."""
    at, who = os.environ.get("HVD_ADAPTIVE_FAIL_AT_ROUND"), os.environ.get("HVD_ADAPTIVE_FAIL_RANK")
    if at is None or (who is not None and int(who) != rank):
        return None
    return int(at)


def _loop(cfg, cluster, algo, test_ds, log, rates, base_p1, ckpt, resumed) -> dict:
    wall = samples = 0.0
    last_progress, last_say, rnd = 0.0, -1e9, 0
    totals = np.zeros((cluster.size, len(TOTALS)))  # per rank, columns TOTALS
    evals: list[dict] = []
    if resumed:
        wall, samples, rnd = resumed["wall"], resumed["samples"], resumed["round"]
        last_progress, evals = resumed["last_progress"], resumed["evals"]
        if not algo.resized:  # per-rank totals of ranks that no longer exist mean nothing
            totals = np.array(resumed["totals"], dtype=float)
    fail_at = _failure_hook(cluster.rank)

    train_ds = algo.ctx.train
    inv_prop = inverse_propensities(train_ds.label_frequencies(), train_ds.n_rows,
                                    cfg.data.propensity_a, cfg.data.propensity_b)
    evaluator = Evaluator(algo.eval_model(), cfg.train.eval_memory_mb, inv_prop=inv_prop)

    def do_eval(progress: float) -> None:
        nonlocal evaluator
        variables = algo.eval_model().variables_list
        if not all(bool(tf.reduce_all(tf.math.is_finite(v))) for v in variables):
            raise FloatingPointError(
                f"the model's weights became NaN or inf by epoch {progress:.3f} (round {rnd}); "
                "stopping, the last good checkpoint is kept; lower optim.lr or check the data")
        if evaluator.model is not algo.eval_model():
            evaluator = Evaluator(algo.eval_model(), cfg.train.eval_memory_mb, inv_prop=inv_prop)
        m = evaluator(test_ds, cluster, cfg.train.eval_rows)
        norm = float(np.sqrt(sum(float(tf.reduce_sum(v * v)) for v in variables)))
        if hasattr(algo, "on_eval"):
            algo.on_eval(norm)
        rec = dict(event="eval", wall_s=round(wall, 4), epoch=round(progress, 4), samples=int(samples),
                   **{k: round(v, 5) for k, v in m.items()}, weight_norm=round(norm, 4))
        evals.append(rec)
        log.record(**rec)
        log.say(f"eval  epoch {progress:6.2f} | {wall:7.1f} s | P@1 {m['p_at_1']:.4f} "
                f"P@3 {m['p_at_3']:.4f} P@5 {m['p_at_5']:.4f} | nDCG@5 {m['ndcg_at_5']:.4f} "
                f"| PSP@5 {m['psp_at_5']:.4f}")

    def save() -> None:
        _save(ckpt, algo, cfg, log, rnd, wall=wall, samples=samples, totals=totals.copy(),
              evals=evals, last_progress=last_progress)

    while True:
        if rnd == fail_at:
            if os.environ.get("HVD_ADAPTIVE_FAIL_KIND") == "nan":
                w = algo.model.variables_list[0]
                w.assign(tf.fill(tf.shape(w), float("nan")))
            else:
                raise RuntimeError(f"injected failure at round {rnd} (test hook HVD_ADAPTIVE_FAIL_AT_ROUND)")
        t0 = time.perf_counter()
        stats = algo.run_round()
        if stats is None:
            break
        dt = time.perf_counter() - t0
        info = allgather(cluster.comm, (vars(stats), dt))
        wall += info[0][1]  # rank 0's clock is the run's clock
        ranks = [i[0] for i in info]
        samples += sum(r["samples"] for r in ranks)
        totals += [[r[k] for k in TOTALS] for r in ranks]
        loss = sum(r["loss_sum"] for r in ranks) / max(sum(r["samples"] for r in ranks), 1)
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss became {loss} at epoch {stats.epoch:.3f} (round {rnd}); "
                                     "lower optim.lr or check the data")
        log.record(event="round", round=rnd, epoch=round(stats.epoch, 4), wall_s=round(wall, 4),
                   samples=int(samples), loss=round(loss, 5),
                   ranks=[{"rank": i, "batch_size": r["batch_size"], "batches": r["batches"],
                           "samples": r["samples"], **{k: round(r[k], 4) for k in TIMES},
                           "weight": round(r["weight"], 5), "lr": r["lr"],
                           **{k: round(v, 4) if isinstance(v, float) else v for k, v in r["extra"].items()}}
                          for i, r in enumerate(ranks)])
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
        if ckpt.due(rnd):
            save()
        if out_of_time:
            log.say(f"time budget of {cfg.train.time_budget_s} s reached")
            break
        target = cfg.train.target_p_at_1
        if target is not None and evals and evals[-1]["p_at_1"] >= target:
            log.say(f"target P@1 {target} reached")
            break
    if not evals or evals[-1]["epoch"] != round(last_progress, 4):
        do_eval(last_progress)
    if ckpt.last_saved != rnd:  # the final state, so a longer run can continue from it
        save()
    summary = _summary(cfg, cluster, algo, evals, totals, wall, samples, rates, base_p1)
    # Fingerprints of every rank's replica: equal where the algorithm keeps replicas equal.
    summary["replica_fingerprints"] = allgather(cluster.comm, _fingerprint(algo.model))
    # Peak resident memory of each rank's process so far (Linux reports kilobytes).
    peak = allgather(cluster.comm, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    for rec, mb in zip(summary["per_rank"], peak):
        rec["peak_rss_mb"] = round(mb, 1)
    log.write_json("summary.json", summary)
    log.say(f"done: P@1 {summary['final']['p_at_1']:.4f} P@3 {summary['final']['p_at_3']:.4f} "
            f"P@5 {summary['final']['p_at_5']:.4f} after {wall:.1f} s of training "
            f"(baseline P@1 {base_p1:.4f}); cluster efficiency {summary['efficiency']:.2f}")
    log.close()
    return summary


def _fingerprint(model: SparseMLP) -> list[float]:
    return [float(tf.reduce_sum(v)) + float(tf.reduce_sum(v * v)) for v in model.variables_list]


def _summary(cfg, cluster, algo, evals, totals, wall, samples, rates, base_p1) -> dict:
    per_rank = []
    for i, t in enumerate(totals):
        d = dict(zip(TOTALS, t.tolist()))
        per_rank.append({"rank": i, "samples": int(d["samples"]), "batches": int(d["batches"]),
                         **{k: round(d[k], 3) for k in TIMES},
                         "busy_fraction": round(d["compute_s"] / max(wall, 1e-9), 4),
                         "standalone_rate": round(rates[i], 1)})
    return {
        "algorithm": cfg.train.algorithm, "ranks": cluster.size, "train_wall_s": round(wall, 3),
        "samples": int(samples), "rows_per_s": round(samples / max(wall, 1e-9), 1),
        # Samples per second achieved over what the ranks could do alone, added up.
        "efficiency": round(samples / max(wall, 1e-9) / max(sum(rates), 1e-9), 4),
        "baseline_p_at_1": base_p1, "final": {k: v for k, v in evals[-1].items() if k != "event"},
        "best_p_at_1": max(e["p_at_1"] for e in evals), "per_rank": per_rank,
        "algorithm_state": algo.state(),
    }
