#!/usr/bin/env bash
# The one script to run the first time a GPU machine is lent (one GPU, PyPI only): the verdict in <= 10 minutes,
# setup included. Stages in order, each with its own budget inside one global deadline (a stage gets what is
# left of the deadline when that is less than its budget; once it is spent, the remaining stages are "not run"):
#   setup       tests/gpu/setup.sh from PyPI only, transformer-engine off (skipped when the interpreter already
#               has a CUDA torch and twinkle: PYTHON=... or an existing .venv-gpu)
#   environment nvidia-smi, torch/CUDA/GPU and the optional components' versions
#   bench_0_5b  bench/bench_gpu_train.py, LoRA and full, 0.5B shape: tokens/s, MFU, ratio to the hand-written loop,
#               with and without the fast path (kernelize + fused linear CE)
#   bench_1_5b  full training, 1.5B shape, the fast path against the hand-written loop (MFU goal: >= 45% on an H200)
#   hf_gpu      the HF GPU tests, by file (no suite collection): bf16/fp16 LoRA, fused CE memory, a one-GPU NCCL
#               FSDP2 meta build + training step, liger through kernelize, the fp8 and precision GPU tests
#   vllm        tests/gpu/run_vllm.sh (skipped when vLLM did not install)
#   megatron    a Megatron subset without transformer-engine: the schedule, micro-batches, LoRA, resume
# OUT (the first argument; default $OUT, else gpu-results) gets summary.json rewritten after every stage, so a run
# cut short still returns every finished stage; plus each stage's log and the benchmark JSONs.
# Exit status: 0 every stage passed or was skipped for a missing optional prerequisite; 1 otherwise; 2 usage;
# 77 no NVIDIA driver (nvidia-smi fails).
#
# Usage: tests/gpu/first_run.sh [OUT] [--deadline SECONDS] [--no-setup] [--check]
#   --deadline  the global deadline in seconds (default 600)
#   --check     on any machine (CPU too): the scripts parse, the named test files exist and collect, the
#               benchmark accepts its arguments, setup.sh --dry-run plans PyPI only. Run by the suite
#               (tests/gpu/test_first_run.py).
# FIRST_RUN_STANDINS=FILE (tests only) is sourced after the stage commands are defined, to replace them.
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/../.."

OUT_DIR="${OUT:-gpu-results}"
DEADLINE=600
SETUP=1
CHECK=0
RUN_STAGE=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --run-stage) RUN_STAGE="${2:?}"; shift 2 ;;  # internal: one stage's commands, under its stage's timeout
    --deadline) [[ "${2:-}" =~ ^[0-9]+$ ]] || { echo "first_run.sh: --deadline takes seconds, got '${2:-}'" >&2; exit 2; }
                DEADLINE="$2"; shift 2 ;;
    --no-setup) SETUP=0; shift ;;
    --check) CHECK=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    -*) echo "first_run.sh: unknown argument '$1' (takes OUT, --deadline SECONDS, --no-setup, --check)" >&2; exit 2 ;;
    *) OUT_DIR="$1"; shift ;;
  esac
done

# the stages' own budgets (seconds); the HF GPU test files, run by name
declare -A BUDGET=([setup]=240 [environment]=30 [bench_0_5b]=130 [bench_1_5b]=100 [hf_gpu]=120 [vllm]=120
                   [megatron]=90)
ORDER=(setup environment bench_0_5b bench_1_5b hf_gpu vllm megatron)
HF_FILES=(tests/gpu/test_hf_gpu.py tests/hf/test_precision.py tests/hf/test_fp8.py tests/kernels/test_liger_kernels.py)
MEGATRON_SUBSET="schedule or microbatches or lora_through or resume"
BENCH_STEPS=(--steps 4 --warmup 2)

source tests/gpu/python.sh  # sets PY
source tests/gpu/stages.sh  # stage, stage_state, environment, write_summary
KILL_GRACE=5  # inside a global deadline: a stage that ignores TERM is killed soon after

