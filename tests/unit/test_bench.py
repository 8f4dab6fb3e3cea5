"""The benchmark's table: medians over repeats, time to target interpolated as the report does,
missing values as "-", the limit from the scenario's standalone rates; and its contenders come
from the one registry of algorithms and write no model."""
from pathlib import Path

import pytest

from hvd_adaptive.train.algorithms import ALGORITHMS
from hvd_adaptive.bench.measure import limits, measures
from hvd_adaptive.bench.speed import CONTENDERS, scenario_list, scenario_sets, skip_reason, table, train_args


def run(p1s, compute_s, rates=(60.0, 40.0), probe=None):
    """One run's summary, evaluations (one second and 100 rows apart) and start record (the
    rate probe's seconds, or a pinned rate)."""
    evals = [{"p_at_1": p, "wall_s": i + 1.0, "samples": 100 * (i + 1)} for i, p in enumerate(p1s)]
    per_rank = [{"compute_s": compute_s, "comm_s": 1.0, "sync_s": 0.0, "wait_s": 0.0, "batch_s": 0.0,
                 "standalone_rate": r} for r in rates]
    return {"summary": {"per_rank": per_rank, "efficiency": 0.5, "final": {"p_at_1": p1s[-1]}},
            "evals": evals, "start": {"lr_choice": None if probe is None else {"seconds": probe},
                                      "lr": 0.1}}


def test_table_medians_ratio_limit_and_missing_values():
    results = {"even": {"sync": [run([0.2, 0.5], 1.0, probe=0.5),
                                 run([0.2, 0.3, 0.5], 1.0, rates=(80, 40), probe=0.7),
                                 run([0.5], 1.0, probe=0.6)],
                        "adaptive": [run([0.4], 3.0, rates=(20, 40))],
                        "local": [run([0.5], 1.0), run([0.2, 0.5], 1.0), run([0.1, 0.2, 0.3, 0.5], 1.0)]}}
    lines = table(results, 0.45).splitlines()
    assert "medians over 3 repeat(s)" in lines[1]
    # per rank the median over all seven runs (60, 80, 60, 20, 60, 60, 60 and seven 40s: 60 and
    # 40 rows/s, where the mean would say 57); the runs' sums 60 to 120
    assert "standalone rows/s per rank (median of the scenario's runs): 60, 40; sum 100" in lines[2]
    assert "(runs spread 100%)" in lines[2]
    # sync's rows to 0.45: 183, 275, 100 -> median 183 at 100 rows/s: 1.83 s
    assert "limit 1.8 s to target" in lines[2]
    assert "ref/this: sync's time to the target over the contender's, per seed" in lines[3]
    assert "q1: the lower quartile of the seeds' ratios; probe: optim.lr auto's seconds" in lines[4]
    assert lines[5].split() == ["contender", "s->target", "range", "probe", "rows->tgt", "rows/s",
                                "effic.", "ref/this", "range", "q1", "of_limit", "of_lim-pr", "compute",
                                "comm", "allgat", "wait", "batch"]
    # sync: 1.83 s (1.0 to 2.75 over the seeds), its probe 0.6 s (median of 0.5, 0.7, 0.6), 183
    # rows, 100 rows/s -> efficiency 1.00 of the sum, and at the limit; the probe left out of
    # each seed's time, 1.83 / (1.83 - 0.5), 1.83 / (2.75 - 0.7), 1.83 / (1.0 - 0.6): median 1.38
    assert lines[6].split()[:12] == ["sync", "1.8", "1.0-2.8", "0.6", "183", "100", "1.00", "1.00",
                                     "1.00-1.00", "1.00", "1.00", "1.38"]
    # adaptive never reached the target: no time, rows, rate, efficiency, ratio or fraction;
    # its rate was pinned: no probe
    assert lines[7].split() == ["adaptive", "-", "(0/1)", "-", "-", "-", "-", "-", "-", "-", "-", "-",
                                "0.75", "0.25", "0.00", "0.00", "0.00"]
    # local against sync seed by seed: 1.83 / 1.0, 2.75 / 1.83, 1.0 / 3.75 -> median 1.50; the
    # lower quartile halfway between the lowest two, 0.27 and 1.50
    assert lines[8].split()[7:10] == ["1.50", "0.27-1.83", "0.88"]
    # then each seed's time and the rate it trained at, in the order of the seeds
    assert lines[9] == "  per seed, in the order of the seeds: seconds to the target (learning rate)"
    assert lines[10].split() == ["sync", "1.8", "(0.1)", "2.8", "(0.1)", "1.0", "(0.1)"]
    assert lines[11].split() == ["adaptive", "-", "(0.1)"]
    assert lines[12].split()[:3] == ["local", "1.0", "(0.1)"]


