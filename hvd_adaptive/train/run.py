"""Starting training: on this rank, the layer below both entry points that train
(`hvd-adaptive train` in cli.py, `hvd-adaptive sweep run` in sweep.py); and the local `mpirun`
command that the benchmark and the tests start ranks with.

Order matters: input errors that need neither MPI nor TensorFlow end the run first
(`check_inputs`, on every rank, so a job under mpirun ends before its ranks meet), TensorFlow's
start-up messages are silenced before anything imports TensorFlow, thread pools are sized
before TensorFlow creates its context, and any rank's failure ends the whole job. Nothing heavy is imported at module level, so the CLI's other commands stay quick.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional

from hvd_adaptive.config import Config, resolve


def run_training(cfg: Config, run_dir: Optional[str], verbose: bool = False,
                 choose_only: bool = False) -> int:
    """Initializes the ranks, trains, shuts down; any rank's failure ends the whole job.

    Args:
        cfg: the validated config.
        run_dir: the run folder; default runs/<algorithm>-<time>, named by rank 0.
        verbose: keep TensorFlow's and absl's start-up messages on stderr.
        choose_only: stop once the settings are chosen (`hvd-adaptive tune`), before training.
    """
    if cfg.train.keep_memory:  # before TensorFlow, Horovod and MPI start their threads
        from hvd_adaptive.parallel.memory import keep_freed_memory

        keep_freed_memory()
    check_inputs(cfg, run_dir)
    quiet_tensorflow(verbose)  # before the first import of TensorFlow (distributed.init)
    from hvd_adaptive.parallel import distributed

    cluster, (cfg,) = start_ranks([cfg])
    train_on(cluster, cfg, run_dir, choose_only)
    distributed.shutdown()
    return 0


def start_ranks(cfgs: list[Config]):
    """Starts this rank for runs of these configs and resolves them, once, before anything
    reads them: MPI first (the only value resolution needs from the job is the ranks on this
    node, for the default threads), then Horovod and TensorFlow with the thread pools and the
    Horovod cycle the resolved configs give this rank.

    Returns:
        (distributed.Cluster, the resolved configs in order).

    Raises:
        ValueError: the configs ask this rank for different threads or Horovod cycles (pools
            and the cycle are set once, when TensorFlow and Horovod start).
    """
    from hvd_adaptive.parallel import distributed
    from hvd_adaptive.train.algorithms import worker_threads
    from hvd_adaptive.train.hetero import smallest_quota

    comm = distributed.start_mpi()
    threads = distributed.default_threads(distributed.node_size(comm))
    cfgs = [resolve(c, threads) for c in cfgs]
    # CPU workers of hogbatch may run another thread count than the other ranks.
    wanted = {worker_threads(c, comm.Get_rank()) for c in cfgs}
    cycles = {distributed.cycle_ms(smallest_quota(c.hetero, c.train.threads)) for c in cfgs}
    if len(wanted) > 1 or len(cycles) > 1:
        raise ValueError(f"runs in one job must give rank {comm.Get_rank()} the same threads and "
                         f"Horovod cycle, got threads {sorted(wanted)}, cycles {sorted(cycles)} ms")
    return distributed.init(threads=wanted.pop(), cycle=cycles.pop()), cfgs


def train_on(cluster, cfg: Config, run_dir: Optional[str], choose_only: bool = False) -> None:
    """One run on ranks that have started (`distributed.init`, inputs checked): the folder
    agreed, trained; any rank's failure ends the whole job.

    Args:
        cluster: this rank's distributed.Cluster.
        cfg: the resolved config (config.resolve).
        run_dir: the run folder; default runs/<algorithm>-<time>, named by rank 0.
        choose_only: stop once the settings are chosen, before training.
    """
    from hvd_adaptive.parallel import distributed
    from hvd_adaptive.train import trainer

    with distributed.fail_fast(cluster):
        # Every rank must write to the same folder: rank 0 names it, the others receive it.
        name = run_dir or f"runs/{cfg.train.algorithm}-{time.strftime('%Y%m%d-%H%M%S')}"
        name = cluster.comm.bcast(name, root=0)
        trainer.train(cfg, Path(name), cluster, choose_only)


def check_inputs(cfg: Config, run_dir: Optional[str] = None) -> None:
    """The input errors a rank can see before MPI and TensorFlow start, each in one line.

    The names that registries own (train.algorithm, data.synth.preset), the data files'
    existence and headers, enough training rows for the ranks mpirun started, and with
    checkpoint.resume auto (`--resume`) whether the newest checkpoint in `run_dir` was taken
    by this algorithm with this window stream (seed, window, training rows); config.py
    checked the rest when the config was built.

    Raises:
        ConfigError: an unknown algorithm or synthetic preset; a checkpoint of another run.
        DataError: a data file that does not exist, whose header disagrees, or with fewer
            training rows than ranks.
    """
    from hvd_adaptive.train.algorithms import check_name
    from hvd_adaptive.data import check_sources

    check_name(cfg)
    ranks = launched_ranks()
    rows = check_sources(cfg, ranks)
    if run_dir is not None and cfg.checkpoint.resume == "auto":
        from hvd_adaptive.train.checkpoint import check_before_start

        t = cfg.train
        window = None if ranks is None else t.window_rows(ranks)
        check_before_start(run_dir, t.algorithm, [t.seed, window, rows])


def launched_ranks() -> Optional[int]:
    """The job's size as OpenMPI's launcher (mpirun, horovodrun) tells each process before MPI
    starts (OMPI_COMM_WORLD_SIZE); None elsewhere (srun, one process), where the trainer
    checks the ranks against the rows once MPI has started."""
    size = os.environ.get("OMPI_COMM_WORLD_SIZE", "")
    return int(size) if size.isdigit() else None


def quiet_tensorflow(verbose: bool) -> None:
    """Keeps TensorFlow's start-up messages off stderr unless `verbose`; errors still show.

    On every rank, importing TensorFlow logs through its C++ (absl) logging: "This TensorFlow
    binary is optimized to use available CPU instructions ..." (cpu_feature_guard), on CPUs
    that use oneDNN "oneDNN custom operations are on ...", and before the first of them absl's
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR".
    All are INFO messages, and TF_CPP_MIN_LOG_LEVEL, read when TensorFlow loads, filters them
    at their source: 2 keeps INFO and WARNING back and lets ERROR and FATAL through. A level the
    environment already sets higher (3: errors hidden too) is kept; `verbose` sets 0. On hosts
    where TensorFlow prints the oneDNN line whatever the level, hvd_adaptive.tfload filters the
    import's INFO lines instead.
    """
    if "tensorflow" in sys.modules:  # too late: the level is read once, when TensorFlow loads
        return
    if verbose:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
        return
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "")
    if not (level.isdigit() and int(level) >= 2):
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"


def mpirun_command(ranks: int, args: list[str]) -> tuple[list[str], dict]:
    """`mpirun -np ranks python ARGS` on this machine, and its environment.

    More ranks than cores are allowed (--oversubscribe), no rank is pinned to a core
    (--bind-to none), and OpenMPI may run as root (containers).
    """
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none", sys.executable, *args]
    return cmd, dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
