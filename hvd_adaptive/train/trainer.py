"""The training loop shared by every algorithm: round -> account -> maybe evaluate -> maybe
checkpoint -> log.

Only rank 0 writes (config.json, metrics.jsonl, summary.json in the run folder); metrics are
reduced over ranks before they are written. `wall_s` in the records is training time, with
evaluation and checkpoint time left out, so accuracy-against-time curves compare algorithms
fairly. A resumed run (checkpoint.resume: auto) cuts metrics.jsonl back to where its checkpoint
was taken and continues the curve from there.

Around the loop, each concern has its own module: loading the data and its checks in
data/loading.py, restoring and saving checkpoints in checkpoint.py (Checkpointer), evaluation
in evaluation.py, the run's files in records.py, a round's accounting in algorithms/base.py
(RoundStats).

The faults the test suite injects (a failing rank, NaN weights, a late start or evaluation)
come from faults.py, read once from the environment.
"""
from __future__ import annotations

import math
import os
import resource
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

import numpy as np
from hvd_adaptive.tfload import tf

from hvd_adaptive.config import Config, model_for, model_lines
from hvd_adaptive.data import Dataset, check_fits, load_data, split_validation
from hvd_adaptive.model.metrics import inverse_propensities, most_frequent_label_p1
from hvd_adaptive.model.network import SparseMLP
from hvd_adaptive.parallel.distributed import Cluster, allgather, mpi_control_variable, node_allgather
from hvd_adaptive.train import algorithms, tune
from hvd_adaptive.train.algorithms.base import TIMES, TOTALS, RoundStats
from hvd_adaptive.train.build import build_algorithm
from hvd_adaptive.train import checkpoint as ck
from hvd_adaptive.train.average import WeightAverage
from hvd_adaptive.train.checkpoint import Checkpointer
from hvd_adaptive.train.evaluation import Evaluator
from hvd_adaptive.train.faults import Faults
from hvd_adaptive.train.hetero import Heterogeneity, check_profile
from hvd_adaptive.train.periodic import itstime
from hvd_adaptive.train import records
from hvd_adaptive.train.records import VAL_METRICS, RunLog, val_score


