"""Everything MPI and Horovod: set-up, device choice, collectives, fail-fast shutdown.

Each MPI rank owns one GPU (chosen among the GPUs it can see) or the CPU. mpi4py and Horovod
share MPI_COMM_WORLD: mpi4py initializes MPI first with MPI_THREAD_MULTIPLE (Horovod's
background thread calls MPI concurrently with ours), then hvd.init() adopts it.
"""
from __future__ import annotations

import os
import sys
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NoReturn, Optional, Sequence

import numpy as np


@dataclass(frozen=True)
class Cluster:
    """What the trainer needs to know about its place in the job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    device: str   # "/GPU:0" or "/CPU:0"
    threads: int  # TensorFlow intra-op threads of this rank
    comm: Any     # mpi4py communicator over all ranks
    # Threads MPI and Horovod started in this process (their background and progress threads):
    # their CPU time is communication, which a rank's standalone speed leaves out.
    comm_threads: frozenset = frozenset()

    @property
    def is_root(self) -> bool:
        return self.rank == 0


def gpu_slot(local_rank: int, n_visible: int) -> int:
    """Index of this rank's GPU among the ``n_visible`` GPUs it sees.

    Under Slurm's per-task GPU binding each process sees exactly one GPU (index 0); with the
    whole node visible, ranks on the node spread over its GPUs by their rank on the node
    (never the global rank: rank 2 of a job is rank 0 of the second node).
    """
    return local_rank % n_visible


def _pick_gpu(tf, local_rank: int) -> Optional[str]:
    """Makes this rank's GPU (`gpu_slot`) the only one TensorFlow uses; None without GPUs.
    Untested here: these machines have no GPU (the choice itself is tested across nodes).
    """
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    gpu = gpus[gpu_slot(local_rank, len(gpus))]
    tf.config.set_visible_devices([gpu], "GPU")
    tf.config.experimental.set_memory_growth(gpu, True)
    return "/GPU:0"


HOROVOD_CYCLE_MS = 5  # the ranks' Horovod cycle at a core or more (`cycle_ms`, `init`)
HOROVOD_CYCLE_MAX_MS = 50
YIELD_WHEN_IDLE = "OMPI_MCA_mpi_yield_when_idle"  # set to 1 unless set (`init`)


def cycle_ms(smallest_cores: Optional[float] = None) -> float:
    """Horovod's cycle for ranks of which the slowest has `smallest_cores` CPUs' worth of time
    (None: no quota). Horovod's background thread coordinates the ranks once a cycle and waits
    there for the slowest; that costs the same CPU time a cycle whatever the rank's share, so
    at a fraction f of a core the cycle is HOROVOD_CYCLE_MS / f (at most HOROVOD_CYCLE_MAX_MS),
    keeping the cost's share of the rank's time about that of a full core at 5 ms (the
    measurements: docs/benchmark.md, "Where the defaults come from")."""
    if smallest_cores is None or smallest_cores >= 1.0:
        return float(HOROVOD_CYCLE_MS)
    return float(min(HOROVOD_CYCLE_MAX_MS, round(HOROVOD_CYCLE_MS / smallest_cores, 1)))


_THREADS_BEFORE_MPI: Optional[set[int]] = None  # this process's threads before MPI started


def start_mpi():
    """Initializes MPI through mpi4py, before Horovod and TensorFlow; returns MPI.COMM_WORLD.

    Called alone first, it lets a run learn its ranks (`node_size`) and resolve its config
    before `init` sizes TensorFlow's thread pools from it; `init` calls it too (a second call
    returns the same communicator).
    """
    global _THREADS_BEFORE_MPI
    import mpi4py

    if _THREADS_BEFORE_MPI is None:
        _THREADS_BEFORE_MPI = thread_ids()

    # A rank waiting in MPI spins on its core unless OpenMPI yields it (mpi_yield_when_idle),
    # which OpenMPI turns on by itself only on nodes with more ranks than cores. Horovod's
    # background thread waits there once a cycle, so spinning took the rank's own computing
    # time, and yielding raised the ranks' standalone rows/s (docs/benchmark.md, "Where the
    # defaults come from"). Must precede MPI's initialization; an exported value (or
    # `mpirun --mca mpi_yield_when_idle 0`) wins.
    os.environ.setdefault(YIELD_WHEN_IDLE, "1")
    mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI

    # Horovod's background thread calls MPI while this thread calls mpi4py: a lower level than
    # requested would corrupt MPI's state later, far from the cause, so it is checked first.
    require_thread_level(MPI.Query_thread(), MPI)
    return MPI.COMM_WORLD


def node_size(comm) -> int:
    """Ranks of `comm` on this rank's node (shared memory), as Horovod's local_size counts them."""
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size()
    finally:
        node.Free()


def init(threads: Optional[int] = None, cycle: Optional[float] = None) -> Cluster:
    """Initializes MPI (`start_mpi`, unless done), Horovod and TensorFlow's devices for this rank.

    Args:
        threads: TensorFlow intra-op threads; default: this node's cores / ranks on the node,
            so ranks sharing a node do not oversubscribe it.
        cycle: Horovod's cycle in ms (`cycle_ms`; default HOROVOD_CYCLE_MS); an exported
            HOROVOD_CYCLE_TIME wins.
    """
    comm = start_mpi()
    before = _THREADS_BEFORE_MPI
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Horovod's background thread coordinates the ranks once a cycle (1 ms by default), and a
    # rank waiting for the others there spins, taking a large share of each rank's computing
    # time; a 5 ms cycle reached the target sooner for sync and adaptive alike (docs/benchmark.md,
    # "Where the defaults come from"); a collective waits at most one cycle longer to start.
    # Ranks under a CPU quota get a longer cycle (`cycle_ms`).
    os.environ.setdefault("HOROVOD_CYCLE_TIME", f"{cycle if cycle is not None else HOROVOD_CYCLE_MS:g}")
    from hvd_adaptive.tfload import tf
    import horovod.tensorflow as hvd

    hvd.init()  # adopts the MPI world mpi4py initialized
    if hvd.size() != comm.Get_size():
        raise RuntimeError(
            f"Horovod sees {hvd.size()} ranks but MPI sees {comm.Get_size()}: launch with MPI "
            "(mpirun, srun --mpi=pmix, or horovodrun without --gloo)")
    local_size = hvd.local_size()
    n_threads = threads or default_threads(local_size)
    # Thread pools must be sized before TensorFlow creates its context (first op).
    tf.config.threading.set_intra_op_parallelism_threads(n_threads)
    tf.config.threading.set_inter_op_parallelism_threads(min(2, n_threads))
    device = _pick_gpu(tf, hvd.local_rank()) or "/CPU:0"
    # Importing TensorFlow starts no thread (its pools start with its context, after this), so
    # the threads new since MPI's initialization are MPI's and Horovod's.
    return Cluster(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                   local_size=local_size, device=device, threads=n_threads, comm=comm,
                   comm_threads=frozenset(thread_ids() - before))


def thread_ids() -> set[int]:
    """The kernel's ids of this process's threads (empty where /proc has no task list)."""
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def threads_cpu_s(tids: frozenset) -> float:
    """CPU seconds the threads `tids` of this process have run so far (those that ended count
    no more). Reads the kernel's per-thread run time in nanoseconds (/proc schedstat), or its
    clock ticks (/proc stat) where schedstat is missing; 0.0 where /proc has neither."""
    total = 0.0
    for tid in tids:
        task = f"/proc/self/task/{tid}"
        try:
            with open(f"{task}/schedstat") as f:
                total += int(f.read().split()[0]) / 1e9
            continue
        except (OSError, ValueError, IndexError):
            pass
        try:
            with open(f"{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            pass
    return total


def mpi_control_variable(name: str) -> Optional[int]:
    """An integer (or boolean) control variable of the MPI library as this process runs with it,
    read through MPI's tool interface (MPI_T): what the library took from its defaults, the
    launcher and the environment. None where the library has no variable of that name (another
    MPI than OpenMPI) or no tool interface. Call after MPI's initialization."""
    import ctypes
    from mpi4py import MPI

    lib = ctypes.CDLL(None)  # the MPI library mpi4py loaded into this process
    if not hasattr(lib, "MPI_T_cvar_get_index"):
        return None
    provided = ctypes.c_int()
    if lib.MPI_T_init_thread(MPI.THREAD_MULTIPLE, ctypes.byref(provided)) != 0:
        return None
    try:
        index, count, handle = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p()
        if lib.MPI_T_cvar_get_index(name.encode(), ctypes.byref(index)) != 0:
            return None
        if lib.MPI_T_cvar_handle_alloc(index, None, ctypes.byref(handle), ctypes.byref(count)) != 0:
            return None
        value = (ctypes.c_int32 * 2)()  # an int or a bool reads as its first 4 bytes; 8 of room
        ok = count.value == 1 and lib.MPI_T_cvar_read(handle, value) == 0
        lib.MPI_T_cvar_handle_free(ctypes.byref(handle))
        return int(value[0]) if ok else None
    finally:
        lib.MPI_T_finalize()


