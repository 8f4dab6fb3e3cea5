"""When periodic work is due: the one rule for the run's evaluations (in epochs), checkpoints
(in rounds) and progress lines (in seconds)."""
from __future__ import annotations

import math


def itstime(progress: float, every: float, last: float) -> bool:
    """Whether something due every `every` units (epochs, rounds, seconds) fell in
    (`last`, `progress`]: a multiple of `every` was reached since the last look."""
    return math.floor(progress / every + 1e-9) > math.floor(last / every + 1e-9)
