"""What every training algorithm shares: the data stream, the local step, simulated slowdown.

An algorithm trains in rounds. A round covers `train.window_rows(ranks)` rows of the epoch's
shuffled stream (`train.window_samples`, at least two batches a rank; fewer at the end of an
epoch); for model-averaging algorithms it ends with a merge. Where the replicas are equal after
every step (sync), a round also ends at the first step after each `train.eval_every` mark, so
the run is evaluated there, as a plain Horovod script is, whatever the window. `run_round`
returns this rank's accounting for the round, or None when training is over.

Checkpoints: `state_dict` / `load_state_dict` cover the model, the optimizer, the data position
and the jitter RNG here; subclasses add their own state (batch sizes, central model, ...).
"""
from __future__ import annotations

import dataclasses
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import numpy as np
from hvd_adaptive.tfload import tf

from hvd_adaptive.config import Config
from hvd_adaptive.data import Dataset, epoch_permutation, make_batch
from hvd_adaptive.parallel.distributed import Cluster, threads_cpu_s
from hvd_adaptive.train import checkpoint as ck
from hvd_adaptive.train.hetero import Heterogeneity
from hvd_adaptive.train.periodic import itstime
from hvd_adaptive.model.network import (BATCH_SIGNATURE, JUDGE_SIGNATURE, Optimizer, SparseMLP,
                                        batch_tensors)
from hvd_adaptive.train.tune import TOP_K, probes, top_labels, unchanged, warm_up


@dataclass
class Context:
    """What an algorithm is built from."""

    cfg: Config
    cluster: Cluster
    model: SparseMLP
    opt: Optimizer
    train: Dataset
    hetero: Heterogeneity


def chunks(total: int, size: int) -> list[tuple[int, int]]:
    """Splits [0, total) into batches of `size`; a remainder under half a batch joins the last.

    One tiny batch at the end of every epoch made a noisy step that cost sync several points
    of P@1 each time on the benchmark workload.
    """
    bounds = list(range(0, total, size)) + [total]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < size / 2:
        del bounds[-2]
    return list(zip(bounds[:-1], bounds[1:]))


@dataclass(frozen=True)
class Window:
    """A round's slice [start, end) of the epoch's permutation."""

    index: int         # global round counter
    epoch: int
    perm: np.ndarray
    start: int
    end: int
    epoch_rows: int    # rows of this epoch (fewer in a fractional last epoch)
    n_rows: int        # rows of a full epoch


    @property
    def progress(self) -> float:
        """Epochs completed when this window is done."""
        return self.epoch + self.end / self.n_rows


# Where a round's time goes (RoundStats), and the per-rank totals the run summary keeps.
TIMES = ("batch_s", "compute_s", "comm_s", "sync_s", "wait_s")
TOTALS = ("samples", "batches", *TIMES)


@dataclass
class RoundStats:
    """This rank's accounting for one round (allgathered and written by rank 0).

    Where the round's time went: `batch_s` building batches from the data, `compute_s` local
    computation (forward, backward, optimizer update; with the injected slowdown), `comm_s`
    moving model data (allreduce of gradients, merge of replicas, shared-memory copies),
    `sync_s` exchanging timings (allgather), `wait_s` the rest: waiting for other ranks (the
    algorithms enter each collective through a barrier, so that waiting is not counted as
    communication). Sync's fused step (`sync.step: fused`) is one span: its allreduce and its
    wait for the other ranks are inside its compute_s.
    """

    epoch: float
    batch_size: int
    batches: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    batch_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    sync_s: float = 0.0
    wait_s: float = 0.0
    weight: float = 0.0
    lr: float = 0.0
    extra: dict = field(default_factory=dict)

    def add_step(self, rows: int, loss: float, compute_s: float) -> None:
        """Accounts one batch of `rows` rows whose local computation took `compute_s`."""
        self.batches += 1
        self.samples += rows
        self.loss_sum += loss * rows
        self.compute_s += compute_s

    @contextmanager
    def timed(self, what: str) -> Iterator[None]:
        """Adds the time spent inside to the field `what` ("comm_s", "sync_s", ...)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, what, getattr(self, what) + time.perf_counter() - t0)

    def note_merge(self, merge) -> None:
        """Records the bytes a rank put into the round's merge (a merge.Merge), a dense one's,
        and how many allreduces (pieces) carried them."""
        self.extra["merge_mb"] = merge.last_bytes / 2**20
        self.extra["merge_full_mb"] = merge.dense_bytes / 2**20
        self.extra["merge_pieces"] = merge.last_pieces

    def close(self, total_s: float, slowdown_s: float) -> None:
        """Ends the round: wait_s is the part of its `total_s` that no other field accounts
        for; `slowdown_s` is the injected slowdown (hetero) within it."""
        busy = self.batch_s + self.compute_s + self.comm_s + self.sync_s
        self.wait_s = max(total_s - busy, 0.0)
        self.extra["slowdown_s"] = slowdown_s

    def totals(self) -> list[float]:
        """The round's values of TOTALS, which the run summary adds up per rank."""
        return [getattr(self, k) for k in TOTALS]

    def record(self, rank: int) -> dict:
        """This rank's entry in the round's record in metrics.jsonl."""
        return {"rank": rank, "batch_size": self.batch_size, "batches": self.batches,
                "samples": self.samples, **{k: round(getattr(self, k), 4) for k in TIMES},
                "weight": round(self.weight, 5), "lr": self.lr,
                **{k: round(v, 4) if isinstance(v, float) else v for k, v in self.extra.items()}}


