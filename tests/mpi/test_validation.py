"""The best model kept and read (the model itself, or the running average of its weights), and
the early stop, on 2-rank runs on tiny data, most with half of its labels noise
(data.synth.label_noise 0.5: the validation P@1 falls and rises between evaluations); the
accuracy benchmark sets the kept model beside the tree."""
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hvd_adaptive.data import preset, synth_to_files
from hvd_adaptive.train import checkpoint as ck
from hvd_adaptive.train.trainer import kept_score, val_score
from tests.harness.mpirun import REPO, mpi_env, records, train, train_many
from tests.harness.trained_run import TINY, cli


@pytest.fixture(scope="module")
def runs(noisy_files, tmp_path_factory):
    """2-rank runs on the noisy noisy_files with a tenth of the training rows held out,
    evaluated every epoch: sync for 5 epochs ("keep") and 12 with a patience of 2 ("early"),
    sync for 6 with a checkpoint a round ("plateau": sync's steps do not depend on which rank
    is faster, so its validation curve, which must stop rising for a cut, is the same every time); and sync for 5 epochs evaluated
    every other with checkpoint.average, on the tiny data without noise ("average")."""
    root = tmp_path_factory.mktemp("validation")
    train_txt, test_txt = noisy_files
    # The average's run: the tiny data without noise, at a rate where the model's validation
    # P@1 jumps between evaluations and the average wins the last by 6 of its 200 rows.
    clean_train, clean_test = synth_to_files(preset("eurlex4k", **TINY), root / "clean")
    data = (f"data.train={train_txt}", f"data.test={test_txt}", "data.validation=0.1",
            "train.eval_every=1")
    # The model alone competes for the keep in these two (checkpoint.average 0); "average" has
    # the weights' running average compete too, evaluated every other epoch, a checkpoint a round.
    spec = {"keep": (root / "keep", (*data, "train.epochs=5", "checkpoint.average=0")),
            "early": (root / "early", (*data, "train.epochs=12", "train.patience=2",
                                       "checkpoint.average=0")),
            "average": (root / "average", (
                f"data.train={clean_train}", f"data.test={clean_test}", "data.validation=0.1",
                "train.eval_every=2", "train.epochs=5", "optim.lr=3", "checkpoint.average=0.75",
                "checkpoint.every=1", "checkpoint.keep=100")),
            # Sync at a pinned rate, a checkpoint a round: the rate cut on a plateau. (Adaptive
            # SGD's shared counter hands rows to whichever rank comes first, so its curve
            # varied: once in a fresh-clone run it rose at every evaluation and nothing was cut.)
            "plateau": (root / "plateau", (*data, "train.algorithm=sync", "train.epochs=6",
                                           "optim.plateau=0.5", "optim.plateau_epochs=1",
                                           "checkpoint.average=0", "checkpoint.every=1",
                                           "checkpoint.keep=100"))}
    return {name: (path, s) for (name, (path, _)), s in zip(spec.items(), train_many(2, spec).values())}


def test_the_best_model_is_kept_and_read_by_default(runs, noisy_files, tmp_path):
    run_dir, summary = runs["keep"]
    evals = records(run_dir, "eval")
    val = [val_score(e) for e in evals]
    best = int(np.argmax(val))
    assert best < len(evals) - 1 and val[-1] < val[best], (
        f"the run's validation score must fall after its best for this test to mean anything: {val}")
    assert summary["kept"]["epoch"] == evals[best]["epoch"]
    kept = list((run_dir / "checkpoints" / "best").iterdir())
    assert [p.name for p in kept] == [f"ckpt-{4 * (best + 1)}"]  # 4 rounds an epoch
    _, test_txt = noisy_files
    p = cli("evaluate", run_dir, "--data", test_txt, "--out", tmp_path / "best.json")
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads((tmp_path / "best.json").read_text())
    assert "checkpoints/best/" in got["checkpoint"]
    for k in ("p_at_1", "p_at_5", "psp_at_5"):  # the best evaluation's model, not the last's
        assert got["metrics"][k] == pytest.approx(evals[best][k], abs=1e-5), k
    p = cli("evaluate", run_dir, "--data", test_txt, "--checkpoint", "last",
            "--out", tmp_path / "last.json")
    assert p.returncode == 0, p.stderr[-3000:]
    last = json.loads((tmp_path / "last.json").read_text())
    assert last["metrics"]["p_at_1"] == pytest.approx(evals[-1]["p_at_1"], abs=1e-5)
    assert last["checkpoint"].endswith("checkpoints/ckpt-20")


