"""The real CLI end to end: synthetic files written by `data synth`, then trained on. The default
config's run is test_launch.py's."""
import json

from tests.harness.trained_run import cli


def test_train_on_files_written_by_data_synth(tmp_path):
    p = cli("data", "synth", "--preset", "eurlex4k", "--scale", "0.05", "--n-train", "1500",
            "--n-test", "300", "--n-features", "1000", "--n-labels", "60", "--out", str(tmp_path / "d"))
    assert p.returncode == 0, p.stderr
    train_txt = tmp_path / "d" / "train.txt"
    assert train_txt.read_text().splitlines()[0] == "1500 1000 60"  # XC header
    run = tmp_path / "run"
    p = cli("train", "--config", "configs/tiny.yaml", "--run-dir", str(run),
            "--set", f"data.train={train_txt}", "--set", f"data.test={tmp_path / 'd' / 'test.txt'}")
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((run / "summary.json").read_text())
    assert s["ranks"] == 1 and s["final"]["p_at_1"] > s["baseline_p_at_1"] + 0.1
    assert (tmp_path / "d" / "train.txt.hvdcache" / "meta.json").is_file()  # parsed once, cached
    used = json.loads((run / "config.json").read_text())  # what the run used, not None
    assert used["train"]["threads"] >= 1 and used["hogbatch"]["cpu_threads"] == used["train"]["threads"]
    assert used["adaptive"]["b_max"] == used["hogbatch"]["gpu_batch"] == 64  # tiny's batch size
    assert "eval  epoch" in p.stdout and "done: P@1" in p.stdout


