"""`optim.lr: auto`: the learning rate chosen for the data by a rule or by a short probe.

The rule (`rule`, `optim.lr_choice: rule`, for Adagrad-type optimizers): ADAGRAD_STEP over the
square root of the training rows' median L1 norm, over the fourth root of their mean labels a
row in units of LABELS_A_ROW where they have more, over the square root of the last hidden
layer's width in units of WIDTH where it is wider, and times SAMPLED_STEP under the sampled
loss (`centre`), read from the rows and the config, no training; for a linear model
LINEAR_RATE.

The probe (`search`, `optim.lr_choice: probe`, and for the other optimizers):
Every candidate rate trains the same rows from the same start for a few steps and is judged on
rows it did not train: the highest precision at 5 wins among the candidates whose cross-entropy
is within LOSS_SLACK of the lowest (`best`), and where one of its neighbours judges alike the
rate is the two's geometric mean (`settle`; `pick` does both). The candidates are powers of 2
around a centre taken from the data (`centre`), and the search goes on past the lowest or
highest rate while the pick is there and does not bracket the best with its neighbour
(`choose`, `brackets`). A round holds a candidate for each rank near the fastest (`width`),
shared by the ranks' measured speeds (`split`), and every rank takes the same choice from one
allgather of the judgements a round.
The probe runs inside each rank's slowdown and its seconds are charged to the run's clock: what
a choice costs counts in the time to a target. Either choice's rate is then multiplied by
optim.lr_scale (1 by default; `auto_choice`).

The rule, the candidates, the probe's size, the judge's top labels (`top_labels`) and its first
run before the clock (`warm_up`) are the module's; how a candidate trains and how its held-out
rows are scored are the caller's (`search`), so the project's algorithms
(`probe`) and the plain Horovod script of the benchmark (hvd_adaptive.bench.plain_horovod)
choose the same way with their own steps.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from hvd_adaptive.config import ConfigError
from hvd_adaptive.model.metrics import hits_matrix

# Candidates are the centre times powers of 2. Adagrad-type optimizers step each weight by
# about lr whatever its gradient, so a step moves the input layer's output by about lr times a
# row's L1 norm, while the output layer's step does not grow with it: their centre is
# ADAGRAD_STEP over the square root of the training rows' median L1 norm (0.1 for the
# L2-normalized TF-IDF rows of the synthetic presets, whose best rate that was); the search
# then finds the best wherever it is. The others start from a fixed centre.
ADAGRAD_STEP = 0.25
# Rows with many labels want a lower rate at the same norm: on the same synthetic rows with 20
# and 75 labels a row in place of 5.45 the best fixed rate was half the rule's (0.05 against
# 0.1), and on the Delicious-shaped rows (75 labels a row) 0.036 against 0.072. Above
# LABELS_A_ROW labels a row in mean the rate falls as the fourth root of their ratio
# (docs/benchmark.md, "Labels a row").
LABELS_A_ROW = 6.0
# The sampled loss wants a lower rate than the full softmax on the same rows: at 33,504 and
# 67,009 labels sync's best fixed rate was 0.05 and adaptive SGD's 0.0716-0.1 where the rule
# above gives 0.1018 (docs/benchmark.md, "The sampled loss's rate").
SAMPLED_STEP = 2 ** -0.5
# A wider hidden layer wants a lower rate: every weight of the output layer steps by about lr,
# so a step moves a logit by about lr times the hidden activations' L1 norm, which grows with
# the width. The constant above was set at WIDTH units; at 512 the best fixed rate was half the
# rule's on the npm data and on the synthetic TF-IDF rows, and the probe took 0.71 of its
# rate on the EURLex shape (docs/benchmark.md, "A wider hidden layer's rate"). Above WIDTH the rate falls as
# the square root of the output layer's fan-in over WIDTH, as it does with a row's L1 norm;
# below WIDTH it was not measured and is not raised.
WIDTH = 128
# A linear model's rate (model.hidden []), whatever its rows: its weights start their
# accumulators above zero (config.LINEAR_ROWS_START), and from there its best rate did not follow
# the rows' L1 norm. On synthetic rows of L1 norm 3.2 and 9.9 at the same 1,000 labels the best
# rates measured were 1.1-2.3 and 1.3 (the highest tried); at 7,390 labels and with label noise
# 0.3-0.6, with rare features 0.4 (the highest tried); on the EURLex shape (L1 10.7) 0.6 (the
# highest tried); on the npm data (L1 2.6) every rate from 0.16 to 2.0 kept P@1 within a point.
# At 0.5 every shape was within 1.5 points of its best (docs/accuracy.md, "The linear model's
# rows start above zero").
LINEAR_RATE = 0.5
CENTRES = {"sgd": 1.0, "momentum": 0.1, "adam": 0.001}
ADAGRADS = ("adagrad", "rowwise_adagrad")
MAX_DOUBLINGS = 8       # the search extends at most 2^8 either way from the centre
PROBE_STEPS = 32        # steps each candidate trains
PROBE_BATCH = 64        # rows a probe step (at most train.batch_size)
HELD_OUT_ROWS = 1024    # rows, not trained by the probe, that judge the candidates
TOP_K = 5               # the judge's precision at k
TOP_BLOCK = 256         # labels a block of `top_labels`
# A candidate whose held-out loss is more than this fraction above the lowest is not picked,
# however it ranks: a short probe sees a rate one doubling too large rank as well as the best,
# while its loss is further above the lowest than the best rate's (docs/benchmark.md).
LOSS_SLACK = 0.025
PROBE_SEED = 7919       # the probe's rows: a permutation of its own, the same on every rank
# The sampled loss's stream of negatives every candidate starts from, on whichever rank trains
# it (model.negatives.Negatives; the ranks' own training streams are 0 .. ranks - 1): the
# candidates are compared on the same draws, and a seed's probe draws alike in every run.
PROBE_STREAM = 1 << 20
# A neighbour of the pick (a doubling away) judges alike when its loss is within LOSS_SLACK of the
# lowest and its P@5 within this fraction below the pick's. The probe cannot tell the two apart
# then, and seeds split between them, while one of them can need far more rows to a target (the
# sampled loss at 67,009 labels: 0.05 and 0.1, 1.7x; docs/benchmark.md): their geometric mean is
# within half a doubling of the better one.
TIE_BAND = 0.03
# Two neighbours judged alike end the search at an edge (`choose`) only where their losses
# differ by at most this share of the gain from the start (`brackets`). Where they bracketed
# the best rate (0.0506 and 0.1012 at 67,009 labels, from 11.11 to 7.48 and 7.45) they differed
# by 1% of it; with the loss falling in proportion to the rate, by half.
BRACKET_SHARE = 0.2
# A rank adds a candidate to a round (`width`) when it trains one in at most 1 + ROUND_SLACK
# times the fastest rank's time: well above the few percent by which alike ranks' calibrated
# speeds differ, well below the 2 times a second candidate takes on the fastest rank; a
# candidate more a round can spare a later round.
ROUND_SLACK = 0.4
# The judge's labels where there are many (`judge_labels`): the candidates' logits over every
# label cost the judge a matmul that grows with the label count, while the sampled loss's steps
# do not. Scored exactly: every positive label of the probe's training rows and of the held-out
# rows (the only labels whose output rows the probe's steps move towards rows) and the
# JUDGE_FREQUENT most frequent training labels (those a short training ranks high). The rest
# enter the loss's normalizer through JUDGE_SAMPLE of them drawn uniformly, each standing for
# rest / JUDGE_SAMPLE labels. Used where that set is at most half of the labels, else every
# label is scored.
JUDGE_FREQUENT = 2048
JUDGE_SAMPLE = 2048
# `judge_labels`' answer where every label is scored: no labels, no corrections.
EVERY_LABEL = (np.zeros(0, np.int64), np.zeros(0, np.float32))


@dataclass
class LrChoice:
    """What `optim.lr: auto` chose, and how (the start record's `lr_choice`)."""

    lr: float
    candidates: list
    losses: list           # held-out loss after the probe, per candidate (nan: diverged)
    p_at_5: list           # held-out precision at 5 after the probe, per candidate
    start_loss: float      # held-out loss of the untrained start
    ranks: list            # the rank that trained each candidate
    steps: int
    rows: int              # rows a candidate trained
    held_out_rows: int
    judged_labels: int     # labels the judge scored (`judge_labels`; every label where as many)
    seconds: float         # the probe's wall time on the slowest rank, all of it (charged to the clock)
    scale: float = 1.0     # optim.lr_scale, in `lr`

    def record(self) -> dict:
        def short(v):
            return round(v, 6) if isinstance(v, float) else [short(x) for x in v] if isinstance(v, list) else v
        return {k: short(v) for k, v in asdict(self).items()}

    def line(self) -> str:
        tried = ", ".join(f"{c:g}: {l:.4f}/{p:.4f}" for c, l, p in
                          zip(self.candidates, self.losses, self.p_at_5))
        picked = self.lr / self.scale
        alike = ("" if any(math.isclose(picked, c) for c in self.candidates)
                 else ", between the two best, judged alike")
        return (f"optim.lr auto: {self.lr:g}{alike}{scaled(self.scale)} (held-out loss/P@5 of "
                f"{self.held_out_rows} rows over {self.judged_labels} labels after {self.steps} "
                f"steps of {self.rows // max(self.steps, 1)} rows, loss from "
                f"{self.start_loss:.4f}: {tried}; {self.seconds:.2f} s, charged to the clock)")


def copies(variables: Sequence) -> list[np.ndarray]:
    """The values of `variables` (tf.Variables) as host numpy arrays, never aliases of them."""
    return [np.array(v.numpy(), copy=True) for v in variables]


def snapshots(variables: Sequence) -> list:
    """Copies of `variables` (tf.Variables) held by TensorFlow, never aliases of them. Putting
    one back copies it into the variable's own buffer, where a host numpy copy became a newly
    allocated tensor at every putting back: on 8 quarter-core ranks at 67,009 labels the first
    pages of those 150 MB took a rank 1-2 s inside its quota (docs/benchmark.md)."""
    from hvd_adaptive.tfload import tf

    return [tf.raw_ops.DeepCopy(x=v.read_value()) for v in variables]


@contextmanager
def unchanged(variables: Sequence, saved: Optional[list] = None) -> Iterator[Callable[[], None]]:
    """Steps run inside change none of `variables` (tf.Variables: a model, its optimizer's
    state, its rate): they are put back afterwards. Yields the function that puts them back,
    for use in between (each candidate of the probe starts from the same place). `saved`:
    their values as `copies` already took them, put back instead of taking new ones
    (`snapshots`)."""
    saved = snapshots(variables) if saved is None else saved

    def restore() -> None:
        for v, x in zip(variables, saved):
            v.assign(x)

    try:
        yield restore
    finally:
        restore()


def probe_rows(n_rows: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows the candidates train (PROBE_STEPS batches of at most PROBE_BATCH rows) and the
    held-out rows that judge them: disjoint slices of one seeded permutation of the training
    rows. On small data sets the batches shrink so that a quarter of the rows stays held out."""
    perm = np.random.default_rng(PROBE_SEED).permutation(n_rows)
    held = min(HELD_OUT_ROWS, max(1, n_rows // 4))
    rows = PROBE_STEPS * min(PROBE_BATCH, batch_size)
    train = perm[held:held + min(rows, n_rows - held)]
    return train, perm[:held]


def probe_batches(train: np.ndarray) -> list[np.ndarray]:
    """The probe's training rows `train` cut into its (at most PROBE_STEPS) steps' batches."""
    return [b for b in np.array_split(train, PROBE_STEPS) if len(b)]


def announce(n_rows: int, batch_size: int) -> str:
    """The line said before the probe starts: what it will train and judge."""
    train, held = probe_rows(n_rows, batch_size)
    batches = probe_batches(train)
    small, large = min(map(len, batches)), max(map(len, batches))
    rows = f"{small}" if small == large else f"{small}-{large}"
    return (f"optim.lr auto: probing candidate rates, each {len(batches)} steps of "
            f"{rows} rows from the same start, judged on {len(held)} held-out training rows (its "
            "seconds count as training time) ...")


def median_l1(ds, rows: np.ndarray) -> float:
    """The median L1 norm of the feature values of `rows` of the dataset `ds` (its CSR arrays)."""
    l1 = [float(np.abs(ds.values[ds.indptr[r]:ds.indptr[r + 1]]).sum()) for r in rows]
    return float(np.median(l1)) if l1 else 0.0


def labels_a_row(ds, rows: np.ndarray) -> float:
    """The mean number of labels of `rows` of the dataset `ds`."""
    return float(np.mean(ds.label_indptr[rows + 1] - ds.label_indptr[rows])) if len(rows) else 0.0


def centre(cfg, ds, rows: np.ndarray) -> float:
    """The rate the search starts from, and the rule's choice (`rule`), under the run's config
    `cfg` (its model.output resolved): for adagrad and rowwise_adagrad `norm_rate` of `rows` of
    the dataset `ds` (a linear model: LINEAR_RATE), else CENTRES."""
    if cfg.optim.name not in ADAGRADS:
        return CENTRES[cfg.optim.name]
    return adagrad_rate(cfg, median_l1(ds, rows), labels_a_row(ds, rows))


def adagrad_rate(cfg, norm: float, labels: float) -> float:
    """An Adagrad-type optimizer's rate for rows of median L1 norm `norm` and `labels` a row in
    mean under the run's config `cfg`: LINEAR_RATE for a linear model, else `norm_rate`."""
    if cfg.model.linear:
        return LINEAR_RATE
    return norm_rate(norm, labels, sampled(cfg), fan_in(cfg))


def sampled(cfg) -> bool:
    """Whether the run trains with the sampled loss (model.output resolved)."""
    return cfg.model.output == "sampled"


def fan_in(cfg) -> int:
    """The output layer's fan-in: the last hidden layer's width (0 for a linear model, whose
    rate is LINEAR_RATE)."""
    return cfg.model.hidden[-1] if cfg.model.hidden else 0


def norm_rate(norm: float, labels: float, sampled_loss: bool, units: int) -> float:
    """ADAGRAD_STEP over the square root of a median L1 norm (ADAGRAD_STEP for a norm of 0),
    over the fourth root of a mean of `labels` a row in units of LABELS_A_ROW where above 1,
    over the square root of the output layer's fan-in, `units`, over WIDTH where above 1, and
    times SAMPLED_STEP for the sampled loss."""
    rate = ADAGRAD_STEP / math.sqrt(norm) if norm > 0 else ADAGRAD_STEP
    rate /= max(1.0, labels / LABELS_A_ROW) ** 0.25
    rate /= max(1.0, units / WIDTH) ** 0.5
    return rate * SAMPLED_STEP if sampled_loss else rate


@dataclass
class RuleChoice:
    """What `optim.lr: auto` chose by the rule (`rule`; the start record's `lr_choice`)."""

    lr: float
    median_l1: float       # of the rows read
    labels_a_row: float    # their mean
    sampled: bool          # the sampled loss's SAMPLED_STEP taken
    rows: int              # training rows read
    width: int             # the output layer's fan-in
    seconds: float         # the slowest rank's, charged to the clock
    method: str = "rule"
    scale: float = 1.0     # optim.lr_scale, in `lr`
    linear: bool = False   # a linear model's: LINEAR_RATE

    def record(self) -> dict:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(self).items()}

    def line(self) -> str:
        if self.linear:
            return (f"optim.lr auto: {self.lr:g} (the rule for a linear model: {LINEAR_RATE:g} "
                    f"whatever the rows; {self.rows} training rows read, median L1 norm "
                    f"{self.median_l1:.4g}{scaled(self.scale)}; {self.seconds:.3f} s, charged "
                    "to the clock)")
        labels = (f", and over ({self.labels_a_row:.3g} labels a row / {LABELS_A_ROW:g}) ** 0.25"
                  if self.labels_a_row > LABELS_A_ROW else "")
        wide = (f", and over ({self.width} hidden units / {WIDTH}) ** 0.5"
                if self.width > WIDTH else "")
        loss = f", times {SAMPLED_STEP:.4g} for the sampled loss" if self.sampled else ""
        return (f"optim.lr auto: {self.lr:g} (the rule: {ADAGRAD_STEP:g} over the square root of "
                f"the median L1 norm, {self.median_l1:.4g}, of {self.rows} training rows"
                f"{labels}{wide}{loss}{scaled(self.scale)}; {self.seconds:.3f} s, charged to "
                "the clock)")


def uses_rule(cfg) -> bool:
    """Whether `optim.lr: auto` takes the rule (`rule`) rather than the probe (`search`) under
    the run's config `cfg`: for the optimizers the rule is for, unless optim.lr_choice is probe
    (auto, the default, and rule take it)."""
    optim = cfg.optim
    return optim.lr == "auto" and optim.name in ADAGRADS and optim.lr_choice != "probe"


def probes(cfg) -> bool:
    """Whether the run's `optim.lr: auto` probes (`search`): its judge is then warmed up and
    the probe announced before it runs."""
    return cfg.optim.lr == "auto" and not uses_rule(cfg)


def auto_choice(cfg, ds, allgather: Callable[[object], list],
           search_with: Callable[[], LrChoice]) -> Optional[LrChoice | RuleChoice]:
    """`optim.lr: auto`'s choice for the training rows `ds`: the rule's (`rule`) where
    `uses_rule`, else what `search_with()` returns (the caller's `search` with its own step
    and judge), its rate times optim.lr_scale (`scale`); None when the rate is pinned."""
    if cfg.optim.lr != "auto":
        return None
    choice = rule(cfg, ds, allgather) if uses_rule(cfg) else search_with()
    choice.scale = cfg.optim.lr_scale
    choice.lr *= choice.scale
    return choice


def scaled(scale: float) -> str:
    """The words a choice's line gives optim.lr_scale (none at 1)."""
    return f", times optim.lr_scale {scale:g}" if scale != 1.0 else ""


def rule(cfg, ds, allgather: Callable[[object], list]) -> RuleChoice:
    """`optim.lr: auto` by the rule: `centre` of the training rows the probe would train (the
    same seeded rows on every rank), rank 0's value taken by every rank. Training rows without
    a label stop the run: no rate can learn from them."""
    t0 = time.perf_counter()
    rows, _ = probe_rows(ds.n_rows, cfg.train.batch_size)
    labels = labels_a_row(ds, rows)
    if labels == 0:
        raise ConfigError(
            f"optim.lr=auto: none of the {len(rows)} training rows the rule reads has a label; "
            "check that the training rows have labels")
    norm = median_l1(ds, rows)
    lr, norm, labels = allgather((adagrad_rate(cfg, norm, labels), norm, labels))[0]
    return RuleChoice(lr=lr, median_l1=norm, labels_a_row=labels, sampled=sampled(cfg),
                      rows=len(rows), width=fan_in(cfg),
                      seconds=max(allgather(time.perf_counter() - t0)),
                      linear=cfg.model.linear)


def judge_labels(ds, train_rows: np.ndarray, held_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The labels the judge scores and each one's correction (JUDGE_FREQUENT, JUDGE_SAMPLE):
    (labels ascending int64, float32 to subtract from their logits in the loss: 0 for the labels
    scored exactly, -log(rest / JUDGE_SAMPLE) for each drawn one). EVERY_LABEL where that set
    would be more than half of the labels: the judge then scores every label. The draw is
    seeded (PROBE_SEED), so every rank and every candidate is judged over the same labels."""
    n = ds.n_labels
    counts = ds.label_frequencies()
    frequent = np.argsort(-counts, kind="stable")[:JUDGE_FREQUENT]
    rows = np.concatenate([train_rows, held_rows])
    exact = np.union1d(frequent, ds.labels[rows].indices).astype(np.int64)
    rest = np.setdiff1d(np.arange(n, dtype=np.int64), exact, assume_unique=True)
    drawn_count = min(JUDGE_SAMPLE, len(rest))
    if len(exact) + drawn_count > n // 2:
        return EVERY_LABEL
    drawn = np.random.default_rng(PROBE_SEED).choice(rest, drawn_count, replace=False)
    labels = np.concatenate([exact, drawn])
    corr = np.concatenate([np.zeros(len(exact), np.float32),
                           np.full(drawn_count, -math.log(len(rest) / drawn_count), np.float32)])
    order = np.argsort(labels, kind="stable")
    return labels[order], corr[order]


class HeldOut:
    """The probe's judge: its held-out rows in chunks whose logits over the judged labels fit in
    `memory_mb`, at least `pieces` of them (the ranks that share the start's judgement), each
    chunk's batch built once by `make_batch` (rows of `ds` -> the batch the caller's scoring
    function takes) and followed by `labels` (`judge_labels`); `width`: the labels it scores.
    `row_floats`: floats a row the scoring holds beside its logits (a linear model's dense
    input rows: the features)."""

    def __init__(self, ds, rows: np.ndarray, memory_mb: float,
                 make_batch: Callable[[np.ndarray], tuple], pieces: int = 1,
                 labels: tuple[np.ndarray, np.ndarray] = EVERY_LABEL, row_floats: int = 0):
        self.labels, self.width = labels, len(labels[0]) or ds.n_labels
        self.parts = [((*make_batch(r), *labels), ds.subset(r))
                      for r in self.chunks(ds, rows, memory_mb, pieces, self.width + row_floats)]

    @staticmethod
    def chunks(ds, rows: np.ndarray, memory_mb: float, pieces: int = 1,
               width: int = 0) -> list[np.ndarray]:
        """`rows` cut into the judge's chunks (non-empty, in order), each chunk's `width`
        floats a row (0: a logit a label) within `memory_mb`."""
        per = max(1, int(memory_mb * 2**20 // (4 * max(width or ds.n_labels, 1))))
        cut = np.array_split(rows, max(1, pieces, math.ceil(len(rows) / per)))
        return [r for r in cut if len(r)]

    def sums(self, scores: Callable[..., tuple], rank: int = 0, size: int = 1) -> np.ndarray:
        """[loss summed over the rows with labels, rows with labels, hits in the top TOP_K,
        rows, hits at the top] over chunks rank, rank + size, ... (all by default);
        `scores(*batch, labels, corrections)` returns a chunk's mean loss over the judged labels
        (every label when `labels` is empty; else their logits less `corrections`) and its top
        label ids among them. Ranks that split the chunks add their sums."""
        out = np.zeros(5)
        for b, sub in self.parts[rank::size]:
            loss, top = scores(*b)
            has = float((np.diff(sub.label_indptr) > 0).sum())
            hits = hits_matrix(np.asarray(top), sub.label_indptr, sub.label_indices)
            out += [float(loss) * has, has, float(hits.sum()), float(sub.n_rows),
                    float(hits[:, :1].sum())]
        return out

    @staticmethod
    def judged(sums: np.ndarray) -> tuple[float, float]:
        """(mean cross-entropy over the rows with labels, precision at TOP_K) of `sums`."""
        return sums[0] / max(sums[1], 1.0), sums[2] / (TOP_K * max(sums[3], 1.0))

    def __call__(self, scores: Callable[..., tuple]) -> tuple[float, float]:
        """`judged` over every held-out row, of the model as it stands."""
        return self.judged(self.sums(scores))

    def shared(self, scores: Callable[..., tuple], rank: int, size: int,
               allgather: Callable[[object], list]) -> tuple[float, float]:
        """`judged` over every held-out row of a model every rank holds alike, each rank
        scoring its share of the chunks and one allgather adding the sums."""
        return self.judged(np.sum(allgather(self.sums(scores, rank, size)), axis=0))


def top_labels(z, k: int = TOP_K, width: int = TOP_BLOCK):
    """Each row's `k` labels of highest logit in `z` (a TensorFlow [rows, labels] tensor, its
    label count static), best first: `tf.math.top_k(z, k).indices`, ties aside, in less time
    on wide rows. The row's `k` best labels lie in the `k` blocks of `width` labels whose
    maxima are highest, so one pass takes every block's maximum and `top_k` runs on the
    blocks' maxima and then on those `k` blocks alone (a full `top_k` over 67,009 labels took
    as long as the logits' matmul; docs/benchmark.md). Both judges of the probe use it."""
    from hvd_adaptive.tfload import tf

    n = z.shape[1]
    if n is not None and n <= 4 * k * width:
        return tf.math.top_k(z, k=min(k, n)).indices
    # A label count known only at run time (the judge's labels, `judge_labels`) takes the
    # blocks whatever it is: it is at least JUDGE_FREQUENT + JUDGE_SAMPLE, k blocks and more.
    n = tf.shape(z)[1]
    blocks = (n + width - 1) // width
    zb = tf.reshape(tf.pad(z, [[0, 0], [0, blocks * width - n]], constant_values=-np.inf),
                    [-1, blocks, width])
    _, best_blocks = tf.math.top_k(tf.reduce_max(zb, axis=2), k=k)
    inside = tf.reshape(tf.gather(zb, best_blocks, batch_dims=1), [-1, k * width])
    _, at = tf.math.top_k(inside, k=k)
    return tf.gather(best_blocks, at // width, batch_dims=1) * width + at % width


def warm_up(cfg, ds, make_batch: Callable[[np.ndarray], tuple], scores: Callable[..., tuple],
            size: int) -> None:
    """Runs the judge `scores` once on the first chunk of held-out rows `search` will score
    (the same shape), so its first execution, which took 0.3-0.7 s more than the next at
    67,009 labels, is start-up before the clock like the steps' (`Algorithm.trace`); the
    plain Horovod script does the same."""
    train_rows, held_rows = probe_rows(ds.n_rows, cfg.train.batch_size)
    labels = judge_labels(ds, train_rows, held_rows)
    first = HeldOut.chunks(ds, held_rows, cfg.train.eval_memory_mb, size, len(labels[0]))[0]
    scores(*make_batch(first), *labels)


def paces(speeds: Optional[Sequence[float]], size: int) -> list[float]:
    """Each rank's measured rows/s (`speeds`), or 1.0 for every rank where they are unusable
    (None, a count other than `size`, one not finite and positive)."""
    ok = speeds is not None and len(speeds) == size and all(
        math.isfinite(v) and v > 0 for v in speeds)
    return [float(v) for v in speeds] if ok else [1.0] * size


def width(speeds: Optional[Sequence[float]], size: int) -> int:
    """Candidates a round beyond the first (which holds at least two): one for each rank that
    trains one within 1 + ROUND_SLACK times the fastest rank's time. Alike ranks all take one
    (no rank idles); a far slower rank adds none, so a round does not last two candidates on
    a fast rank, or one on the slow rank, where one on each fast rank ends it (`split`)."""
    pace = paces(speeds, size)
    top = max(pace)
    return sum(p * (1 + ROUND_SLACK) >= top for p in pace)


def split(n: int, speeds: Optional[Sequence[float]], size: int) -> list[int]:
    """The rank that trains each of a round's `n` candidates: each in turn goes to the rank
    that would finish it soonest, at its measured rows/s (`speeds`, one per rank; ties to the
    lower rank). Alike ranks take turns; a rank half as fast as the other of two takes one
    candidate of four, not two, so the round ends in 3 candidates' time instead of 4. Without
    usable speeds (None, or one not finite and positive), turns."""
    pace = paces(speeds, size)
    done, owner = [0] * size, []
    for _ in range(n):
        r = min(range(size), key=lambda i: ((done[i] + 1) / pace[i], i))
        done[r] += 1
        owner.append(r)
    return owner


def near_lowest(losses: Sequence[float]) -> list[int]:
    """The indices of the finite losses within LOSS_SLACK of the lowest (none when no loss is
    finite)."""
    finite = [i for i, l in enumerate(losses) if math.isfinite(l)]
    low = min((losses[i] for i in finite), default=0.0)
    return [i for i in finite if losses[i] <= low + LOSS_SLACK * abs(low)]


def best(losses: Sequence[float], p_at_5: Sequence[float]) -> Optional[int]:
    """The index `pick` takes: among `near_lowest`, the highest precision at 5, then the lower
    loss; None when no loss is finite."""
    near = near_lowest(losses)
    return max(near, key=lambda i: (p_at_5[i], -losses[i])) if near else None


def alike_neighbours(losses: Sequence[float], p_at_5: Sequence[float], i: int) -> tuple[bool, bool]:
    """Whether the candidate below and the one above index `i` (ascending rates) judge alike
    with it: a loss in `near_lowest` and a precision at 5 within TIE_BAND below i's."""
    near = near_lowest(losses)

    def alike(j: int) -> bool:
        return 0 <= j < len(losses) and j in near and p_at_5[j] >= p_at_5[i] * (1 - TIE_BAND)

    return alike(i - 1), alike(i + 1)


def brackets(losses: Sequence[float], p_at_5: Sequence[float], i: int,
             start_loss: float) -> tuple[bool, bool]:
    """`alike_neighbours` of index `i`, each only where the two losses also differ by at most
    BRACKET_SHARE of what the lower one gained from `start_loss`: a pair that brackets the
    best rate, where the loss is flat. Far below the best rate a step's gain grows with the
    rate, so two rates a doubling apart can be alike within LOSS_SLACK while the larger
    gained about twice as much: the search goes on there."""
    def flat(j: int) -> bool:
        gain = start_loss - min(losses[i], losses[j])
        return abs(losses[i] - losses[j]) <= BRACKET_SHARE * gain

    below, above = alike_neighbours(losses, p_at_5, i)
    return below and flat(i - 1), above and flat(i + 1)


def settle(candidates: Sequence[float], losses: Sequence[float], p_at_5: Sequence[float],
           i: int) -> float:
    """The rate for `best`'s index `i` of `candidates` (ascending, a doubling apart): the
    geometric mean of it and its neighbour when exactly one neighbour judges alike (TIE_BAND),
    else candidates[i]."""
    below, above = alike_neighbours(losses, p_at_5, i)
    if below == above:
        return candidates[i]
    j = i - 1 if below else i + 1
    return float(f"{math.sqrt(candidates[i] * candidates[j]):.4g}")


def pick(candidates: Sequence[float], losses: Sequence[float], p_at_5: Sequence[float],
         start_loss: float, optimizer: str) -> float:
    """The rate `settle` takes for the candidate `best` takes.

    Raises:
        ConfigError: no candidate lowered the held-out loss below the start's (rows without
            labels, labels unrelated to the features, or every rate diverged).
    """
    finite = [l for l in losses if math.isfinite(l)]
    if not finite or min(finite) >= start_loss * (1 - 1e-4):
        tried = ", ".join(f"{c:g}: {l:.4g}" for c, l in zip(candidates, losses))
        raise ConfigError(
            f"optim.lr=auto: no candidate rate of {optimizer} learned in the probe (held-out loss "
            f"from {start_loss:.4g} to {tried}); check that the training rows have labels that "
            "depend on their features, or pin optim.lr")
    return settle(candidates, losses, p_at_5, best(losses, p_at_5))


def choose(start: float, try_rate: Callable[[float], tuple[float, float]],
           start_loss: Callable[[], float], rank: int, size: int,
           allgather: Callable[[object], list], optimizer: str,
           speeds: Optional[Sequence[float]] = None) -> LrChoice:
    """The search every rank runs together; returns the choice every rank makes (its seconds
    this rank's own; `search` replaces them by the slowest rank's whole probe).

    Rounds of candidates `start` x 2^j: first j = -1, 0 on one or two ranks, -1, 0, 1 on
    three, -2 to 1 on four alike ranks (one for each rank near the fastest, `width`, at least
    two, centred, one more below on even counts); while `best` is the lowest or highest rate
    tried, the next round goes further that way, `width` candidates, at most MAX_DOUBLINGS
    from `start`, unless its one neighbour judges alike where the loss is flat (`brackets`):
    the two then bracket the best rate, which `settle` puts between them. `split` gives each rank its
    candidates of a round by the ranks' speeds; one allgather a round shares the judgements.

    Args:
        start: the centre of the search (`centre`).
        try_rate: trains the probe's rows at a rate from the common start and returns the
            held-out (loss, precision at 5) (a loss of nan or inf when it diverged); leaves the
            start as it found it.
        start_loss: returns the held-out loss of the start.
        rank, size: this rank and the ranks sharing the candidates.
        allgather: the job's allgather of a Python object.
        optimizer: the optimizer's name, for the error message.
        speeds: every rank's standalone rows/s (the calibration's), the same list on every
            rank; None: the ranks take turns.
    """
    t0 = time.perf_counter()
    start_loss = float(start_loss())
    # As many candidates as ranks near the fastest (`width`), so that alike ranks do not idle
    # in the first round and a slow rank does not make a fast one train two, and at least two,
    # a doubling apart: a pair judged alike ends the search in one round (the
    # sampled loss at 67,009 labels, PyPI; docs/benchmark.md), where a third candidate cost
    # a second candidate's time on one or two ranks. On even counts the extra one lies below
    # (where the best rate lay on the Delicious-shaped rows).
    n = width(speeds, size)
    first = max(2, n)
    todo = [j - first // 2 for j in range(first)]
    judged: dict[int, tuple[float, float]] = {}
    trained_by: dict[int, int] = {}
    while todo:
        mine, owners = {}, split(len(todo), speeds, size)
        for j, r in zip(todo, owners):
            if r == rank:
                loss, p5 = (float(x) for x in try_rate(start * 2.0 ** j))
                mine[j] = (loss if math.isfinite(loss) else float("nan"), p5)
        trained_by.update(zip(todo, owners))
        for part in allgather(mine):
            judged.update(part)
        js = sorted(judged)
        losses = [judged[j][0] for j in js]
        finite = [l for l in losses if math.isfinite(l)]
        if finite and min(finite) >= start_loss * (1 - 1e-4):
            break  # nothing learns at any rate tried: no direction to search (`pick` says so)
        p5s = [judged[j][1] for j in js]
        i = best(losses, p5s)
        top = js[i] if i is not None else js[0]
        lo, hi = js[0], js[-1]
        below, above = (brackets(losses, p5s, i, start_loss) if i is not None
                        else (False, False))
        if top == lo and lo > -MAX_DOUBLINGS and not above:
            todo = [lo - 1 - k for k in range(n) if lo - 1 - k >= -MAX_DOUBLINGS]
        elif top == hi and hi < MAX_DOUBLINGS and finite and not below:
            todo = [hi + 1 + k for k in range(n) if hi + 1 + k <= MAX_DOUBLINGS]
        else:
            todo = []
    # This rank's seconds in the search; `search` charges the slowest rank's whole probe.
    seconds = time.perf_counter() - t0
    js = sorted(judged)
    rates = [float(f"{start * 2.0 ** j:.4g}") for j in js]
    losses = [judged[j][0] for j in js]
    p5s = [judged[j][1] for j in js]
    return LrChoice(lr=pick(rates, losses, p5s, start_loss, optimizer), candidates=rates,
                    losses=losses, p_at_5=p5s, start_loss=float(start_loss),
                    ranks=[trained_by[j] for j in js], steps=PROBE_STEPS,
                    rows=0, held_out_rows=0, judged_labels=0, seconds=seconds)


def search(cfg, ds, make_batch: Callable[[np.ndarray], tuple], step: Callable[..., object],
           scores: Callable[..., tuple], lr, unchanged, rank: int, size: int,
           allgather: Callable[[object], list],
           speeds: Optional[Sequence[float]] = None,
           restart_draws: Callable[[int], None] = lambda stream: None) -> LrChoice:
    """`choose` with the probe's rows of `ds`: each candidate sets the rate variable `lr`,
    runs `step(*batch)` on the probe's batches (`make_batch`: rows -> batch) from the model as
    it stands and is judged by `scores` on the held-out rows (`HeldOut`); the restore function
    that the context manager `unchanged()` yields puts the start back before the next
    candidate, and the context's exit after the last. Each candidate's random draws start from
    PROBE_STREAM (`restart_draws`). The choice's seconds are the slowest rank's whole search,
    set-up and the last putting back included. The project's algorithms (`probe`) and the
    plain Horovod script each pass their own step, judge and variables."""
    t0 = time.perf_counter()
    train_rows, held_rows = probe_rows(ds.n_rows, cfg.train.batch_size)
    steps = [make_batch(b) for b in probe_batches(train_rows)]
    held = HeldOut(ds, held_rows, cfg.train.eval_memory_mb, make_batch, size,
                   judge_labels(ds, train_rows, held_rows),
                   row_floats=ds.n_features if cfg.model.linear else 0)

    with unchanged() as restore:
        moved = False  # whether a candidate has trained since the start was last put back

        def try_rate(rate: float) -> tuple[float, float]:
            nonlocal moved
            if moved:  # the previous candidate's model; the last one's goes on leaving
                restore()
            moved = True
            lr.assign(rate)
            restart_draws(PROBE_STREAM)
            for b in steps:
                step(*b)
            return held(scores)

        choice = choose(centre(cfg, ds, train_rows), try_rate,
                        lambda: held.shared(scores, rank, size, allgather)[0],
                        rank, size, allgather, cfg.optim.name, speeds)
    # The clock is charged the slowest rank's whole probe: its batches built, the start copied,
    # the candidates, and the start put back after the last.
    choice.seconds = max(allgather(time.perf_counter() - t0))
    choice.rows, choice.held_out_rows = len(train_rows), len(held_rows)
    choice.judged_labels = held.width
    return choice


def probe(algo, allgather: Callable[[object], list],
          speeds: Optional[Sequence[float]] = None) -> Optional[LrChoice | RuleChoice]:
    """`optim.lr: auto` for one of the project's algorithms (`auto_choice`): the rule, or the probe
    (`search`), whose candidates each run the
    algorithm's local training step (`Algorithm.local_step`'s traced function, with its
    slowdown) from the model as it stands, which is then put back (`Algorithm.unchanged`), and
    is judged by `Algorithm.held_out`. `speeds`: every rank's calibrated rows/s, which share out
    the candidates (`split`). None when the rate is pinned."""
    return auto_choice(algo.cfg, algo.ctx.train, allgather, lambda: search(
        algo.cfg, algo.ctx.train, algo.batch, algo.probe_step, algo.held_out, algo.opt.lr,
        algo.unchanged, algo.cluster.rank, algo.cluster.size, allgather, speeds,
        algo.model.restart_draws))
