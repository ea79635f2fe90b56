#!/usr/bin/env bash
# Everything the accelerator issue measures, on one CUDA machine, in one call of at most 8 minutes:
#
#     bash benchmarks/gpu.sh [--dry-run] [--out=DIR] [--budget=SECONDS]
#
# Stages, most wanted first, each under its own time limit and never past the budget (default 480 s); a stage that
# fails or runs out of time is recorded as such and the next one runs:
#   peak        benchmarks/peak.py: bfloat16, float32 and TF32 matmul peaks at 8192^3 and 16384^3
#   train       benchmarks/train.py, GPT-2 small in bfloat16 at batch 32 x 1024: attention auto (cuDNN) against the
#               reference, layers scanned; then unrolled with auto
#   decode      benchmarks/batched_generation.py: GPT-2 small greedy, batch 1 and 64, 256 new tokens, against
#               transformers.generate eager and with its static cache (torch.compile), same run
#   moe         benchmarks/moe_step.py, GPT-2 small in bfloat16: the dense train step against 8 experts top-2 of half
#               the width (the same active FLOPs), dropless (jax.lax.ragged_dot) and with capacity factor 1.25
#   cache       the unrolled train variant again in a new process: its compile loads from the persistent cache
#   flags       the same under XLA flag sets (FLAG_SETS below), one process each
#   small       shakespeare_char (launch-bound) and marian_small (if ../shared/data/bible is there)
#   tests       python -m pytest -m gpu (pyproject.toml's marker: attention, families, cached decoding, train step,
#               checkpoint restore)
# Results: one JSON file per stage in DIR (default benchmarks/results/gpu), each with the device, driver, jax
# version and XLA_FLAGS (txjax.ops.provenance); stage logs in DIR/logs; then benchmarks/gpu_summary.py prints the
# summary and writes DIR/summary.json. --dry-run runs every stage on small shapes on whatever jax has (a CPU in CI:
# tests/test_gpu_script.py), so that the script keeps working where no GPU is.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
OUT=benchmarks/results/gpu
BUDGET=480
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    --out=*) OUT=${arg#--out=} ;;
    --budget=*) BUDGET=${arg#--budget=} ;;
    -h | --help) sed -n '2,25p' "$0" | cut -c3-; exit 0 ;;
    *) echo "error: unknown argument $arg (usage: bash benchmarks/gpu.sh [--dry-run] [--out=DIR] [--budget=S])" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
CACHE=$(mktemp -d)  # the measured peak and jax's compilation cache: fresh, so that the cache stage shows a hit
trap 'rm -rf "$CACHE"' EXIT
export TXJAX_CACHE_DIR=$CACHE JAX_COMPILATION_CACHE_DIR=$CACHE/jax XLA_PYTHON_CLIENT_PREALLOCATE=false
export TXJAX_PEAK_RESULT=$OUT/peak.json  # the MFU denominator: the peak stage's full measurement (8192^3 and up)
PY=${PYTHON:-python3}
START=$SECONDS
: >"$OUT/stages.tsv"

stage() {  # stage NAME LIMIT_SECONDS COMMAND...: runs it within what is left of the budget, logs, records rc
  local name=$1 limit=$2 left
  shift 2
  left=$((BUDGET - (SECONDS - START)))
  ((left < limit)) && limit=$left
  if ((limit < 10)); then
    printf '%s\tskipped\t0\n' "$name" >>"$OUT/stages.tsv"
    echo "== $name: skipped (budget spent)"
    return
  fi
  echo "== $name (at most ${limit}s): $*"
  local t0=$SECONDS
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >>"$OUT/stages.tsv"
  tail -n 3 "$OUT/logs/$name.log"
  echo "== $name: rc $rc in $((SECONDS - t0))s"
}

if ((DRY)); then  # small shapes, the same code paths
  PEAK=(--quick --repeats=2)
  TINY=(--model.num_layers=2 --train.batch_size=2)  # compiling is the cost here: 2 layers still loop and scan
  TRAIN=(--shape=shakespeare_char --dtype=bfloat16 --steps=2 --warmup=1 "${TINY[@]}")  # the experiment's dtype
  DECODE=(--models=gpt2_tiny --batches=1,2 --new_tokens=4 --repeats=1 --peers=eager --prompts=equal --stream_calls=3)
  SMALL=(--shape=shakespeare_char --dtype=bfloat16 --attention=auto --steps=2 --warmup=1 "${TINY[@]}")
  MOE=(--shape=shakespeare_char --steps=2 --batch_size=2 --model.num_layers=2)
  TESTS=(--co -q tests/test_layers.py)  # collected, not run (CI runs them on its CPU anyway); one file: the marker
  FLAG_SETS=("--xla_backend_optimization_level=1")
else
  PEAK=()
  TRAIN=(--shape=gpt2_small --dtype=bfloat16 --batch_size=32 --steps=20)
  DECODE=(--models=gpt2_small --batches=1,64 --new_tokens=256 --repeats=2 --peers=eager,static --prompts=equal)
  SMALL=(--shape=shakespeare_char --dtype=float32,bfloat16 --attention=auto --steps=50)
  MOE=(--shape=gpt2_small --steps=20 --model.dtype=bfloat16)
  TESTS=(-q -x -n 4)
  FLAG_SETS=(
    "--xla_gpu_enable_latency_hiding_scheduler=true"
    "--xla_gpu_enable_triton_gemm=false"
    "--xla_gpu_enable_command_buffer= --xla_gpu_autotune_level=0"
  )
fi

stage peak 60 "$PY" benchmarks/peak.py "${PEAK[@]}" --out="$OUT/peak.json"
stage train 210 "$PY" benchmarks/train.py "${TRAIN[@]}" --attention=auto,reference --scan_layers=true \
  --out="$OUT/train_scan.json"
stage train_loop 150 "$PY" benchmarks/train.py "${TRAIN[@]}" --attention=auto --scan_layers=false \
  --out="$OUT/train_loop.json"
stage decode 150 "$PY" benchmarks/batched_generation.py "${DECODE[@]}" --out="$OUT/decode.json"
stage moe 150 "$PY" benchmarks/moe_step.py "${MOE[@]}" --out="$OUT/moe_step.json"
stage cache 90 "$PY" benchmarks/train.py "${TRAIN[@]}" --attention=auto --scan_layers=false \
  --out="$OUT/train_loop_cached.json"
for i in "${!FLAG_SETS[@]}"; do
  stage "flags_$i" 120 env XLA_FLAGS="${FLAG_SETS[$i]}" "$PY" benchmarks/train.py "${TRAIN[@]}" --attention=auto \
    --scan_layers=false --out="$OUT/train_flags_$i.json"
done
stage small 90 "$PY" benchmarks/train.py "${SMALL[@]}" --out="$OUT/train_shakespeare_char.json"
if [[ -d ../shared/data/bible ]] && ((!DRY)); then
  stage marian 90 "$PY" benchmarks/train.py --shape=marian_small --dtype=bfloat16 --attention=auto --steps=30 \
    --out="$OUT/train_marian_small.json"
fi
stage tests 300 "$PY" -m pytest -m gpu "${TESTS[@]}" -p no:cacheprovider
"$PY" benchmarks/gpu_summary.py "$OUT"
