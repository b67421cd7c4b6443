#!/usr/bin/env bash
# Prove on an NVIDIA GPU machine that the library and the book do not depend on
# the device. Two paths:
#
#   bash scripts/gpu_check.sh            # TensorFlow: a real CI runner with a GPU
#   bash scripts/gpu_check.sh jax        # JAX: a machine with JAX and CUDA, no TensorFlow
#   bash scripts/gpu_check.sh wheels     # here: fill the wheel folder the JAX path installs from
#   ALLOW_CPU=1 bash scripts/gpu_check.sh jax   # rehearse the JAX path on a CPU
#
# The TensorFlow path installs the CUDA build of TensorFlow into a fresh venv,
# checks that TensorFlow sees the GPU, runs every test and then the strict
# nbval step on every chapter.
#
# The JAX path installs nothing from the network. It makes a venv that sees the
# machine's own JAX (--system-site-packages) and installs Keras and the few
# small wheels the tests need from $WHEELS (default .gpu-wheels, git-ignored;
# carry it to the machine). It prints the device, runs the Keras-level tests
# (marked every_backend) and refimpl's doctests under KERAS_BACKEND=jax, then
# runs every code cell of the backend chapter, whose claims are assertions
# (tools/run_notebook.py), skipping the one cell that starts TensorFlow.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-tensorflow}
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.gpu-wheels}
export TF_CPP_MIN_LOG_LEVEL=3 IPYTHONDIR="$PWD/tools/ipython" PYTHONHASHSEED=0 MPLBACKEND=Agg

# The pins the JAX path needs, read from requirements.txt.
pins() {
  grep -E '^(keras|pytest|hypothesis|optax|scikit-learn)==' requirements.txt
}

case "$MODE" in
wheels)
  # Wheels for the GPU machine's Python (PY_VERSION, default 3.11) on x86-64,
  # less what a JAX install already brings (JAX, NumPy, SciPy, ml_dtypes).
  PY_VERSION=${PY_VERSION:-3.11}
  mkdir -p "$WHEELS"
  "$PYTHON" -m pip download --quiet --dest "$WHEELS" --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 \
    --python-version "$PY_VERSION" $(pins)
  (cd "$WHEELS" && rm -f jax-* jaxlib-* numpy-* scipy-* ml_dtypes-* opt_einsum-*)
  du -sh "$WHEELS"
  exit 0
  ;;
jax)
  VENV=${VENV:-.venv-gpu-jax}
  "$PYTHON" - <<'PY'
import jax
devices = jax.devices()
print("JAX", jax.__version__, "devices:", devices)
if devices[0].platform != "gpu":
    import os
    if os.environ.get("ALLOW_CPU") != "1":
        raise SystemExit("gpu_check: JAX does not see a GPU; nothing was proven")
    print("gpu_check: no GPU; ALLOW_CPU=1 runs the path on the CPU (a rehearsal)")
PY
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  test -d "$WHEELS" || { echo "gpu_check: no wheel folder $WHEELS (make it with: bash scripts/gpu_check.sh wheels)"; exit 1; }
  test -x "$VENV/bin/python" || "$PYTHON" -m venv --system-site-packages "$VENV"
  "$VENV/bin/python" -m pip install --quiet --no-index --find-links "$WHEELS" $(pins)
  export KERAS_BACKEND=jax PYTHONPATH="$PWD"
  "$VENV/bin/python" -c 'import keras; print("Keras", keras.__version__, "on", keras.backend.backend())'
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m every_backend tests --doctest-modules refimpl
  "$VENV/bin/python" tools/run_notebook.py chapters/08_backends.ipynb \
    --skip '"KERAS_BACKEND": "tensorflow"'
  platform=$("$VENV/bin/python" -c 'import jax; print(jax.devices()[0].platform)')
  echo "gpu_check: the Keras-level tests and the backend chapter pass on JAX ($platform)"
  exit 0
  ;;
tensorflow) ;;
*)
  echo "usage: bash scripts/gpu_check.sh [tensorflow|jax|wheels]" >&2
  exit 2
  ;;
esac

VENV=${VENV:-.venv-gpu}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# requirements.txt pins tensorflow; its [and-cuda] extra brings the CUDA libraries.
tf_pin=$(grep -E '^tensorflow==' requirements.txt)
grep -v -E '^tensorflow==' requirements.txt > "$VENV/requirements-gpu.txt"
echo "${tf_pin/tensorflow==/tensorflow[and-cuda]==}" >> "$VENV/requirements-gpu.txt"
"$VENV/bin/python" -m pip install --quiet -r "$VENV/requirements-gpu.txt"

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
