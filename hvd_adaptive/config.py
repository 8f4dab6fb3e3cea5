"""Run configuration: YAML -> frozen dataclasses, validated in one place.

Precedence: `--set section.key=value` overrides win over the YAML file, which wins over the
defaults below. Unknown keys and bad values raise ConfigError naming the key's full path.
The config as the run uses it (`resolve`: every None that stands for a value derived from
another filled in) is written to the run folder as `config.json`.

This module is the ground floor: it imports nothing else of hvd_adaptive. Names that live in
registries above it are checked where the registries live, before MPI and TensorFlow start
(run.check_inputs): train.algorithm by hvd_adaptive.train.algorithms, data.synth.preset by
hvd_adaptive.data.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml

WINDOW_MIN_BATCHES = 2
"""The fewest batches a rank a round holds (TrainConfig.window_rows)."""


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key's path."""


@dataclass(frozen=True)
class SynthConfig:
    """Synthetic data, used when data.train is "synthetic"."""

    preset: str = "amazon670k"
    """Shape to imitate: amazon670k, delicious200k or eurlex4k (data.PRESETS, which checks it)."""
    scale: float = 0.01
    """Multiplies the preset's rows and labels (features are kept)."""
    n_train: Optional[int] = None
    """Overrides the preset's training rows after scaling."""
    n_test: Optional[int] = None
    """Overrides the preset's test rows after scaling."""
    n_features: Optional[int] = None
    """Overrides the preset's feature count."""
    n_labels: Optional[int] = None
    """Overrides the preset's label count after scaling."""
    nnz_mean: Optional[float] = None
    """Overrides the mean non-zeros per row."""
    labels_mean: Optional[float] = None
    """Overrides the mean labels per row."""
    seed: int = 0
    """Generator seed (every rank generates the same data from it)."""
    label_noise: float = 0.0
    """Fraction of rows (train and test alike) whose labels are drawn from a random topic,
    not the one their features came from: labels no model can read off the features, which
    a network can memorize on the training rows."""
    rare_features: float = 0.0
    """Each row also gets this many times its non-zeros of features drawn uniformly over all
    features, each of which then falls in a few rows (the rare words of real text). With
    label_noise 0.3 and rare_features 3 the default data overfits: test P@1 peaks near epoch 3
    and falls (docs/accuracy.md, "Data that overfits"). A row then holds 1 + this many times
    its non-zeros."""

    def validate(self, path: str) -> None:
        _positive(self, path, "scale", "n_train", "n_test", "n_features", "n_labels", "nnz_mean",
                  "labels_mean")
        if not 0.0 <= self.label_noise <= 1.0:
            raise ConfigError(f"{path}.label_noise: must be in [0, 1], got {self.label_noise}")
        if self.rare_features < 0:
            raise ConfigError(f"{path}.rare_features: must be >= 0, got {self.rare_features}")


@dataclass(frozen=True)
class DataConfig:
    train: str = "synthetic"
    """Training file (Extreme Classification Repository or LIBSVM multi-label), or "synthetic"."""
    test: str = "synthetic"
    """Test file, or "synthetic" (must match train)."""
    format: Literal["auto", "xc", "libsvm"] = "auto"
    """File format; auto detects the XC header line."""
    cache_dir: Optional[str] = None
    """Where parsed binary caches go; default: beside each source file. With synthetic data:
    the generated arrays are kept here (rank 0 writes, the others map them); None: every rank
    generates them in memory."""
    synth: SynthConfig = field(default_factory=SynthConfig)
    propensity_a: float = 0.55
    """A of the Jain et al. label propensities behind PSP@k and PSnDCG@k (0.6 for Amazon data
    sets, 0.5 for Wikipedia ones in that paper)."""
    propensity_b: float = 1.5
    """B of those propensities (2.6 for Amazon, 0.4 for Wikipedia)."""
    validation: float = 0.0
    """Rows carved from the training set (never the test file) on which the run measures
    itself: a fraction below 1, or a count from 1 up; 0: none, every training row trains.
    With a split, each evaluation also reports the validation P@k (val_p_at_k), the run keeps
    the model of the best validation score, the mean of P@1, P@3 and P@5 (checkpoint.best),
    and can stop early (train.patience)."""
    validation_seed: int = 0
    """Seed of the rows the validation split takes (fixed apart from train.seed, so runs of
    several seeds train on the same rows)."""

    def validation_rows(self, n_rows: int, source: str) -> int:
        """The rows the validation split takes out of `n_rows` training rows.

        Raises:
            ConfigError: The split would leave no training row, or holds no row.
        """
        v = self.validation
        k = 0 if v == 0 else int(round(v * n_rows)) if v < 1 else int(v)
        if v > 0 and not 1 <= k < n_rows:
            raise ConfigError(f"data.validation: {v:g} takes {k} of the {n_rows} training rows of "
                              f"{source}; it must take at least one and leave at least one")
        return k

    def validate(self, path: str) -> None:
        if (self.train == "synthetic") != (self.test == "synthetic"):
            raise ConfigError(f"{path}: train and test must both be files or both be 'synthetic'")
        _positive(self, path, "propensity_a", "propensity_b")
        if self.validation < 0 or (self.validation >= 1 and self.validation != int(self.validation)):
            raise ConfigError(f"{path}.validation: a fraction in [0, 1) or a whole count of rows, "
                              f"got {self.validation}")
        self.synth.validate(path + ".synth")


