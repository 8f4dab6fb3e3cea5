"""The workstation launcher, launch/train.sh, as the README's first command runs it: 2 ranks
under horovodrun on the default config (cut to half an epoch)."""
import json
import os

from tests.harness.mpirun import run as run_job, start_up_lines


def test_train_sh_two_ranks_under_horovodrun(tmp_path):
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("CONFIG", "NP")}  # train.sh's defaults
    cut = ["--set", "train.epochs=0.5", "--set", "train.eval_every=0.5", "--set", "train.eval_rows=500",
           "--set", "train.calibrate_s=0.2", "--set", "checkpoint.keep=0"]
    p = run_job(["bash", "launch/train.sh", "--run-dir", str(run), *cut], 240, env)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ranks"] == 2 and len(summary["per_rank"]) == 2
    assert summary["final"]["p_at_1"] > summary["baseline_p_at_1"], summary
    used = json.loads((run / "config.json").read_text())
    assert used["data"]["synth"]["preset"] == "amazon670k" and used["train"]["epochs"] == 0.5
    assert used["train"]["algorithm"] == "adaptive"  # the recommended mode is the default's
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["event"] == "eval"]
    assert evals and abs(evals[-1]["epoch"] - 0.5) < 0.01
    # checkpoint.keep 0 (the benchmark's runs): not even the final checkpoint is written.
    assert not list(run.glob("checkpoints/ckpt-*")), list(run.glob("checkpoints/*"))
    # horovodrun makes mpirun tag every chunk of output; train.sh drops rank 0's tag at the
    # start of a line, so its progress lines read as written, and a line split into chunks
    # would still show a tag in its middle.
    progress = [line for line in p.stdout.splitlines() if "P@1" in line]
    assert len(progress) >= 2 and progress[-2].startswith("done: P@1"), p.stdout[-3000:]
    # The default holds out 5% of the training rows and says which evaluation it would keep
    # (keep 0 writes nothing): at the one evaluation the weights' average is the model itself,
    # and the model wins the tie.
    assert progress[-1].startswith("best model: the model at epoch 0.50, validation score "), p.stdout[-3000:]
    assert progress[-1].endswith("(not written)") and abs(summary["kept"]["epoch"] - 0.5) < 0.01
    assert "[1,0]<stdout>:" not in p.stdout, p.stdout[-3000:]
    # Quiet unless --verbose: neither the ranks nor horovodrun (which imports TensorFlow to
    # check Horovod's build) show TensorFlow's start-up messages.
    assert start_up_lines(p.stderr) == [], p.stderr[-3000:]
