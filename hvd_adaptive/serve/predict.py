"""`hvd-adaptive predict` and `hvd-adaptive evaluate`: a trained model on new rows.

predict streams the input (formats.iter_rows: blocks of about 4 MB of text), so memory stays
bounded by a block, the model and the label-blocked top-k of evaluation.py (logits of at most
`train.eval_memory_mb` at a time). Each block is cut into steps of `batch_rows` rows; on N
ranks step j goes to rank j mod N and rank 0 gathers every block's results and writes them in
input order. A step's rows are the same whatever the number of ranks, so the labels depend
only on the checkpoint (near-ties aside); a score's last digit can move with `batch_rows` or a rank's threads
(how TensorFlow splits the products; docs/scale.md).

The score of a label is its softmax probability over all labels (the model's training loss
is a softmax), the normalizer accumulated block by block, or under model.loss sigmoid the
label's own sigmoid; lines are `label:score` pairs, best
first, as napkinXC and omikuji write them.

evaluate computes the trainer's metrics (Evaluator) on a labelled file, with propensities from
the run's training labels (data.propensity_a/_b), like the run's own evaluations.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

from hvd_adaptive.parallel import distributed
from hvd_adaptive.data import iter_rows, load_data, load_dataset, split_validation
from hvd_adaptive.train.evaluation import Evaluator
from hvd_adaptive.model.metrics import inverse_propensities
from hvd_adaptive.serve.runmodel import TrainedRun, build_model


def format_lines(labels: np.ndarray, scores: np.ndarray) -> str:
    """`label:score` pairs of each row, best first, one row a line."""
    return "".join(" ".join(f"{lab}:{s:.6g}" for lab, s in zip(ls, ss)) + "\n"
                   for ls, ss in zip(labels.tolist(), scores.tolist()))


def predict(run: TrainedRun, data: str, out: str, k: int, batch_rows: int = 2048,
            progress_s: float = 10.0) -> int:
    """Writes the top-k labels and scores of every row of `data` to `out` (collective).

    Args:
        run: The opened run (runmodel.open_run).
        data: Rows in XC or LIBSVM form (run's data.format); labels are read and ignored.
        out: The output file, written by rank 0 (replaced whole at the end).
        k: Labels per row.
        batch_rows: Rows scored at once (fewer when eval_memory_mb cannot hold k logits each).
        progress_s: Seconds between progress lines on stderr (rank 0).

    Returns:
        Rows predicted.
    """
    cluster = distributed.init()
    with distributed.fail_fast(cluster):
        rank, size, comm = cluster.rank, cluster.size, cluster.comm
        ev = Evaluator(build_model(run), run.cfg.train.eval_memory_mb, chunk=batch_rows, k=k)
        tmp = Path(f"{out}.tmp-{os.getpid()}")
        sink = open(tmp, "w") if rank == 0 else None
        t0 = last = time.perf_counter()
        rows = steps = 0
        try:
            for _, block in iter_rows(data, fmt=run.cfg.data.format, n_features=run.n_features):
                idx = np.arange(block.n_rows)
                cut = [idx[i:i + ev.chunk] for i in range(0, block.n_rows, ev.chunk)]
                owner = [(steps + j) % size for j in range(len(cut))]
                mine = [ev.top_scores(block, c) for c, o in zip(cut, owner) if o == rank]
                steps += len(cut)
                # Rank 0 writes every rank's steps in input order; one gather a block bounds memory.
                parts = comm.gather(mine, root=0) if size > 1 else [mine]
                rows += block.n_rows
                if rank != 0:
                    continue
                taken = [iter(p) for p in parts]
                for o in owner:
                    sink.write(format_lines(*next(taken[o])))
                if time.perf_counter() - last >= progress_s:
                    last = time.perf_counter()
                    _say(f"predict: {rows:,} rows, {rows / (last - t0):,.0f} rows/s")
            if sink is not None:
                sink.close()
                os.replace(tmp, out)
        finally:
            if sink is not None and not sink.closed:
                sink.close()
            if rank == 0 and tmp.exists():
                tmp.unlink()
        seconds = time.perf_counter() - t0
        peak = max(comm.allgather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
        if rank == 0:
            _say(f"predicted {rows:,} rows in {seconds:.1f} s ({rows / max(seconds, 1e-9):,.0f} "
                 f"rows/s) on {size} rank(s) from {run.path}; peak memory {peak:,.0f} MB a rank; "
                 f"wrote {out}")
    distributed.shutdown()
    return rows


def evaluate(run: TrainedRun, data: str, out: Optional[str], rows: Optional[int] = None) -> dict:
    """P@k, nDCG@k, PSP@k and PSnDCG@k (k = 1, 3, 5) of the run's model on `data` (collective).

    Propensities come from the run's training labels (its data.train, or the synthetic set it
    generated), as in the run's own evaluations, so the run's test file gives its last record.

    Args:
        run: The opened run.
        data: A labelled file in the run's data.format.
        out: Optional JSON file for the result (rank 0 writes it).
        rows: Evaluate the first `rows` rows only (the run's train.eval_rows does the same).

    Returns:
        {"metrics": ..., "rows", "data", "run", "checkpoint"} (every rank).
    """
    cluster = distributed.init()
    with distributed.fail_fast(cluster):
        cfg, model = run.cfg, build_model(run)
        train_ds, _ = split_validation(cfg, load_data(cfg, cluster.is_root, cluster.comm.Barrier)[0])  # the rows it trained on
        inv_prop = inverse_propensities(train_ds.label_frequencies(), train_ds.n_rows,
                                        cfg.data.propensity_a, cfg.data.propensity_b)

        def load():
            return load_dataset(data, fmt=cfg.data.format, cache_dir=cfg.data.cache_dir,
                                n_features=model.n_features, n_labels=model.n_labels)

        # Rank 0 parses and writes the binary cache first; the others then memory-map it.
        test = load() if cluster.is_root else None
        cluster.comm.Barrier()
        test = test if test is not None else load()
        metrics = Evaluator(model, cfg.train.eval_memory_mb, inv_prop=inv_prop)(test, cluster, rows)
        result = {"run": str(run.run_dir), "checkpoint": str(run.path), "data": str(data),
                  "rows": min(rows or test.n_rows, test.n_rows),
                  "metrics": {k: round(v, 5) for k, v in metrics.items()}}
        if cluster.is_root:
            m = result["metrics"]
            print(f"{data}: {result['rows']:,} rows, {run.path}")
            for name, title in (("p", "P"), ("ndcg", "nDCG"), ("psp", "PSP"), ("psndcg", "PSnDCG")):
                print("  " + "  ".join(f"{title}@{k} {m[f'{name}_at_{k}']:.4f}" for k in (1, 3, 5)))
            if out:
                Path(out).write_text(json.dumps(result, indent=1) + "\n")
    distributed.shutdown()
    return result


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
