"""Report: reading run folders, time to target, the table, and a real PNG."""
import argparse
import json

import pytest

from hvd_adaptive.cli import main as cli_main
from hvd_adaptive.bench.measure import time_to_target
from hvd_adaptive.bench.report import default_target, format_table, main, table_rows
from hvd_adaptive.train.records import RecordsError, load_run, load_runs, read_metrics


def ev(wall, p1, epoch=1.0):
    return {"event": "eval", "wall_s": wall, "epoch": epoch, "samples": 100, "p_at_1": p1,
            "p_at_3": p1 / 2, "p_at_5": p1 / 3, "ndcg_at_1": p1, "ndcg_at_3": p1, "ndcg_at_5": p1}


def rnd(i, wall, batches, weights):
    return {"event": "round", "round": i, "epoch": 0.5 * (i + 1), "wall_s": wall, "samples": 64,
            "loss": 1.0, "ranks": [{"rank": k, "batch_size": b, "batches": 1, "samples": b,
                                    "compute_s": 0.1, "wait_s": 0.0, "weight": w, "lr": 0.1}
                                   for k, (b, w) in enumerate(zip(batches, weights))]}


def write_run(folder, records, summary=None, tail=""):
    folder.mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in records) + tail
    (folder / "metrics.jsonl").write_text(text)
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


START = {"event": "start", "algorithm": "adaptive", "ranks": 2}


def test_time_to_target_interpolates_up_to_the_first_eval_reaching_it():
    evals = [ev(1.0, 0.2), ev(2.0, 0.5), ev(3.0, 0.4), ev(4.0, 0.6)]
    assert time_to_target(evals, 0.5) == 2.0     # >=, and the first such one
    assert time_to_target(evals, 0.45) == pytest.approx(1.0 + 0.25 / 0.3)  # between 1 s and 2 s
    assert time_to_target(evals, 0.6) == pytest.approx(4.0)  # from the dip at 3 s
    assert time_to_target(evals, 0.1) == 1.0     # reached at the first evaluation
    assert time_to_target(evals, 0.61) is None
    assert time_to_target([], 0.1) is None


def test_reads_latest_run_and_skips_an_unfinished_last_line(tmp_path):
    old = [START, ev(1.0, 0.9)]
    new = [START, rnd(0, 0.5, [32, 64], [0.3, 0.7]), ev(1.0, 0.3), ev(2.0, 0.6)]
    run = load_run(write_run(tmp_path / "a", old + new, tail='{"event": "ev'))
    assert run.name == "a" and run.algorithm == "adaptive" and run.summary is None
    assert [e["p_at_1"] for e in run.evals] == [0.3, 0.6]   # the first run's record is dropped
    assert run.final["p_at_1"] == 0.6 and run.train_s == 0.5
    assert run.rounds[0]["ranks"][1]["batch_size"] == 64


def test_malformed_line_names_file_and_line(tmp_path):
    folder = write_run(tmp_path / "bad", [START], tail="not json\n" + json.dumps(ev(1, 0.1)) + "\n")
    with pytest.raises(RecordsError, match=r"bad/metrics.jsonl:2: not a JSON record"):
        read_metrics(folder / "metrics.jsonl")


def test_missing_folder_or_metrics_is_named(tmp_path):
    with pytest.raises(RecordsError, match=f"{tmp_path / 'nope'}: no such run folder"):
        load_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecordsError, match=f"{tmp_path / 'empty'}: no metrics.jsonl"):
        load_run(tmp_path / "empty")


