#!/usr/bin/env bash
# Prove on an NVIDIA GPU machine that the stored notebook outputs do not depend on
# the device: install the CUDA build of TensorFlow into a fresh venv, check that
# TensorFlow sees the GPU, run the unit tests and then the strict nbval step.
#
#   bash scripts/gpu_check.sh            # venv in .venv-gpu
#   VENV=/tmp/gpu-venv bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-gpu}
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# requirements.txt pins tensorflow; its [and-cuda] extra brings the CUDA libraries.
tf_pin=$(grep -E '^tensorflow==' requirements.txt)
grep -v -E '^tensorflow==' requirements.txt > "$VENV/requirements-gpu.txt"
echo "${tf_pin/tensorflow==/tensorflow[and-cuda]==}" >> "$VENV/requirements-gpu.txt"
"$VENV/bin/python" -m pip install --quiet -r "$VENV/requirements-gpu.txt"

export TF_CPP_MIN_LOG_LEVEL=3 IPYTHONDIR="$PWD/tools/ipython" PYTHONHASHSEED=0 MPLBACKEND=Agg
"$VENV/bin/python" - <<'PY'
import tensorflow as tf
gpus = tf.config.list_physical_devices("GPU")
print("TensorFlow", tf.__version__, "GPUs:", [g.name for g in gpus])
for g in gpus:
    print("  ", tf.config.experimental.get_device_details(g))
if not gpus:
    raise SystemExit("gpu_check: TensorFlow does not see a GPU; nothing was proven")
PY
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

"$VENV/bin/python" -m pytest -q tests --doctest-modules refimpl
"$VENV/bin/python" -m pytest -q --nbval --nbval-current-env \
  --nbval-sanitize-with tools/nbval_sanitize.cfg chapters/*.ipynb
echo "gpu_check: notebooks reproduce their stored outputs on the GPU"
