#!/usr/bin/env bash
# Set up hvd_adaptive on this machine: idempotent, cached, no hand steps.
#
#   bash launch/setup.sh            # CPU flavour (tensorflow-cpu), what CI and the README use
#   bash launch/setup.sh --slurm    # also Debian's slurm-wlm + munge (the Slurm tests need them)
#   HVD_ADAPTIVE_FLAVOUR=gpu bash launch/setup.sh   # GPU cluster: tensorflow with CUDA, NCCL build
#
# Environment:
#   HVD_ADAPTIVE_VENV     the virtual environment (default: <repo>/.venv)
#   HVD_ADAPTIVE_CACHE    where the built Horovod wheel is kept (default: ~/.cache/hvd_adaptive)
#   HVD_ADAPTIVE_FLAVOUR  cpu (default) or gpu. The gpu flavour is untested here (no GPU).
#
# Horovod 0.28.1 ships only as a source archive; it is built once against the pinned TensorFlow
# and the wheel is cached under a key of (Horovod, TensorFlow, Python, flavour), so a second run
# installs it in seconds.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HVD_ADAPTIVE_VENV:-$REPO/.venv}
CACHE=${HVD_ADAPTIVE_CACHE:-$HOME/.cache/hvd_adaptive}
FLAVOUR=${HVD_ADAPTIVE_FLAVOUR:-cpu}
TF_VERSION=2.21.0
HVD_VERSION=0.28.1
WITH_SLURM=0
for arg in "$@"; do
  case "$arg" in
    --slurm) WITH_SLURM=1 ;;
    *) echo "setup.sh: unknown argument '$arg' (known: --slurm)" >&2; exit 2 ;;
  esac
done
case "$FLAVOUR" in
  cpu) TF_PKG="tensorflow-cpu==$TF_VERSION" ;;
  gpu) TF_PKG="tensorflow[and-cuda]==$TF_VERSION" ;;
  *) echo "setup.sh: HVD_ADAPTIVE_FLAVOUR must be cpu or gpu, not '$FLAVOUR'" >&2; exit 2 ;;
esac
log() { echo "[setup] $*"; }

# --- system packages (Debian) -------------------------------------------------------------
need_pkgs=()
command -v mpirun >/dev/null 2>&1 || need_pkgs+=(openmpi-bin)
[ -e /usr/include/x86_64-linux-gnu/openmpi/mpi.h ] || [ -n "$(ls /usr/lib/*/openmpi/include/mpi.h 2>/dev/null)" ] \
  || need_pkgs+=(libopenmpi-dev)
command -v cmake >/dev/null 2>&1 || need_pkgs+=(cmake)
command -v g++ >/dev/null 2>&1 || need_pkgs+=(g++)
# ip: the multi-node tests build their nodes from network namespaces (tests/harness/nodes.py).
command -v ip >/dev/null 2>&1 || need_pkgs+=(iproute2)
if [ "$WITH_SLURM" = 1 ]; then
  command -v slurmctld >/dev/null 2>&1 || need_pkgs+=(slurm-wlm)
  command -v munged >/dev/null 2>&1 || need_pkgs+=(munge)
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing Debian packages: ${need_pkgs[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# --- virtual environment -----------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
PYVER=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
export PIP_DISABLE_PIP_VERSION_CHECK=1

# -rN: raised whenever the package list below changes, so set-up machines install the change
stamp="$VENV/.hvd_adaptive-deps-$FLAVOUR-$TF_VERSION-r2"
if [ ! -e "$stamp" ]; then
  log "installing $TF_PKG and the Python dependencies (first time only)"
  "$PY" -m pip install -q --upgrade pip setuptools wheel
  "$PY" -m pip install -q "$TF_PKG" "numpy<2.5" scipy pyyaml matplotlib pytest napkinxc tensorboard
  # mpi4py is compiled against the system OpenMPI that Horovod also uses.
  "$PY" -m pip install -q --no-binary mpi4py "mpi4py>=4,<5"
  touch "$stamp"
fi

# --- Horovod, built once against this TensorFlow and cached -------------------------------
if ! "$PY" -c "import horovod.tensorflow" >/dev/null 2>&1; then
  WHEELS="$CACHE/wheels/horovod-$HVD_VERSION-tf$TF_VERSION-$PYVER-$FLAVOUR"
  wheel=$(ls "$WHEELS"/horovod-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$wheel" ]; then
    log "building Horovod $HVD_VERSION against TensorFlow $TF_VERSION (about 3 minutes, once)"
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    "$PY" -m pip download -q --no-binary :all: --no-deps -d "$build" "horovod==$HVD_VERSION"
    tar -xzf "$build"/horovod-$HVD_VERSION.tar.gz -C "$build"
    src="$build/horovod-$HVD_VERSION"
    # The optional XLA custom-call ops do not compile against TF 2.21 (headers moved); nothing
    # here uses them, so the file is left out of the build.
    sed -i '/xla_mpi_ops.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
    gpu_env=()
    [ "$FLAVOUR" = gpu ] && gpu_env=(HOROVOD_GPU_OPERATIONS=NCCL)
    mkdir -p "$WHEELS"
    env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
        HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=0 MAKEFLAGS=-j"$(nproc)" "${gpu_env[@]}" \
        "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$build/out" "$src" \
        > "$build/build.log" 2>&1 || { tail -n 40 "$build/build.log"; echo "[setup] Horovod build failed" >&2; exit 1; }
    mv "$build"/out/horovod-*.whl "$WHEELS"/
    wheel=$(ls "$WHEELS"/horovod-*.whl | head -n 1)
  else
    log "using cached Horovod wheel $wheel"
  fi
  "$PY" -m pip install -q --no-deps "$wheel"
  # Horovod's own run-time dependencies (horovodrun needs them).
  "$PY" -m pip install -q cloudpickle psutil packaging
fi

# --- this project --------------------------------------------------------------------------
# (setuptools' editable-install chatter goes to a log, shown only if the install fails)
"$PY" -m pip install -q --no-deps --no-build-isolation -e "$REPO" > "$VENV/.hvd_adaptive-install.log" 2>&1 \
  || { cat "$VENV/.hvd_adaptive-install.log"; echo "[setup] installing hvd_adaptive failed" >&2; exit 1; }

"$PY" - <<'PYEOF'
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from hvd_adaptive.tfload import tf  # its start-up lines filtered as in every run
import horovod, horovod.tensorflow as hvd, mpi4py, numpy, scipy
print(f"[setup] ok: tensorflow {tf.__version__}, horovod {horovod.__version__} "
      f"(mpi built: {hvd.mpi_built()}), mpi4py {mpi4py.__version__}, numpy {numpy.__version__}, "
      f"scipy {scipy.__version__}")
PYEOF
echo "[setup] activate with: source $VENV/bin/activate"