@dataclass(frozen=True)
class ModelConfig:
    hidden: Union[Literal["auto"], list[int]] = "auto"
    """Hidden layer widths (ReLU); the papers use one layer of 128. [] is a linear model: one
    weight a feature and label, read by the batch's features (output full; features x labels
    at most LINEAR_MAX_WEIGHTS). auto: the linear model where its weights fit, the rows are
    sparse and nothing set asks for a hidden layer or a softmax, else AUTO_HIDDEN (`model_for`)."""
    dropout: float = 0.0
    """Dropout rate on hidden activations during training."""
    dropout_after: float = 0.0
    """Epochs trained without dropout before `dropout` applies (0: from the first step). A later
    start leaves the first part of the curve as it is without dropout and regularizes the rest."""
    label_smoothing: float = 0.0
    """Training target: (1 - this) x the row's labels (the multi-hot target normalized to sum 1)
    plus this spread evenly over every label (output: full). Off by default: on PyPI it did not
    raise P@1 (docs/accuracy.md). Evaluation and optim.lr auto's judge use the plain target."""
    init_seed: int = 1
    """Seed of the initial weights (identical on every rank) and of the sampled loss's
    negatives (each rank its own stream; hvd_adaptive.model.negatives)."""
    output: Literal["auto", "full", "sampled"] = "auto"
    """Output layer loss. full: softmax over every label (cost: batch x labels x hidden a step).
    sampled: softmax over a candidate set per batch, the batch's positive labels plus
    `negatives` sampled labels shared by the batch, with the sampler's log-probability
    correction; a step's cost follows the candidates, and the output layer's gradient and
    optimizer update touch only their rows. Evaluation always ranks all labels.
    auto: sampled with negatives by frequency from SAMPLED_FROM_LABELS labels on (without
    label smoothing, a linear model or the sigmoid loss), else full (`output_for`;
    docs/scale.md)."""
    negatives: int = 4096
    """sampled: distinct negatives expected per batch (drawn with replacement, each kept once;
    positives are always in)."""
    sampler: Literal["uniform", "frequency"] = "uniform"
    """sampled: uniform over labels, or proportional to (training frequency + 1) ^ 0.75."""
    loss: Literal["auto", "softmax", "sigmoid"] = "auto"
    """softmax: cross-entropy against the row's labels normalized to sum 1. sigmoid: one
    logistic loss a label (one-vs-all), summed over the labels and averaged over the rows;
    output full only. auto: sigmoid for a linear model, softmax for a network. Evaluation ranks
    by the logits either way; predict's scores are the softmax's probabilities or each label's
    sigmoid."""

    @property
    def linear(self) -> bool:
        """No hidden layer: the logits are the input rows times one weight a feature and label."""
        if self.hidden == "auto":
            raise ValueError("model.hidden auto depends on the data: resolve it with model_for")
        return not self.hidden

    def validate(self, path: str) -> None:
        if self.hidden != "auto":  # auto's choice meets the checks below (`model_for`)
            self._validate_layers(path)
        if self.loss == "sigmoid" and (self.output == "sampled" or self.label_smoothing > 0):
            raise ConfigError(f"{path}.loss: sigmoid scores every label, with {path}.output full "
                              f"or auto and no {path}.label_smoothing (got output {self.output}, "
                              f"label_smoothing {self.label_smoothing:g})")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"{path}.dropout: must be in [0, 1), got {self.dropout}")
        if self.dropout_after < 0:
            raise ConfigError(f"{path}.dropout_after: must be >= 0 epochs, got {self.dropout_after}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"{path}.label_smoothing: must be in [0, 1), got {self.label_smoothing}")
        if self.label_smoothing > 0 and self.output == "sampled":
            raise ConfigError(f"{path}.label_smoothing: spreads the target over every label, which "
                              f"only {path}.output: full computes (got {self.output})")
        _positive(self, path, "negatives")

    def _validate_layers(self, path: str) -> None:
        if any(h <= 0 for h in self.hidden):
            raise ConfigError(f"{path}.hidden: widths must be positive ([] for a linear model), "
                              f"got {self.hidden}")
        if self.linear and self.output == "sampled":
            raise ConfigError(f"{path}.hidden: [] (a linear model) reads every label's weights of "
                              f"the batch's features: {path}.output must be full or auto, got "
                              "sampled")
        if self.linear and self.dropout > 0:
            raise ConfigError(f"{path}.dropout: acts on hidden activations, which "
                              f"{path}.hidden: [] (a linear model) has none of; set it to 0")


# model.output auto takes the sampled loss from this many labels on (4 times the default
# negatives). With 4,096 negatives by frequency, adaptive SGD on 2 equal ranks reached the speed
# benchmark's targets in 0.87-0.88 of the full softmax's time at 13,402 labels, 0.75-0.77 at
# 20,103, 0.61-0.64 at 33,505 and about half at 67,009 (twice the rows at four times the rows a
# second; also with one rank 2x slower, and 0.56-0.71 at 8 ranks): docs/scale.md. At 13,402
# labels, where the candidates are a third of the labels, the ranges of the seeds touched.
SAMPLED_FROM_LABELS = 16384


# The most weights (features x labels) a linear model (model.hidden: []) takes: 1 GiB of float32,
# which its optimizer state, merges and checkpoints copy again. Larger problems want the hidden
# layer, whose weights grow with features + labels rather than their product.
LINEAR_MAX_WEIGHTS = 2 ** 28
# model.hidden auto's network, where a linear model does not fit or is not asked for.
AUTO_HIDDEN = (128,)
# model.hidden auto takes a linear model for rows of at most this many non-zeros in mean. Its step
# reads and writes every label's weight of each non-zero, the network's a hidden layer a label:
# with 2 ranks, adaptive SGD, it trained 5-6 times fewer rows a second than the 128-unit network at
# 8 non-zeros a row, 11 at 32, 24 at 236 (the EURLex shape), and needed 0.16-0.54 of its rows to
# the targets both reach. At 8 (npm, real) it reached P@1 0.70 as soon and 0.75-0.79, which the
# network never reached, up to 2.5x sooner than the plain script; at 8 (synthetic) in 1.5-2.8x the
# network's time to the targets both reach (fractions of a second) and 0.75 where the network
# stayed at 0.74; at 32 in 3-6x its time, at 236 in 8-11x (23 against 2 s to 0.80), with the
# higher plateau (docs/accuracy.md, "The model chosen for the data"). 16 lies between the
# measured 8 and 32.
LINEAR_MAX_NNZ = 16.0


def linear_refused(model: ModelConfig, n_features: int, n_labels: int,
                   nnz_a_row: float) -> Optional[str]:
    """Why model.hidden auto does not take a linear model for `n_features` x `n_labels` and rows
    of `nnz_a_row` non-zeros in mean, in the log's words, or None where it does: its weights
    must fit LINEAR_MAX_WEIGHTS, the rows be sparse (LINEAR_MAX_NNZ), and nothing set need a
    hidden layer (dropout), a sampled output or a softmax (model.loss softmax, label smoothing)."""
    weights = n_features * n_labels
    if weights > LINEAR_MAX_WEIGHTS:
        return (f"a linear model would need {n_features:,} features x {n_labels:,} labels = "
                f"{weights:,} weights, more than {LINEAR_MAX_WEIGHTS:,}")
    if nnz_a_row > LINEAR_MAX_NNZ:
        return (f"rows of {nnz_a_row:.1f} non-zeros in mean: a linear model would read every "
                f"label's weights of more than {LINEAR_MAX_NNZ:g} a row")
    if (model.dropout > 0 or model.output == "sampled" or model.loss == "softmax"
            or model.label_smoothing > 0):
        return "the model's settings ask for a hidden layer or a softmax"
    return None


def model_for(model: ModelConfig, n_features: int, n_labels: int,
              nnz_a_row: Optional[float] = None) -> ModelConfig:
    """`model` as a run on `n_features` features, `n_labels` labels and training rows of
    `nnz_a_row` non-zeros in mean takes it: hidden auto becomes [] unless `linear_refused`, else
    AUTO_HIDDEN; loss auto sigmoid for a linear model, else softmax; then output auto
    (`output_for`). Pinned values stay as they are; the rows are needed only under hidden auto."""
    if model.hidden == "auto":
        if nnz_a_row is None:
            raise ValueError("model.hidden auto reads the rows' non-zeros: pass nnz_a_row")
        refused = linear_refused(model, n_features, n_labels, nnz_a_row)
        model = dataclasses.replace(model, hidden=list(AUTO_HIDDEN) if refused else [])
    if model.loss == "auto":
        model = dataclasses.replace(model, loss="sigmoid" if model.linear else "softmax")
    return output_for(model, n_labels)


def model_lines(given: ModelConfig, chosen: ModelConfig, n_features: int, n_labels: int,
                nnz_a_row: float) -> list[str]:
    """What `model_for` chose for the keys `given` left at auto, a line each, for the log."""
    lines = []
    if given.hidden == "auto":
        why = linear_refused(given, n_features, n_labels, nnz_a_row)
        lines.append(f"model.hidden auto: {chosen.hidden} ({why})" if why else
                     f"model.hidden auto: [] (a linear model: {n_features:,} features x "
                     f"{n_labels:,} labels = {n_features * n_labels:,} weights, at most "
                     f"{LINEAR_MAX_WEIGHTS:,}; rows of {nnz_a_row:.1f} non-zeros in mean, at most "
                     f"{LINEAR_MAX_NNZ:g})")
    if given.loss == "auto":
        lines.append(f"model.loss auto: {chosen.loss}")
    if given.output == "auto":
        lines.append(f"model.output auto: {chosen.output}" + (
            f" ({chosen.negatives} negatives by {chosen.sampler} a batch)"
            if chosen.output == "sampled" else "") + f" for {n_labels} labels")
    return lines


def output_for(model: ModelConfig, n_labels: int) -> ModelConfig:
    """`model` with output (and under auto the sampler) as a network of `n_labels` labels
    takes it: auto becomes sampled by frequency from SAMPLED_FROM_LABELS labels on unless
    label smoothing, a linear model or the sigmoid loss is set, else full; full and sampled stay
    as they are."""
    if model.output != "auto":
        return model
    if (n_labels >= SAMPLED_FROM_LABELS and model.label_smoothing == 0 and not model.linear
            and model.loss != "sigmoid"):
        return dataclasses.replace(model, output="sampled", sampler="frequency")
    return dataclasses.replace(model, output="full")


# The largest optim.initial_accumulator lr auto takes with Adagrad: its rule and probe assume
# first steps of about lr, which a start of s keeps for gradients above sqrt(s) (docs/accuracy.md,
# "A small first accumulator").
AUTO_MAX_INITIAL_ACCUMULATOR = 1e-6
# Where a linear model's weights (its row-sparse layer) start under optim.initial_accumulator_rows
# auto. On npm's 742 labels, at the network's rule's rate, from 1e-6 the kept P@1 was 0.802
# against 0.788 from 0, and within 0.5 points from 1 to 8 times that rate where from 0 twice the
# rate cost 1.2 points; 1e-7 kept 0.795, 1e-5 wanted twice the rate, 1e-4 lost 3 points. With
# tune.LINEAR_RATE it kept 1.1 and 1.6 points more than from 0 on npm's 742 and 7,390 labels and
# 6.5 more on the EURLex shape (docs/accuracy.md, "The linear model's rows start above zero").
LINEAR_ROWS_START = 1e-6


@dataclass(frozen=True)
class OptimConfig:
    name: Literal["sgd", "momentum", "adam", "adagrad", "rowwise_adagrad"] = "sgd"
    """Per-rank optimizer; input-layer updates are row-sparse (lazy) for all of them.
    rowwise_adagrad: Adagrad with one accumulator a row on the row-sparse layers (the input
    layer's features; the sampled output layer's labels) and Adagrad's elsewhere
    (model.Optimizer): less optimizer state for adaptive SGD's merges to move."""
    lr: Union[float, Literal["auto"]] = "auto"
    """Base learning rate (lr0 of the papers: the rate at the largest batch), or "auto": chosen
    at start for the training rows as optim.lr_choice says (hvd_adaptive.train.tune), its time
    charged to the run's clock. A number is used as given."""
    lr_choice: Literal["auto", "rule", "probe"] = "auto"
    """How optim.lr auto chooses. rule: for adagrad and rowwise_adagrad, 0.25 over the square
    root of the training rows' median L1 norm, over the fourth root of their mean labels a row
    over 6 where above, over the square root of the last hidden layer's width over 128 where
    wider, and 1/sqrt(2) of that under the sampled loss, 0.5 for a linear model
    (hvd_adaptive.train.tune.centre), read from the rows in milliseconds, no training; the
    other optimizers probe. probe: candidate rates around that value, each trained 32 steps of
    64 rows from the same start and judged on held-out training rows
    (hvd_adaptive.train.tune.search; 0.3-1.5 s on 2 ranks of this machine, 2.5-5.6 s on 8
    quarter-core ranks). auto, the default, is the rule: it reached the benchmark's targets
    sooner than the probe on every workload, mode and target measured (docs/benchmark.md,
    "Settings chosen by the tool")."""
    lr_scale: float = 1.0
    """Multiplies the rate optim.lr auto chooses (rule or probe), for every mode and the plain
    Horovod script alike; recorded and printed with the choice. The rule's rate is the fastest
    to the benchmark's early targets; the last points of accuracy want a lower one (0.5 with
    a wider layer and dropout reached the label tree on the npm data: docs/accuracy.md, "Up to
    the tree"). A pinned rate is used as given: set one or the other."""
    momentum: float = 0.9
    """Momentum coefficient (name: momentum)."""
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-7
    """Adagrad's and Adam's epsilon. The row-sparse layers' accumulators start at zero
    (optim.initial_accumulator_rows), so a weight's first update there is about lr whatever its
    gradient unless the gradient is small against eps; TensorFlow's Keras optimizers use this
    value: with every accumulator from zero it kept the first steps of rarely-pushed weights
    (every negative label's output weights) smaller than a tenth of it would
    (docs/benchmark.md, "Settings chosen by the tool")."""
    initial_accumulator: float = 1e-9
    """The value Adagrad's and row-wise Adagrad's accumulators start from (TensorFlow's Keras
    Adagrad: 0.1), on every layer but the row-sparse ones unless optim.initial_accumulator_rows.
    Above zero, a weight's first steps grow with its gradient, lr g / sqrt(initial_accumulator
    + g^2), instead of being about lr whatever the gradient: gradients below its square root
    (3e-5 at 1e-9), such as the full softmax's on every negative label's output weights, take
    smaller first steps. lr auto, whose rule and probe assume steps of about lr, takes it up to
    AUTO_MAX_INITIAL_ACCUMULATOR. 1e-9 on those layers kept 2.2 points more P@1 on the npm data
    at 1.01-1.10x the time to its early targets, and reached the PyPI and synthetic targets
    sooner; 0.001 and above stopped the learning (docs/accuracy.md, "A small first
    accumulator")."""
    initial_accumulator_rows: Union[Literal["auto"], bool, float] = "auto"
    """Where the row-sparse layers' accumulators (the input layer, a linear model's weights, the
    sampled output layer) start: false at 0, true at optim.initial_accumulator, a number at that
    value (up to AUTO_MAX_INITIAL_ACCUMULATOR under optim.lr auto). auto, the default: a linear
    model's at LINEAR_ROWS_START, a network's at 0 (`rows_start`). From 0, a weight's first
    step is about lr whatever its gradient, so a feature seen in a row or two takes a full step
    towards that row's labels; from 1e-6 the linear model kept 1.1-1.6 points more P@1 on the
    npm data and its best rate hardly mattered there (docs/accuracy.md, "The linear model's
    rows start above zero"). On the network's input layer a start of 1e-9 gained nothing
    on the npm data and cost 1.37-1.54x the time to the early targets (docs/accuracy.md, "A
    small first accumulator")."""
    weight_decay: float = 0.0
    """L2 decay added to the gradient of the rows/parameters an update touches."""
    plateau: float = 1.0
    """With a validation split (data.validation): the rate (optim.lr, chosen or pinned) is
    multiplied by this factor (0.5, say) at an evaluation where the trained model's validation
    P@1 has not passed its best for optim.plateau_epochs epochs since that best or the last
    cut. 1, the default: the rate stays as it is; a cut of 0.5 after 1 epoch raised no
    workload's kept P@1 and cost two of four up to 0.8 points (docs/accuracy.md, "The rate
    cut on a plateau")."""
    plateau_epochs: float = 1.0
    """Epochs without a gain in validation P@1 before optim.plateau cuts the rate."""

    def rows_start(self, linear: bool) -> float:
        """The row-sparse layers' start under optim.initial_accumulator_rows, for a linear
        model or a network."""
        rows = self.initial_accumulator_rows
        if rows == "auto":
            return LINEAR_ROWS_START if linear else 0.0
        if isinstance(rows, bool):
            return self.initial_accumulator if rows else 0.0
        return float(rows)

    def start(self, row_sparse: bool, linear: bool = False) -> float:
        """The value a layer's optimizer state starts from: initial_accumulator for Adagrad and
        row-wise Adagrad, except on the row-sparse layers (the input layer, a linear model's
        weights, the sampled output layer): `rows_start`; 0 for the other optimizers."""
        if self.name not in ("adagrad", "rowwise_adagrad"):
            return 0.0
        return self.rows_start(linear) if row_sparse else self.initial_accumulator

    def validate(self, path: str) -> None:
        _positive(self, path, "eps", "plateau_epochs")
        if not 0.0 < self.plateau <= 1.0:
            raise ConfigError(f"{path}.plateau: a factor in (0, 1] (1: no cut), got {self.plateau}")
        if self.initial_accumulator < 0:
            raise ConfigError(f"{path}.initial_accumulator: must be >= 0, got "
                              f"{self.initial_accumulator}")
        rows = self.initial_accumulator_rows
        if not isinstance(rows, (bool, str)) and rows < 0:
            raise ConfigError(f"{path}.initial_accumulator_rows: auto, true, false or a number "
                              f">= 0, got {rows}")
        _positive(self, path, "lr_scale")
        if self.lr != "auto":
            _positive(self, path, "lr")
            if self.lr_scale != 1.0:
                raise ConfigError(
                    f"{path}.lr_scale: scales the rate {path}.lr auto chooses, but {path}.lr is "
                    f"pinned at {self.lr:g}; pin the rate you want ({self.lr * self.lr_scale:g}?) "
                    "or set lr auto")
        elif self.name in ("adagrad", "rowwise_adagrad"):
            # The probe's centre and its 32 steps assume Adagrad's first steps of about lr.
            for key, value in (("initial_accumulator", self.initial_accumulator),
                               ("initial_accumulator_rows", max(self.rows_start(True),
                                                                self.rows_start(False)))):
                if value > AUTO_MAX_INITIAL_ACCUMULATOR:
                    raise ConfigError(
                        f"{path}.lr: auto takes {path}.{key} up to "
                        f"{AUTO_MAX_INITIAL_ACCUMULATOR:g} with {self.name}, got {value:g}: its "
                        "rule and probe assume Adagrad's first steps of about lr, which larger "
                        "accumulators shorten (docs/accuracy.md); pin optim.lr or start the "
                        "accumulators lower")
        if self.weight_decay < 0:
            raise ConfigError(f"{path}.weight_decay: must be >= 0, got {self.weight_decay}")
        for k in ("momentum", "beta1", "beta2"):
            if not 0.0 <= getattr(self, k) < 1.0:
                raise ConfigError(f"{path}.{k}: must be in [0, 1), got {getattr(self, k)}")


@dataclass(frozen=True)
class TrainConfig:
    algorithm: str = "sync"
    """Training algorithm, a name in hvd_adaptive.train.algorithms.ALGORITHMS (which checks it);
    see docs/algorithms.md."""
    epochs: float = 3.0
    """Passes over the training set (fractions allowed)."""
    batch_size: int = 256
    """Per-rank batch for sync/local/sma; the largest batch (b_max) for adaptive."""
    seed: int = 0
    """Seed of the epoch permutations."""
    eval_every: float = 0.5
    """Evaluate on the test set every this many epochs (and at the end): at the end of the
    first round after each mark; sync's rounds also end at the step that reaches one."""
    eval_rows: Optional[int] = None
    """Evaluate on the first N test rows only (None: all)."""
    time_budget_s: Optional[float] = None
    """Stop after this much training time (evaluation excluded)."""
    target_p_at_1: Optional[float] = None
    """Stop at the first evaluation whose test P@1 reaches this (time-to-accuracy runs)."""
    patience: Optional[int] = None
    """Early stop: end training after this many evaluations in a row without a higher
    validation score than the best so far (needs data.validation); None: train to the end."""
    threads: Optional[int] = None
    """TensorFlow threads per rank; default: the node's cores divided by the ranks on it."""
    log_every_s: float = 10.0
    """Seconds between progress lines on rank 0."""
    window_samples: int = 2048
    """Rows per round for all ranks together: the merge window S of adaptive, the averaging
    period of local and sma, the accounting round of sync. Rounds never cross an epoch, and a
    round holds at least WINDOW_MIN_BATCHES batches a rank (window_rows): at 13,402 labels
    adaptive SGD reached the target soonest with 2 to 4 batches a rank between merges, and
    with one its merge came every step and dynamic scheduling had nothing to balance
    (docs/benchmark.md, "Windows of 2,048 rows"). At 67,009 labels, whose merges move a
    larger output layer, 8,192 rows (16 batches a rank on 2 ranks) reached the later target
    sooner than 4,096, with equal ranks and with one under a half-core quota ("Windows at
    67,009 labels"): configs/bench.yaml takes 8,192."""
    calibrate_s: float = 2.0
    """Seconds each rank times its standalone speed before the clock starts (at least 8
    steps): the split's starting point and the denominator of cluster efficiency. 2 s span 200
    periods of a CPU quota; the tiny test config uses less."""
    keep_memory: bool = True
    """Each rank's C allocator (glibc) keeps the memory the rank frees for its next
    allocations instead of handing it back to the kernel, which zeroes fresh pages for every
    large buffer a merge or a step allocates again (hvd_adaptive/parallel/memory.py): at 8
    quarter-core ranks and 67,009 labels adaptive SGD reached the target 1.13x sooner with it
    (docs/benchmark.md, "Freed memory kept"). A rank's memory then stays at its peak."""
    eval_memory_mb: float = 256.0
    """Evaluation ranks all labels in blocks whose logits take at most this many MB per rank
    (test rows x block labels x 4 bytes), keeping a running top-k across blocks."""

    def window_rows(self, ranks: int) -> int:
        """The rows of a round at `ranks` ranks: window_samples, raised to WINDOW_MIN_BATCHES
        batches of batch_size a rank."""
        return max(self.window_samples, WINDOW_MIN_BATCHES * ranks * self.batch_size)

    def validate(self, path: str) -> None:
        _positive(self, path, "epochs", "batch_size", "eval_every", "eval_rows", "time_budget_s",
                  "threads", "log_every_s", "window_samples", "target_p_at_1", "eval_memory_mb",
                  "calibrate_s", "patience")


@dataclass(frozen=True)
class SyncConfig:
    partition: Literal["equal", "proportional"] = "equal"
    """equal: every rank takes train.batch_size rows a step (Horovod's usual data parallelism).
    proportional: the global batch (ranks x batch_size) is split so that every rank's local
    computation takes equally long, re-measured from the training steps every window; gradients
    are weighted by row share (LB-BSP)."""
    min_batch: int = 8
    """Smallest per-rank share of the global batch under proportional partition."""
    smoothing: float = 0.5
    """Proportional partition: weight of the older measurements when a window's are blended in."""
    deadband: float = 0.05
    """Proportional partition: a new split is taken only when some rank's share moves by more
    than this fraction of train.batch_size, so measurement noise between ranks of equal speed
    does not unbalance them (and a rank within about 5% of the others keeps its equal share)."""
    step: Literal["fused", "timed"] = "fused"
    """fused: a step is one tf.function (gradient, allreduce, update), as a plain Horovod script's
    is; its whole time counts as compute_s in the round records. timed: three, with a barrier
    before the allreduce, so computation, transfer and waiting are measured apart (the records'
    breakdown; 5% fewer rows/s at 13,402 labels here, docs/benchmark.md). The proportional partition, shard_update
    and a sleep-mode slowdown (which sleeps after the local parts only) need the parts timed and
    always take the timed step."""
    shard_update: bool = False
    """Shard the dense layers' optimizer update: the output layer's gradient is reduce-scattered,
    each rank updates its slice (with its slice of the optimizer state) and the slices are
    allgathered, so no rank updates the whole layer every step (ZeRO-style; full softmax only)."""

    def validate(self, path: str) -> None:
        _positive(self, path, "min_batch")
        if not 0.0 <= self.smoothing < 1.0:
            raise ConfigError(f"{path}.smoothing: must be in [0, 1), got {self.smoothing}")
        if not 0.0 <= self.deadband < 1.0:
            raise ConfigError(f"{path}.deadband: must be in [0, 1), got {self.deadband}")


@dataclass(frozen=True)
class AutoConfig:
    """The hybrid mode (train.algorithm: auto, hvd_adaptive/train/algorithms/auto.py): every
    window either aggregates gradients (sync with the proportional split) or trains adaptive
    SGD's window and merges, whichever measured more goodput."""

    averaging_cost: float = 1.0
    """Rows model averaging needs per row of gradient aggregation to reach the same accuracy
    (its statistical cost): a window merges only when adaptive SGD's measured rows/s beat
    sync's by more than this factor. 1.0: with adaptive.label_norm adaptive SGD reached the
    target in no more rows than sync, at 67,009 labels and at 13,402 (docs/algorithms.md,
    "auto, the hybrid mode")."""
    probe_every: int = 6
    """Windows between probes of the mode not chosen, whose rows/s may have changed."""
    shard_update: bool = False
    """Gradient windows shard the output layer's optimizer update (sync.shard_update). Off:
    with Horovod's cycle as the project sets it, it took about sync_prop's time, with equal
    ranks and with a slowed rank alike (docs/algorithms.md), and a switch of mode gathers or
    re-shards the optimizer state."""

    def validate(self, path: str) -> None:
        _positive(self, path, "probe_every")
        if self.averaging_cost < 1.0:
            raise ConfigError(f"{path}.averaging_cost: must be >= 1, got {self.averaging_cost}")


@dataclass(frozen=True)
class AdaptiveConfig:
    warmup_epochs: float = 0.0
    """Epochs of warm-up with batch b_warm on every rank. The prototype used 10 (of many more);
    on the benchmark workload 0.25 epochs of warm-up (batch 32 and a 100x lower starting rate)
    delayed the target P@1 several times over, so it is off by default (docs/algorithms.md,
    "Choices where the sources are silent")."""
    b_warm: int = 32
    """Warm-up batch size."""
    b_min: int = 32
    """Smallest batch after warm-up."""
    b_max: Optional[int] = None
    """Largest batch; every rank starts here after warm-up. None: train.batch_size."""
    step: int = 32
    """Additive policy: batch size change per window."""
    policy: Literal["additive", "proportional"] = "additive"
    """Batch-size scaling rule: the papers' additive steps, or b_i <- b_i * n * p_i (smoothed)."""
    smoothing: float = 0.5
    """Proportional policy: weight of the old batch size in the blend."""
    lr_decay: float = 0.0
    """d in lr_i = lr0 * b_i / b_max / (1 + d * (epoch - warmup))."""
    norm_mode: Literal["off", "grow", "shrink"] = "off"
    """Adaptive normalization: boost the fastest rank's merge weight while the model's L2 norm
    grows (grow) or shrinks (shrink) between evaluations."""
    norm_factor: float = 0.1
    """Adaptive normalization: weights x (1 +/- factor) for the largest/smallest share."""
    merge_momentum: float = 0.0
    """Block momentum mu at the merge (an outer optimizer, SlowMo's):
    v <- mu v + (merged - prev), theta <- prev + merge_lr v; 0 turns it off."""
    merge_lr: float = 1.0
    """The outer learning rate of block momentum. A steady merged change d grows to
    d / (1 - mu) under momentum, so merge_lr = 1 - mu keeps the step size of plain merging and
    momentum only smooths; 1.0 with mu 0.5 doubled every step (docs/benchmark.md)."""
    scheduler: Literal["rma", "static"] = "rma"
    """rma: dynamic scheduling through an MPI one-sided shared counter on rank 0.
    static: fallback without one-sided MPI; each window is split in proportion to the ranks'
    speeds (rows/s) measured in the previous windows."""
    guided: bool = False
    """Dynamic scheduling's guided tail (SharedCounter.claims): near a window's end a claim takes
    at most the rows left / ranks (at least a quarter of its batch), so the ranks reach the merge
    within a small batch of each other, and counts as its fraction of a batch in the merge
    weights. It cut the end-of-window wait at 8 ranks but not the time to the target, within
    noise at 2-8 ranks (docs/algorithms.md, docs/benchmark.md), so it is off: every claim is a
    whole batch (the papers')."""
    weights: Literal["batches", "rows"] = "batches"
    """Merge weights p_i from the window's batch counts (the papers) or from rows processed."""
    opt_state: Literal["local", "average"] = "average"
    """Optimizer state (Adagrad accumulators, momentum, Adam moments) under averaging: merged
    with the same weights as the model (average: in the ablation per-rank state needed more
    rows and so reached the target later, docs/benchmark.md, "Where the defaults come from"),
    or each rank's own (local, the papers')."""
    row_norm: bool = True
    """Row-normalized merge of the row-sparse layers (input layer; output layer and bias under
    model.output: sampled; the full softmax's: label_norm): a row that only some ranks touched
    in the window
    takes the change of those ranks, weighted among them, instead of an average that counts the
    untouched replicas' old values (off: the papers' plain weighted average)."""
    label_norm: bool = True
    """The row-normalized merge of the full softmax's output layer and bias by the labels each
    rank trained as positives in the window: a label that only some ranks saw keeps their
    change instead of a share of it (the softmax's small changes to other labels' rows count
    only where nobody had the label). Off, adaptive SGD needed more rows than sync to reach the
    target at 67,009 labels (docs/benchmark.md, "Where the defaults come from")."""
    lr_scaling: Literal["linear", "none"] = "none"
    """none: every rank uses lr0 (with Adagrad, whose steps do not grow with the gradient's
    scale, this reached the target sooner than linear in the ablation, docs/benchmark.md, "Where
    the defaults come from"); linear: lr_i = lr0 * b_i / b_max (the papers)."""

    def validate(self, path: str) -> None:
        _positive(self, path, "b_warm", "b_min", "b_max", "step")
        if self.b_max is not None and self.b_min > self.b_max:
            raise ConfigError(f"{path}.b_min: {self.b_min} is larger than b_max {self.b_max}")
        if not 0.0 <= self.smoothing < 1.0:
            raise ConfigError(f"{path}.smoothing: must be in [0, 1), got {self.smoothing}")
        if not 0.0 < self.merge_lr <= 1.0:
            raise ConfigError(f"{path}.merge_lr: must be in (0, 1], got {self.merge_lr}")
        if not 0.0 <= self.merge_momentum < 1.0:
            raise ConfigError(f"{path}.merge_momentum: must be in [0, 1), got {self.merge_momentum}")
        if self.warmup_epochs < 0 or self.lr_decay < 0 or not 0 <= self.norm_factor < 1:
            raise ConfigError(f"{path}: warmup_epochs and lr_decay must be >= 0, norm_factor in [0, 1)")


@dataclass(frozen=True)
class MergeConfig:
    """How the model-averaging algorithms (local, adaptive) merge replicas (hvd_adaptive/parallel/merge.py)."""

    sparse: bool = True
    """Carry only the rows of the input and output layers that some rank touched since the last
    merge (their union, agreed by a bitwise-or allreduce of per-rank masks); untouched rows are
    identical on every rank already. Hidden layers and biases always travel whole. The result
    equals the dense merge up to float rounding."""
    dtype: Literal["float32", "float16"] = "float32"
    """Wire type of the merge: float16 sends each rank's weighted change since the last merge in
    16 bits and adds the sum to a 32-bit copy of the merged model (one extra model copy)."""

    chunk_mb: float = 256.0
    """Sparse merge: the touched rows travel in pieces of at most this many MB a rank (one
    allreduce each), so a merge's transient buffers stay bounded at large label or feature
    counts; 0 sends them in one piece."""

    overlap: bool = False
    """Adaptive SGD: a window's merge runs in a background thread while the next window trains,
    and lands at that window's end (each rank keeps its new steps on top of the merged model);
    the model evaluated is the last merged one, a window behind. Pays where the merge waits on
    a network or another device, not where it takes the computing's own CPU (docs/benchmark.md,
    "A merge beside the next window"). float32 merges, without block momentum."""

    def validate(self, path: str) -> None:
        if self.chunk_mb < 0:
            raise ConfigError(f"{path}.chunk_mb: must be >= 0 (0: one piece), got {self.chunk_mb}")
        if self.overlap and self.dtype != "float32":
            raise ConfigError(f"{path}.overlap: needs {path}.dtype float32 (the float16 merge's "
                              f"anchor is the model merged last, which the overlap moves), got {self.dtype}")


@dataclass(frozen=True)
class SmaConfig:
    alpha: float = 0.1
    """CROSSBOW: each replica moves alpha x (replica - central) toward the central model."""
    momentum: float = 0.9
    """CROSSBOW: momentum of the central model's correction."""

    def validate(self, path: str) -> None:
        _positive(self, path, "alpha")
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"{path}.momentum: must be in [0, 1), got {self.momentum}")


