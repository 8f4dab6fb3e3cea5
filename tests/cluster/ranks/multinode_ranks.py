"""Run under mpirun on several nodes: sync and adaptive train across nodes, per-node set-up.

Usage: mpirun ... python tests/cluster/ranks/multinode_ranks.py EXPECT    (EXPECT: dynamic, fallback)

One process trains the tiny config's first epoch with sync, then with adaptive (fresh models),
with a spy around the batch builder, and checks on rank 0:
- every training row is used exactly once in the epoch by each algorithm (which rows, not
  only how many), whether adaptive got the shared counter or fell back to static scheduling;
- adaptive used the scheduler EXPECT says (dynamic: the counter across nodes; fallback);
- the replicas are identical at the end and the training loss fell from the first window to
  the last (the algorithms learn across nodes);
- each rank's local rank, local size, GPU choice and thread count are those of its own node
  (threads = the node's cores / ranks on the node; on a node with one GPU per rank, the
  ranks of each node take GPUs 0..k-1, one each; with one GPU visible per rank, GPU 0);
- hogbatch refuses a job spanning nodes and names the alternative.
Prints ``multinode ok (...)`` and one ``rank {json}`` line per rank. Exit code 0 means all held.
"""
import json
import os
import socket
import sys

import numpy as np

from hvd_adaptive.parallel import distributed
from hvd_adaptive.config import load_config


def main() -> int:
    expect = sys.argv[1]
    c = distributed.init()  # default threads: this node's cores / ranks on this node
    import tensorflow as tf
    from hvd_adaptive.train.algorithms import base
    from hvd_adaptive.data import load_data
    from tests.harness.real_algorithm import RowSpy, build

    me = dict(rank=c.rank, host=socket.gethostname(), local_rank=c.local_rank,
              local_size=c.local_size, threads=c.threads, device=c.device,
              gpu_per_rank=distributed.gpu_slot(c.local_rank, c.local_size),
              gpu_bound=distributed.gpu_slot(c.local_rank, 1),
              cores=len(os.sched_getaffinity(0)))
    everyone = c.comm.allgather(me)
    if c.is_root:
        for r in everyone:
            print("rank " + json.dumps(r), flush=True)
        by_host = {}
        for r in everyone:
            by_host.setdefault(r["host"], []).append(r)
        assert len(by_host) > 1, f"all ranks on one node: {everyone}"
        for host, ranks in by_host.items():
            assert sorted(r["local_rank"] for r in ranks) == list(range(len(ranks))), (host, ranks)
            for r in ranks:
                assert r["local_size"] == len(ranks), (host, r)
                assert r["threads"] == max(1, r["cores"] // len(ranks)), (host, r)
                assert r["gpu_bound"] == 0, (host, r)
            assert sorted(r["gpu_per_rank"] for r in ranks) == list(range(len(ranks))), (host, ranks)

    spy = RowSpy(base)
    results = {}
    for name in ("sync", "adaptive"):
        cfg, _ = load_config("configs/tiny.yaml", [
            f"train.algorithm={name}", "train.epochs=1", "train.window_samples=512",
            "adaptive.warmup_epochs=0"])
        train, _ = load_data(cfg, c.is_root, c.comm.Barrier)
        with tf.device(c.device):
            algo = build(cfg, c, train)
            spy.used.clear()
            spy.recording = True
            losses = []
            while (stats := algo.run_round()) is not None:
                s = np.array(c.comm.allgather((stats.loss_sum, stats.samples))).sum(axis=0)
                losses.append(s[0] / max(s[1], 1))
            spy.recording = False
        # A rank may claim no batch of an epoch under the counter (the others took them all).
        mine = np.concatenate(spy.used) if spy.used else np.zeros(0, np.int64)
        rows = c.comm.gather(mine, root=0)
        fingerprint = [float(tf.reduce_sum(v)) + float(tf.reduce_sum(v * v)) for v in algo.model.variables_list]
        fps = c.comm.gather(fingerprint, root=0)
        scheduler = "dynamic" if getattr(algo, "counter", None) is not None else "fallback"
        if c.is_root:
            rows_by_rank = rows
            rows = np.sort(np.concatenate(rows))
            assert np.array_equal(rows, np.arange(train.n_rows)), \
                f"{name}: rows lost or repeated ({len(rows)} used of {train.n_rows})"
            for other in fps[1:]:
                np.testing.assert_allclose(other, fps[0], rtol=1e-6, err_msg=f"{name}: replicas differ")
            assert losses[-1] < losses[0], f"{name}: loss did not fall: {losses}"
            counts = [len(r) for r in rows_by_rank]
            # Under the counter the remote node's ranks must get claims through too. One rank
            # of a node may claim nothing in an epoch when the machine's cores are busy (its
            # node's other rank and the other node took every batch); a node whose ranks all
            # trained nothing is a counter that remote ranks cannot reach.
            per_node = {}
            for r, n in zip(everyone, counts):
                per_node[r["host"]] = per_node.get(r["host"], 0) + n
            assert min(per_node.values()) > 0, f"{name}: a node trained no rows: {per_node}, {counts}"
            results[name] = f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, rows per rank {counts}"
        if name == "adaptive":
            assert scheduler == expect, f"adaptive scheduler {scheduler}, expected {expect}"

    # hogbatch's shared model is one node's memory: a job across nodes must be refused.
    cfg, _ = load_config("configs/tiny.yaml", ["train.algorithm=hogbatch"])
    try:
        with tf.device(c.device):
            build(cfg, c, train, ready=False)
        raise AssertionError("hogbatch accepted ranks on several nodes")
    except RuntimeError as e:
        assert "train.algorithm=adaptive" in str(e), e
        refusal = str(e)
    if c.is_root:
        print(f"multinode ok ({expect}): {c.size} ranks on {len(by_host)} nodes; every row once; "
              f"replicas identical; sync {results['sync']}, adaptive {results['adaptive']}; "
              f"hogbatch refused: {refusal}", flush=True)
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    from hvd_adaptive.parallel.distributed import exit_process

    try:
        code = main()
    except BaseException:
        # A failed check on one rank ends the job at once, not at the test's timeout with the
        # other ranks waiting in a collective.
        import traceback
        from mpi4py import MPI

        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
    exit_process(code)