def test_the_weights_average_is_sampled_saved_and_kept_where_it_validates_better(runs, noisy_files,
                                                                                 tmp_path):
    """The average in the run's last checkpoint is the running average (half-life 0.75 epochs)
    of the models its checkpoints hold at the rounds where it was sampled: each evaluation, and
    between them the first round 0.75 epochs or more after the last sample. The kept model
    is the first best of the model and the average by validation score, and `evaluate` reads it."""
    run_dir, summary = runs["average"]
    rounds, evals = records(run_dir, "round"), records(run_dir, "eval")
    at_eval = {e["epoch"] for e in evals}
    samples, last = [], None
    for r in rounds:  # the round record r is followed by checkpoint ckpt-(r + 1)
        e = r["epoch"]
        if e in at_eval or (last is not None and e - last >= 0.75):
            samples.append((e, r["round"] + 1))
            last = e
    assert len(samples) > len(evals), samples  # samples between evaluations were taken
    ckpts = run_dir / "checkpoints"
    avg, checked = None, 0
    for i, ((e, n), prev) in enumerate(zip(samples, [None] + samples[:-1])):
        state, _ = ck.load(ckpts / f"ckpt-{n}")
        w = [np.asarray(state[k], np.float64) for k in ck.indexed_keys(state, ck.MODEL)]
        keep = 0.0 if prev is None else 0.5 ** ((e - prev[0]) / 0.75)
        avg = w if avg is None else [keep * a + (1 - keep) * x for a, x in zip(avg, w)]
        if abs(state["trainer.average_at"] - e) > 1e-3:  # only the final evaluation, after the loop's
            assert i == len(samples) - 1, (e, state["trainer.average_at"])  # last checkpoint
            continue
        saved = [state[k] for k in ck.indexed_keys(state, "trainer.average.")]
        assert len(saved) == len(avg)
        for a, b in zip(saved, avg):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)  # epochs recorded to 4 places
        checked += 1
    assert checked >= len(samples) - 1
    # Kept: the first evaluation of the highest of the two validation scores.
    score = [max(val_score(e), val_score(e, "avg_val_")) for e in evals]
    best = evals[int(np.argmax(score))]
    kept = summary["kept"]
    assert kept["epoch"] == best["epoch"] and val_score(kept) == max(score)
    model = "average" if val_score(best, "avg_val_") > val_score(best) else "trained"
    assert kept["model"] == model and (best.get("kept") == "average") == (model == "average")
    assert any(e.get("kept") == "average" for e in evals), (
        f"the average must win an evaluation for this test to mean anything: {evals}")
    best_dir = run_dir / "checkpoints" / "best"
    (only,) = best_dir.iterdir()
    state, _ = ck.load(only)
    assert state["best.model"] == model and state["best.epoch"] == best["epoch"]
    test_txt = run_dir.parent / "clean" / "test.txt"
    p = cli("evaluate", run_dir, "--data", test_txt, "--out", tmp_path / "kept.json")
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads((tmp_path / "kept.json").read_text())["metrics"]
    for k in ("p_at_1", "p_at_5", "psp_at_5"):
        assert got[k] == pytest.approx(kept[k], abs=1e-5), k


def cut_back(run_dir, cut, round_: int):
    """A copy of the run folder `run_dir` at `cut` without its checkpoints after round `round_`
    (its best model and records left as they are); returns it and the last round it had."""
    shutil.copytree(run_dir, cut)
    last = max(int(p.name.split("-")[1]) for p in (cut / "checkpoints").glob("ckpt-*"))
    for n in range(round_ + 1, last + 1):
        shutil.rmtree(cut / "checkpoints" / f"ckpt-{n}")
    return cut, last


