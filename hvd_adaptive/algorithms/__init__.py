"""Training algorithms, all in one harness (config `train.algorithm`).

ALGORITHMS is the one list of algorithm names: config validates `train.algorithm` against it,
`build` instantiates from it and the benchmark offers its names as contenders. Importing this
package does not import TensorFlow (config and the CLI read it before TensorFlow starts): each
algorithm's module is imported when it is built, and Algorithm, Context and RoundStats (from
algorithms/base.py) when first used.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from hvd_adaptive.algorithms.base import Algorithm, Context
    from hvd_adaptive.config import Config

# name -> "module:class"
ALGORITHMS = {
    "sync": "hvd_adaptive.algorithms.sync:Sync",
    "local": "hvd_adaptive.algorithms.averaging:LocalSGD",
    "sma": "hvd_adaptive.algorithms.averaging:SMA",
    "adaptive": "hvd_adaptive.algorithms.adaptive:Adaptive",
    "hogbatch": "hvd_adaptive.algorithms.hogbatch:Hogbatch",
    "adaptive_hogbatch": "hvd_adaptive.algorithms.hogbatch:AdaptiveHogbatch",
}
# Algorithms whose CPU workers (hogbatch.cpu_ranks) may run their own thread count.
HOGBATCH = ("hogbatch", "adaptive_hogbatch")


def build(ctx: Context) -> Algorithm:
    """Instantiates the configured algorithm (importing its module: each pulls in Horovod)."""
    name = ctx.cfg.train.algorithm
    if name not in ALGORITHMS:
        raise ValueError(f"train.algorithm: must be one of {list(ALGORITHMS)}, got {name!r}")
    module, _, cls = ALGORITHMS[name].partition(":")
    return getattr(importlib.import_module(module), cls)(ctx)


def eval_model_keys(state: dict) -> list[str]:
    """Keys of the evaluated model's arrays in a training checkpoint, input layer first.

    What `Algorithm.eval_model` returns, as `state_dict` stores it: SMA evaluates its central
    model ("sma.central.<i>"); every other algorithm its replica ("model.<i>"), equal on every
    rank at a round's end. Read without TensorFlow (predict checks a run before it starts).
    """
    prefix = "sma.central." if state.get("algorithm") == "sma" else "model."
    keys = [k for k in state if k.startswith(prefix) and k[len(prefix):].isdigit()]
    return sorted(keys, key=lambda k: int(k[len(prefix):]))


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
        from hvd_adaptive.algorithms import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ALGORITHMS", "Algorithm", "Context", "HOGBATCH", "RoundStats", "build", "eval_model_keys",
           "worker_threads"]
