#!/usr/bin/env bash
# Train on this workstation: N ranks on localhost under horovodrun with the MPI controller
# (so mpi4py and Horovod share one MPI world). Extra arguments go to `hvd-adaptive train`.
#   bash launch/train.sh                                    # 2 ranks, configs/default.yaml
#   NP=4 CONFIG=configs/tiny.yaml bash launch/train.sh --set train.algorithm=adaptive
#   bash launch/train.sh --run-dir runs/mine --set hetero.slowdown='{1: 2.0}'
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NP=${NP:-2}
CONFIG=${CONFIG:-$REPO/configs/default.yaml}
VENV=${HVD_ADAPTIVE_VENV:-$REPO/.venv}
[ -x "$VENV/bin/horovodrun" ] || { echo "train.sh: no Horovod in $VENV; run: bash launch/setup.sh" >&2; exit 2; }
# OpenMPI refuses to start as root unless told; more ranks than cores need oversubscription.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export PATH="$VENV/bin:$PATH"
# horovodrun makes mpirun tag every line with its rank ("[1,0]<stdout>:"); rank 0 prints the run's
# progress, so its tag goes and its lines read as written; other ranks keep theirs.
untag='s/^\[[0-9]*,0\]<std\(out\|err\)>://'
# horovodrun imports TensorFlow itself (to check Horovod's build), and TensorFlow 2.21 prints its
# start-up INFO lines whatever TF_CPP_MIN_LOG_LEVEL says on some hosts: unless --verbose they
# are dropped (hvd_adaptive/tflines.py, as the ranks drop theirs); warnings and errors pass.
quiet=("$VENV/bin/python" -m hvd_adaptive.tflines)
case " $* " in
  *" --verbose "*) quiet=(cat) ;;
  *) export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2} ;;
esac
rc=0
horovodrun --mpi -np "$NP" -H "localhost:$NP" hvd-adaptive train --config "$CONFIG" "$@" \
  > >(sed -u "$untag") 2> >(sed -u "$untag" | "${quiet[@]}" >&2) || rc=$?
wait  # the two filters' last lines
exit $rc
