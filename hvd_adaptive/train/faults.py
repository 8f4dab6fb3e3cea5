"""Faults the test suite injects into a run through the environment, kept out of the loop's code.

HVD_ADAPTIVE_FAIL_AT_ROUND=<round> (and optionally HVD_ADAPTIVE_FAIL_RANK=<rank>; default every
rank) raises RuntimeError at the start of that round, to test fail-fast; with
HVD_ADAPTIVE_FAIL_KIND=nan it writes NaN into the model's input layer instead, to test the
non-finite guards. HVD_ADAPTIVE_SLOW_START=<rank>:<seconds> makes that rank enter its CPU quota
that much later (no rank calibrates before all are in), HVD_ADAPTIVE_SLOW_EVAL=<rank>:<seconds>
leave every evaluation that much later (no rank's evaluation reaches the training clock).
Without these variables every hook does nothing.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Faults:
    """The faults this rank was told to inject (`from_env`)."""

    rank: int
    fail_at: Optional[int] = None   # the round at whose start this rank fails
    nan: bool = False               # fail by NaN weights instead of an exception

    @classmethod
    def from_env(cls, rank: int) -> Faults:
        at, who = os.environ.get("HVD_ADAPTIVE_FAIL_AT_ROUND"), os.environ.get("HVD_ADAPTIVE_FAIL_RANK")
        mine = at is not None and (who is None or int(who) == rank)
        return cls(rank, int(at) if mine else None, os.environ.get("HVD_ADAPTIVE_FAIL_KIND") == "nan")

    def at_round(self, rnd: int, algo) -> None:
        """At the start of round `rnd`: NaN in the input layer or an exception, if told to."""
        if rnd != self.fail_at:
            return
        if self.nan:
            from hvd_adaptive.tfload import tf

            w = algo.model.variables_list[0]
            w.assign(tf.fill(tf.shape(w), float("nan")))
        else:
            raise RuntimeError(f"injected failure at round {rnd} (test hook HVD_ADAPTIVE_FAIL_AT_ROUND)")

    def delay(self, where: str) -> None:
        """Sleeps where HVD_ADAPTIVE_SLOW_<WHERE>=<rank>:<seconds> names this rank, and says so
        on stderr (the tests count these lines: a hook that never fired proves nothing)."""
        variable = f"HVD_ADAPTIVE_SLOW_{where.upper()}"
        who, _, seconds = os.environ.get(variable, "").partition(":")
        if who and int(who) == self.rank:
            print(f"[rank {self.rank}] test hook {variable}: {seconds} s late", file=sys.stderr, flush=True)
            time.sleep(float(seconds))
