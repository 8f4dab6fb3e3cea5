"""Adaptive SGD and the baselines on real MPI ranks: dynamic scheduling, the batch-size rules,
the static scheduler, the merge rule window by window, learning rates and merge weights."""
import json

import numpy as np
import pytest

from hvd_adaptive.train import balance
from tests.harness.mpirun import explain, mpirun, records, train_many


SCHEDULED = ["adaptive", "sync", "local", "sma", "hogbatch", "auto"]


@pytest.fixture(scope="module")
def scheduling():
    """algorithms_scheduling_ranks.py for every algorithm, one after another in one 2-rank job."""
    return mpirun(2, ["tests/mpi/ranks/algorithms_scheduling_ranks.py", *SCHEDULED, "guided"], timeout=300)


@pytest.mark.parametrize("name", SCHEDULED)
def test_every_row_once_per_epoch_and_dynamic_scheduling_favours_the_fast_rank(scheduling, name):
    p = scheduling
    assert f"scheduling ok ({name})" in p.stdout and p.returncode == 0, explain(p)


def test_guided_claims_shrink_as_a_windows_rows_run_out(scheduling):
    # adaptive.guided: the last claims of a window take a share of the rows left, so the ranks
    # reach the merge within a small batch of each other (algorithms_scheduling_ranks.py, case guided).
    p = scheduling
    assert "guided ok" in p.stdout and p.returncode == 0, explain(p)


def _balance_sets(policy, *extra):
    # Steps must be long enough (tens of ms) for the injected slowdown to dominate the fixed
    # per-step costs, hence more labels and a larger batch than the tiny config.
    return ("train.algorithm=adaptive", "hetero.slowdown={1: 2.0}", f"adaptive.policy={policy}",
            "data.synth.n_train=16000", "data.synth.n_labels=4000", "model.hidden=[128]",
            "train.epochs=4", "train.window_samples=4096", "train.batch_size=256",
            "adaptive.b_min=32", "adaptive.step=32", "train.eval_every=4", "optim.lr=0.5", *extra)


# One adaptive run for the learning-rate, merge-weight and normalization rules (issue 20): a
# warm-up epoch of three, then batch sizes that differ (rank 1 slowed), learning rates scaled
# by them and decaying, merge weights from the rows each rank took, tilted while the weights'
# L2 norm shrinks between evaluations (one after every window). Without weight decay the norm
# only grew here; with 0.003 it fell during warm-up and at times later, and grew otherwise.
RULES = ("train.algorithm=adaptive", "hetero.slowdown={1: 3.0}", "train.epochs=3",
         "train.eval_every=0.25", "adaptive.warmup_epochs=1", "adaptive.lr_decay=0.5",
         "adaptive.lr_scaling=linear", "adaptive.weights=rows", "adaptive.norm_mode=shrink",
         "optim.weight_decay=0.003")

# Fixed per-step costs (a third of a 256-row step here) put the balance point near batch 64 for
# the slow rank. Windows of 8,192 rows hold ~25 batches a rank, so one batch more or less is 4%;
# 6 epochs of 2 full windows leave time to settle.
PROPORTIONAL = ("train.epochs=6", "train.window_samples=8192", "data.synth.n_train=16384",
                "adaptive.smoothing=0.25")
