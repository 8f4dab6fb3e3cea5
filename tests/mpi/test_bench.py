"""The speed benchmark end to end: the plain Horovod script beside sync on real ranks."""
def test_the_benchmark_runs_the_plain_horovod_script_beside_sync(tmp_path):
    """The real benchmark on the tiny data: a horovod row with figures in the even scenario,
    and a printed line instead of a run in the sleep-mode one."""
    import sys

    from tests.harness.mpirun import explain, mpi_env, run as run_job

    out = tmp_path / "bench"
    p = run_job([sys.executable, "-m", "hvd_adaptive.bench.speed", "--config", "configs/tiny.yaml",
                 "--algorithms", "sync", "horovod", "--scenarios", "even", "slowed", "--slowdown", "2",
                 "--target", "0.6", "--out", str(out)], timeout=300, env=mpi_env())
    assert p.returncode == 0, explain(p)
    assert "horovod skipped in the slowed scenario" in p.stdout, p.stdout
    text = (out / "bench.txt").read_text()
    even, slowed = text.split("\nrank 1 slowed")
    row = next(line.split() for line in even.splitlines() if line.startswith("horovod"))
    assert row[1] != "-" and float(row[1]) > 0, text  # it reached P@1 0.6: seconds to it
    assert row[-5:] == ["-"] * 5, text  # no breakdown of its time
    assert "ref/this: horovod's time to the target" in even, text  # the ratios' denominator
    assert row[6] == "1.00", text
    assert not any(line.startswith("horovod") for line in slowed.splitlines()), text
    assert (out / "even-horovod-r0" / "summary.json").is_file()