def test_a_resumed_run_goes_on_with_the_average_it_saved(runs, tmp_path):
    """The "average" run cut back to its checkpoint after round 9 (between its first evaluation
    and the next sample) and resumed ends with the average the uninterrupted run saved last."""
    run_dir, _ = runs["average"]
    cut, last = cut_back(run_dir, tmp_path / "cut", 9)
    assert ck.load(cut / "checkpoints" / "ckpt-9")[0]["trainer.average_at"] == pytest.approx(2.0, abs=1e-3)
    train(2, cut, "checkpoint.resume=auto", config=str(cut / "config.json"))
    assert len(records(cut, "resume")) == 1
    want, _ = ck.load(run_dir / "checkpoints" / f"ckpt-{last}")
    got, _ = ck.load(cut / "checkpoints" / f"ckpt-{last}")
    assert got["trainer.average_at"] == want["trainer.average_at"]
    keys = ck.indexed_keys(want, "trainer.average.")
    assert keys and keys == ck.indexed_keys(got, "trainer.average.")
    for k in keys:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_a_resumed_run_keeps_a_later_best_it_does_not_pass(runs, tmp_path):
    """The "average" run cut back to its checkpoint after round 9 with its best model (kept at
    its last evaluation, epoch 5) left in place under an early round's name (ckpt-1, so that
    the folders' numbering, which keeps the newest, cannot decide), resumed to end at epoch 4:
    the evaluation there passes every one the checkpoint holds but not the kept best, so the
    best stays (the resumed run reads the kept score back, best.val_score)."""
    run_dir, _ = runs["average"]
    cut, _ = cut_back(run_dir, tmp_path / "cut", 9)
    best = ck.newest(cut / "checkpoints" / "best").rename(cut / "checkpoints" / "best" / "ckpt-1")
    kept, _ = ck.load(best)
    assert kept["best.epoch"] > 4, kept["best.epoch"]  # kept after the end of the resumed run
    # the score it was kept by, as the run's evaluations record it (not another figure)
    assert kept["best.val_score"] == pytest.approx(max(kept_score(e) for e in records(run_dir, "eval")), abs=1e-4)
    train(2, cut, "checkpoint.resume=auto", "train.epochs=4", config=str(cut / "config.json"))
    rows = [json.loads(line) for line in (cut / "metrics.jsonl").read_text().splitlines()]
    since = next(i for i, r in enumerate(rows) if r["event"] == "resume")
    before = max(kept_score(e) for e in ck.load(cut / "checkpoints" / "ckpt-9")[0]["trainer.evals"])
    scores = [kept_score(r) for r in rows[since:] if r["event"] == "eval"]
    assert scores and before < max(scores) < kept["best.val_score"], (
        f"the resumed run must pass its checkpoint's evaluations and stay below the kept best "
        f"for this test to mean anything: {before}, {scores}, {kept['best.val_score']}")
    (still,) = (cut / "checkpoints" / "best").iterdir()
    assert still.name == best.name
    state, _ = ck.load(still)
    assert state["best.epoch"] == kept["best.epoch"] and state["best.val_score"] == kept["best.val_score"]


def test_the_early_stop_stops_after_its_patience(runs):
    run_dir, summary = runs["early"]
    val = [val_score(e) for e in records(run_dir, "eval")]
    best = int(np.argmax(val))
    assert len(val) == best + 1 + 2, val  # two evaluations without gain, then no more
    assert summary["final"]["epoch"] < 12
    assert val_score(summary["kept"]) == max(val)


def test_a_fresh_run_in_the_folder_drops_the_old_best(runs, tmp_path):
    run_dir, _ = runs["keep"]
    again = tmp_path / "again"
    shutil.copytree(run_dir, again)
    assert (again / "checkpoints" / "best").is_dir()
    summary = train(2, again, "train.epochs=1")  # the tiny synthetic data, no split
    assert summary["kept"] is None
    assert not (again / "checkpoints" / "best").exists()
    assert [p.name for p in (again / "checkpoints").iterdir()] == ["ckpt-4"]


