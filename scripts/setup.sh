#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian machine for hetgrad:
# apt packages (Open MPI), a .venv with pinned deps, Horovod 0.28.1 built against TF 2.15.1.
# Usage: scripts/setup.sh [--no-slurm]   (Slurm + munge are installed for the Slurm tests)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${HETGRAD_VENV:-$ROOT/.venv}
WITH_SLURM=1
[ "${1:-}" = "--no-slurm" ] && WITH_SLURM=0

SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
need_apt=()
command -v mpirun >/dev/null || need_apt+=(openmpi-bin)
[ -e /usr/include/x86_64-linux-gnu/openmpi ] || dpkg -s libopenmpi-dev >/dev/null 2>&1 || need_apt+=(libopenmpi-dev)
command -v cmake >/dev/null || need_apt+=(cmake)
if [ "$WITH_SLURM" = 1 ]; then
  command -v slurmctld >/dev/null || need_apt+=(slurm-wlm munge)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade "pip<25" wheel "setuptools<70"
"$PY" -m pip install -q -r requirements.txt

export TF_CPP_MIN_LOG_LEVEL=3
if "$VENV/bin/horovodrun" --check-build 2>/dev/null | grep -q "\[X\] TensorFlow" \
   && "$VENV/bin/horovodrun" --check-build 2>/dev/null | grep -q "\[X\] MPI"; then
  echo "[setup] Horovod already built with TensorFlow+MPI; skipping build"
else
  echo "[setup] building Horovod 0.28.1 against TensorFlow (takes ~4 min)"
  PATH="$VENV/bin:/usr/bin:$PATH" \
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 CMAKE_POLICY_VERSION_MINIMUM=3.5 \
  HOROVOD_CMAKE=/usr/bin/cmake MAKEFLAGS=-j"$(nproc)" \
    "$PY" -m pip install -q --no-cache-dir --no-build-isolation horovod==0.28.1
fi
"$PY" -m pip install -q --no-deps --no-build-isolation -e .
TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/horovodrun" --check-build 2>/dev/null | grep -E "Horovod|\[X\]"
echo "[setup] done: $VENV"
