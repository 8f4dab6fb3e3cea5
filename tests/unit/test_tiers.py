"""The suite's tiers: a test's folder gives its markers (tests/conftest.py), so the unit loop
(`-m "not mpi"`) is exactly tests/unit and every test that starts ranks carries `mpi`."""
import subprocess
import sys

from tests.harness.mpirun import REPO


def collected(*args: str) -> list[str]:
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return [line for line in p.stdout.splitlines() if "::" in line]


def test_markers_follow_the_folders():
    everything = collected()
    assert {t.split("/")[1] for t in everything} == {"unit", "mpi", "cluster"}
    assert collected("-m", "not mpi") == [t for t in everything if t.startswith("tests/unit/")]
    assert collected("-m", "cluster") == [t for t in everything if t.startswith("tests/cluster/")]
