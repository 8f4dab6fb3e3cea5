"""Run under mpirun: each algorithm's round accounting with rank 1 slowed 4x (sleep mode).

Usage: mpirun -np 2 python tests/mpi/ranks/fairness_ranks.py PLAN
  PLAN: JSON {"sets": [KEY=VALUE, ...], "algorithms": {NAME: [KEY=VALUE, ...], ...}}, the
  config overrides of every run (on configs/tiny.yaml) and each algorithm's own.

The algorithms run one after another in the same ranks (one start-up of TensorFlow and
Horovod), each on a fresh model. Rank 0 prints one line per algorithm, `fairness NAME JSON`,
JSON being every round's per-rank records as the trainer writes them to metrics.jsonl
(RoundStats.record); tests/mpi/test_fairness.py asserts on them.
"""
import json
import sys

from hvd_adaptive.parallel import distributed
from hvd_adaptive.config import load_config

def main() -> int:
    c = distributed.init(threads=1)
    import tensorflow as tf
    from hvd_adaptive.data import load_data
    from tests.harness.real_algorithm import build

    plan = json.loads(sys.argv[1])
    for name, own in plan["algorithms"].items():
        cfg, _ = load_config("configs/tiny.yaml", [f"train.algorithm={name}", *plan["sets"], *own])
        train, _ = load_data(cfg, c.is_root, c.comm.Barrier)
        with tf.device(c.device):
            algo = build(cfg, c, train)
            c.comm.Barrier()  # as the trainer's calibration allgather: start the clock together
            rounds = []
            while (stats := algo.run_round()) is not None:
                rounds.append(c.comm.allgather(stats.record(c.rank)))
        if c.is_root:
            print(f"fairness {name} {json.dumps(rounds)}", flush=True)
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    from hvd_adaptive.parallel.distributed import exit_process

    exit_process(main())