def test_rows_prefer_summary_and_default_target(tmp_path):
    summary = {"algorithm": "sync", "efficiency": 0.8, "train_wall_s": 3.5,
               "final": ev(3.5, 0.7)}
    a = write_run(tmp_path / "x" / "run", [START, ev(1.0, 0.5), ev(3.0, 0.65), ev(3.5, 0.7)],
                  summary)
    b = write_run(tmp_path / "y" / "run", [START, ev(2.0, 0.4)])
    runs = load_runs([a, b])
    assert [r.name for r in runs] == ["x/run", "y/run"]  # clashing folder names get the parent
    target = default_target(runs)
    assert target == pytest.approx(0.9 * 0.7)
    rows = table_rows(runs, target)
    assert rows[0] == {"run": "x/run", "algorithm": "sync", "p_at_1": 0.7, "p_at_3": 0.35,
                       "p_at_5": pytest.approx(0.7 / 3), "psp_at_1": None, "psp_at_3": None,
                       "psp_at_5": None, "best_p_at_1": 0.7, "train_s": 3.5,
                       "time_to_target": pytest.approx(1.0 + 2.0 * (0.63 - 0.5) / 0.15),
                       "efficiency": 0.8}
    assert rows[1]["algorithm"] == "adaptive" and rows[1]["time_to_target"] is None
    assert rows[1]["efficiency"] is None and rows[1]["train_s"] == 2.0
    text = format_table(rows, target).splitlines()
    assert "s to P@1>=0.630" in text[0]
    assert text[2].split()[:3] == ["y/run", "adaptive", "0.4000"]
    assert text[2].split()[-2:] == ["-", "-"]


def test_no_evaluations_anywhere(tmp_path):
    runs = load_runs([write_run(tmp_path / "r", [START])])
    assert default_target(runs) is None
    row = table_rows(runs, None)[0]
    assert row["p_at_1"] is None and row["time_to_target"] is None
    assert format_table([row], None).splitlines()[1].split()[2:] == ["-"] * 7


def test_figure_is_a_png_and_table_is_printed(tmp_path, capsys):
    recs = [START, rnd(0, 0.5, [32, 32], [0.5, 0.5]), ev(0.5, 0.3),
            rnd(1, 1.0, [64, 32], [0.66, 0.34]), ev(1.0, 0.5)]
    a = write_run(tmp_path / "runs" / "adaptive", recs)
    b = write_run(tmp_path / "runs" / "sync", [dict(START, algorithm="sync"), ev(0.7, 0.45)])
    out = tmp_path / "fig" / "report.png"
    args = argparse.Namespace(runs=[str(a), str(b)], out=str(out), target=0.4)
    assert main(args) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[0] == "adaptive" and lines[1].split()[-2:] == ["0.8", "-"]  # 0.75 s, interpolated
    assert lines[2].split()[0] == "sync" and lines[2].split()[-2] == "0.7"


def test_cli_errors_exit_2(tmp_path, capsys):
    assert cli_main(["report", str(tmp_path / "gone"), "--out", str(tmp_path / "r.png")]) == 2
    assert f"{tmp_path / 'gone'}: no such run folder" in capsys.readouterr().err
    run = write_run(tmp_path / "r", [START, ev(1, 0.5)])
    assert cli_main(["report", str(run), "--out", str(tmp_path / "r.png"), "--target", "5"]) == 2
    assert "--target" in capsys.readouterr().err
    assert cli_main(["report", str(run), "--out", str(tmp_path / "r.pdf")]) == 2
    assert "PNG" in capsys.readouterr().err
    assert cli_main(["report", "--out", str(tmp_path / "r.png")]) == 2
    assert "give one or more run folders (or --scaling FILE)" in capsys.readouterr().err
    assert cli_main(["report", str(run), "--scaling", str(tmp_path / "s.json"),
                     "--out", str(tmp_path / "r.png")]) == 2
    assert "--scaling draws from its JSON file alone" in capsys.readouterr().err
    assert cli_main(["report", "--scaling", str(tmp_path / "s.json"), "--out", str(tmp_path / "r.png")]) == 2
    assert "s.json: not a scaling.json" in capsys.readouterr().err


def test_psp_columns_only_when_a_run_has_them(tmp_path):
    plain = write_run(tmp_path / "plain", [START, ev(1.0, 0.5)])
    scored = write_run(tmp_path / "scored", [START, dict(ev(1.0, 0.6), psp_at_1=0.21, psp_at_3=0.25,
                                                         psp_at_5=0.3, psndcg_at_5=0.28)])
    text = format_table(table_rows(load_runs([plain]), 0.4), 0.4).splitlines()
    assert "PSP" not in text[0]
    text = format_table(table_rows(load_runs([plain, scored]), 0.4), 0.4).splitlines()
    header = text[0].split()
    assert header[5:8] == ["PSP@1", "PSP@3", "PSP@5"]
    assert text[1].split()[5:8] == ["-", "-", "-"]  # the run without them
    assert text[2].split()[2:8] == ["0.6000", "0.3000", "0.2000", "0.2100", "0.2500", "0.3000"]
