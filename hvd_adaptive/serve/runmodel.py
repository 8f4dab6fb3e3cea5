"""A trained model read from a run folder: what `predict`, `evaluate` and `export` start from.

A run folder holds `config.json` (the resolved config), `checkpoints/ckpt-<round>/` and, with a
validation split, the best model in `checkpoints/best/ckpt-<round>/`. That best model (or else
the newest checkpoint, or the one named) is verified against its COMPLETE manifest exactly as
resume verifies it (checkpoint.verify), but nothing in the folder is ever changed: where resume
renames a damaged checkpoint and falls back to an older one, a reader stops with an error that
names the checkpoint, so a prediction never comes silently from an older model.

Opening a run needs numpy only (arrays are memory-mapped; the optimizer's slots are never
read), so the CLI checks the run, k and the data file before TensorFlow starts; `build_model`
then makes the TensorFlow model.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from hvd_adaptive.train import checkpoint, records
from hvd_adaptive.train.algorithms import eval_model_keys
from hvd_adaptive.config import Config, ConfigError, config_from_dict


@dataclass
class TrainedRun:
    """A verified checkpoint of a run and its config."""

    run_dir: Path
    cfg: Config
    path: Path              # the checkpoint folder
    arrays: list            # the evaluated model's arrays (memory-mapped), input layer first

    @property
    def n_features(self) -> int:
        return int(self.arrays[0].shape[0])

    @property
    def n_labels(self) -> int:
        return int(self.arrays[-1].shape[0])  # the output layer's bias

    def check_k(self, k: int) -> None:
        """Raises ConfigError unless 1 <= k <= the model's labels."""
        if not 1 <= k <= self.n_labels:
            raise ConfigError(f"--k {k}: must be between 1 and the model's {self.n_labels} labels "
                              f"({self.path})")


LAST = "last"  # --checkpoint last: the newest training checkpoint, not the best model


def open_run(run_dir: str | Path, name: Optional[str] = None) -> TrainedRun:
    """Reads a run's config and verifies the checkpoint to read: by default the best model
    (checkpoints/best/, kept with a validation split) or else the newest checkpoint; `name`
    "best", "last" (the newest training checkpoint) or a folder such as "ckpt-40".

    Raises:
        ConfigError: No such run folder, no config.json, or no checkpoint.
        checkpoint.CheckpointError: The checkpoint fails verification (the message says why).
    """
    run_dir = Path(run_dir)
    if not (run_dir / records.CONFIG).is_file():
        raise ConfigError(f"{run_dir}: not a run folder (no config.json)")
    try:
        cfg = config_from_dict(json.loads((run_dir / records.CONFIG).read_text()))
    except ValueError as e:
        raise ConfigError(f"{run_dir / 'config.json'}: {e}") from None
    ckpt_dir = run_dir / "checkpoints"
    best = checkpoint.newest(ckpt_dir / checkpoint.BEST)
    if name == checkpoint.BEST and best is None:
        raise ConfigError(f"{ckpt_dir}: no best model kept; a run keeps one with a validation "
                          "split (data.validation) and checkpoint.best")
    if name in (None, checkpoint.BEST) and best is not None:
        path = best
    elif name in (None, LAST):
        path = checkpoint.newest(ckpt_dir)
    else:
        path = ckpt_dir / name
    if path is None or not path.is_dir():
        what = f"no checkpoint {name}" if name not in (None, LAST) else "no checkpoint"
        raise ConfigError(f"{ckpt_dir}: {what}; a run writes one at its end (checkpoint.every "
                          "for more)")
    try:
        checkpoint.verify(path)
    except checkpoint.CheckpointError as e:
        older = " or name an older one with --checkpoint ckpt-N" if not name else ""
        raise checkpoint.CheckpointError(f"{e}; nothing in the run folder was changed: "
                                         f"retrain{older}") from None
    state, _ = checkpoint.load(path, mmap=True)
    arrays = [state[k] for k in eval_model_keys(state)]
    if not arrays:
        raise checkpoint.CheckpointError(f"{path}: holds no model arrays")
    return TrainedRun(run_dir, cfg, path, arrays)


def build_model(run: TrainedRun):
    """The run's SparseMLP with the checkpoint's weights (imports TensorFlow)."""
    from hvd_adaptive.model.network import SparseMLP

    # Inference never samples negatives: the uniform sampler needs no label frequencies.
    cfg = dataclasses.replace(run.cfg.model, sampler="uniform")
    model = SparseMLP(run.n_features, run.n_labels, cfg)
    variables = model.variables_list
    if [tuple(v.shape) for v in variables] != [a.shape for a in run.arrays]:
        raise checkpoint.CheckpointError(
            f"{run.path}: its arrays {[a.shape for a in run.arrays]} do not fit the model of "
            f"{run.run_dir / 'config.json'} {[tuple(v.shape) for v in variables]}")
    for v, a in zip(variables, run.arrays):
        v.assign(np.asarray(a))
    return model
