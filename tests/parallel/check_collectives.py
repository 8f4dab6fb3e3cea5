"""Run under mpirun: checks the weighted allreduce and the shared counter on real ranks.

Every rank can rebuild every other rank's variables from the seeds, so each rank checks the
merged result against numpy's weighted average by itself. Exit code 0 means all checks held.
"""
import sys

import numpy as np

from hvd_adaptive import distributed


def replica(rank: int):
    rng = np.random.default_rng(100 + rank)
    dense = rng.normal(size=(7, 5)).astype(np.float32)
    # row-sparse: an input layer where each rank touched a few different rows since the merge
    sparse = np.zeros((50, 4), np.float32)
    rows = rng.choice(50, size=6, replace=False)
    sparse[rows] = rng.normal(size=(6, 4))
    bias = rng.normal(size=3).astype(np.float32)
    return [dense, sparse, bias]


def main() -> int:
    import tensorflow as tf

    c = distributed.init(threads=1)
    n, r = c.size, c.rank
    weights = np.array([1.0 + 2.0 * i for i in range(n)])  # unequal on purpose
    variables = [tf.Variable(a) for a in replica(r)]
    merge = distributed.WeightedAllreduce(variables)
    merge(float(weights[r]), float(weights.sum()))
    reps = [replica(i) for i in range(n)]
    for j, v in enumerate(variables):
        want = sum(weights[i] * reps[i][j].astype(np.float64) for i in range(n)) / weights.sum()
        np.testing.assert_allclose(v.numpy(), want, rtol=1e-5, atol=1e-6)
    merge.plain_sum()
    for j, v in enumerate(variables):
        want = n * sum(weights[i] * reps[i][j].astype(np.float64) for i in range(n)) / weights.sum()
        np.testing.assert_allclose(v.numpy(), want, rtol=1e-5, atol=1e-5)

    # Shared counter: over several windows every offset is handed out exactly once.
    counter = distributed.SharedCounter(c.comm)
    rng = np.random.default_rng(r)
    budgets = [1000, 37, 555, 1]
    for w, budget in enumerate(budgets):
        counter.prepare(w)
        got = []
        while True:
            take = int(rng.integers(1, 40))
            off = counter.fetch_add(w, take)
            if off >= budget:
                break
            got.extend(range(off, min(off + take, budget)))
        everyone = c.comm.allgather(got)
        flat = sorted(x for g in everyone for x in g)
        assert flat == list(range(budget)), f"window {w}: offsets lost or repeated"
    counter.free()
    if r == 0:
        print(f"collectives ok on {n} ranks")
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
