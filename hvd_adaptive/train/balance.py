"""Batch-size, learning-rate and merge-weight policies of adaptive SGD: pure functions.

No MPI and no TensorFlow here, so every rule is unit-tested on hand-checked cases. Terms
(see docs/algorithms.md): n ranks, b_i the batch size of rank i, p_i the share of a merge
window's batches that rank i processed.
"""
from __future__ import annotations

from typing import Optional

import numpy as np


def batch_shares(batches: np.ndarray) -> np.ndarray:
    """p_i = batches of rank i / all batches in the window (equal shares if none)."""
    b = np.asarray(batches, dtype=np.float64)
    total = b.sum()
    return b / total if total > 0 else np.full(len(b), 1.0 / len(b))


def smoothed(old: np.ndarray, new: np.ndarray, keep: float) -> np.ndarray:
    """keep x old + (1 - keep) x new, elementwise; the first measurement (old all zero: nothing
    measured yet) is taken as it is. Sync's proportional split smooths its cost estimates so."""
    old, new = np.asarray(old, dtype=np.float64), np.asarray(new, dtype=np.float64)
    return new.copy() if not old.any() else keep * old + (1.0 - keep) * new


def additive_batch_sizes(b: np.ndarray, p: np.ndarray, step: int, b_min: int, b_max: int) -> np.ndarray:
    """The papers' rule: a rank below its fair share 1/n shrinks its batch by `step`, above grows.

    A rank that processed fewer batches than average is slow; a smaller batch lets it make
    as many updates as the others. Results stay within [b_min, b_max].
    """
    b = np.asarray(b, dtype=np.int64).copy()
    fair = 1.0 / len(b)
    tol = 1e-9
    b[(p < fair - tol) & (b > b_min)] -= step
    b[(p > fair + tol) & (b < b_max)] += step
    return np.clip(b, b_min, b_max)


def proportional_batch_sizes(b: np.ndarray, p: np.ndarray, b_min: int, b_max: int,
                             smoothing: float = 0.5, multiple: int = 1) -> np.ndarray:
    """b_i <- clip(b_i * n * p_i), blended with the old size by `smoothing` (0 = jump at once).

    With equal update counts as the goal, a rank's batch should scale with its speed; n * p_i
    is its update count relative to the average. `multiple` rounds to hardware-friendly sizes.
    """
    b = np.asarray(b, dtype=np.float64)
    target = b * len(b) * np.asarray(p, dtype=np.float64)
    new = smoothing * b + (1.0 - smoothing) * target
    new = np.round(new / multiple) * multiple
    return np.clip(new, b_min, b_max).astype(np.int64)


def adaptive_lr(lr0: float, b: int, b_max: int, epoch: float, warmup_epochs: float, decay: float) -> float:
    """lr_i = lr0 * b_i / b_max / (1 + decay * (epoch - warmup)) after warm-up."""
    return lr0 * b / b_max / (1.0 + decay * max(epoch - warmup_epochs, 0.0))


def warmup_lr(lr0: float, b_warm: int, b_max: int, epoch: float, warmup_epochs: float) -> float:
    """Linear ramp from lr_w/100 to lr_w during warm-up, lr_w = lr0 * b_warm / b_max."""
    lr_w = lr0 * b_warm / b_max
    frac = min(max(epoch / warmup_epochs, 0.0), 1.0) if warmup_epochs > 0 else 1.0
    return lr_w * (0.01 + 0.99 * frac)


def merge_weights(p: np.ndarray, boost: bool = False, factor: float = 0.1) -> np.ndarray:
    """Normalized merging weights w_i = p_i, optionally with adaptive normalization.

    When `boost` is set (the L2-norm trend asked for it), the rank with the largest share gets
    weight x (1 + factor) and the one with the smallest x (1 - factor), as in the prototype.
    Weights are renormalized to sum to 1.
    """
    w = np.asarray(p, dtype=np.float64).copy()
    if boost and len(w) > 1:
        hi, lo = int(np.argmax(w)), int(np.argmin(w))
        if hi != lo:
            w[hi] *= 1.0 + factor
            w[lo] *= 1.0 - factor
    s = w.sum()
    return w / s if s > 0 else np.full(len(w), 1.0 / len(w))


def norm_trend_flag(mode: str, prev_norm: float | None, norm: float) -> bool:
    """Whether adaptive normalization boosts the next merges.

    mode "grow": boost while the model's L2 norm grows between evaluations; "shrink": while it
    shrinks; "off": never. The sources do not publish the direction, so both are options.
    """
    if mode == "off" or prev_norm is None:
        return False
    return norm > prev_norm if mode == "grow" else norm < prev_norm


def proportional_partition(total: int, speeds: np.ndarray, minimum: int = 1) -> np.ndarray:
    """Splits a global batch of `total` rows in proportion to speeds; integers summing to total."""
    s = np.maximum(np.asarray(speeds, dtype=np.float64), 1e-12)
    n = len(s)
    if total < minimum * n:
        raise ValueError(f"global batch {total} too small for {n} ranks with at least {minimum} rows each")
    raw = minimum + (total - minimum * n) * s / s.sum()
    out = np.floor(raw).astype(np.int64)
    rest = total - out.sum()
    out[np.argsort(-(raw - out))[:rest]] += 1  # largest remainders get the leftover rows
    return out