def test_limit_of_a_time_varying_scenario_sums_its_phases():
    runs = {"sync": [run([0.2, 0.3, 0.4, 0.5], 1.0, rates=(60, 40))]}
    # sync reaches 0.45 at 350 rows: 100 at full speed (100 rows/s), 200 with the last rank
    # 2x slower (60 + 20 = 80 rows/s), the last 50 at full speed again
    lim = limits(runs, 0.45, phases=[(100, 1.0), (300, 2.0), (float("inf"), 1.0)])
    assert lim["t"] == pytest.approx(100 / 100 + 200 / 80 + 50 / 100)


def test_scenarios_per_factor_and_schedule():
    assert scenario_list(["even", "slowed", "quota", "vary"], [1.25, 2.0]) == [
        ("even", 1.25), ("slowed", 1.25), ("slowed", 2.0), ("quota", 1.25), ("quota", 2.0), ("vary", 1.25)]
    assert scenario_list(["slowed", "quota"], [1.25, 2.0], [2.0]) == [
        ("slowed", 1.25), ("slowed", 2.0), ("quota", 2.0)]
    label, sets = scenario_sets("vary", 2, 2.0, (0.2, 0.4))
    assert "from epoch 0.200 to 0.400" in label
    assert sets == ["hetero.schedule=[{from_epoch: 0.2000, slowdown: {1: 2.0}}, "
                    "{from_epoch: 0.4000, slowdown: {}}]"]


def test_every_algorithm_is_a_contender():
    assert all(CONTENDERS[name] == [f"train.algorithm={name}"] for name in ALGORITHMS)
    assert {"sync_prop", "adaptive_paper"} <= set(CONTENDERS)
    from hvd_adaptive.config import load_config
    for name, sets in CONTENDERS.items():  # every contender's overrides are valid keys
        load_config(None, sets)
    # The published algorithm: none of the project's additions to the merge or the rate.
    a = load_config(None, CONTENDERS["adaptive_paper"])[0].adaptive
    assert (a.opt_state, a.row_norm, a.label_norm, a.lr_scaling) == ("local", False, False, "linear")


def test_contenders_write_no_model_unless_the_user_sets_it():
    from hvd_adaptive.config import load_config

    def used(sets):
        args = train_args("configs/bench_quick.yaml", sets, Path("runs/x"))
        return load_config(args[args.index("--config") + 1],
                           [args[i + 1] for i, a in enumerate(args) if a == "--set"])[0]
    assert used(CONTENDERS["adaptive"]).checkpoint.keep == 0
    assert used(CONTENDERS["adaptive"]).train.algorithm == "adaptive"
    assert used(["checkpoint.keep=2"]).checkpoint.keep == 2  # a --set of the user's wins


