"""Run under mpirun: several training runs one after another in the same ranks.

Usage: mpirun -np N python tests/harness/train_runs.py RUN.json [RUN.json ...]
    each RUN.json: {"config": "configs/tiny.yaml", "run_dir": "...", "sets": ["k=v", ...]}

Each run goes the way `hvd-adaptive train` goes (run.py's check_inputs, start_ranks and
train_on), on a fresh model and in its own run folder; TensorFlow and
Horovod start once for all of them, which is most of a short job's time. For tests that read
their runs, not ones compared bit for bit with a run of the CLI (the CLI's own path is what the
other tests run). Thread pools and Horovod's cycle are set once, when TensorFlow and Horovod
start: the runs must give each rank the same (start_ranks refuses them otherwise).
"""
import json
import sys
from pathlib import Path

from hvd_adaptive.config import load_config
from hvd_adaptive.parallel import distributed
from hvd_adaptive.train.run import check_inputs, start_ranks, train_on


def main() -> int:
    runs = [json.loads(Path(a).read_text()) for a in sys.argv[1:]]
    cfgs = [load_config(r["config"], r["sets"])[0] for r in runs]
    for run, cfg in zip(runs, cfgs):
        check_inputs(cfg, run["run_dir"])
    cluster, cfgs = start_ranks(cfgs)  # as run.py starts a rank and resolves its config
    for run, cfg in zip(runs, cfgs):
        train_on(cluster, cfg, run["run_dir"])
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    from hvd_adaptive.parallel.distributed import exit_process

    exit_process(main())