def balanced_partition(total: int, per_row_s: np.ndarray, per_step_s: np.ndarray,
                       minimum: int = 1) -> np.ndarray:
    """Splits a global batch so that every rank's local computation takes equally long.

    Rank i's step takes per_step_s[i] + per_row_s[i] * b_i; the split makes these equal
    (T = (total + sum c_i / a_i) / sum 1 / a_i, b_i = (T - c_i) / a_i), keeps every rank at
    `minimum` rows or more, and rounds to integers that sum to `total`. Without measurements
    (all per-row costs 0) the split is equal.
    """
    a = np.asarray(per_row_s, dtype=np.float64)
    c = np.asarray(per_step_s, dtype=np.float64)
    n = len(a)
    if total < minimum * n:
        raise ValueError(f"global batch {total} too small for {n} ranks with at least {minimum} rows each")
    if not np.all(a > 0):
        return proportional_partition(total, np.ones(n), minimum)
    t = (total + np.sum(c / a)) / np.sum(1.0 / a)
    rows = np.maximum((t - c) / a, 0.0)
    return proportional_partition(total, rows, minimum)


def keep_within_deadband(current: np.ndarray, proposed: np.ndarray, rows: float) -> np.ndarray:
    """The proposed split, unless no rank's share moves by more than `rows` from the current
    one: then the current split stays (noise between ranks of equal speed is not followed)."""
    current = np.asarray(current, dtype=np.int64)
    proposed = np.asarray(proposed, dtype=np.int64)
    return current.copy() if np.abs(proposed - current).max() <= rows else proposed


def split_evenly(total: int, n: int) -> np.ndarray:
    """Offsets [n+1] splitting `total` rows into n contiguous nearly equal parts."""
    return (np.arange(n + 1, dtype=np.int64) * total) // n


# auto's two ways to train a window: gradient aggregation and model averaging.
MODES = ("grad", "avg")


def choose_mode(index: int, rates: dict, last_probe: dict, cost: float, probe_every: int) -> str:
    """The mode of auto's window `index` (algorithms/auto.py): gradient aggregation ("grad")
    or model averaging ("avg").

    Args:
        index: windows trained so far in this run.
        rates: mode -> measured rows/s (None before its first window).
        last_probe: mode -> the last window index that mode ran.
        cost: auto.averaging_cost.
        probe_every: auto.probe_every.
    """
    for mode in MODES:  # each mode is measured once before any choice
        if rates.get(mode) is None:
            return mode
    best = "avg" if rates["avg"] > cost * rates["grad"] else "grad"
    other = "grad" if best == "avg" else "avg"
    if index - last_probe.get(other, -1) > probe_every:
        return other
    return best


# ---- Adaptive Hogbatch (hvd_adaptive/train/algorithms/hogbatch.py) ----------------------------------
def adapt_batch(b: int, rates: np.ndarray, me: int, threshold: float, b_min: int, b_max: int,
                adjusting: bool = False) -> tuple[int, bool]:
    """Adaptive Hogbatch's rule: resize a worker's batch so that update rates balance.

    A worker whose update rate is above the mean of all published rates by more than
    `threshold` (relative) grows its batch, one below shrinks it, by the factor rate / mean.
    An update's cost grows with the batch, so if every worker applies this at once with rates
    proportional to 1 / b, all rates become the mean in one step. Fixed per-update costs make
    one step fall short, so a worker that started resizing keeps on until it is within half the
    threshold (hysteresis: it settles near the mean, not at the band's edge). Inside the band the
    batch is kept: a larger threshold keeps large, efficient batches (utilization), a smaller
    one balances update counts more tightly.

    Args:
        b: This worker's current batch size.
        rates: Published update rates of all workers (updates per second; 0 = not yet known).
        me: This worker's index in `rates`.
        threshold: Relative dead band around the mean rate.
        b_min: Smallest batch allowed.
        b_max: Largest batch allowed.
        adjusting: Whether this worker resized at its previous decision (from the last call).

    Returns:
        (new batch size within [b_min, b_max], whether this worker is resizing); the batch is
        kept while fewer than two rates are known.
    """
    r = np.asarray(rates, dtype=np.float64)
    known = r > 0
    if not known[me] or known.sum() < 2:
        return b, adjusting
    rel = r[me] / r[known].mean()
    if abs(rel - 1.0) <= (threshold / 2 if adjusting else threshold):
        return b, False
    new = int(round(b * rel))
    if new == b:  # outside the band always moves, even when rounding would not
        new = b + (1 if rel > 1 else -1)
    return int(np.clip(new, b_min, b_max)), True


def update_shares(updates: np.ndarray, cpu_ranks: list[int]) -> tuple[np.ndarray, Optional[float]]:
    """Each worker's share of the updates, and the CPU workers' total share (None without any)."""
    u = np.asarray(updates, dtype=np.float64)
    total = u.sum()
    shares = u / total if total > 0 else np.zeros(len(u))
    cpu = float(shares[list(cpu_ranks)].sum()) if cpu_ranks else None
    return shares, cpu
