"""train.keep_memory: a rank's freed memory stays in the process for its next allocations, so a
buffer allocated again takes no fresh pages from the kernel (hvd_adaptive/parallel/memory.py).
Each case runs in a fresh interpreter: the setting is per process and cannot be undone."""
import subprocess
import sys

from tests.harness.mpirun import REPO, mpi_env

# 48 MB through the C allocator (as TensorFlow's and MPI's buffers come): above the largest size
# glibc's moving threshold takes from the heap, so by default the block comes through mmap and
# goes back with munmap every time.
REALLOCATE = """
import ctypes, ctypes.util, resource
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def once():
    block = libc.malloc(48 * 2**20)
    ctypes.memset(block, 1, 48 * 2**20)
    libc.free(block)
once()
before = faults()
once()
print("faults", faults() - before)
"""


def faults_of_a_second_allocation(prelude: str) -> int:
    p = subprocess.run([sys.executable, "-c", prelude + REALLOCATE], cwd=REPO, env=mpi_env(),
                       capture_output=True, text=True, timeout=60)
    words = p.stdout.split()
    assert p.returncode == 0 and "faults" in words, p.stdout + p.stderr[-3000:]
    return int(words[words.index("faults") + 1])


def test_freed_memory_is_kept_for_the_next_allocation():
    kept = faults_of_a_second_allocation(
        "from hvd_adaptive.parallel.memory import keep_freed_memory\n"
        "assert keep_freed_memory()\n")
    handed_back = faults_of_a_second_allocation("")
    # 48 MB are 12,288 pages of 4 KB: each a fault when the block is fresh from the kernel.
    assert kept < 1000 < 6000 < handed_back, (kept, handed_back)


def test_the_train_command_keeps_freed_memory_unless_told_not_to():
    # The command stops at its missing data file, before MPI and TensorFlow; the process's
    # allocator is then as training would have it.
    def command(*sets: str) -> str:
        argv = ["train", "--config", "configs/tiny.yaml", "--set", "data.train=/nonexistent/t.txt",
                "--set", "data.test=/nonexistent/t.txt", *(a for s in sets for a in ("--set", s))]
        return ("from hvd_adaptive.cli import main\n"
                f"assert main({argv!r}) == 2\n")

    kept = faults_of_a_second_allocation(command())
    handed_back = faults_of_a_second_allocation(command("train.keep_memory=false"))
    assert kept < 1000 < 6000 < handed_back, (kept, handed_back)
