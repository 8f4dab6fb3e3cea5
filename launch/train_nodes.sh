#!/usr/bin/env bash
# Train on several nodes under mpirun with a hostfile (one line per node: "NAME slots=N"),
# PER_NODE ranks on each. Extra arguments go to `hvd-adaptive train`. Run from any node that
# reaches the others by ssh (OpenMPI's default launcher); the repository and its .venv must be
# at the same path on every node (a shared home).
#   HOSTFILE=hosts PER_NODE=2 CONFIG=configs/tiny.yaml bash launch/train_nodes.sh --run-dir runs/x
# Set for several nodes (docs/multinode.md):
#   osc ucx       the dynamic scheduler's shared counter across nodes (OpenMPI's default
#                 one-sided component cannot make it; the run would fall back to static)
#   oob keepalive a node that drops off the network ends the job after about 11 s (5 s idle,
#                 then 3 probes 2 s apart) with "ORTE has lost communication with a remote
#                 daemon", instead of a hang
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HOSTFILE=${HOSTFILE:?set HOSTFILE to a file of node names, one "NAME slots=N" line per node}
PER_NODE=${PER_NODE:-1}
CONFIG=${CONFIG:-$REPO/configs/default.yaml}
VENV=${HVD_ADAPTIVE_VENV:-$REPO/.venv}
[ -x "$VENV/bin/python" ] || { echo "train_nodes.sh: no $VENV/bin/python; run: bash launch/setup.sh" >&2; exit 2; }
nodes=$(grep -cvE '^[[:space:]]*(#|$)' "$HOSTFILE")
osc=()
ompi_info 2>/dev/null | grep "MCA osc: ucx" >/dev/null && osc=(--mca osc ucx)
# OpenMPI refuses to start as root unless told (containers, test machines).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun --hostfile "$HOSTFILE" -np $((nodes * PER_NODE)) --map-by "ppr:$PER_NODE:node" \
    --bind-to none "${osc[@]}" --mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 \
    --mca oob_tcp_keepalive_probes 3 \
    "$VENV/bin/python" -m hvd_adaptive.cli train --config "$CONFIG" "$@"
