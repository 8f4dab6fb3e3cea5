"""`hvd-adaptive export`: a run's model as a TensorFlow SavedModel that serves top-k labels.

The serving signature (`serving_default`) takes a batch of sparse rows in the segment form the
trainer uses (data.Batch), so a client sends only the non-zeros:

  feat_ids  int64 [nnz]   feature id of every non-zero, rows one after another
  feat_vals float32 [nnz] its value
  row_ids   int32 [nnz]   the batch row (0 .. n_rows-1) each non-zero belongs to, in any order
  n_rows    int32 []      rows in the batch (rows without features are allowed)

and returns `labels` int32 [n_rows, k] and `scores` float32 [n_rows, k], best first: the same
labels and scores as `hvd-adaptive predict`, computed by the same label-blocked
top-k (evaluation.py) with its block fixed at export time for `train.eval_memory_mb` and 2,048
rows a request. The graph holds TensorFlow ops only: loading it needs TensorFlow, not
hvd_adaptive. A feature id at or beyond the model's features fails the request
(InvalidArgumentError from the gather).
"""
from __future__ import annotations

import json
from pathlib import Path

from hvd_adaptive.tfload import tf

from hvd_adaptive.train.evaluation import Evaluator
from hvd_adaptive.serve.runmodel import TrainedRun, build_model

SIGNATURE = (tf.TensorSpec([None], tf.int64, name="feat_ids"),
             tf.TensorSpec([None], tf.float32, name="feat_vals"),
             tf.TensorSpec([None], tf.int32, name="row_ids"),
             tf.TensorSpec([], tf.int32, name="n_rows"))


class Serving(tf.Module):
    """The model's variables and one serving function over them."""

    def __init__(self, run: TrainedRun, k: int):
        super().__init__(name="hvd_adaptive_serving")
        self.model = build_model(run)  # tracked: its variables are saved with the function
        ev = Evaluator(self.model, run.cfg.train.eval_memory_mb, k=k)

        def serve(feat_ids, feat_vals, row_ids, n_rows):
            # The model sums a row's non-zeros in row order: a request's may come in any order.
            order = tf.argsort(row_ids, stable=True)
            hidden = self.model.hidden(tf.gather(feat_ids, order), tf.gather(feat_vals, order),
                                       tf.gather(row_ids, order), n_rows)
            labels, scores = ev.scored_top_k(hidden)
            return {"labels": labels, "scores": scores}

        self.serve = tf.function(serve, input_signature=SIGNATURE, autograph=False)


def export(run: TrainedRun, out: str, k: int) -> Path:
    """Writes the SavedModel to `out` (a new or empty folder: the CLI checks) and `hvd_adaptive.json` in its
    assets.extra/ (run, checkpoint, k, features, labels; TF Serving ignores that folder)."""
    dest = Path(out)
    module = Serving(run, k)
    tf.saved_model.save(module, str(dest), signatures={"serving_default": module.serve})
    meta = {"run": str(run.run_dir), "checkpoint": str(run.path), "k": k,
            "n_features": run.n_features, "n_labels": run.n_labels,
            "inputs": [s.name for s in SIGNATURE], "outputs": ["labels", "scores"]}
    (dest / "assets.extra").mkdir(exist_ok=True)
    (dest / "assets.extra" / "hvd_adaptive.json").write_text(json.dumps(meta, indent=1) + "\n")
    return dest
