"""Run under mpirun: checks the dense weighted merge and the shared counter on real ranks.

Every rank can rebuild every other rank's replica from the seeds, so each rank checks the
merged result against numpy's weighted average by itself. The merge is merge.Merge with
merge.sparse off and no row normalization: sum_i w_i theta_i in one fused allreduce (the row
rules and the sparse merge are checked in real runs by algorithms_merge_ranks.py).
Exit code 0 means all checks held.
"""

import numpy as np

from hvd_adaptive.parallel import distributed
from hvd_adaptive.config import MergeConfig, ModelConfig

N_FEATURES, N_LABELS = 50, 3


def replica(rank: int, shapes: list[tuple]) -> list[np.ndarray]:
    """Rank `rank`'s values; in the input layer only a few rows differ from zero, as if each
    rank had trained a few different rows since the last merge."""
    rng = np.random.default_rng(100 + rank)
    out = [rng.normal(size=s).astype(np.float32) for s in shapes]
    sparse = np.zeros(shapes[0], np.float32)
    rows = rng.choice(shapes[0][0], size=6, replace=False)
    sparse[rows] = out[0][rows]
    return [sparse, *out[1:]]


def main() -> int:
    c = distributed.init(threads=1)
    from hvd_adaptive.parallel.merge import Merge
    from hvd_adaptive.model.network import SparseMLP

    n, r = c.size, c.rank
    model = SparseMLP(N_FEATURES, N_LABELS, ModelConfig(hidden=[4]))
    variables = model.variables_list
    shapes = [tuple(v.shape) for v in variables]
    for v, a in zip(variables, replica(r, shapes)):
        v.assign(a)
    weights = np.array([1.0 + 2.0 * i for i in range(n)])  # unequal on purpose
    weights /= weights.sum()  # the merge's weights sum to 1 over ranks
    merge = Merge(model, None, MergeConfig(sparse=False), False, c.comm)
    merge(float(weights[r]))
    reps = [replica(i, shapes) for i in range(n)]
    mean = [sum(weights[i] * reps[i][j].astype(np.float64) for i in range(n)) for j in range(len(shapes))]
    for v, want in zip(variables, mean):
        np.testing.assert_allclose(v.numpy(), want, rtol=1e-5, atol=1e-6)
    # Weight 1 on every rank: the plain sum of the (now equal) replicas.
    merge(1.0)
    for v, want in zip(variables, mean):
        np.testing.assert_allclose(v.numpy(), n * want, rtol=1e-5, atol=1e-5)

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
    from hvd_adaptive.parallel.distributed import exit_process

    exit_process(main())