def default_threads(local_size: int) -> int:
    """TensorFlow threads of a rank that asks for none: this node's cores / ranks on the node, so
    ranks sharing a node do not oversubscribe it."""
    return max(1, usable_cores() // local_size)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a Slurm cpuset, taskset)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cores or 1


def require_thread_level(granted: int, MPI) -> None:
    """Fails clearly when MPI granted less than MPI_THREAD_MULTIPLE (see `init`)."""
    if granted >= MPI.THREAD_MULTIPLE:
        return
    names = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
             MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED"}
    raise RuntimeError(
        f"MPI granted thread level {names.get(granted, granted)}, but hvd_adaptive needs "
        "MPI_THREAD_MULTIPLE: Horovod's background thread and mpi4py call MPI at the same "
        "time. Use an MPI built with thread support (OpenMPI: --enable-mpi-thread-multiple, "
        "the default since 3.0; check `ompi_info | grep -i thread`)")


def exit_process(code: int) -> NoReturn:
    """Ends this process with exit status `code`, without the interpreter's teardown.

    Once TensorFlow and Horovod are loaded, Python's teardown (freeing their modules and C++
    state) takes a noticeable share of a short run (docs/benchmark.md, "Figures behind the
    code's defaults"). It does nothing a finished command needs, so the entry points that
    start ranks (the CLI, the tests' programs under mpirun) end through this instead:
    the atexit handlers run as at a normal exit (a rank's cgroup removed, the shared counter's
    progress thread stopped, Horovod shut down, logging flushed), MPI is finalized (what mpi4py
    does at exit), the standard streams are flushed, and os._exit ends the process. Files the
    run wrote are closed by then (the run log, checkpoints and outputs close as they finish).
    """
    import atexit

    atexit._run_exitfuncs()  # the handlers a normal exit runs, in the same (reverse) order
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing left to write to
            pass
    os._exit(code)


def shutdown() -> None:
    import horovod.tensorflow as hvd

    if hvd.is_initialized():
        hvd.shutdown()


def abort_on_error(comm, exc: BaseException, rank: int) -> None:
    """Logs the error with the rank, then ends the whole job (never a hang in a collective).

    A single rank has nobody to wait for: the exception goes on to the caller, which reports it.
    """
    if comm.Get_size() == 1:
        return
    sys.stderr.write(f"[rank {rank}] error: {type(exc).__name__}: {exc}\n")
    if os.environ.get("HVD_ADAPTIVE_TRACEBACK"):
        traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    comm.Abort(1)


@contextmanager
def fail_fast(cluster: Cluster) -> Iterator[None]:
    """Any exception on this rank aborts all ranks, so none waits forever in a collective."""
    try:
        yield
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - every failure must end the job
        abort_on_error(cluster.comm, e, cluster.rank)
        raise


def broadcast_variables(variables: Sequence, root: int = 0) -> None:
    """Makes every rank start from rank 0's values (seeds could differ across machines)."""
    import horovod.tensorflow as hvd

    hvd.broadcast_variables(list(variables), root_rank=root)


def allgather(comm, obj: Any) -> list:
    """mpi4py allgather of small Python objects (timings, counters, flags)."""
    return comm.allgather(obj)


def node_allgather(comm, obj: Any) -> list:
    """allgather among the ranks on this rank's node (MPI's shared-memory split: the node as
    MPI and Horovod's local_size see it)."""
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.allgather(obj)
    finally:
        node.Free()


def allreduce_sum_np(comm, arr: np.ndarray) -> np.ndarray:
    """Sum of a small numpy array over ranks (metric sums)."""
    from mpi4py import MPI

    out = np.empty_like(arr)
    comm.Allreduce(np.ascontiguousarray(arr), out, op=MPI.SUM)
    return out


class SharedCounter:
    """A counter on rank 0 that every rank advances atomically (MPI one-sided Fetch_and_op).

    Dynamic scheduling hands out batches from one global stream with it: a faster rank comes
    back sooner and so takes more batches. Two slots alternate between merge windows so that
    rank 0 can reset the next window's slot while others may still read the current one.
    """

    def __init__(self, comm, barrier: bool = True):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm
        nbytes = 2 * 8 if comm.Get_rank() == 0 else 0
        self.win = MPI.Win.Allocate(nbytes, 8, comm=comm)
        if comm.Get_rank() == 0:
            self._reset(0)
            self._reset(1)
        if barrier:  # nobody claims before rank 0 zeroed the slots
            comm.Barrier()

    def _reset(self, slot: int) -> None:
        zero = np.zeros(1, np.int64)
        self.win.Lock(0, self.MPI.LOCK_EXCLUSIVE)
        self.win.Put(zero, 0, target=(slot, 1, self.MPI.INT64_T))
        self.win.Unlock(0)

    def prepare(self, window: int) -> None:
        """Rank 0 zeroes the slot of window+1; call after the merge that ended window-1."""
        if self.comm.Get_rank() == 0:
            self._reset((window + 1) % 2)

    def fetch_add(self, window: int, amount: int) -> int:
        """Adds `amount` to the window's counter and returns the value before the add."""
        inc = np.array([amount], np.int64)
        old = np.zeros(1, np.int64)
        self.win.Lock(0, self.MPI.LOCK_SHARED)
        self.win.Fetch_and_op(inc, old, 0, target_disp=(window % 2), op=self.MPI.SUM)
        self.win.Unlock(0)
        return int(old[0])

    def claims(self, window: int, budget: int, size: Callable[[], int], parts: int = 1,
               smallest: int = 1) -> Iterator[tuple[int, int]]:
        """Yields this rank's claims [lo, hi) of a window's `budget` rows, `size()` at a time.

        No claim is under half a batch unless the budget is: a claim that would leave less than
        half a batch behind takes the rest with it (as `chunks` does), so no rank trains a
        noisy one-row step that counts as a whole batch.

        Guided tail (parts > 1, the ranks sharing the window): a claim takes at most 1/parts of
        the rows left, read from the counter just before (one more atomic a claim), and at least
        `smallest`, so the last claims of a window shrink and the ranks finish within a small
        batch of each other instead of a whole one. Another rank's claim between the read and
        this claim can only make this claim a little large, never larger than size().
        """
        while True:
            b = size()
            if parts > 1:
                left = budget - self.fetch_add(window, 0)
                b = min(b, max(smallest, -(-left // parts)))
            lo = self.fetch_add(window, b)
            if lo >= budget:
                return
            hi = min(lo + b, budget)
            if 0 < budget - hi < b / 2:
                # Push the counter past the budget; the rows up to where it stood are ours
                # (another rank may have claimed [hi, old) between the two operations).
                old = self.fetch_add(window, budget)
                if old == hi:
                    hi = budget
                elif old < budget:
                    yield lo, hi
                    lo, hi = old, budget
            yield lo, hi

    def keep_progressing(self) -> None:
        """Rank 0 only: a thread calls MPI every half millisecond while this rank computes.

        Over TCP, UCX serves other ranks' atomics on rank 0's window only inside rank 0's MPI
        calls; without this thread the ranks of other nodes waited for rank 0's next claim and
        rank 0 trained 1,648 of an epoch's 2,000 rows on 2 nodes x 2 ranks.
        """
        self._progress = _Progress()

    def free(self) -> None:
        if getattr(self, "_progress", None) is not None:
            self._progress.stop()
        self.win.Free()


class _Progress:
    """A daemon thread that drives MPI's progress engine (MPI_Iprobe on COMM_SELF, which
    matches nothing) until stopped; stopped before MPI is finalized at exit."""

    def __init__(self, interval_s: float = 0.0005):
        import atexit
        import threading
        from mpi4py import MPI

        self._stop = threading.Event()

        def run() -> None:
            while not self._stop.wait(interval_s):
                try:
                    MPI.COMM_SELF.Iprobe()
                except Exception:  # noqa: BLE001 - MPI is going away; nothing left to drive
                    return

        self._thread = threading.Thread(target=run, name="mpi-progress", daemon=True)
        self._thread.start()
        # Python runs atexit handlers before mpi4py finalizes MPI (a C-level exit hook).
        atexit.register(self.stop)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def shared_counter(comm) -> Optional[SharedCounter]:
    """The dynamic scheduler's counter, or None (once warned) when MPI cannot host it.

    Across nodes OpenMPI's default one-sided component can refuse the window ("MPI_ERR_WIN:
    invalid window"; `--mca osc ucx` works, docs/multinode.md). The ranks agree on the outcome
    with an allgather, so either all of them use the counter or all take the caller's fallback;
    a rank alone on the fallback would train rows the others also claim.
    """
    from mpi4py import MPI

    counter, why = None, ""
    try:
        counter = SharedCounter(comm, barrier=False)
        counter.fetch_add(0, 0)  # the first atomic operation fails where the window is unusable
    except MPI.Exception as e:
        counter, why = None, e.Get_error_string().strip() or str(e)
    everyone = comm.allgather(why)
    if not any(everyone):
        # Ranks on other nodes than rank 0 reach the window through the network.
        across = len(node_allgather(comm, None)) < comm.Get_size()
        if across and comm.Get_rank() == 0:
            counter.keep_progressing()
        comm.Barrier()  # rank 0 zeroed the slots before anyone claims
        return counter
    if comm.Get_rank() == 0:
        failed = [r for r, w in enumerate(everyone) if w]
        sys.stderr.write(
            f"warning: MPI one-sided windows do not work in this job (rank(s) {failed}: "
            f"{next(w for w in everyone if w)}); adaptive.scheduler falls back to static: each rank "
            "takes a part of every window in proportion to its measured speed. For the dynamic "
            "scheduler across nodes run OpenMPI with --mca osc ucx (docs/multinode.md)\n")
        sys.stderr.flush()
    return None


# ---- Hogbatch's shared model (hvd_adaptive/train/algorithms/hogbatch.py) ---------------------------------
_SHARED_ALIGN = 64  # cache-line alignment of every array in the window


def require_one_node(node_size: int, world_size: int) -> None:
    """Fails clearly when the ranks do not all share one node's memory."""
    if node_size != world_size:
        raise RuntimeError(
            f"hogbatch keeps the shared model in one node's memory, but only {node_size} of the "
            f"{world_size} ranks share this node: across nodes use train.algorithm=adaptive "
            "(dynamic scheduling and weighted merges over the network), or run "
            "hogbatch/adaptive_hogbatch on one node (one shared model per node with merges "
            "between nodes is future work)")


class SharedModel:
    """The model's variables and the per-worker table in one node-shared MPI window.

    Args:
        comm: Communicator of all ranks (they must share one node).
        shapes: Shapes of the model's variables, in `SparseMLP.variables_list` order.
        n_workers: Rows of the per-worker table (float64).
        n_columns: Its columns.
    """

    def __init__(self, comm, shapes: list[tuple[int, ...]], n_workers: int, n_columns: int):
        from mpi4py import MPI

        self.comm = comm
        self.node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        require_one_node(self.node.Get_size(), comm.Get_size())
        sizes = [n_workers * n_columns * 8] + [int(np.prod(s)) * 4 for s in shapes]
        offsets = np.concatenate([[0], np.cumsum([-(-n // _SHARED_ALIGN) * _SHARED_ALIGN for n in sizes])])
        nbytes = int(offsets[-1]) if self.node.Get_rank() == 0 else 0
        # Node rank 0 holds the memory; every rank maps it and addresses it from rank 0's base.
        self.win = MPI.Win.Allocate_shared(nbytes, 1, comm=self.node)
        buf, _ = self.win.Shared_query(0)
        raw = np.frombuffer(buf, dtype=np.uint8)
        self.table = raw[offsets[0]:offsets[0] + sizes[0]].view(np.float64).reshape(n_workers, n_columns)
        self.params = [raw[o:o + n].view(np.float32).reshape(s)
                       for o, n, s in zip(offsets[1:], sizes[1:], shapes)]
        # MPI-3 unified model: one passive epoch for the whole run; load/store from here on,
        # with Sync() as the memory barrier at round ends.
        self.win.Lock_all(MPI.MODE_NOCHECK)

    def initialize(self, variables: list) -> None:
        """Node rank 0 writes its starting values and zeroes the table (collective)."""
        if self.node.Get_rank() == 0:
            for a, v in zip(self.params, variables):
                a[...] = v.numpy()
            self.table[...] = 0.0
        self.fence()

    def fence(self) -> None:
        """Memory barrier plus barrier: every store before it is seen by every load after it."""
        self.win.Sync()
        self.node.Barrier()
        self.win.Sync()

    def copy_into(self, variables: list) -> None:
        """Copies every shared array into the local variables (a private copy: TensorFlow may
        alias an aligned numpy buffer, and a variable must never alias shared memory)."""
        for a, v in zip(self.params, variables):
            v.assign(a.copy())
