"""Run under mpirun: several training runs one after another in the same ranks.

Usage: mpirun -np N python tests/parallel/train_runs.py RUN.json [RUN.json ...]
    each RUN.json: {"config": "configs/tiny.yaml", "run_dir": "...", "sets": ["k=v", ...]}

Each run goes the way `hvd-adaptive train` goes once its ranks have started (run.py's
check_inputs, then train_on), on a fresh model and in its own run folder; TensorFlow and
Horovod start once for all of them, which is most of a short job's time. For tests that read
their runs, not ones compared bit for bit with a run of the CLI (the CLI's own path is what the
other tests run). Thread pools are sized once, when TensorFlow starts: the runs must give each
rank the same threads.
"""
import json
import sys
from pathlib import Path

from hvd_adaptive.parallel import distributed
from hvd_adaptive.train.algorithms import worker_threads
from hvd_adaptive.config import load_config
from hvd_adaptive.train.run import check_inputs, train_on


def main() -> int:
    runs = [json.loads(Path(a).read_text()) for a in sys.argv[1:]]
    cfgs = [load_config(r["config"], r["sets"])[0] for r in runs]
    for run, cfg in zip(runs, cfgs):
        check_inputs(cfg, run["run_dir"])

    def threads_for(rank: int):
        wanted = {worker_threads(cfg, rank) for cfg in cfgs}
        assert len(wanted) == 1, f"rank {rank}: the runs ask for different threads {wanted}"
        return wanted.pop()

    cluster = distributed.init(threads_for=threads_for)  # as run.py sizes them
    for run, cfg in zip(runs, cfgs):
        train_on(cluster, cfg, run["run_dir"])
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    from hvd_adaptive.parallel.distributed import exit_process

    exit_process(main())
