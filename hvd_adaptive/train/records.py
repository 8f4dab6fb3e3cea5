"""The run folder's files, written (RunLog, rank 0) and read back (load_run): the one owner of
their names and of the records' schema.

A run folder holds config.json (the resolved config), metrics.jsonl (the records), summary.json
(the run's end), tb/ (TensorBoard events) and checkpoints/ (train/checkpoint.py). The records:
a `start` record (or `resume`) with the run's set-up and the chosen settings, a `round` record
per round (the trainer's accounting, with each rank's RoundStats.record) and an `eval` record
per evaluation (test metrics, and `val_*` metrics with a validation split).

Every record goes to `metrics.jsonl` (one JSON object a line). `eval` and `round` records are
also written as TensorFlow summary scalars to `<run-dir>/tb/`, so `tensorboard --logdir runs`
shows every run under the folder. Their step is `samples`, the training rows seen by all ranks
so far (comparable across algorithms and rank counts; accuracy against training time is what
`hvd-adaptive report` draws):

  eval/<metric>            every numeric field of an eval record (p_at_k, ndcg_at_k, psp_at_k
                           and psndcg_at_k when evaluated, weight_norm)
  train/loss               a round's mean training loss
  train/rows_per_s         rows trained per second of training time since the previous round
  rank<r>/batch_size       rank r's batch size and merge weight in the round
  rank<r>/weight

A fresh run (a `start` record) removes the events a previous run left in `tb/`, as the report
reads only the latest run of a folder; a resumed run (`resume`) adds its events beside them.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


VAL_METRICS = ("p_at_1", "p_at_3", "p_at_5")  # recorded on the validation split as val_<name>


def val_score(e: dict, prefix: str = "val_") -> float:
    """The validation score the kept model is chosen by: the mean of the split's P@1, P@3 and
    P@5 in the record `e` (`prefix` "avg_val_": checkpoint.average's), -1 where it has none.
    Three figures count three times the hits of P@1 alone, so a split of a few hundred rows
    picks among late evaluations with less noise (docs/accuracy.md, "What this shows")."""
    if prefix + "p_at_1" not in e:
        return -1.0
    return sum(e[prefix + k] for k in VAL_METRICS) / len(VAL_METRICS)

CONFIG = "config.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"

# Fields of an eval record that say when it happened rather than how good the model is.
_EVAL_CLOCKS = ("event", "wall_s", "epoch", "samples")
# Per-rank fields of a round record written as scalars.
_RANK_SCALARS = ("batch_size", "weight")


class RunLog:
    """Rank 0's files and progress lines; other ranks keep quiet.

    Args:
        run_dir: the run folder (created on rank 0).
        active: whether this rank writes (rank 0 only).
    """

    def __init__(self, run_dir: Path, active: bool):
        self.dir, self.active = Path(run_dir), active
        self._fh = None
        self._tb = None
        self._last_round = None  # (wall_s, samples) of the previous round record
        if active:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.dir / METRICS, "a", buffering=1)

    def record(self, **rec) -> None:
        """Appends a record to metrics.jsonl and writes its scalars to TensorBoard."""
        if not self._fh:
            return
        self._fh.write(json.dumps(rec) + "\n")
        event = rec.get("event")
        if event in ("start", "resume"):
            self._open_events(fresh=event == "start")
            self._last_round = (rec["wall_s"], None) if event == "resume" else (0.0, 0)
        elif event == "eval":
            self._scalars(rec["samples"], {f"eval/{k}": v for k, v in rec.items()
                                           if k not in _EVAL_CLOCKS and _is_number(v)})
            self._tb.flush()  # evaluations are few; a crashed run keeps its curve
        elif event == "round":
            self._round_scalars(rec)

    def _open_events(self, fresh: bool) -> None:
        from hvd_adaptive.tfload import tf

        tb = self.dir / "tb"
        if self._tb is not None:
            self._tb.close()
        if fresh and tb.is_dir():
            for old in tb.glob("events.out.tfevents.*"):
                old.unlink()
        with tf.device("/CPU:0"):
            self._tb = tf.summary.create_file_writer(str(tb))

    def _round_scalars(self, rec: dict) -> None:
        values = {"train/loss": rec["loss"]}
        last_wall, last_samples = self._last_round or (None, None)
        if last_samples is not None and rec["wall_s"] > last_wall:
            values["train/rows_per_s"] = (rec["samples"] - last_samples) / (rec["wall_s"] - last_wall)
        self._last_round = (rec["wall_s"], rec["samples"])
        for r in rec.get("ranks", []):
            for key in _RANK_SCALARS:
                if _is_number(r.get(key)):
                    values[f"rank{r['rank']}/{key}"] = r[key]
        self._scalars(rec["samples"], values)

    def _scalars(self, step: int, values: dict) -> None:
        if self._tb is None:  # a record before start/resume (not written by the trainer)
            self._open_events(fresh=False)
        from hvd_adaptive.tfload import tf

        with tf.device("/CPU:0"), self._tb.as_default():
            for tag, value in values.items():
                tf.summary.write(tag, tf.constant(float(value), tf.float32), step=int(step),
                                 metadata=_scalar_metadata())

    def say(self, msg: str) -> None:
        if self.active:
            # One write per line: OpenMPI's --tag-output (always on under horovodrun) tags
            # every chunk it reads, so print's separate "\n" write could split the line.
            print(msg + "\n", end="", flush=True)

    def size(self) -> int:
        """Bytes of metrics.jsonl written so far (0 on other ranks)."""
        if not self._fh:
            return 0
        self._fh.flush()
        return os.fstat(self._fh.fileno()).st_size

    def truncate(self, size: int) -> None:
        """Cuts metrics.jsonl back to `size` bytes (records of rounds a resume redoes)."""
        if self._fh and self.size() > size:
            os.truncate(self.dir / METRICS, size)  # appends then go to the new end

    def write_json(self, name: str, obj: dict) -> None:
        if self.active:
            tmp = self.dir / f".{name}.tmp"
            tmp.write_text(json.dumps(obj, indent=2) + "\n")
            os.replace(tmp, self.dir / name)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None
        if self._fh:
            self._fh.close()
            self._fh = None


def _scalar_metadata():
    """What marks a summary as a scalar for TensorBoard's scalars dashboard.

    tf.summary.scalar needs the tensorboard package at write time (tensorflow-cpu does not
    bring it); writing the same record through tf.summary.write does not, so training nodes
    need only TensorFlow and the viewer alone needs tensorboard.
    """
    from tensorflow.core.framework import summary_pb2

    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# The run folder read back (reports, benchmarks, tests).

class RecordsError(ValueError):
    """A run folder is missing or its files cannot be read; the message names the path."""


@dataclass
class Run:
    """What one run folder holds (records of its latest start only)."""

    name: str
    path: Path
    evals: list[dict] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)
    start: Optional[dict] = None
    summary: Optional[dict] = None

    @property
    def algorithm(self) -> str:
        for src in (self.summary, self.start):
            if src and "algorithm" in src:
                return str(src["algorithm"])
        return "?"

    @property
    def final(self) -> Optional[dict]:
        """Final test metrics: summary.json's, else the last evaluation (a run still going)."""
        if self.summary and self.summary.get("final"):
            return self.summary["final"]
        return self.evals[-1] if self.evals else None

    @property
    def train_s(self) -> Optional[float]:
        if self.summary and "train_wall_s" in self.summary:
            return float(self.summary["train_wall_s"])
        last = self.rounds or self.evals
        return float(last[-1]["wall_s"]) if last else None


def read_metrics(path: Path) -> list[dict]:
    """Records of a metrics.jsonl file, from its last `start` record on.

    The trainer appends, so a folder reused by a second run holds both; only the latest run
    is reported. A final line cut short (a run still writing) is ignored.

    Raises:
        RecordsError: a malformed line other than an unfinished last one (file and line named).
    """
    text = path.read_text()
    lines = text.splitlines()
    records: list[dict] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines) and not text.endswith("\n"):
                break
            raise RecordsError(f"{path}:{number}: not a JSON record ({e})") from None
        if not isinstance(rec, dict) or "event" not in rec:
            raise RecordsError(f"{path}:{number}: expected an object with an 'event' key")
        if rec["event"] == "start":
            records = []
        records.append(rec)
    return records


