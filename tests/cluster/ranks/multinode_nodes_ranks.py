"""Run under mpirun on several nodes: what MPI sees of the nodes, and the shared counter.

Usage: mpirun ... python tests/cluster/ranks/multinode_nodes_ranks.py BUDGET

Without TensorFlow or Horovod (seconds, not a training job). Rank 0 prints one line,
``nodes [json, ...]`` in rank order (gathered: mpirun forwards ranks' output in pieces, so
lines printed by several ranks at once can run together): hostname, the node-local rank and
size (MPI_Comm_split_type SHARED, as Horovod's local rank), the thread level granted. Then
the dynamic scheduler's counter from `distributed.shared_counter`: either every rank gets it
and two windows of BUDGET rows are claimed in batches of 7 (root asserts every row claimed
exactly once, by every rank in part, and prints ``counter dynamic ...``), or every rank got None (``counter fallback``).
"""
import json
import socket
import sys
import time

import numpy as np
import mpi4py

mpi4py.rc.thread_level = "multiple"
from mpi4py import MPI  # noqa: E402

from hvd_adaptive.parallel.distributed import require_thread_level, shared_counter  # noqa: E402


def _work(seconds: float) -> None:
    """A batch's work: no MPI calls, the GIL released (as in TensorFlow's kernels); the
    counter's progress thread on rank 0 must serve the other ranks' claims meanwhile."""
    time.sleep(seconds)


def main() -> int:
    budget = int(sys.argv[1])
    comm = MPI.COMM_WORLD
    require_thread_level(MPI.Query_thread(), MPI)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    info = dict(rank=comm.Get_rank(), host=socket.gethostname(), processor=MPI.Get_processor_name(),
                local_rank=node.Get_rank(), local_size=node.Get_size(),
                thread_multiple=MPI.Query_thread() == MPI.THREAD_MULTIPLE)
    infos = comm.gather(info, root=0)
    if comm.Get_rank() == 0:
        print("nodes " + json.dumps(infos), flush=True)
    counter = shared_counter(comm)
    kinds = comm.allgather(counter is not None)
    assert len(set(kinds)) == 1, f"ranks disagree on the counter: {kinds}"
    if counter is None:
        if comm.Get_rank() == 0:
            print("counter fallback", flush=True)
        return 0
    claimed = []
    for window in range(2):
        counter.prepare(window)
        comm.Barrier()  # as between merge windows: the slot is zeroed before anyone claims
        for lo, hi in counter.claims(window, budget, lambda: 7):
            claimed.append((window, lo, hi))
            _work(0.002)
        comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(200):
        counter.fetch_add(1, 0)
    op_us = (time.perf_counter() - t0) / 200 * 1e6
    ops = comm.gather(op_us, root=0)
    everyone = comm.gather(claimed, root=0)
    counter.free()
    if comm.Get_rank() == 0:
        for window in range(2):
            rows = np.sort(np.concatenate([np.arange(lo, hi) for c in everyone
                                           for w, lo, hi in c if w == window]))
            assert np.array_equal(rows, np.arange(budget)), f"window {window}: rows lost or repeated"
        per_rank = [sum(hi - lo for _, lo, hi in c) for c in everyone]
        assert min(per_rank) > 0, f"a rank never got a claim through: {per_rank}"
        print(f"counter dynamic: 2 windows of {budget} rows, each row once; rows per rank "
              f"{per_rank}; microseconds per fetch-and-add by rank {[round(x) for x in ops]}",
              flush=True)
    return 0


if __name__ == "__main__":
    from hvd_adaptive.parallel.distributed import exit_process

    exit_process(main())