def test_the_accuracy_benchmark_sets_the_kept_model_beside_the_tree(noisy_files, tmp_path):
    train_txt, test_txt = noisy_files
    p = subprocess.run([sys.executable, "-m", "hvd_adaptive.bench.accuracy", "--config", "configs/tiny.yaml",
                        "--name", "t", "--seeds", "1", "--first-seed", "1", "--epochs", "4", "--eval-every", "1",
                        "--validation", "0.1", "--set", f"data.train={train_txt}",
                        "--set", f"data.test={test_txt}", "--out", str(tmp_path), "--tree-method", "br"],
                       cwd=REPO, env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    saved = json.loads((tmp_path / "accuracy-t.json").read_text())
    assert saved["tree_method"] == "br" and "beside napkinXC's BR" in p.stdout
    assert saved["code"].startswith(f"code: {REPO / 'hvd_adaptive'}"), saved["code"]  # what ran
    (row,) = saved["rows"]
    assert row["seed"] == 1  # --first-seed: seed 1's run (train.seed 1, model.init_seed 2)
    config = json.loads((tmp_path / "t-r1" / "config.json").read_text())
    assert (config["train"]["seed"], config["model"]["init_seed"]) == (1, 2)
    evals = records(tmp_path / "t-r1", "eval")
    best = max(evals, key=kept_score)  # the first
    kept = "average" if best.get("kept") == "average" else "trained"  # the model or its average
    assert row["kept_model"] == kept
    assert row["kept_p1"] == best["avg_p_at_1" if kept == "average" else "p_at_1"]
    assert row["best_p1"] == max(e["p_at_1"] for e in evals)
    assert row["gap_points"] == pytest.approx(100 * (row["best_p1"] - row["kept_p1"]), abs=0.01)
    tree = json.loads((tmp_path / "t-r1" / "trees.json").read_text())
    assert row["tree_p1"] == tree["metrics"]["p_at_1"] and tree["train_rows"] == 1800
    assert tree["model"] == "BR"  # --tree-method reached `hvd-adaptive trees`
    reached = [e["wall_s"] for e in evals if e["p_at_1"] >= row["tree_p1"]]
    assert row["net_s_to_tree_p1"] == (reached[0] if reached else None)


def _rates_in_force(run_dir) -> list[tuple[float, float]]:
    """(the round's rate on every rank, the rate the records say is in force) per round: the
    start's, or the one the last evaluation before the round left (its "lr")."""
    start = (records(run_dir, "start") or records(run_dir, "resume"))[0]["lr"]
    evals = records(run_dir, "eval")
    out = []
    for r in records(run_dir, "round"):
        before = [e for e in evals if e["epoch"] < r["epoch"]]
        force = before[-1]["lr"] if before else start
        out += [(k["lr"], force) for k in r["ranks"]]
    return out


def test_the_rate_is_cut_where_validation_stops_rising_and_a_resumed_run_keeps_the_cut(runs, tmp_path):
    """optim.plateau 0.5 after 1 epoch, on evaluations an epoch apart: every evaluation whose
    validation P@1 is no higher than an earlier one halves the rate, and the rounds after it
    train at the halved rate; resumed from a checkpoint after a cut, the run goes on at it."""
    run_dir, _ = runs["plateau"]
    start = records(run_dir, "start")[0]
    assert start["lr_plateau"] == {"factor": 0.5, "epochs": 1.0} and start["lr"] == 1.5
    evals = records(run_dir, "eval")
    val, rate, cuts = [], 1.5, []
    for e in evals:
        cut = bool(val) and e["val_p_at_1"] <= max(val)
        val.append(e["val_p_at_1"])
        rate *= 0.5 if cut else 1.0
        assert e.get("lr_cut", False) == cut and e["lr"] == pytest.approx(rate), (e, val)
        cuts += [e["epoch"]] if cut else []
    assert cuts and cuts[0] < evals[-1]["epoch"], (
        f"the run must cut before its last evaluation for this test to mean anything: {val}")
    for got, force in _rates_in_force(run_dir):
        assert got == pytest.approx(force)
    # By default (optim.plateau 1) nothing is cut, though the "keep" run's P@1 falls too.
    keep_dir, _ = runs["keep"]
    start = records(keep_dir, "start")[0]
    assert start["lr_plateau"] is None
    assert all(e["lr"] == start["lr"] and "lr_cut" not in e for e in records(keep_dir, "eval"))
    # Cut back to two rounds after the first cut (4 rounds an epoch) and resumed.
    again = tmp_path / "again"
    shutil.copytree(run_dir, again)
    keep = int(round(4 * cuts[0])) + 2
    for p in (again / "checkpoints").glob("ckpt-*"):
        if int(p.name.split("-")[1]) > keep:
            shutil.rmtree(p)
    train(2, again, "checkpoint.resume=auto", config=str(again / "config.json"))
    (resume,) = records(again, "resume")
    assert resume["round"] == keep
    after = [r for r in records(again, "round") if r["round"] >= keep]
    assert after and all(k["lr"] < 1.5 for k in after[0]["ranks"])
    for got, force in _rates_in_force(again):
        assert got == pytest.approx(force)
