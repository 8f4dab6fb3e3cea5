"""How a training rank's C allocator treats freed memory (train.keep_memory).

glibc's malloc hands large blocks back to the kernel when they are freed (blocks from 128 KB
to 32 MB through a threshold that moves, every block above it through mmap/munmap, a heap's
free top through trimming, and each thread's arena on its own heaps). A rank allocates the
same large buffers again and again: the merge's gathered rows, MPI's receive buffers,
TensorFlow's outputs. Each time, the kernel zeroes fresh pages for them. At 8 quarter-core
ranks and 67,009 labels that zeroing was 30% of a run's first merge, and keeping the freed
memory in the process (one arena, no mmap, no trimming) took adaptive SGD to the target 1.13x
sooner (1.11-1.25x by seed, in one run), its later merges 0.30-0.46 s against 0.42-0.75 s, its
peak memory 1,395 MB a rank against 1,476 (docs/benchmark.md, "Freed memory kept"). A
process's memory then stays at its peak instead of shrinking after it.
"""
from __future__ import annotations

import ctypes

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
KEEP = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1))


def keep_freed_memory() -> bool:
    """Has glibc keep this process's freed memory for its next allocations: one arena for
    every thread, no block through mmap, no trimming. Call it before threads start (the
    arenas of threads already running stay as they are). Returns False where the C library
    is not glibc or refuses a setting (nothing is changed then beyond what it took)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols, the C library's among them
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in KEEP)
