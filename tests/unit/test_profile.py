"""Cluster profiles (`hetero.cores`) checked before any rank starts: bad profiles, and profiles
that do not fit the job or the node."""
import os

import pytest

from hvd_adaptive.config import ConfigError, load_config
from hvd_adaptive.train.hetero import check_profile

@pytest.mark.parametrize("sets, message", [
    (["hetero.cores=[0.5, 0]", "hetero.mode=cpu_quota"], r"hetero.cores: every rank's cores must be > 0"),
    (["hetero.cores=[0.5, 0.5]"], r"hetero.cores: .* set hetero.mode=cpu_quota \(got sleep\)"),
    (["hetero.cores=[0.5, 0.5]", "hetero.mode=cpu_quota", "hetero.slowdown={1: 2}"],
     r"hetero.cores: gives each rank's speed directly"),
])
def test_bad_profiles_in_the_config_are_clear_errors(sets, message):
    with pytest.raises(ConfigError, match=message):
        load_config("configs/tiny.yaml", sets)


def test_a_profile_must_fit_the_job_and_the_node():
    node = len(os.sched_getaffinity(0))
    check_profile([0.5, 0.25], 0, 2, [0.5, 0.25])  # fits: no error
    with pytest.raises(ConfigError, match=r"hetero.cores: the profile has 3 entries for 2 rank"):
        check_profile([0.5, 0.5, 0.5], 0, 2, [0.5, 0.5])
    with pytest.raises(ConfigError, match=rf"rank 1's node ask for {node + 1:g} cores .* node has {node}"):
        check_profile([node / 2 + 0.5] * 2, 1, 2, [node / 2 + 0.5] * 2)