def train(cfg: Config, run_dir: Path, cluster: Cluster, choose_only: bool = False) -> dict:
    """Trains with the configured algorithm; returns the summary (identical on every rank).
    With `choose_only` it stops once the start record (the chosen settings) is written."""
    log = RunLog(run_dir, cluster.is_root)
    log.write_json(records.CONFIG, cfg.to_dict())
    t_load = time.perf_counter()
    train_ds, test_ds = load_data(cfg, cluster.is_root, cluster.comm.Barrier)
    train_ds, val_ds = split_validation(cfg, train_ds)
    check_fits(cfg, train_ds, cluster.size)
    # The model for this data (model.hidden, loss and output auto), recorded as the run's.
    shape = (train_ds.n_features, train_ds.n_labels, train_ds.nnz_a_row)
    model = model_for(cfg.model, *shape)
    if model != cfg.model:
        for line in model_lines(cfg.model, model, *shape):
            log.say(line)
        cfg = replace(cfg, model=model)
        log.write_json(records.CONFIG, cfg.to_dict())
    base_p1 = most_frequent_label_p1(train_ds.label_frequencies(), test_ds.label_indptr,
                                     test_ds.label_indices)
    val = f" / {val_ds.n_rows} validation" if val_ds is not None else ""
    log.say(f"data: {train_ds.n_rows} train{val} / {test_ds.n_rows} test rows, "
            f"{train_ds.n_features} features, {train_ds.n_labels} labels "
            f"({time.perf_counter() - t_load:.1f} s); most-frequent-label P@1 {base_p1:.4f}")
    hetero = Heterogeneity(cfg.hetero, cluster.rank)
    if cfg.hetero.cores:  # every rank has the same config: all or none take this collective
        mine = cfg.hetero.cores[cluster.rank] if cluster.rank < len(cfg.hetero.cores) else 0.0
        check_profile(cfg.hetero.cores, cluster.rank, cluster.size, node_allgather(cluster.comm, mine))
    with tf.device(cluster.device):
        algo = build_algorithm(cfg, cluster, train_ds, hetero)
        algo.setup()
        ckpt = Checkpointer(run_dir, cfg.checkpoint, cluster.comm, log.say)
        resumed = ckpt.restore(algo, log)
        algo.trace()
        run = Trainer(cfg, algo, test_ds, log, ckpt,
                      Position.restored(resumed, cluster.size, algo.resized), val_ds)
        run.warm_up()
        # The quota slows what the clock and the calibration measure, not the start-up before
        # them (tracing at a sixteenth of a core took tens of seconds).
        run.faults.delay("start")
        quota = hetero.start(cluster.threads, tag=f"rank{cluster.rank}-{os.getpid()}")
        if quota:  # every rank may print: only the slowed ones have a quota
            print(f"[rank {cluster.rank}] {quota}\n", end="", flush=True)
        # Every rank inside its quota before any calibrates: a rank still in its start-up (no
        # quota, full cores) took CPU from the quarter-core ranks calibrating beside it, which
        # once read a sixteenth-core rank at 1/1.94 of a quarter-core one in the suite.
        cluster.comm.Barrier()
        log.say("calibrating: each rank's standalone rows/s, at least "
                f"{cfg.train.calibrate_s:g} s ...")
        t_cal = time.perf_counter()
        rates = allgather(cluster.comm, algo.calibrate(cfg.train.batch_size,
                                                         min_seconds=cfg.train.calibrate_s))
        t_cal = time.perf_counter() - t_cal
        algo.on_calibrated(rates)
        # optim.lr auto: chosen inside the ranks' slowdowns, its seconds charged to the clock.
        if tune.probes(cfg) and not resumed:
            log.say(tune.announce(train_ds.n_rows, cfg.train.batch_size))
        choice = None if resumed else tune.probe(algo, lambda x: allgather(cluster.comm, x), rates)
        if choice is not None:
            algo.set_lr(choice.lr)
            run.position.wall += choice.seconds
            log.say(choice.line())
        rows_start = cfg.optim.rows_start(cfg.model.linear)
        if cfg.optim.initial_accumulator_rows == "auto" and rows_start > 0:
            log.say(f"optim.initial_accumulator_rows auto: a linear model's weights start their "
                    f"accumulators at {rows_start:g}")
        if run.plateau():
            log.say(f"optim.plateau: the rate x{cfg.optim.plateau:g} after "
                    f"{cfg.optim.plateau_epochs:g} epoch(s) without a gain in validation P@1")
        window = cfg.train.window_rows(cluster.size)
        log.say(f"{cfg.train.algorithm} on {cluster.size} rank(s), {cluster.device}, "
                f"{cluster.threads} thread(s) each, rounds of {window} rows; standalone rows/s "
                "per rank: " + ", ".join(f"{r:.0f}" for r in rates))
        head = dict(algorithm=cfg.train.algorithm, ranks=cluster.size, window_rows=window,
                    standalone_rates=rates,
                    baseline_p_at_1=base_p1, train_rows=train_ds.n_rows, time=time.time(),
                    horovod_cycle_ms=float(os.environ.get("HOROVOD_CYCLE_TIME", "nan")),
                    mpi_yield_when_idle=mpi_control_variable("mpi_yield_when_idle"),
                    calibration_s=round(t_cal, 3), lr=float(algo.cfg.optim.lr),
                    lr_plateau=run.plateau(), rows_start=rows_start,
                    lr_choice=choice.record() if choice is not None else None)
        if resumed:
            log.record(event="resume", round=resumed["round"], wall_s=resumed["wall"], **head)
        else:
            log.record(event="start", **head)
        if choose_only:
            return head
        run.loop()
        return run.finish(rates, base_p1)


AVERAGE = "average."  # checkpoint.average's arrays among the loop's keys ("trainer.average.<i>")