def test_scaling_profiles_points_and_table(tmp_path):
    from hvd_adaptive.bench import scaling

    assert scaling.profile_cores("equal", 4, 0.25) == [0.25] * 4
    assert scaling.profile_cores("half", 8, 0.25) == [0.25] * 4 + [0.125] * 4
    assert scaling.profile_cores("half", 1, 0.25) == [0.25]
    assert scaling.profile_sets("half", 2, 0.5)[1] == ["hetero.cores=[0.5, 0.25]", "hetero.mode=cpu_quota",
                                                       "train.threads=1"]
    # one rank once (sync alone), then every profile at every larger count
    assert scaling.points(["equal", "half"], [1, 2, 4]) == [("equal", 1), ("equal", 2), ("equal", 4),
                                                          ("half", 2), ("half", 4)]
    one = run([0.2, 0.5], 1.0, rates=(100.0,))  # 0.45 at 1.83 s, 183 rows
    one["summary"]["per_rank"][0]["peak_rss_mb"] = 500.0
    two = run([0.5], 1.0, rates=(100.0, 100.0))  # 0.45 at 1.0 s, 100 rows
    two["summary"]["per_rank"][1]["peak_rss_mb"] = 520.0
    ref2 = [run([0.2, 0.5], 1.0, rates=(100.0, 100.0)), run([0.2, 0.2, 0.5], 1.0, rates=(100.0, 100.0))]
    slow = run([0.2, 0.2, 0.2, 0.5], 1.0, rates=(100.0, 100.0))  # 3.83 s, 383 rows
    slow["summary"]["per_rank"][0]["peak_rss_mb"] = 540.0
    # one rank ran the reference only; the speedups are over it
    data = scaling.rows({("equal", 1): {"horovod": [one]},
                         ("equal", 2): {"horovod": ref2, "adaptive": [two, slow]}}, 0.45, "horovod")
    got = {(r["ranks"], r["contender"]): r for r in data}
    ada = got[(2, "adaptive")]
    assert ada["speedup"] == pytest.approx(1.8333 / 2.4167, rel=1e-3)  # median of 1.0 and 3.83 s
    assert got[(1, "horovod")]["speedup"] == pytest.approx(1.0)
    assert ada["ceiling"] == pytest.approx(2.0)  # 200 rows/s over one rank's 100
    assert ada["rows_x"] == pytest.approx(241.67 / 183.33, rel=1e-3)  # median of 100 and 383 rows
    assert ada["peak_mb"] == 530.0  # the median over seeds of the largest rank's
    assert ada["comm"] == pytest.approx(0.5)  # comm 1 s of 2 s per rank
    # seed by seed: horovod 1.83 s over 1.0 s, 2.83 s over 3.83 s
    assert ada["ratio"] == pytest.approx((1.8333 + 2.8333 / 3.8333) / 2, rel=1e-3)
    assert ada["ratio_range"] == "0.74-1.83"
    assert got[(2, "horovod")]["ratio"] == pytest.approx(1.0)
    # the limit: horovod's median rows (233) at 200 rows/s, 1.17 s, over each seed's time
    assert ada["of_limit"] == pytest.approx((1.1667 + 1.1667 / 3.8333) / 2, rel=1e-3)
    lines = scaling.table(data).splitlines()
    assert lines[0].split()[:6] == ["profile", "ranks", "contender", "s->target", "range", "rows->tgt"]
    assert lines[1].split()[:3] == ["equal", "1", "horovod"]
    row = dict(zip(lines[0].split(), lines[3].split()))  # header names repeat ("range"): last wins
    assert (row["contender"], row["speedup"], row["ref/this"], row["range"]) == ("adaptive", "0.76", "1.29", "0.74-1.83")
    # a point the reference sat out (a sleep scenario): the limit takes sync's rows instead
    from hvd_adaptive.bench.measure import limits
    assert limits({"sync": ref2, "adaptive": [two]}, 0.45, reference="horovod")["t"] == pytest.approx(1.1667, rel=1e-3)
    # of_limit without the reference or sync at a point: no limit, "-"
    lone = scaling.rows({("equal", 2): {"adaptive": [two]}}, 0.45, "horovod")
    assert lone[0]["of_limit"] is None and lone[0]["ratio"] is None
    scaling.save(data, 0.45, 0.25, tmp_path / "scaling.json")
    png = scaling.plot(tmp_path / "scaling.json", tmp_path / "s.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_scaling_figure_names_a_bad_file(tmp_path):
    from hvd_adaptive.bench import scaling
    from hvd_adaptive.bench.report import ReportError

    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ReportError, match="x.json: not a scaling.json"):
        scaling.plot(tmp_path / "x.json", tmp_path / "s.png")


def test_the_plain_horovod_script_is_a_contender_of_its_own():
    """`horovod` runs hvd_adaptive.bench.plain_horovod with the same config and overrides, sits out
    the sleep-mode scenarios (a plain script has no computation spans to slow), and shows no
    time breakdown rather than zeros."""
    args = train_args("configs/tiny.yaml", ["train.epochs=2"], Path("runs/x"), "horovod")
    assert args == ["-m", "hvd_adaptive.bench.plain_horovod", "--config", "configs/tiny.yaml", "--run-dir",
                    "runs/x", "--set", "checkpoint.keep=0", "--set", "train.epochs=2"]
    assert train_args("configs/tiny.yaml", [], Path("runs/x"), "sync")[:3] == ["-m", "hvd_adaptive.cli", "train"]
    assert all("plain script" in skip_reason("horovod", s) for s in ("slowed", "vary"))
    assert skip_reason("horovod", "even") is None and skip_reason("horovod", "quota") is None
    assert skip_reason("sync", "slowed") is None
    # A variant of it (--variant NAME=train.algorithm=horovod,...) runs the script too.
    sets = ["train.algorithm=horovod", "optim.lr=0.1"]
    assert train_args("configs/tiny.yaml", sets, Path("runs/x"), "horovod_lr")[:2] == [
        "-m", "hvd_adaptive.bench.plain_horovod"]
    assert train_args("configs/tiny.yaml", sets, Path("runs/x"), "horovod_lr")[-2:] == ["--set", "optim.lr=0.1"]
    assert skip_reason("horovod_lr", "slowed", sets) and not skip_reason("horovod_lr", "even", sets)
    r = run([0.2, 0.5], 1.0)
    for rank in r["summary"]["per_rank"]:
        for k in ("batch_s", "compute_s", "comm_s", "sync_s", "wait_s"):
            del rank[k]
    m = measures(r, 0.45)
    assert m["compute_s"] is None and m["comm_s"] is None and m["t"] == pytest.approx(1.8333, rel=1e-3)




