"""A run's parts built from its resolved config: the one place the trainer, the test harness
and the merge benchmark take the model, its optimizer and the algorithm from."""
from __future__ import annotations

from typing import Optional

import numpy as np

from hvd_adaptive.config import Config, unresolved
from hvd_adaptive.data import Dataset
from hvd_adaptive.model.network import Optimizer, SparseMLP
from hvd_adaptive.parallel.distributed import Cluster
from hvd_adaptive.train import algorithms
from hvd_adaptive.train.hetero import Heterogeneity


def build_model(cfg: Config, n_features: int, n_labels: int,
                label_freq: Optional[np.ndarray] = None, stream: int = 0) -> SparseMLP:
    """The network of `cfg.model` for data of this shape (label frequencies: the sampled output
    layer's proposal; `stream`: the rank's stream of sampled negatives)."""
    return SparseMLP(n_features, n_labels, cfg.model, label_freq=label_freq, stream=stream)


def build_algorithm(cfg: Config, cluster: Cluster, train: Dataset,
                    hetero: Optional[Heterogeneity] = None) -> algorithms.Algorithm:
    """The configured algorithm on a fresh model and optimizer, on this rank's device scope.

    Args:
        cfg: the run's config, resolved (config.resolve): the algorithms read the derived
            values (batch bounds, threads) as they are; its model chosen for the data
            (config.model_for: SparseMLP refuses model.hidden auto).
        cluster: this rank's place in the job.
        train: the training set.
        hetero: this rank's slowdown; default the config's.

    Raises:
        ValueError: `cfg` is not resolved.
    """
    missing = unresolved(cfg)
    if missing:
        raise ValueError(f"build_algorithm needs a resolved config (config.resolve); unset: {missing}")
    model = build_model(cfg, train.n_features, train.n_labels, train.label_frequencies(),
                        stream=cluster.rank)
    opt = Optimizer.for_model(model, cfg.optim)
    hetero = hetero if hetero is not None else Heterogeneity(cfg.hetero, cluster.rank)
    return algorithms.build(algorithms.Context(cfg, cluster, model, opt, train, hetero))
