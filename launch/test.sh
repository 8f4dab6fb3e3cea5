#!/usr/bin/env bash
# Set up (idempotent, cached) and run the whole test suite, the Slurm tests included.
#   bash launch/test.sh              # what CI runs: every tier (tests/README.md)
#   bash launch/test.sh tests/unit   # the unit loop, under a minute: no MPI ranks, no training run
#   bash launch/test.sh -k config    # extra arguments go to pytest
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$REPO/launch/setup.sh" --slurm
VENV=${HVD_ADAPTIVE_VENV:-$REPO/.venv}
cd "$REPO"
exec "$VENV/bin/python" -m pytest -q -rs "$@"
