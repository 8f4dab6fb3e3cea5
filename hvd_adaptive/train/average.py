"""checkpoint.average: a running average of the evaluated model's weights, which competes with
the model itself for the kept best.

The average is an exponential one over training progress with a half-life of H epochs: at each
sample the model's weights w enter as

    avg <- b * avg + (1 - b) * w,    b = 0.5 ** (epochs since the last sample / H)

so a model's share halves every H epochs whatever the spacing of the samples. The trainer
samples at every evaluation and, between them, at the end of the first round at least H epochs
after the last sample. The first sample, the first evaluation's model, is the average (the
model at its start would keep a share for epochs, and a run that ends at its first evaluation
keeps the model). Every rank holds the same average (the evaluated model is equal on every
rank at a round's end). It lives in host memory as numpy arrays, in the order of the model's
`variables_list`; the training loop's position holds it and saves it with its checkpoints
(trainer.Position), so H is the config's, also after a resume.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np


@dataclass
class WeightAverage:
    """The running average (`arrays`, None before the first sample) and the progress in
    epochs of its last sample (`at`)."""

    arrays: Optional[list] = None
    at: float = 0.0

    def due(self, progress: float, halflife: float) -> bool:
        """Whether the trainer samples at `progress` between evaluations: a half-life or more
        after the last sample (never before the first, which an evaluation takes)."""
        return self.arrays is not None and progress - self.at >= halflife

    def add(self, weights: Sequence[np.ndarray], progress: float, halflife: float) -> None:
        """Takes the model's `weights` at `progress` epochs into the average, a model's share
        halving every `halflife` epochs (a second sample at the same progress changes
        nothing)."""
        if not halflife > 0:
            raise ValueError(f"the average's half-life must be > 0 epochs, got {halflife}")
        if self.arrays is None:
            self.arrays = [np.array(w, dtype=np.float32, copy=True) for w in weights]
        elif progress > self.at:
            keep = 0.5 ** ((progress - self.at) / halflife)
            for avg, w in zip(self.arrays, weights):
                avg *= keep
                avg += (1.0 - keep) * w
        else:
            return
        self.at = float(progress)