def test_a_time_range_says_how_many_seeds_reached_the_target():
    from hvd_adaptive.bench.measure import time_span

    assert time_span([2.0, 1.0, 3.0]) == "1.0-3.0"
    assert time_span([2.0, None, 3.0]) == "2.0-3.0(2/3)"
    assert time_span([2.0, None]) == "(1/2)"
    assert time_span([None]) == "(0/1)"
    assert time_span([2.0]) is None
    # in the benchmark's table: a contender that missed the target in one seed of two
    results = {"even": {"sync": [run([0.2, 0.5], 1.0), run([0.5], 1.0)],
                        "adaptive": [run([0.5], 1.0), run([0.2, 0.3], 1.0)]}}
    row = next(line.split() for line in table(results, 0.45).splitlines() if line.startswith("adaptive"))
    assert row[1:3] == ["1.0", "(1/2)"]


def test_a_reference_that_is_not_a_contender_is_refused_before_any_run(tmp_path):
    from hvd_adaptive.bench.speed import main

    with pytest.raises(SystemExit, match="--reference adaptive_f16: not a contender of this run "
                                         r"\(sync, adaptive\)"):
        main(["--config", "configs/tiny.yaml", "--algorithms", "sync", "adaptive",
              "--reference", "adaptive_f16", "--target", "0.5", "--out", str(tmp_path / "b")])
    assert not (tmp_path / "b").exists()


def test_every_run_evaluates_on_the_benchmarks_grid_unless_a_set_item_says_otherwise(tmp_path):
    """--eval-every (0.05 epochs by default) goes first among every run's overrides: it replaces
    the config's train.eval_every (tiny.yaml's 2.0), a --set of the key still wins, and a grid
    of 0 is refused before any run. (tests/mpi/test_bench.py reads it back from the runs.)"""
    from hvd_adaptive.bench.speed import EVAL_EVERY, grid_sets, main
    from hvd_adaptive.config import load_config

    cfg, _ = load_config("configs/tiny.yaml", grid_sets(EVAL_EVERY, ["optim.lr=0.1"]))
    assert cfg.train.eval_every == EVAL_EVERY == 0.05 and cfg.optim.lr == 0.1
    cfg, _ = load_config("configs/tiny.yaml", grid_sets(0.5, ["train.eval_every=0.25"]))
    assert cfg.train.eval_every == 0.25
    with pytest.raises(SystemExit, match="--eval-every 0: must be above 0"):
        main(["--config", "configs/tiny.yaml", "--algorithms", "sync", "--target", "0.5",
              "--eval-every", "0", "--out", str(tmp_path / "b")])
    assert not (tmp_path / "b").exists()


def test_a_set_of_a_key_a_contender_sets_itself_is_refused_before_any_run(tmp_path):
    """A --set comes after a contender's own items and would replace them in every run (a
    variant's rate, sync_prop's partition): refused, naming the --set and the contender's item;
    a --set of keys no contender sets passes."""
    from hvd_adaptive.bench.speed import CONTENDERS, main, refuse_set_over_contender

    with pytest.raises(SystemExit, match=r"--set optim.lr=0.1: contender fast sets optim.lr=0.2 "
                                         r"itself, and the --set would replace it in every run; "
                                         r"set optim.lr in each --variant instead"):
        main(["--config", "configs/tiny.yaml", "--algorithms", "--variant",
              "fast=train.algorithm=sync,optim.lr=0.2", "--reference", "fast",
              "--set", "optim.lr=0.1", "--target", "0.5", "--out", str(tmp_path / "b")])
    assert not (tmp_path / "b").exists()
    with pytest.raises(SystemExit, match="contender sync_prop sets sync.partition=proportional"):
        refuse_set_over_contender({"sync_prop": CONTENDERS["sync_prop"]}, ["sync.partition=equal"])
    refuse_set_over_contender({"sync_prop": CONTENDERS["sync_prop"], "fast": ["optim.lr=0.2"]},
                              ["optim.eps=1e-7", "train.eval_every=0.1"])


