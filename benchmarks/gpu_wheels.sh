#!/usr/bin/env bash
# The wheels a CUDA machine without a package registry lacks for benchmarks/gpu.sh, downloaded here into .whl/
# (git-ignored) for Python 3.12 on x86-64 (the lent NVIDIA machines' image: jax, flax, optax, orbax, torch,
# transformers, pytest and pytest-xdist are there; these are not). On that machine, from the checkout's root:
#
#     python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#     bash benchmarks/gpu.sh
#
# usage: bash benchmarks/gpu_wheels.sh   (about 5 MB; the versions are this machine's, so both sides agree)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
version() { "$PY" -m pip show "$1" 2>/dev/null | awk '/^Version:/{print $2}'; }
wanted=()
for name in grain ml-collections tensorboardX array-record portpicker gguf; do
  v=$(version "$name")
  wanted+=("$name${v:+==$v}")
done
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$p")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .whl "${wanted[@]}"
ls -1 .whl
