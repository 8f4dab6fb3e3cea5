"""Training algorithms, all in one harness (config `train.algorithm`)."""
from __future__ import annotations

from hvd_adaptive.algorithms.base import Algorithm, Context, RoundStats


def build(ctx: Context) -> Algorithm:
    """Instantiates the configured algorithm (imports lazily: each pulls in Horovod)."""
    name = ctx.cfg.train.algorithm
    if name == "sync":
        from hvd_adaptive.algorithms.sync import Sync as cls
    elif name == "local":
        from hvd_adaptive.algorithms.averaging import LocalSGD as cls
    elif name == "sma":
        from hvd_adaptive.algorithms.averaging import SMA as cls
    elif name == "adaptive":
        from hvd_adaptive.algorithms.adaptive import Adaptive as cls
    elif name == "hogbatch":
        from hvd_adaptive.algorithms.hogbatch import Hogbatch as cls
    elif name == "adaptive_hogbatch":
        from hvd_adaptive.algorithms.hogbatch import AdaptiveHogbatch as cls
    else:
        raise ValueError(f"train.algorithm: {name!r} is not implemented yet")
    return cls(ctx)


__all__ = ["Algorithm", "Context", "RoundStats", "build"]