@dataclass
class Position:
    """Where training stands; checkpointed with the model (Checkpointer.save_training)."""

    totals: np.ndarray              # per rank, columns TOTALS: RoundStats added up
    wall: float = 0.0               # training seconds on rank 0's clock
    samples: float = 0.0            # rows trained, all ranks
    rounds: int = 0                 # rounds done
    last_progress: float = 0.0      # epochs done at the end of the last round
    evals: list = field(default_factory=list)  # the eval records so far
    average: Optional[WeightAverage] = None  # checkpoint.average's, where it is on

    @classmethod
    def restored(cls, saved: Optional[dict], ranks: int, resized: bool) -> Position:
        """A fresh run's position, or the one a checkpoint saved (Checkpointer.restore)."""
        at = cls(np.zeros((ranks, len(TOTALS))))
        if saved:
            at.wall, at.samples, at.rounds = saved["wall"], saved["samples"], saved["round"]
            at.last_progress, at.evals = saved["last_progress"], saved["evals"]
            n = len(ck.indexed_keys(saved, AVERAGE))
            if n:
                at.average = WeightAverage([np.asarray(saved[f"{AVERAGE}{i}"], np.float32)
                                            for i in range(n)], float(saved["average_at"]))
            if not resized:  # per-rank totals of ranks that no longer exist mean nothing
                at.totals = np.array(saved["totals"], dtype=float)
        return at

    def saved(self) -> dict:
        """The loop's part of a checkpoint ("trainer.<key>")."""
        out = dict(wall=self.wall, samples=self.samples, totals=self.totals.copy(),
                   evals=self.evals, last_progress=self.last_progress)
        if self.average is not None and self.average.arrays is not None:
            out.update(ck.indexed(AVERAGE, self.average.arrays), average_at=self.average.at)
        return out