class Algorithm:
    """Base class: subclasses implement `train_window` and may override `setup`, `eval_model`,
    `on_eval`, `state` and the checkpoint pair `state_dict` / `load_state_dict`."""

    name = "base"
    # Whether these can differ between ranks at the end of a round. Parts that can are
    # checkpointed once per rank (keys "rank.*"); the rest once, from rank 0.
    model_differs_by_rank = False     # sma keeps its replicas apart from the central model
    optimizer_differs_by_rank = True  # only sync applies the same (summed) update on every rank
    # Whether a round also ends at the first step after each train.eval_every mark (the
    # replicas are equal after every step); elsewhere evaluations wait for a round's merge.
    rounds_end_at_evaluations = False

    def __init__(self, ctx: Context):
        self.ctx, self.cfg, self.cluster = ctx, ctx.cfg, ctx.cluster
        self.model, self.opt = ctx.model, ctx.opt
        self.variables = self.model.variables_list
        self.hetero = ctx.hetero
        self._windows = self._window_stream()
        self.windows_done = 0  # data position: windows handed out so far
        self.resized = False   # set on resume from a checkpoint of another rank count

        # autograph=False here and on every tf.function of the project: the graphs have no
        # tensor-dependent Python control flow (loops are tf.while_loop), and AutoGraph's source
        # conversion took a large part of every job's start-up (docs/benchmark.md, "Figures
        # behind the code's defaults").
        @tf.function(input_signature=BATCH_SIGNATURE, autograph=False)
        def local_step(*batch):
            with tf.GradientTape() as tape:
                loss = self.model.loss(*batch, training=True)
            grads = tape.gradient(loss, self.variables)
            self.opt.apply(grads, self.variables)
            return loss

        self._local_step = local_step

        @tf.function(input_signature=JUDGE_SIGNATURE, autograph=False)
        def held_out(*batch):  # optim.lr auto's judge (hvd_adaptive.train.tune.HeldOut)
            return self.model.loss_and_top(*batch, k=TOP_K, top_labels=top_labels)

        self.held_out = held_out

    # ---- data stream ---------------------------------------------------------------------
    def _window_stream(self) -> Iterator[Window]:
        n = self.ctx.train.n_rows
        s = self.cfg.train.window_rows(self.ctx.cluster.size)
        epochs = self.cfg.train.epochs
        index = 0
        for epoch in range(math.ceil(epochs)):
            rows = n if epoch + 1 <= epochs else max(1, int(round((epochs - epoch) * n)))
            perm = epoch_permutation(n, self.cfg.train.seed, epoch)[:rows]
            for start in range(0, rows, s):
                for lo, hi in self._pieces(epoch, start, min(start + s, rows), n):
                    yield Window(index, epoch, perm, lo, hi, rows, n)
                    index += 1

    def _pieces(self, epoch: int, start: int, end: int, n: int) -> list[tuple[int, int]]:
        """The window [start, end) of an epoch, cut after each step that reaches a
        train.eval_every mark (rounds_end_at_evaluations), so the trainer evaluates there."""
        if not self.rounds_end_at_evaluations:
            return [(start, end)]
        every, cuts = self.cfg.train.eval_every, [start]
        step = self.cfg.train.batch_size * self.ctx.cluster.size
        for lo, hi in chunks(end - start, step):
            if start + hi < end and itstime(epoch + (start + hi) / n, every, epoch + (start + lo) / n):
                cuts.append(start + hi)
        return list(zip(cuts, cuts[1:] + [end]))

    def next_window(self) -> Optional[Window]:
        w = next(self._windows, None)
        self.windows_done += w is not None
        return w

    def skip_windows(self, n: int) -> None:
        """Skips the first n windows (resume): the stream depends only on train.seed and epoch."""
        for _ in range(n - self.windows_done):
            if self.next_window() is None:
                break

    def batch(self, rows: np.ndarray, stats: Optional[RoundStats] = None) -> tuple:
        """The batch's tensors; the time it takes counts as batch building in `stats`."""
        t0 = time.perf_counter()
        out = batch_tensors(make_batch(self.ctx.train, rows))
        if stats is not None:
            stats.batch_s += time.perf_counter() - t0
        return out

    # ---- steps ---------------------------------------------------------------------------
    def local_step(self, rows: np.ndarray, stats: RoundStats) -> None:
        """One plain SGD step on this rank's replica; its computation is slowed as configured."""
        batch = self.batch(rows, stats)
        loss, dt = self.hetero.compute(self._local_step, *batch)
        stats.add_step(len(rows), float(loss), dt)

    def step_functions(self) -> list:
        """tf.functions with full input signatures that training calls."""
        return [self._local_step]

    def calibrate(self, batch_size: int, steps: int = 8, min_seconds: float = 2.0) -> float:
        """This rank's standalone speed in rows/s: the local training step, optimizer update
        and slowdown included, as if this rank trained alone (no communication, no waiting).

        The denominator of cluster efficiency (1.0: no waiting and no overhead). At least
        `steps` steps and `min_seconds` (several periods of a cgroup CPU quota) are timed. The
        steps change nothing: model and optimizer state are put back afterwards.
        """
        n = self.ctx.train.n_rows
        rng = np.random.default_rng(7 + self.cluster.rank)
        batches = [self.batch(rng.integers(0, n, size=min(batch_size, n))) for _ in range(steps)]
        rows = 0.0
        done = 0
        with self.unchanged():
            self.hetero.compute(self._local_step, *batches[0])  # not timed: first run optimizes
            # Wall time of the whole loop, not the sum of the steps' spans: a CPU quota can also
            # stall the process between spans. (Under a quota both readings agreed within the
            # runs' spread where they were compared: docs/benchmark.md, "Figures behind the
            # code's defaults".)
            t0, cpu0 = time.perf_counter(), time.process_time()
            comm0 = threads_cpu_s(self.cluster.comm_threads)
            while done < steps or time.perf_counter() - t0 < min_seconds:
                b = batches[done % steps]
                self.hetero.compute(self._local_step, *b)
                rows += int(b[-1])
                done += 1
            seconds = time.perf_counter() - t0
            comm = threads_cpu_s(self.cluster.comm_threads) - comm0
            cpu = time.process_time() - cpu0
        return rows / self.training_seconds(seconds, cpu, comm)

    def training_seconds(self, seconds: float, cpu_s: float, comm_cpu_s: float) -> float:
        """Of `seconds` of calibration, those this rank would have needed alone.

        Under a CPU quota, MPI's and Horovod's threads spend the rank's own quota: Horovod's
        background thread coordinates the ranks once a cycle and spins in MPI until the last
        one answers, and a throttled rank answers late, so a fast rank beside a much slower
        one lost a large and varying part of its quota there. That is communication, not this
        rank's speed: those CPU seconds (`comm_cpu_s`, of the process's `cpu_s`) are given back
        at the quota's pace, never below the time the rest of the CPU seconds needed at that
        pace. Without a quota those threads run beside the training on other cores.
        """
        if self.hetero.quota is None:
            return seconds
        cores = self.hetero.quota.cores
        return max(seconds - comm_cpu_s / cores, (cpu_s - comm_cpu_s) / cores)

    @contextmanager
    def unchanged(self) -> Iterator[Callable[[], None]]:
        """Steps run inside change nothing: model, optimizer state, learning rate and the
        sampled loss's draw counter are put back afterwards (warm-up runs and calibration
        before the clock starts, the probe of optim.lr auto, whose candidates so draw the
        same negatives). Yields the function that puts them back, for use in between."""
        with unchanged([*self.variables, *self.opt.slot_variables(), self.opt.lr,
                        *self.model.random_state()]) as restore:
            yield restore

    # ---- interface -----------------------------------------------------------------------
    def setup(self) -> None:
        """Called once after construction on every rank (collectives allowed)."""

    def trace(self) -> None:
        """Traces the step functions before the clock starts, so tracing is not training time.

        The first execution of a traced step is slow too (graph optimization, kernel set-up),
        so the local step also runs once, with its effects undone.
        """
        for fn in self.step_functions():
            fn.get_concrete_function()
        if probes(self.cfg):  # the probe's judge, traced and run as it will run
            warm_up(self.cfg, self.ctx.train, self.batch, self.held_out, self.cluster.size)
        with self.unchanged():
            self._local_step(*self.batch(np.arange(min(8, self.ctx.train.n_rows))))

    def on_calibrated(self, rates: list) -> None:
        """Receives every rank's standalone rows/s (Algorithm.calibrate, allgathered) before
        the clock starts."""

    def probe_step(self, *batch) -> None:
        """One local training step, slowed as configured (hvd_adaptive.train.tune.probe)."""
        self.hetero.compute(self._local_step, *batch)

    def set_lr(self, lr: float) -> None:
        """Takes `lr` as optim.lr from now on (optim.lr auto's choice, or a checkpoint's)."""
        self.cfg = dataclasses.replace(self.cfg, optim=dataclasses.replace(self.cfg.optim, lr=lr))
        self.opt.lr.assign(lr)

    def run_round(self) -> Optional[RoundStats]:
        w = self.next_window()
        if w is None:
            return None
        self.hetero.at_epoch(w.epoch + w.start / w.n_rows)
        t0, slept = time.perf_counter(), self.hetero.injected_s
        self.model.touched.clear()  # rows this window trains (not calibration's or warm-up's)
        stats = self.train_window(w)
        stats.close(time.perf_counter() - t0, self.hetero.injected_s - slept)
        return stats

    def train_window(self, w: Window) -> RoundStats:
        raise NotImplementedError

    def eval_model(self) -> SparseMLP:
        """The model to evaluate (identical on all ranks)."""
        return self.model

    def settle(self) -> bool:
        """Finishes work a round left in flight (adaptive SGD's overlapped merge), so the
        replicas are what a checkpoint or the run's end should hold; True if there was any."""
        return False

    def on_eval(self, weight_norm: float) -> None:
        """Called on every rank after each evaluation of `eval_model` with the L2 norm of its
        weights (the eval record's weight_norm); adaptive's normalization follows its trend."""

    def state(self) -> dict:
        """Algorithm state for the run summary (batch sizes etc.)."""
        return {}

    # ---- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue exactly: flat str -> numpy array or JSON value.

        Keys starting with "rank." may differ between ranks (saved per rank). Subclasses
        extend the dict; call on every rank at a round's end.
        """
        model = ck.indexed(ck.MODEL, [v.numpy() for v in self.variables])
        opt = ck.indexed(ck.OPT, [v.numpy() for v in self.opt.slot_variables()])
        opt[ck.OPT + "lr"] = float(self.opt.lr.numpy())
        d = {"algorithm": self.name, "ranks": self.cluster.size, "windows": self.windows_done,
             ck.PER_RANK + "rng": self.hetero.state()["rng"], "optim.lr": float(self.cfg.optim.lr)}
        for part, differs in ((model, self.model_differs_by_rank),
                              (opt, self.optimizer_differs_by_rank)):
            d.update({(ck.PER_RANK + k if differs else k): v for k, v in part.items()})
        return d

    def load_state_dict(self, d: dict) -> None:
        """Restores a state_dict (per-rank keys of old rank r mod N when the rank count changed).

        Subclasses restore their part and reset arrays with one entry per rank when
        `self.resized` (the checkpoint was written by another number of ranks).
        """
        if d["algorithm"] != self.name:
            raise ValueError(f"checkpoint was written by train.algorithm={d['algorithm']}, "
                             f"this run uses {self.name}")
        self.resized = d["ranks"] != self.cluster.size
        pre_m = ck.PER_RANK if self.model_differs_by_rank else ""
        pre_o = ck.PER_RANK if self.optimizer_differs_by_rank else ""
        for i, v in enumerate(self.variables):
            _assign(v, d, f"{pre_m}{ck.MODEL}{i}")
        for i, v in enumerate(self.opt.slot_variables()):
            _assign(v, d, f"{pre_o}{ck.OPT}{i}")
        if self.cfg.optim.lr == "auto" and "optim.lr" in d:  # the rate this run's probe chose
            self.set_lr(float(d["optim.lr"]))
        self.opt.lr.assign(d[pre_o + ck.OPT + "lr"])
        if not self.resized:  # the jitter stream of a rank that no longer exists means nothing
            self.hetero.load_state({"rng": d[ck.PER_RANK + "rng"]})
        self.skip_windows(int(d["windows"]))

    def per_rank(self, d: dict, key: str, default: np.ndarray) -> np.ndarray:
        """A checkpointed array with one entry per rank, or `default` after a rank-count change."""
        return default if self.resized else np.asarray(d[key], dtype=default.dtype)


def _assign(var: tf.Variable, d: dict, key: str) -> None:
    value = d.get(key)
    if value is None or tuple(np.shape(value)) != tuple(var.shape):
        have = "missing" if value is None else f"shape {tuple(np.shape(value))}"
        raise ValueError(f"checkpoint entry {key} is {have}, this run needs shape "
                         f"{tuple(var.shape)}: was it written for another model or data set?")
    var.assign(value)