@dataclass(frozen=True)
class HogbatchConfig:
    """CPU+GPU Hogbatch and Adaptive Hogbatch (asynchronous, one node; docs/hogbatch.md)."""

    cpu_ranks: list[int] = field(default_factory=list)
    """Ranks that are CPU workers (small batches); the others are GPU workers (their GPU if any)."""
    cpu_threads: Optional[int] = None
    """TensorFlow threads of CPU workers; None: as train.threads. Applied when the ranks start
    (run.py passes algorithms.worker_threads to distributed.init)."""
    cpu_batch: int = 16
    """Starting batch of CPU workers (plain hogbatch keeps it)."""
    gpu_batch: Optional[int] = None
    """Starting batch of GPU workers; None: train.batch_size."""
    b_min: int = 16
    """adaptive_hogbatch: smallest batch (tinier batches at one learning rate made learning
    noisy in our runs)."""
    b_max: Optional[int] = None
    """adaptive_hogbatch: largest batch; None: 8 x the GPU batch."""
    threshold: float = 0.2
    """adaptive_hogbatch: a worker whose update rate is off the mean by more than this fraction
    resizes its batch; larger keeps batches (utilization), smaller balances update counts."""
    adjust_every: int = 2
    """adaptive_hogbatch: updates between publishing the rate and resizing."""
    round_epochs: Optional[float] = None
    """Epochs of the stream per round (rounds end with a barrier and never cross an epoch);
    None: train.eval_every, so the only barriers are those evaluation needs."""

    def validate(self, path: str) -> None:
        _positive(self, path, "cpu_threads", "cpu_batch", "gpu_batch", "b_min", "b_max",
                  "adjust_every", "round_epochs")
        if any(r < 0 for r in self.cpu_ranks) or len(set(self.cpu_ranks)) != len(self.cpu_ranks):
            raise ConfigError(f"{path}.cpu_ranks: needs distinct ranks >= 0, got {self.cpu_ranks}")
        if self.b_max is not None and self.b_min > self.b_max:
            raise ConfigError(f"{path}.b_min: {self.b_min} is larger than b_max {self.b_max}")
        if self.threshold < 0:
            raise ConfigError(f"{path}.threshold: must be >= 0, got {self.threshold}")