class Trainer:
    """The loop over rounds, with evaluation, checkpoints and the run's records around it."""

    def __init__(self, cfg: Config, algo: algorithms.Algorithm, test_ds: Dataset, log: RunLog,
                 ckpt: Checkpointer, position: Position, val_ds: Optional[Dataset] = None):
        self.cfg, self.algo, self.cluster = cfg, algo, algo.cluster
        self.test_ds, self.log, self.ckpt, self.position = test_ds, log, ckpt, position
        self.val_ds = val_ds
        # The best model is kept where there is a split to choose it by and checkpoints at all.
        self.keeps_best = val_ds is not None and cfg.checkpoint.best and cfg.checkpoint.keep > 0
        # A resumed run's best so far: its evaluations', or the kept model's if that came later.
        self.best_val = max([kept_score(e) for e in position.evals if "val_p_at_1" in e]
                            + [ckpt.best_value() if self.keeps_best else -1.0], default=-1.0)
        # checkpoint.average: the running average of the weights that competes for the keep,
        # held by the position (a resumed run's goes on); its half-life is this run's config.
        self.halflife = cfg.checkpoint.average if val_ds is not None else 0.0
        position.average = (position.average or WeightAverage()) if self.halflife > 0 else None
        train_ds = algo.ctx.train
        self.inv_prop = inverse_propensities(train_ds.label_frequencies(), train_ds.n_rows,
                                             cfg.data.propensity_a, cfg.data.propensity_b)
        self.evaluator: Optional[Evaluator] = None
        self.landed = False  # a merge landed after the last evaluation (settle)
        self.faults = Faults.from_env(self.cluster.rank)
        cut = [e for e in position.evals if "lr" in e]
        if any(e.get("lr_cut") for e in cut):  # a resumed run goes on at the rate it had cut to
            algo.set_lr(float(cut[-1]["lr"]))

    def plateau(self) -> Optional[dict]:
        """optim.plateau as this run applies it (the start record's lr_plateau): None without
        a validation split or at a factor of 1."""
        o = self.cfg.optim
        if self.val_ds is None or o.plateau >= 1.0:
            return None
        return {"factor": o.plateau, "epochs": o.plateau_epochs}

    def warm_up(self) -> None:
        """The evaluation's functions traced and run once (Evaluator.warm_up), before the clock
        and any CPU quota, as the algorithm's steps are (Algorithm.trace)."""
        self.evaluator_for(self.algo.eval_model()).warm_up(self.test_ds)

    def evaluator_for(self, model) -> Evaluator:
        if self.evaluator is None or self.evaluator.model is not model:
            self.evaluator = Evaluator(model, self.cfg.train.eval_memory_mb, inv_prop=self.inv_prop)
        return self.evaluator

    def loop(self) -> None:
        """Round -> account -> maybe evaluate -> maybe checkpoint -> stop at the end, the time
        budget or the target; a final evaluation and checkpoint if the last round had none."""
        cfg, pos, log = self.cfg.train, self.position, self.log
        t_loop, said_at = time.perf_counter(), -cfg.log_every_s  # the first round says where it is
        self.dropout_on(pos.last_progress)  # a resumed run past model.dropout_after
        while True:
            self.faults.at_round(pos.rounds, self.algo)
            t0 = time.perf_counter()
            stats = self.algo.run_round()
            if stats is None:
                break
            ranks, loss = self.account(stats, time.perf_counter() - t0)
            now = time.perf_counter() - t_loop
            if itstime(now, cfg.log_every_s, said_at):
                said_at = now
                log.say(f"train epoch {stats.epoch:6.2f} | {pos.wall:7.1f} s | loss {loss:.4f} | "
                        f"{pos.samples / max(pos.wall, 1e-9):8.0f} rows/s | batch "
                        + "/".join(str(r.batch_size) for r in ranks))
            out_of_time = cfg.time_budget_s is not None and pos.wall >= cfg.time_budget_s
            if itstime(stats.epoch, cfg.eval_every, pos.last_progress) and not out_of_time:
                self.evaluate(stats.epoch)
            elif pos.average is not None and pos.average.due(stats.epoch, self.halflife):
                self.sample_average(stats.epoch)
            pos.last_progress = stats.epoch
            self.dropout_on(stats.epoch)
            if self.ckpt.due(pos.rounds):
                self.save()
            if out_of_time:
                log.say(f"time budget of {cfg.time_budget_s} s reached")
                break
            target = cfg.target_p_at_1
            if target is not None and pos.evals and pos.evals[-1]["p_at_1"] >= target:
                log.say(f"target P@1 {target} reached")
                break
            stale = evals_since_best(pos.evals)
            if cfg.patience is not None and stale >= cfg.patience:
                log.say(f"early stop: the validation score has not passed {self.best_val:.4f} in "
                        f"{stale} evaluations (train.patience {cfg.patience})")
                break
        # A merge still in flight (merge.overlap) lands first: the last evaluation then saw
        # the model merged a window earlier, and the final one sees the merged end.
        self.settle()
        if self.landed or not pos.evals or pos.evals[-1]["epoch"] != round(pos.last_progress, 4):
            self.evaluate(pos.last_progress)
        if self.ckpt.final_due(pos.rounds):
            self.save()

    def account(self, stats: RoundStats, seconds: float) -> tuple[list[RoundStats], float]:
        """Gathers every rank's RoundStats, adds them to the position, writes the round's
        record; returns the ranks' stats and the round's mean loss."""
        pos = self.position
        info = allgather(self.cluster.comm, (stats, seconds))
        pos.wall += info[0][1]  # rank 0's clock is the run's clock
        ranks = [i[0] for i in info]
        pos.samples += sum(r.samples for r in ranks)
        pos.totals += [r.totals() for r in ranks]
        loss = sum(r.loss_sum for r in ranks) / max(sum(r.samples for r in ranks), 1)
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss became {loss} at epoch {stats.epoch:.3f} (round {pos.rounds}); "
                                     "lower optim.lr or check the data")
        self.log.record(event="round", round=pos.rounds, epoch=round(stats.epoch, 4),
                        wall_s=round(pos.wall, 4), samples=int(pos.samples), loss=round(loss, 5),
                        ranks=[r.record(i) for i, r in enumerate(ranks)])
        pos.rounds += 1
        return ranks, loss

    def dropout_on(self, epochs: float) -> None:
        """model.dropout_after: dropout applies to every round after the first `epochs` epochs
        that reach it (said once)."""
        if self.algo.model.dropout_on(epochs):
            self.log.say(f"model.dropout {self.algo.model.dropout:g} from epoch {epochs:.2f} on "
                         f"(model.dropout_after {self.algo.model.cfg.dropout_after:g})")

    def evaluate(self, progress: float) -> None:
        """Evaluates the algorithm's model on the test set (every rank), records and says it."""
        model, pos = self.algo.eval_model(), self.position
        self.landed = False
        # The weights' L2 norm is part of every eval record (weight_norm); the algorithm hears
        # it too (Algorithm.on_eval: adaptive normalization follows its trend).
        finite, norm = weight_stats(model.variables_list)
        if not finite:
            raise FloatingPointError(
                f"the model's weights became NaN or inf by epoch {progress:.3f} (round {pos.rounds}); "
                "stopping, the last good checkpoint is kept; lower optim.lr or check the data")
        m = self.evaluator_for(model)(self.test_ds, self.cluster, self.cfg.train.eval_rows)
        self.algo.on_eval(norm)
        rec = dict(event="eval", wall_s=round(pos.wall, 4), epoch=round(progress, 4),
                   samples=int(pos.samples), **{k: round(v, 5) for k, v in m.items()},
                   weight_norm=round(norm, 4))
        said = ""
        if self.val_ds is not None:
            v = self.evaluator_for(model)(self.val_ds, self.cluster, None)
            rec.update({f"val_{k}": round(v[k], 5) for k in VAL_METRICS})
            score = val_score(rec)
            said = f" | val P@1 {rec['val_p_at_1']:.4f} score {score:.4f}"
            if score > self.best_val:
                self.best_val = score
                if self.keeps_best:
                    self.ckpt.save_best(model.variables_list, pos.rounds, rec,
                                        self.cfg.train.algorithm)
                    said += " (best: kept)"
            if pos.average is not None:
                said += self.evaluate_average(model, progress, rec)
            said += self.on_plateau(rec)
        pos.evals.append(rec)
        self.log.record(**rec)
        self.log.say(f"eval  epoch {progress:6.2f} | {pos.wall:7.1f} s | P@1 {m['p_at_1']:.4f} "
                     f"P@3 {m['p_at_3']:.4f} P@5 {m['p_at_5']:.4f} | nDCG@5 {m['ndcg_at_5']:.4f} "
                     f"| PSP@5 {m['psp_at_5']:.4f}{said}")
        # The ranks leave an evaluation at different times (rank 0 writes the record); the next
        # window starts together, so no rank's share of the evaluation lands on the training
        # clock as other ranks' wait or as rows the late rank never got to claim.
        self.faults.delay("eval")
        self.cluster.comm.Barrier()

    def on_plateau(self, rec: dict) -> str:
        """optim.plateau: records the rate in the evaluation `rec` (with a validation split),
        cut first where `plateau_cut` says so (every rank alike: the validation P@1 is every
        rank's); returns what the progress line adds."""
        o = self.cfg.optim
        cut = o.plateau < 1.0 and plateau_cut([*self.position.evals, rec], o.plateau_epochs)
        if cut:
            self.algo.set_lr(float(self.algo.cfg.optim.lr) * o.plateau)
            rec["lr_cut"] = True
        rec["lr"] = round(float(self.algo.cfg.optim.lr), 8)
        return (f" | rate cut to {rec['lr']:.4g}: no gain in {o.plateau_epochs:g} epoch(s)"
                if cut else "")

    def sample_average(self, progress: float) -> list:
        """Takes the evaluated model's weights at `progress` into checkpoint.average's running
        average, off the training clock; returns the weights. The ranks leave together, as
        from an evaluation."""
        own = tune.copies(self.algo.eval_model().variables_list)
        self.position.average.add(own, progress, self.halflife)
        self.cluster.comm.Barrier()
        return own

    def evaluate_average(self, model, progress: float, rec: dict) -> str:
        """After the model's evaluation `rec` (its validation score already judged): samples the
        average and scores it on the validation split in the model's place; where it beats the
        best so far, also on the test rows (rec's avg_* metrics) and it is kept. Returns what
        the progress line adds."""
        own, average = self.sample_average(progress), self.position.average.arrays
        ev = self.evaluator_for(model)
        with tune.unchanged(model.variables_list, own):  # the model's own weights put back
            for var, a in zip(model.variables_list, average):
                var.assign(a)
            v = ev(self.val_ds, self.cluster, None)
            rec.update({f"avg_val_{k}": round(v[k], 5) for k in VAL_METRICS})
            score = val_score(rec, "avg_val_")
            said = f" | average's {score:.4f}"
            if score <= self.best_val:
                return said
            self.best_val = score
            m = ev(self.test_ds, self.cluster, self.cfg.train.eval_rows)
        rec.update({f"avg_{k}": round(x, 5) for k, x in m.items()})
        rec["kept"] = "average"
        if self.keeps_best:
            self.ckpt.save_best(average, self.position.rounds, kept_view(rec),
                                self.cfg.train.algorithm, model="average")
            return said + f" (best: the average kept, test P@1 {m['p_at_1']:.4f})"
        return said + f" (best: the average, test P@1 {m['p_at_1']:.4f})"

    def settle(self) -> None:
        """Lands the algorithm's work in flight (Algorithm.settle); `landed` then says that the
        model changed since the last evaluation read it."""
        self.landed = self.algo.settle() or self.landed

    def save(self) -> None:
        self.settle()  # a checkpoint holds merged replicas (merge.overlap)
        self.ckpt.save_training(self.algo, self.log, self.position.rounds, self.position.saved())

    def finish(self, rates: list[float], base_p1: float) -> dict:
        """Writes summary.json (rank 0) and returns it; closes the run's files."""
        pos, cluster, log = self.position, self.cluster, self.log
        summary = self.summary(rates, base_p1)
        # Fingerprints of every rank's replica: equal where the algorithm keeps replicas equal.
        summary["replica_fingerprints"] = allgather(cluster.comm, _fingerprint(self.algo.model))
        # Each rank's peak resident memory so far (Linux reports kilobytes) and its CPU quota as
        # its cgroup holds it (cpu_quota mode), read back from the kernel.
        quota = self.algo.hetero.quota
        mine = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                quota.cores_set() if quota else None)
        for rec, (mb, cores) in zip(summary["per_rank"], allgather(cluster.comm, mine)):
            rec["peak_rss_mb"] = round(mb, 1)
            rec["quota_cores"] = cores
        log.write_json(records.SUMMARY, summary)
        log.say(f"done: P@1 {summary['final']['p_at_1']:.4f} P@3 {summary['final']['p_at_3']:.4f} "
                f"P@5 {summary['final']['p_at_5']:.4f} after {pos.wall:.1f} s of training "
                f"(baseline P@1 {base_p1:.4f}); cluster efficiency {summary['efficiency']:.2f}")
        kept = summary["kept"]
        if kept is not None:
            where = f"kept in {self.ckpt.best_dir}" if self.keeps_best else "not written"
            what = "the weights' average" if kept["model"] == "average" else "the model"
            log.say(f"best model: {what} at epoch {kept['epoch']:.2f}, validation score "
                    f"{val_score(kept):.4f} (P@1 {kept['val_p_at_1']:.4f}), test P@1 "
                    f"{kept['p_at_1']:.4f} ({where})")
        log.close()
        return summary

    def summary(self, rates: list[float], base_p1: float) -> dict:
        """The run's summary.json, peak memory and fingerprints aside."""
        pos = self.position
        per_rank = []
        for i, t in enumerate(pos.totals):
            d = dict(zip(TOTALS, t.tolist()))
            per_rank.append({"rank": i, "samples": int(d["samples"]), "batches": int(d["batches"]),
                             **{k: round(d[k], 3) for k in TIMES},
                             "busy_fraction": round(d["compute_s"] / max(pos.wall, 1e-9), 4),
                             "standalone_rate": round(rates[i], 1)})
        return {
            "algorithm": self.cfg.train.algorithm, "ranks": self.cluster.size,
            "train_wall_s": round(pos.wall, 3),
            "samples": int(pos.samples), "rows_per_s": round(pos.samples / max(pos.wall, 1e-9), 1),
            # Samples per second achieved over what the ranks could do alone, added up.
            "efficiency": round(pos.samples / max(pos.wall, 1e-9) / max(sum(rates), 1e-9), 4),
            "baseline_p_at_1": base_p1, "final": {k: v for k, v in pos.evals[-1].items() if k != "event"},
            "best_p_at_1": max(e["p_at_1"] for e in pos.evals),
            # The evaluation of the best validation score: the model predict reads (checkpoint.best).
            "kept": _kept(pos.evals), "per_rank": per_rank,
            "algorithm_state": self.algo.state(),
        }


