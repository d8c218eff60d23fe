#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian machine for hetgrad: apt packages (Open MPI, cmake, and
# Slurm + munge for the Slurm tests), a venv with the stack's locked packages, and Horovod
# 0.28.1 built from its sdist against that TensorFlow (with scripts/patches/*.patch applied).
#
# Usage: scripts/setup.sh [--tf 2.21|2.15] [--no-slurm]
#   --tf 2.21 (default): TF 2.21, Keras 3 as tf.keras, tf-keras for TF_USE_LEGACY_KERAS=1;
#                        venv .venv
#   --tf 2.15:           TF 2.15.1, Keras 2 as tf.keras; venv .venv-tf2.15
#   HETGRAD_VENV=DIR overrides the venv directory.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TF=2.21
WITH_SLURM=1
while [ $# -gt 0 ]; do
  case "$1" in
    --tf) TF=${2:?--tf needs 2.21 or 2.15}; shift 2 ;;
    --no-slurm) WITH_SLURM=0; shift ;;
    *) echo "setup.sh: unknown argument $1 (use --tf 2.21|2.15, --no-slurm)" >&2; exit 2 ;;
  esac
done
case "$TF" in
  2.21) DEFAULT_VENV=$ROOT/.venv ;;
  2.15) DEFAULT_VENV=$ROOT/.venv-tf2.15 ;;
  *) echo "setup.sh: --tf $TF is not a supported stack (2.21 or 2.15)" >&2; exit 2 ;;
esac
VENV=${HETGRAD_VENV:-$DEFAULT_VENV}
LOCK=$ROOT/requirements/lock-tf$TF.txt

SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
need_apt=()
command -v mpirun >/dev/null || need_apt+=(openmpi-bin)
dpkg -s libopenmpi-dev >/dev/null 2>&1 || need_apt+=(libopenmpi-dev)
command -v cmake >/dev/null || need_apt+=(cmake)
command -v patch >/dev/null || need_apt+=(patch)
if [ "$WITH_SLURM" = 1 ]; then
  command -v slurmctld >/dev/null || need_apt+=(slurm-wlm munge)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV (TF $TF)"
  python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade "pip<25" wheel "setuptools<70"
"$PY" -m pip install -q -r "$LOCK"
NODEPS=$ROOT/requirements/tf$TF-nodeps.txt
[ ! -f "$NODEPS" ] || "$PY" -m pip install -q --no-deps -r "$NODEPS"

export TF_CPP_MIN_LOG_LEVEL=3
built() {  # Horovod present, and built with TensorFlow and MPI support
  "$PY" -m horovod.runner.launch --check-build 2>/dev/null | grep -q "\[X\] TensorFlow" &&
  "$PY" -m horovod.runner.launch --check-build 2>/dev/null | grep -q "\[X\] MPI"
}
if built && "$PY" -c "import horovod.tensorflow" 2>/dev/null; then
  echo "[setup] Horovod already built against this TensorFlow; skipping build"
else
  echo "[setup] building Horovod 0.28.1 against TensorFlow $TF (takes ~5 min)"
  SRC=$(mktemp -d)
  trap 'rm -rf "$SRC"' EXIT
  "$PY" -m pip download -q --no-deps --no-binary :all: horovod==0.28.1 -d "$SRC"
  tar -xzf "$SRC"/horovod-0.28.1.tar.gz -C "$SRC"
  for p in "$ROOT"/scripts/patches/horovod-0.28.1-*.patch; do
    patch -s -p1 -d "$SRC/horovod-0.28.1" < "$p"
  done
  PATH="$VENV/bin:/usr/bin:$PATH" \
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 CMAKE_POLICY_VERSION_MINIMUM=3.5 \
  HOROVOD_CMAKE=/usr/bin/cmake MAKEFLAGS=-j"$(nproc)" \
    "$PY" -m pip install -q --no-cache-dir --no-build-isolation "$SRC/horovod-0.28.1"
fi
"$PY" -m pip install -q --no-deps --no-build-isolation -e .
"$PY" -m horovod.runner.launch --check-build 2>/dev/null | grep -E "Horovod|\[X\]"
"$PY" -c "import hetgrad.compat as c; print(f'[setup] TF {c.TF_VERSION}, Keras {c.KERAS_VERSION} ({c.FLAVOUR})')"
echo "[setup] done: $VENV"
