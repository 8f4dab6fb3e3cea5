"""The benchmark's table: medians over repeats, time to target interpolated as the report does,
missing values as "-"; and its contenders come from the one registry of algorithms."""
from hvd_adaptive.algorithms import ALGORITHMS
from hvd_adaptive.bench import CONTENDERS, table


def run(p1s, compute_s, efficiency=0.8):
    """One run's summary and evaluations (evaluations one second and 100 rows apart)."""
    evals = [{"p_at_1": p, "wall_s": i + 1.0, "samples": 100 * (i + 1)} for i, p in enumerate(p1s)]
    per_rank = [{"compute_s": compute_s, "comm_s": 1.0, "sync_s": 0.0, "wait_s": 0.0, "batch_s": 0.0}]
    return {"summary": {"per_rank": per_rank, "efficiency": efficiency, "final": {"p_at_1": p1s[-1]}},
            "evals": evals}


def test_table_medians_ratio_and_missing_values():
    results = {"even": {"sync": [run([0.2, 0.5], 1.0), run([0.2, 0.3, 0.5], 1.0), run([0.5], 1.0)],
                        "adaptive": [run([0.4], 3.0, efficiency=0.9)]}}
    lines = table(results, 0.45).splitlines()
    assert "medians over 3 repeat(s)" in lines[1]
    assert lines[2].split() == ["contender", "s->target", "rows->tgt", "rows/s", "effic.", "sync/this",
                                "compute", "comm", "allgat", "wait", "batch"]
    # sync's times to 0.45: 1.83, 2.75 and 1.0 s -> median 1.83; rows 183, 275, 100 -> 183
    assert lines[3].split()[:6] == ["sync", "1.8", "183", "100", "0.80", "1.00"]
    # adaptive never reached the target: no time, rows, rate or ratio against sync
    assert lines[4].split() == ["adaptive", "-", "-", "-", "0.90", "-", "0.75", "0.25", "0.00", "0.00", "0.00"]


def test_every_algorithm_is_a_contender():
    assert all(CONTENDERS[name] == [f"train.algorithm={name}"] for name in ALGORITHMS)
    assert {"sync_prop", "adaptive_paper"} <= set(CONTENDERS)