stage_setup() {
  if "$PY" -c "import torch, twinkle_hf, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "setup: $PY already has a CUDA torch and twinkle; nothing to install"
    return 0
  fi
  bash tests/gpu/setup.sh --no-te
}
stage_environment() {
  nvidia-smi
  environment "$OUT_DIR/environment.json"
}
stage_bench_0_5b() {
  "$PY" bench/bench_gpu_train.py --config qwen2.5-0.5b --modes lora,full "${BENCH_STEPS[@]}" \
    --out "$OUT_DIR/bench_0_5b.json"
}
stage_bench_1_5b() {
  "$PY" bench/bench_gpu_train.py --config qwen2.5-1.5b --modes full --variants twinkle_fast,hand_written \
    "${BENCH_STEPS[@]}" --out "$OUT_DIR/bench_1_5b.json"
}
stage_hf_gpu() {
  "$PY" -m pytest "${HF_FILES[@]}" -m gpu -q -p no:cacheprovider -rs --junitxml="$OUT_DIR/hf_gpu.xml"
}
stage_vllm() {
  bash tests/gpu/run_vllm.sh
}
stage_megatron() {
  "$PY" -m pytest tests/gpu/test_megatron_gpu.py -m gpu -k "$MEGATRON_SUBSET" -q -p no:cacheprovider -rs
}
[[ -n "${FIRST_RUN_STANDINS:-}" ]] && source "$FIRST_RUN_STANDINS"
if [[ -n "$RUN_STAGE" ]]; then
  "stage_$RUN_STAGE"
  exit
fi

if (( CHECK )); then
  for script in tests/gpu/setup.sh tests/gpu/stages.sh tests/gpu/run_vllm.sh; do bash -n "$script"; done
  for file in "${HF_FILES[@]}" tests/gpu/test_megatron_gpu.py; do
    [[ -f "$file" ]] || { echo "first_run.sh --check: $file is missing" >&2; exit 1; }
  done
  "$PY" -m pytest "${HF_FILES[@]}" -m gpu -p no:cacheprovider --collect-only -q
  "$PY" -m pytest tests/gpu/test_megatron_gpu.py -m gpu -k "$MEGATRON_SUBSET" -p no:cacheprovider --collect-only -q
  for config in qwen2.5-0.5b qwen2.5-1.5b; do "$PY" bench/bench_gpu_train.py --check --config "$config"; done
  plan="$(bash tests/gpu/setup.sh --dry-run --no-te)"
  if grep -q -e "--index-url" -e "transformer-engine" <<<"$plan"; then
    echo "first_run.sh --check: setup.sh would leave PyPI or build transformer-engine:" >&2
    echo "$plan" >&2
    exit 1
  fi
  echo "first_run.sh --check: ok"
  exit 0
fi

if ! nvidia-smi >/dev/null 2>&1; then
  echo "first_run.sh: no NVIDIA driver here (nvidia-smi fails or is missing); this script is for a GPU machine" \
       "(--check runs anywhere)." >&2
  exit "$SKIP_PREREQ"
fi
mkdir -p "$OUT_DIR"
: > "$OUT_DIR/stages.tsv"
START=$SECONDS
for name in "${ORDER[@]}"; do
  left=$(( DEADLINE - (SECONDS - START) ))
  if [[ "$name" == setup ]] && (( ! SETUP )); then
    printf '%s\t%s\t0\t0\t%s\n' "$name" "skipped: --no-setup" "$SKIP_PREREQ" >> "$OUT_DIR/stages.tsv"
  elif (( left <= KILL_GRACE )); then
    printf '%s\t%s\t0\t0\t-1\n' "$name" "not run: global deadline of ${DEADLINE}s reached" >> "$OUT_DIR/stages.tsv"
  else
    limit=$(( ${BUDGET[$name]} < left - KILL_GRACE ? ${BUDGET[$name]} : left - KILL_GRACE ))
    # a process of its own (timeout runs programs, not functions); it picks .venv-gpu once setup made it
    stage "$name" "$limit" bash "$SELF" --run-stage "$name" "$OUT_DIR"
  fi
  write_summary >/dev/null 2>&1 || true  # after every stage: a run cut short keeps what it finished
done
write_summary