def load_run(folder: str | Path, name: Optional[str] = None) -> Run:
    """Reads a run folder's metrics.jsonl and, when present, summary.json.

    Args:
        folder: the run folder.
        name: label in the table and legend; default: the folder's name.

    Raises:
        RecordsError: the folder or its metrics.jsonl is missing, or a file is malformed.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise RecordsError(f"{folder}: no such run folder")
    metrics = folder / METRICS
    if not metrics.is_file():
        raise RecordsError(f"{folder}: no metrics.jsonl (not a run folder, or the run never started)")
    run = Run(name=name or folder.name, path=folder)
    for rec in read_metrics(metrics):
        if rec["event"] == "eval":
            run.evals.append(rec)
        elif rec["event"] == "round":
            run.rounds.append(rec)
        elif rec["event"] == "start":
            run.start = rec
    summary = folder / SUMMARY
    if summary.is_file():
        try:
            run.summary = json.loads(summary.read_text())
        except json.JSONDecodeError as e:
            raise RecordsError(f"{summary}: not valid JSON ({e})") from None
    return run


def load_runs(folders: list[str | Path]) -> list[Run]:
    """Loads every folder; names are folder names, with the parent added where two clash."""
    paths = [Path(f) for f in folders]
    names = [p.name for p in paths]
    clashes = {n for n in names if names.count(n) > 1}
    return [load_run(p, f"{p.parent.name}/{p.name}" if p.name in clashes else p.name)
            for p in paths]