@dataclass(frozen=True)
class PhaseConfig:
    """One phase of a time-varying slowdown (hetero.schedule)."""

    from_epoch: float = 0.0
    """Training progress (epochs) from which this phase's slowdown applies."""
    slowdown: dict[int, float] = field(default_factory=dict)
    """Rank -> factor during the phase; ranks not named run at full speed."""


@dataclass(frozen=True)
class HeteroConfig:
    """Heterogeneity injected into a run (hvd_adaptive/train/hetero.py): the same for every algorithm."""

    slowdown: dict[int, float] = field(default_factory=dict)
    """Rank -> slowdown factor (>= 1), e.g. {1: 2.0} makes rank 1 two times slower."""
    schedule: list[PhaseConfig] = field(default_factory=list)
    """A slowdown that changes with training progress (sleep mode): phases in order of
    `from_epoch`; each replaces `slowdown` from its epoch on, e.g. rank 1 2x slower from epoch
    0.2 to 0.4: [{from_epoch: 0.2, slowdown: {1: 2}}, {from_epoch: 0.4, slowdown: {}}]. The
    phase is chosen at the start of every window (round), so every algorithm sees it on the
    same rows."""
    mode: Literal["sleep", "cpu_quota"] = "sleep"
    """sleep: a slowed rank waits (factor - 1) x each span of its local computation (forward,
    backward, optimizer update), never its communication. cpu_quota: the slowed rank's whole
    process gets a cgroup CPU quota of threads / factor cores, as a slower machine (root)."""
    jitter: float = 0.0
    """Random extra wait, uniform in [0, jitter] x compute time, on every rank (sleep mode)."""
    cores: list[float] = field(default_factory=list)
    """A cluster profile (cpu_quota mode): rank i's whole process gets cores[i] CPUs' worth of
    time in its own cgroup, e.g. [0.5, 0.5, 0.5, 0.25] for three ranks at half a core and one
    at a quarter. One entry per rank; the ranks of a node may not be given more cores than the
    node has. Replaces `slowdown`: a rank's speed is given directly."""

    @property
    def sleeps(self) -> bool:
        """Whether some rank sleeps at some point of the run (sleep mode with a slowdown, a
        schedule or jitter): the same answer on every rank, from the config alone."""
        factors = [*self.slowdown.values(), *(f for p in self.schedule for f in p.slowdown.values())]
        return self.mode == "sleep" and (any(f > 1.0 for f in factors) or self.jitter > 0)

    def validate(self, path: str) -> None:
        if self.cores:
            bad = [c for c in self.cores if not c > 0]
            if bad:
                raise ConfigError(f"{path}.cores: every rank's cores must be > 0, got {self.cores}")
            if self.mode != "cpu_quota":
                raise ConfigError(f"{path}.cores: a cluster profile is a set of real CPU quotas; "
                                  f"set {path}.mode=cpu_quota (got {self.mode})")
            if self.slowdown or self.schedule:
                raise ConfigError(f"{path}.cores: gives each rank's speed directly; leave "
                                  f"{path}.slowdown and {path}.schedule empty")
        for r, f in self.slowdown.items():
            if r < 0 or f < 1.0:
                raise ConfigError(f"{path}.slowdown: needs rank >= 0 and factor >= 1, got {r}: {f}")
        if self.jitter < 0:
            raise ConfigError(f"{path}.jitter: must be >= 0, got {self.jitter}")
        starts = [p.from_epoch for p in self.schedule]
        if starts != sorted(starts) or any(e < 0 for e in starts):
            raise ConfigError(f"{path}.schedule: phases must start at epochs >= 0 in increasing "
                              f"order, got {starts}")
        for i, phase in enumerate(self.schedule):
            for r, f in phase.slowdown.items():
                if r < 0 or f < 1.0:
                    raise ConfigError(f"{path}.schedule[{i}].slowdown: needs rank >= 0 and "
                                      f"factor >= 1, got {r}: {f}")
        if self.schedule and self.mode != "sleep":
            raise ConfigError(f"{path}.schedule: a time-varying slowdown needs hetero.mode=sleep "
                              f"(a cgroup quota is set once at start), got mode {self.mode}")


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints in `<run_dir>/checkpoints/` (see hvd_adaptive/train/checkpoint.py)."""

    every: Optional[int] = None
    """Rounds (merge windows; sync's rounds also end at each evaluation) between checkpoints;
    None: only one at the end of training."""
    keep: int = 3
    """How many of the newest complete checkpoints to keep. 0: write none, not even the final
    one, for runs that only need their metrics (the benchmark's: a 67,009-label model is about
    180 MB a run); such a run leaves nothing to predict with, export or resume."""
    resume: Literal["never", "auto"] = "never"
    """auto: continue from the newest complete checkpoint in the run folder, if there is one
    (`hvd-adaptive train --resume`). never: start over; old checkpoints there are deleted."""
    best: bool = True
    """With a validation split (data.validation), also keep the model of the best validation
    P@1 in `checkpoints/best/` (the model's arrays only, written at the evaluation that
    improved); `predict`, `evaluate` and `export` read it unless told `--checkpoint last`.
    Nothing is written with keep 0."""
    average: float = 0.5
    """Half-life in epochs of a running average of the evaluated model's weights (from the
    first evaluation on, sampled at every evaluation and at least every half-life between
    them, off the training clock), which competes with the model itself for the kept best:
    where its validation score is higher, the average is what `checkpoints/best/` holds and the
    run's `kept` reports. With a validation split only; one more copy of the weights in host
    memory. 0: off. At 0.5, evaluated every half epoch, the average's test P@1 was 0.2-1.0
    points above the model's (docs/accuracy.md, "The average of the weights")."""

    def validate(self, path: str) -> None:
        _positive(self, path, "every")
        if not (math.isfinite(self.average) and self.average >= 0):
            raise ConfigError(f"{path}.average: a half-life in epochs, >= 0 (0: off), got {self.average}")
        if self.keep < 0:
            raise ConfigError(f"{path}.keep: must be >= 0, got {self.keep}")
        if self.keep == 0 and self.every is not None:
            raise ConfigError(f"{path}.every: {self.every} with {path}.keep 0, which writes no "
                              "checkpoint; drop one of them")
        if self.keep == 0 and self.resume == "auto":
            raise ConfigError(f"{path}.resume: auto (--resume) with {path}.keep 0, which writes "
                              "no checkpoint to resume from; drop one of them")


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    hetero: HeteroConfig = field(default_factory=HeteroConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    auto: AutoConfig = field(default_factory=AutoConfig)
    merge: MergeConfig = field(default_factory=MergeConfig)
    sma: SmaConfig = field(default_factory=SmaConfig)
    hogbatch: HogbatchConfig = field(default_factory=HogbatchConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def validate(self, path: str = "") -> None:
        for f in dataclasses.fields(self):
            getattr(self, f.name).validate(f.name)
        if self.merge.overlap and self.train.algorithm != "adaptive":
            raise ConfigError(f"merge.overlap: only adaptive SGD overlaps its merge with training; "
                              f"train.algorithm is {self.train.algorithm}")
        if self.merge.overlap and self.adaptive.merge_momentum > 0:
            raise ConfigError("merge.overlap: block momentum (adaptive.merge_momentum "
                              f"{self.adaptive.merge_momentum}) steps from the merged model, which "
                              "the overlap has a window later; set one of them off")
        if self.train.patience is not None and self.data.validation == 0:
            raise ConfigError(f"train.patience: {self.train.patience} needs a validation split "
                              "to measure (data.validation, e.g. 0.05)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _positive(obj: Any, path: str, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        if v is not None and v <= 0:
            raise ConfigError(f"{path}.{n}: must be > 0, got {v}")


_SCIENTIFIC = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _convert(tp: Any, value: Any, path: str) -> Any:
    """Checks/converts one YAML value against a type hint; raises ConfigError with the path."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__}")
        return _build(tp, value, path)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(inner[0], value, path)
        why = []
        for a in inner:  # the first type that takes the value
            try:
                return _convert(a, value, path)
            except ConfigError as e:
                why.append(str(e).split(": ", 1)[-1])
        raise ConfigError(f"{path}: {' or '.join(why)}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{path}: must be one of {list(typing.get_args(tp))}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        (inner,) = typing.get_args(tp)
        return [_convert(inner, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        kt, vt = typing.get_args(tp)
        # JSON turns integer keys into strings; accept them back.
        fix = (lambda k: int(k) if kt is int and isinstance(k, str) and k.lstrip("-").isdigit() else k)
        return {_convert(kt, fix(k), f"{path}.{k}"): _convert(vt, v, f"{path}.{k}")
                for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _SCIENTIFIC.fullmatch(value.strip()):
            # YAML 1.1 reads 1e-8 (no dot) as a string, and config.json writes floats that way.
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp} at {path}")


def _build(cls: type, data: dict, path: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            where = f"{path}.{key}" if path else str(key)
            raise ConfigError(f"{where}: unknown key (known: {sorted(names)})")
    kwargs = {k: _convert(hints[k], v, f"{path}.{k}" if path else k) for k, v in data.items()}
    return cls(**kwargs)


def _apply_override(raw: dict, item: str) -> None:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected section.key=value")
    key, text = item.split("=", 1)
    parts = key.strip().split(".")
    node = raw
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: {p} is not a section")
    node[parts[-1]] = yaml.safe_load(text) if text.strip() else None


def load_config(path: Optional[str | Path] = None, overrides: tuple[str, ...] | list[str] = (),
                extra_sections: tuple[str, ...] = ()) -> tuple[Config, dict]:
    """Reads a YAML config, applies `--set` overrides and validates.

    Args:
        path: YAML file, or None for the built-in defaults.
        overrides: "section.key=value" strings; values are parsed as YAML.
        extra_sections: top-level keys that other components consume (e.g. "sweep"); they are
            returned untouched in the second element instead of being rejected.

    Returns:
        (config, extras) where extras maps each present extra section to its raw value.
    """
    raw: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: config file not found")
        try:
            raw = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {e}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{p}: top level must be a mapping")
    for item in overrides:
        _apply_override(raw, item)
    extras = {k: raw.pop(k) for k in extra_sections if k in raw}
    try:
        cfg = _build(Config, raw, "")
        cfg.validate()
    except ConfigError as e:
        raise ConfigError(f"{_origin(str(e), path, overrides)}: {e}") from None
    return cfg, extras


def _origin(message: str, path: Optional[str | Path], overrides) -> str:
    """Where the value a config error is about came from: the `--set` items that gave the key
    the message starts with (or a key below or above it), else the config file. Without a file
    the built-in defaults are valid, so the `--set` items are the cause."""
    key = message.split(":", 1)[0].split(" ", 1)[0]

    def about(item: str) -> bool:
        k = item.split("=", 1)[0].strip()
        return k == key or k.startswith(key + ".") or key.startswith(k + ".")

    given = [item for item in overrides if about(item)] or ([] if path else list(overrides))
    return "--set " + ", --set ".join(given) if given else str(path or "the built-in defaults")


def resolve(cfg: Config, threads: int) -> Config:
    """The config as the run uses it: each value whose None means "derived from another" is set.

    Resolved once at start (run.py), so the algorithms and config.json see the same values:
    train.threads, hogbatch.cpu_threads, the batch bounds adaptive.b_max / b_min and
    hogbatch.gpu_batch / b_max / b_min (b_min never above b_max, as the algorithms use it), and
    hogbatch.round_epochs. Nones that mean "none" (no time budget, all test rows) stay.

    Args:
        threads: TensorFlow threads this rank gets when train.threads is None
            (distributed.default_threads: its node's cores / ranks on the node).
    """
    t, a, h = cfg.train, cfg.adaptive, cfg.hogbatch
    threads = t.threads or threads
    a_max = a.b_max or t.batch_size
    gpu = h.gpu_batch or t.batch_size
    h_max = h.b_max or 8 * gpu
    return dataclasses.replace(
        cfg, train=dataclasses.replace(t, threads=threads),
        adaptive=dataclasses.replace(a, b_max=a_max, b_min=min(a.b_min, a_max)),
        hogbatch=dataclasses.replace(h, cpu_threads=h.cpu_threads or threads, gpu_batch=gpu,
                                     b_max=h_max, b_min=min(h.b_min, h_max),
                                     round_epochs=h.round_epochs or t.eval_every))


def unresolved(cfg: Config) -> list[str]:
    """The keys `resolve` would still set, in config order (none in a resolved config)."""
    before, after = cfg.to_dict(), resolve(cfg, threads=1).to_dict()
    return [f"{section}.{key}" for section, values in before.items() if isinstance(values, dict)
            for key, value in values.items() if after[section][key] != value]


def config_from_dict(raw: dict) -> Config:
    """Builds and validates a Config from a plain dict (e.g. a saved config.json)."""
    cfg = _build(Config, json.loads(json.dumps(raw)), "")
    cfg.validate()
    return cfg
