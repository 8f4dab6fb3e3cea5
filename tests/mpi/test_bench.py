"""The speed benchmark end to end: the plain Horovod script beside sync on real ranks."""
def test_the_benchmark_runs_the_plain_horovod_script_beside_sync(tmp_path):
    """The real benchmark on the tiny data: a horovod row with figures in the even scenario (its
    rate probe's seconds among them), and a printed line instead of a run in the sleep-mode one."""
    import sys

    from tests.harness.mpirun import explain, mpi_env, run as run_job

    out = tmp_path / "bench"
    p = run_job([sys.executable, "-m", "hvd_adaptive.bench.speed", "--config", "configs/tiny.yaml",
                 "--algorithms", "sync", "horovod",
                 "--variant", "coarse=train.algorithm=sync,train.eval_every=1",
                 "--scenarios", "even", "slowed", "--slowdown", "2",
                 "--target", "0.6", "--set", "optim.lr=auto", "--set", "optim.lr_choice=probe",
                 "--eval-every", "0.5", "--out", str(out)], timeout=300,
                env=mpi_env())
    assert p.returncode == 0, explain(p)
    assert "horovod skipped in the slowed scenario" in p.stdout, p.stdout
    text = (out / "bench.txt").read_text()
    # The code the runs trained with: printed first, and bench.txt's second line.
    assert p.stdout.startswith("[bench] code: "), p.stdout[:300]
    assert text.splitlines()[1].startswith("code: ") and "hvd_adaptive at commit" in text, text
    even, slowed = text.split("\nrank 1 slowed")
    row = next(line.split() for line in even.splitlines() if line.startswith("horovod"))
    assert row[1] != "-" and float(row[1]) > 0, text  # it reached P@1 0.6: seconds to it
    assert row[-5:] == ["-"] * 5, text  # no breakdown of its time
    assert "ref/this: horovod's time to the target" in even, text  # the ratios' denominator
    head = next(line.split() for line in even.splitlines() if line.startswith("contender"))
    assert row[head.index("ref/this")] == "1.00", text
    assert float(row[head.index("probe")]) > 0, text  # optim.lr auto's seconds, on its clock
    assert not any(line.startswith("horovod") for line in slowed.splitlines()), text
    assert (out / "even-horovod-r0" / "summary.json").is_file()
    # Every run, the plain script's too, evaluated on the benchmark's grid, not tiny.yaml's 2.0,
    # but a variant that sets its own train.eval_every (its items come after the grid's)
    import json

    runs = sorted(d for d in out.iterdir() if d.is_dir())
    assert [d.name for d in runs] == ["even-coarse-r0", "even-horovod-r0", "even-sync-r0",
                                      "slowed2-coarse-r0", "slowed2-sync-r0"], runs
    for d in runs:
        every = json.loads((d / "config.json").read_text())["train"]["eval_every"]
        assert every == (1.0 if "coarse" in d.name else 0.5), d


def test_the_scaling_study_runs_the_reference_on_one_rank_and_a_table_a_target(tmp_path):
    """The scaling study end to end on the tiny data under cgroup quotas: one rank runs the
    plain Horovod script only (the speedups' base), every contender runs at 2 ranks, every
    target gets its table with ratios against the script."""
    import json
    import sys

    from tests.harness.mpirun import explain, mpi_env, run as run_job

    out = tmp_path / "scaling"
    p = run_job([sys.executable, "-m", "hvd_adaptive.bench.speed", "--config", "configs/tiny.yaml",
                 "--scaling", "1", "2", "--core", "0.5", "--profiles", "equal",
                 "--algorithms", "horovod", "sync", "--target", "0.4", "0.6", "--eval-every", "1",
                 "--out", str(out)],
                timeout=300, env=mpi_env())
    assert p.returncode == 0, explain(p)
    assert sorted(d.name for d in out.iterdir() if d.is_dir()) == [
        "equal1-horovod-r0", "equal2-horovod-r0", "equal2-sync-r0"]
    text = (out / "bench.txt").read_text()
    assert "ref/this: horovod's time to the target" in text, text
    tables = text.split("\ntarget P@1 ")[1:]
    assert [t.split(",")[0] for t in tables] == ["0.4000", "0.6000"], text
    for t in tables:
        lines = t.splitlines()
        head = lines[1].split()
        rows = [dict(zip(head, line.split())) for line in lines[2:] if line.strip()]
        assert [(r["ranks"], r["contender"]) for r in rows] == [("1", "horovod"), ("2", "horovod"),
                                                               ("2", "sync")], t
        assert rows[0]["speedup"] == "1.00" and rows[1]["ref/this"] == "1.00", t
        assert float(rows[2]["ref/this"]) > 0 and rows[2]["of_limit"] != "-", t
    saved = json.loads((out / "scaling.json").read_text())
    assert saved["target"] == 0.6 and len(saved["rows"]) == 3
    # --reuse reads the finished runs of the same arguments: the tables again, nothing rerun
    # but the one whose arguments changed (its folder's arguments file removed by hand here)
    stamps = {d.name: (d / "summary.json").stat().st_mtime_ns for d in out.iterdir() if d.is_dir()}
    (out / "equal2-sync-r0" / "bench-args.json").unlink()
    again = run_job(p.args + ["--reuse"], timeout=300, env=mpi_env())
    assert again.returncode == 0, explain(again)
    now = {d.name: (d / "summary.json").stat().st_mtime_ns for d in out.iterdir() if d.is_dir()}
    assert [n for n in stamps if now[n] != stamps[n]] == ["equal2-sync-r0"], (stamps, now)
    assert (out / "bench.txt").read_text().splitlines()[0] == text.splitlines()[0]


def test_the_accuracy_part_runs_five_workloads_the_last_at_bench_yamls_settings(tmp_path):
    """`bash launch/bench.sh accuracy` as documented (docs/accuracy.md), cut to a quarter epoch
    of small data: five workloads each with the network's and the tree's figures, the fifth
    from configs/bench.yaml in adaptive SGD."""
    import json

    from tests.harness.mpirun import explain, mpi_env, run as run_job

    out = tmp_path / "acc"
    env = mpi_env(REPEATS="1", OUT=str(out))
    p = run_job(["bash", "launch/bench.sh", "accuracy", "--epochs", "0.25", "--set",
                 "data.synth.scale=0.02", "--set", "optim.lr=0.1"], 600, env)
    assert p.returncode == 0, explain(p)
    part = out.parent / "acc-accuracy"
    names = ["default", "noisy", "eurlex4k", "delicious200k-5pct", "amazon670k-10pct"]
    for name in names:
        rows = json.loads((part / f"accuracy-{name}.json").read_text())["rows"]
        assert len(rows) == 1 and rows[0]["kept_p1"] > 0 and rows[0]["tree_p1"] > 0, rows
    used = json.loads((part / "amazon670k-10pct-r0" / "config.json").read_text())
    assert used["train"]["algorithm"] == "adaptive", used["train"]
    assert used["train"]["window_samples"] == 8192, used["train"]  # configs/bench.yaml's