def kept_score(e: dict) -> float:
    """An evaluation's claim to the kept model: its validation score, or checkpoint.average's
    where that is higher (-1 without a split)."""
    return max(val_score(e), val_score(e, "avg_val_"))


def plateau_cut(evals: list[dict], epochs: float) -> bool:
    """Whether optim.plateau cuts the rate at the last of `evals`: its trained model's
    validation P@1 is no higher than the best before it, and `epochs` or more have passed since
    that best or the last cut. A function of the records alone, so a resumed run cuts where
    the uninterrupted one would."""
    best, since, cut = -1.0, 0.0, False
    for e in evals:
        cut = False
        if "val_p_at_1" not in e:
            continue
        if e["val_p_at_1"] > best:
            best, since = e["val_p_at_1"], e["epoch"]
        elif e["epoch"] - since >= epochs - 1e-9:
            since, cut = e["epoch"], True
    return cut


def evals_since_best(evals: list[dict]) -> int:
    """Evaluations after the first one of the highest `kept_score` (0 without a split)."""
    scores = [kept_score(e) for e in evals if "val_p_at_1" in e]
    return len(scores) - 1 - int(np.argmax(scores)) if scores else 0


def kept_view(e: dict) -> dict:
    """The evaluation `e` as the model kept at it: where the average was (e["kept"] is
    "average"), its avg_* metrics under the plain names; "model" says which."""
    own = {k: v for k, v in e.items() if k not in ("event", "kept") and not k.startswith("avg_")}
    if e.get("kept") != "average":
        return {**own, "model": "trained"}
    return {**own, **{k[len("avg_"):]: v for k, v in e.items() if k.startswith("avg_")},
            "model": "average"}