def test_keep_rules_measure_how_far_each_validation_figure_picks_below_the_best():
    """bench.keep_rules: the gap is the best test P@1 less the test P@1 of the evaluation a rule
    picks, in points; neighbour averaging smooths a lone validation peak away."""
    from hvd_adaptive.bench.keep_rules import RULES, gap, latest_within_se_gap, table

    def ev(test, v1, v3, v5):
        return {"p_at_1": test, "val_p_at_1": v1, "val_p_at_3": v3, "val_p_at_5": v5}

    # validation P@1 peaks alone at the second evaluation (test 0.50); P@5 picks the third (0.52)
    evals = [ev(0.40, 0.40, 0.30, 0.20), ev(0.50, 0.60, 0.30, 0.20), ev(0.52, 0.55, 0.35, 0.30),
             ev(0.51, 0.54, 0.34, 0.29)]
    assert gap(evals, RULES["val P@1"]) == pytest.approx(2.0)
    assert gap(evals, RULES["val P@5"]) == pytest.approx(0.0)
    # the keep's own score (records.val_score, the mean of the three): 0.3, 0.367, 0.4, 0.39
    assert gap(evals, RULES["val P@1+P@3+P@5"]) == pytest.approx(0.0)
    # neighbours of val P@1: 0.50, 0.517, 0.563, 0.545 -> the third
    assert gap(evals, RULES["val P@1"], smooth=True) == pytest.approx(0.0)
    lines = table([evals, evals], over=1.0).splitlines()
    assert lines[1].split() == ["val", "P@1", "2", "2.00", "2.00", "2.00", "2"]
    assert lines[3].split() == ["val", "P@5", "2", "0.00", "0.00", "0.00", "0"]
    # The standard-error rule: at 50 validation rows the best 0.60 has a standard error of
    # 0.069, so 0.55 (the third) and 0.54 (the fourth, test 0.51) are near-ties: the fourth is
    # kept. At 10,000 rows (s.e. 0.005) neither is, and the rule keeps the second as val P@1 does.
    assert latest_within_se_gap(evals, 50) == pytest.approx(1.0)
    assert latest_within_se_gap(evals, 10_000) == pytest.approx(2.0)
    lines = table([evals, evals], over=0.5, val_rows=[50, 10_000]).splitlines()
    assert lines[-1].split()[-5:] == ["2", "1.50", "1.50", "2.00", "2"], lines[-1]


def _code_line_from(folder: Path) -> str:
    """code_line as a benchmark started with `python -m` from `folder` prints it."""
    import subprocess
    import sys
    src = "from hvd_adaptive.bench.measure import code_line; print(code_line())"
    p = subprocess.run([sys.executable, "-c", src], cwd=folder, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_the_code_line_names_the_package_the_runs_import_its_commit_and_changes(tmp_path):
    import shutil
    import subprocess

    import hvd_adaptive
    from hvd_adaptive.bench.measure import code_line

    # This checkout: its package folder and its commit.
    package = Path(hvd_adaptive.__file__).resolve().parent
    head = subprocess.run(["git", "-C", str(package.parent), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert code_line().startswith(f"code: {package} at commit {head}")
    # Another copy in the working folder is the one imported (ahead of the installed one), and
    # the line says so: first outside git, then committed, then with a file changed.
    other = tmp_path / "checkout"
    shutil.copytree(package, other / "hvd_adaptive",
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert _code_line_from(other) == f"code: {other / 'hvd_adaptive'} (not in a git checkout)"
    git = ["git", "-C", str(other), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "copy"], check=True)
    mine = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert _code_line_from(other) == f"code: {other / 'hvd_adaptive'} at commit {mine}"
    with open(other / "hvd_adaptive" / "__init__.py", "a") as f:
        f.write("# a patch\n")
    assert _code_line_from(other) == (f"code: {other / 'hvd_adaptive'} at commit {mine}, "
                                      "1 file(s) changed since")


def test_the_table_warns_when_few_evaluations_come_before_the_target():
    # Two evaluations below the target, then the one that reaches it: flagged, with the count.
    coarse = {"even": {"sync": [run([0.2, 0.3, 0.5], 1.0), run([0.1, 0.5], 1.0)],
                       "adaptive": [run([0.1, 0.2, 0.3, 0.5], 1.0)] * 2}}
    text = table(coarse, 0.45)
    warned = [line for line in text.splitlines() if "few evaluations before the target" in line]
    assert len(warned) == 1, text
    named = warned[0].split(";")[0]  # the contenders flagged, with their medians
    assert named.endswith("sync 1.5") and "adaptive" not in named, named
    assert "--eval-every" in warned[0]
    # Every contender with at least FEW_EVALS evaluations on the curve: no warning; nor for
    # runs that never reached the target (nothing interpolated).
    fine = {"even": {"sync": [run([0.1, 0.2, 0.3, 0.5], 1.0)], "local": [run([0.1, 0.2], 1.0)]}}
    assert "few evaluations" not in table(fine, 0.45)