RUNS = {
    "proportional": _balance_sets("proportional", *PROPORTIONAL),
    "additive": _balance_sets("additive"),
    # Without one-sided MPI the window is split by the speeds measured in earlier windows:
    # with rank 1 slowed 2x (batch sizes pinned) the fast rank must take clearly more rows.
    "static": ("train.algorithm=adaptive", "adaptive.scheduler=static", "hetero.slowdown={1: 2.0}",
               "data.synth.n_labels=3000", "train.batch_size=128", "adaptive.b_min=128",
               "train.window_samples=1024", "train.epochs=2", "train.eval_every=2"),
    "rules": RULES,
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The module's adaptive runs, one after another in one 2-rank job: {name: run folder}."""
    root = tmp_path_factory.mktemp("adaptive_runs")
    train_many(2, {name: (root / name, sets) for name, sets in RUNS.items()})
    return {name: root / name for name in RUNS}


def _balance(run):
    """A balance run's batch counts per full window and rank, and its batch sizes per window."""
    rounds = records(run, "round")
    for rec in rounds:  # merge weights are the shares of the window's batches (norm_mode off)
        counts = np.array([r["batches"] for r in rec["ranks"]], float)
        assert [r["weight"] for r in rec["ranks"]] == pytest.approx(counts / counts.sum(), abs=1e-5)
    window = json.loads((run / "config.json").read_text())["train"]["window_samples"]
    full = [rec for rec in rounds if sum(r["samples"] for r in rec["ranks"]) == window]
    counts = np.array([[r["batches"] for r in rec["ranks"]] for rec in full], float)
    sizes = [[r["batch_size"] for r in rec["ranks"]] for rec in rounds]
    return counts, sizes


def test_batch_sizes_balance_update_counts_under_a_2x_slowdown(runs):
    counts, sizes = _balance(runs["proportional"])
    assert sizes[-1][1] < sizes[-1][0], f"slow rank kept a batch as large as the fast one: {sizes}"
    # Judge the last six windows together, leaving out the most unbalanced one: a shared
    # machine's hiccup can stall one rank for a whole window now and then.
    tail = counts[-6:]
    gaps = np.abs(tail[:, 0] - tail[:, 1]) / tail.max(axis=1)
    kept = np.delete(tail, np.argmax(gaps), axis=0).sum(axis=0)
    # One window's gap is noisy (0-50% here: ~25 batches a rank, and a stall shifts several),
    # but summed over five windows (~125 batches a rank) the counts agree closely: six
    # repeated runs on this 2-core machine ended at 1.6-3.1%, so 15% leaves room for noise
    # and still fails when the slow rank keeps a batch size that does not match its speed
    # (sizes pinned at 256 by adaptive.b_min=256 under the 2x slowdown: 62%, checked once).
    assert abs(kept[0] - kept[1]) / kept.max() <= 0.15, (counts.tolist(), sizes)


def test_additive_rule_moves_batch_sizes_toward_balance(runs):
    # The papers' rule moves a batch by one step whenever the shares differ, so counts keep
    # oscillating by about a step around the balance point (docs/algorithms.md; near batch 64
    # a step of 32 is half the batch): check the direction and that the gap narrowed.
    counts, sizes = _balance(runs["additive"])
    slow = [s[1] for s in sizes]
    assert slow[:4] == sorted(slow[:4], reverse=True) and slow[3] < slow[0], sizes
    gaps = np.abs(counts[:, 0] - counts[:, 1]) / counts.max(axis=1)
    assert np.median(gaps[-5:]) < gaps[0], (counts.tolist(), sizes)
    assert np.mean(slow[-5:]) < 0.6 * np.mean([s[0] for s in sizes[-5:]]), sizes


def test_static_scheduler_follows_measured_speed(runs):
    rounds = records(runs["static"], "round")
    rows = np.array([[r["samples"] for r in rec["ranks"]] for rec in rounds], float)
    assert list(rows.sum(axis=1)) == [1024, 2000 - 1024] * 2  # every row once
    # Each window is split by the rates (rows / compute s) measured in the earlier ones,
    # smoothed by halves. Recomputed from the records (compute_s rounded to 0.1 ms: a row or
    # two), the split must be that one exactly, whatever the machine's noise made the rates.
    compute = np.array([[r["compute_s"] for r in rec["ranks"]] for rec in rounds], float)
    rate = rows / compute
    speed = rate[0]
    for k in range(1, len(rounds)):
        want = rows[k].sum() * speed / speed.sum()
        assert np.abs(rows[k] - want).max() <= 3, (k, rows.tolist(), compute.tolist())
        speed = 0.5 * speed + 0.5 * rate[k]
    # Rank 1's computation is slowed 2x: once its rates count, the fast rank takes clearly more.
    assert rate[1:, 0].sum() > 1.4 * rate[1:, 1].sum(), compute.tolist()
    assert rows[-1, 0] > 1.3 * rows[-1, 1], rows.tolist()


MERGES = {2: ["plain", "momentum", "dense_sampled", "float16", "rowwise", "overlap"],
          3: ["row_norm", "sampled", "chunked", "overlap_sampled"]}


@pytest.fixture(scope="module")
def merges():
    """algorithms_merge_ranks.py's modes, one job per rank count (each job runs its modes in turn)."""
    return {n: mpirun(n, ["tests/mpi/ranks/algorithms_merge_ranks.py", *modes], timeout=300)
            for n, modes in MERGES.items()}


@pytest.mark.parametrize("mode,ranks", [(m, n) for n, modes in MERGES.items() for m in modes])
def test_adaptive_merge_follows_its_rule_window_by_window(merges, mode, ranks):
    """Sparse and dense merges (on 2 and 3 real ranks) against the rule computed in numpy."""
    p = merges[ranks]
    assert f"merge ok ({mode})" in p.stdout and p.returncode == 0, explain(p)


@pytest.fixture(scope="module")
def rules_run(runs):
    run = runs["rules"]
    return run, json.loads((run / "config.json").read_text())


def test_each_ranks_learning_rate_follows_warm_up_decay_and_its_batch_size(rules_run):
    run, cfg = rules_run
    a, lr0 = cfg["adaptive"], cfg["optim"]["lr"]
    b_max, warmup = a["b_max"] or cfg["train"]["batch_size"], a["warmup_epochs"]
    start = 0.0  # epochs done when the window began: the rate is set from there
    seen = {"ramp": 0, "decay": 0, "sizes differ": 0}
    for rec in records(run, "round"):
        sizes = [r["batch_size"] for r in rec["ranks"]]
        for r in rec["ranks"]:
            if start < warmup:  # warm-up ends after the window that reaches warmup_epochs
                assert r["batch_size"] == a["b_warm"], rec
                want = balance.warmup_lr(lr0, a["b_warm"], b_max, start, warmup)
            else:
                want = balance.adaptive_lr(lr0, r["batch_size"], b_max, start, warmup, a["lr_decay"])
            assert r["lr"] == pytest.approx(want, rel=1e-6), (rec["round"], r["rank"], start, sizes)
        seen["ramp"] += 0 < start < warmup
        seen["decay"] += start > warmup
        seen["sizes differ"] += len(set(sizes)) > 1
        start = rec["epoch"]  # the next window starts where this one ended
    assert all(seen.values()), seen  # every part of the rule was exercised


def test_merge_weights_are_row_shares_tilted_while_the_weight_norm_shrinks(rules_run):
    run, cfg = rules_run
    factor = cfg["adaptive"]["norm_factor"]
    prev, boost, compared = None, False, False
    seen = {"boosted": 0, "not boosted after a rise": 0, "rows differ from batches": 0}
    for rec in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()):
        if rec["event"] == "eval":  # norm_mode shrink: boost the next merges if the norm fell
            compared = prev is not None
            boost = compared and rec["weight_norm"] < prev
            prev = rec["weight_norm"]
        elif rec["event"] == "round":
            rows = np.array([r["samples"] for r in rec["ranks"]], float)
            batches = np.array([r["batches"] for r in rec["ranks"]], float)
            shares = rows / rows.sum()
            assert [r["share"] for r in rec["ranks"]] == pytest.approx(shares, abs=1e-4), rec
            want = balance.merge_weights(shares, boost, factor)
            assert [r["weight"] for r in rec["ranks"]] == pytest.approx(want, abs=1e-5), (rec, boost)
            seen["boosted"] += boost
            seen["not boosted after a rise"] += compared and not boost
            seen["rows differ from batches"] += bool(np.abs(shares - batches / batches.sum()).max() > 0.01)
    assert all(seen.values()), seen


def test_the_algorithm_hears_each_evaluations_weight_norm(rules_run):
    # The trainer hands the eval record's weight_norm to Algorithm.on_eval for every algorithm;
    # adaptive keeps the last one (its normalization trend), and so does its final checkpoint.
    from hvd_adaptive.train import checkpoint as ck

    run, _ = rules_run
    state, _ = ck.load(ck.find_latest(run / "checkpoints")[0])
    last = records(run, "eval")[-1]
    assert last["epoch"] == 3.0 and state["adaptive.prev_norm"] == pytest.approx(last["weight_norm"], abs=1e-4)
