"""Training algorithms, all in one harness (config `train.algorithm`).

ALGORITHMS is the one list of algorithm names: `check_name` checks `train.algorithm` against
it before the ranks start (run.check_inputs), `build` instantiates from it and the benchmark
offers its names as contenders. Importing this
package does not import TensorFlow (config and the CLI read it before TensorFlow starts): each
algorithm's module is imported when it is built, and Algorithm, Context and RoundStats (from
algorithms/base.py) when first used.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Optional

from hvd_adaptive.config import Config, ConfigError
from hvd_adaptive.train import checkpoint as ck

if TYPE_CHECKING:
    from hvd_adaptive.train.algorithms.base import Algorithm, Context

# name -> "module:class"
ALGORITHMS = {
    "sync": "hvd_adaptive.train.algorithms.sync:Sync",
    "auto": "hvd_adaptive.train.algorithms.auto:Auto",
    "local": "hvd_adaptive.train.algorithms.averaging:LocalSGD",
    "sma": "hvd_adaptive.train.algorithms.averaging:SMA",
    "adaptive": "hvd_adaptive.train.algorithms.adaptive:Adaptive",
    "hogbatch": "hvd_adaptive.train.algorithms.hogbatch:Hogbatch",
    "adaptive_hogbatch": "hvd_adaptive.train.algorithms.hogbatch:AdaptiveHogbatch",
}
# Algorithms whose CPU workers (hogbatch.cpu_ranks) may run their own thread count.
HOGBATCH = ("hogbatch", "adaptive_hogbatch")


def check_name(cfg: Config) -> None:
    """Raises ConfigError unless `train.algorithm` is a name of ALGORITHMS (no TensorFlow needed)."""
    name = cfg.train.algorithm
    if name not in ALGORITHMS:
        raise ConfigError(f"train.algorithm: must be one of {list(ALGORITHMS)}, got {name!r}")


def build(ctx: Context) -> Algorithm:
    """Instantiates the configured algorithm (importing its module: each pulls in Horovod)."""
    check_name(ctx.cfg)
    module, _, cls = ALGORITHMS[ctx.cfg.train.algorithm].partition(":")
    return getattr(importlib.import_module(module), cls)(ctx)


def eval_model_keys(state: dict) -> list[str]:
    """Keys of the evaluated model's arrays in a training checkpoint, input layer first.

    What `Algorithm.eval_model` returns, as `state_dict` stores it: SMA evaluates its central
    model ("sma.central.<i>"); every other algorithm its replica ("model.<i>"), equal on every
    rank at a round's end. Read without TensorFlow (predict checks a run before it starts).
    """
    return ck.indexed_keys(state, ck.SMA_CENTRAL if state.get("algorithm") == "sma" else ck.MODEL)


def worker_threads(cfg: Config, rank: int) -> Optional[int]:
    """TensorFlow threads of a rank: hogbatch.cpu_threads on CPU workers, else train.threads.

    Thread pools are sized before TensorFlow starts (distributed.init), so this must not need
    TensorFlow.
    """
    cpu = cfg.train.algorithm in HOGBATCH and rank in cfg.hogbatch.cpu_ranks
    return cfg.hogbatch.cpu_threads or cfg.train.threads if cpu else cfg.train.threads


def __getattr__(name: str):
    # The shared classes live in base.py, which imports TensorFlow: only on first use.
    if name in ("Algorithm", "Context", "RoundStats"):
        from hvd_adaptive.train.algorithms import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ALGORITHMS", "Algorithm", "Context", "HOGBATCH", "RoundStats", "build", "check_name",
           "eval_model_keys",
           "worker_threads"]