def _kept(evals: list[dict]) -> Optional[dict]:
    """The first evaluation of the highest `kept_score`, as its kept model saw it (`kept_view`;
    None without a split)."""
    scored = [e for e in evals if "val_p_at_1" in e]
    if not scored:
        return None
    return kept_view(max(scored, key=kept_score))  # max keeps the first of equals


NORM_ROWS = 16384  # rows of a variable weight_stats reads at a time


def weight_stats(variables) -> tuple[bool, float]:
    """Whether every weight is finite, and the weights' L2 norm, reading at most NORM_ROWS rows
    of a variable at a time (tf.gather: a variable trained with sparse updates copies itself
    whole on every plain read). `v * v` of the whole input layer made a fresh temporary of it
    each evaluation, slow and different on every rank at quarter-core ranks (docs/benchmark.md,
    "Figures behind the code's defaults")."""
    finite, total = True, 0.0
    for v in variables:
        rows = int(v.shape[0]) if v.shape.rank else 0
        parts = ((tf.gather(v, tf.range(lo, min(lo + NORM_ROWS, rows)))  # one slice at a time
                  for lo in range(0, rows, NORM_ROWS)) if rows > NORM_ROWS else [v])
        for x in parts:
            finite = finite and bool(tf.reduce_all(tf.math.is_finite(x)))
            total += float(tf.reduce_sum(tf.square(x)))
    return finite, math.sqrt(total)


def _fingerprint(model: SparseMLP) -> list[float]:
    return [float(tf.reduce_sum(v)) + float(tf.reduce_sum(v * v)) for v in model.variables_list]
