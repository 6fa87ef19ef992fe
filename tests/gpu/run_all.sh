#!/usr/bin/env bash
# twinkle's GPU tier on one CUDA GPU, in one go. On a fresh machine run tests/gpu/setup.sh first (CUDA torch,
# the packages from this clone, liger, megatron-core, transformer-engine where it builds, vLLM).
# Stages, each with its own time budget (a slow stage never eats a later one's time):
#   1. gpu_tests (300 s): every test marked `gpu` anywhere under tests/ (collected by marker, so new ones join
#      automatically), except the files a tests/gpu/run_*.sh script owns (its TESTS= line): bf16/fp16 training
#      (full and LoRA), liger kernels vs torch numerics, fused linear CE memory on CUDA, the meta-device sharded
#      load on a one-GPU NCCL mesh, ...;
#   2. bench (240 s): bench/bench_gpu_train.py, tokens/s and MFU of a 0.5B dense model in bf16, twinkle next to
#      a hand-written transformers+peft loop in the same run;
#   3. every other tests/gpu/run_*.sh with the budget its BUDGET= line declares (+30 s to start):
#      run_vllm.sh (240 s; skipped when the twinkle-hf[vllm] extra is not installed), run_megatron.sh (600 s) last.
#   Worst case, every budget used up: about 24 minutes; a passing run is far shorter.
# Prints the environment (torch, GPUs, liger, megatron-core, transformer-engine, vLLM), then a table of the
# stages and the benchmark, and writes $OUT_DIR/summary.json (+ stage logs, junit XML, bench JSON).
# Exit status: 0 every stage passed or was skipped for a missing optional prerequisite (exit 77 of its script),
# 1 a stage failed or ran out of its budget (pytest's internal error, 3, is a failure, never a skip),
# 2 usage error, 77 no CUDA device (the whole tier's prerequisite). tests/gpu/stages.sh has the details.
#
# Usage: tests/gpu/run_all.sh [--check | --plan] [--strict] [--out DIR] [--budget STAGE=SECONDS ...]
#   (PYTHON=... picks the interpreter; see tests/gpu/python.sh)
#   --check: on any machine (CPU too): the scripts parse, the gpu tests collect and import, the benchmark, every
#            run_*.sh and setup.sh (--dry-run) accept their arguments. Run by the normal test suite
#            (tests/gpu/test_run_all.py).
#   --plan: print the stages in order with their budgets (seconds) and exit.
#   --strict: a skipped stage (a missing prerequisite, e.g. vLLM) fails the run too.
#   --budget gpu_tests=600: another budget for one stage (repeatable).
set -euo pipefail
cd "$(dirname "$0")/../.."

CHECK=0
PLAN=0
OUT_DIR="gpu-results"
declare -A BUDGET=([gpu_tests]=300 [bench]=240)
declare -A OVERRIDE=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --check) CHECK=1; shift ;;
    --plan) PLAN=1; shift ;;
    --strict) export STRICT=1; shift ;;
    --out) OUT_DIR="${2:?--out needs a directory}"; shift 2 ;;
    --budget)
      [[ "${2:-}" =~ ^([a-z_]+)=([0-9]+)$ ]] || { echo "run_all.sh: --budget takes STAGE=SECONDS, got '${2:-}'" >&2; exit 2; }
      OVERRIDE[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "run_all.sh: unknown argument '$1' (takes --check, --plan, --strict, --out DIR and --budget STAGE=SECONDS)" >&2; exit 2 ;;
  esac
done

source tests/gpu/python.sh  # sets PY
source tests/gpu/stages.sh  # stage, script_budget, environment, write_summary
export PYTHON="$PY"  # the run_*.sh scripts use the same interpreter

# the stage scripts, megatron (the longest) last; the test files each one owns are left out of stage 1
mapfile -t SCRIPTS < <(ls tests/gpu/run_*.sh | grep -v -e run_all.sh -e run_megatron.sh; \
                       [[ -f tests/gpu/run_megatron.sh ]] && echo tests/gpu/run_megatron.sh)
IGNORE=()
NAMES=()
for script in "${SCRIPTS[@]}"; do
  owned="$(sed -n 's/^TESTS=//p' "$script")"
  [[ -n "$owned" ]] && IGNORE+=(--ignore="$owned")
  name="$(basename "$script" .sh)"
  name="${name#run_}"
  NAMES+=("$name")
  BUDGET[$name]=$(( $(script_budget "$script" 300) + 30 ))  # the script's own limit, and time to start it
done
for name in "${!OVERRIDE[@]}"; do
  [[ -n "${BUDGET[$name]:-}" ]] || { echo "run_all.sh: --budget: no stage '$name' (stages: ${!BUDGET[*]})" >&2; exit 2; }
  BUDGET[$name]=${OVERRIDE[$name]}
done
PYTEST=("$PY" -m pytest tests -m gpu -p no:cacheprovider "${IGNORE[@]}")
if [[ "$PLAN" == 1 ]]; then
  for name in gpu_tests bench "${NAMES[@]}"; do echo "$name ${BUDGET[$name]}"; done
  exit 0
fi

if [[ "$CHECK" == 1 ]]; then
  for script in "${SCRIPTS[@]}" tests/gpu/setup.sh tests/gpu/stages.sh; do bash -n "$script"; done
  # only the files that use the marker (collecting all of tests/ would double the suite's start-up)
  mapfile -t GPU_FILES < <(grep -rlE "mark\.gpu" tests --include='test_*.py' | sort)
  for flag in "${IGNORE[@]}"; do
    mapfile -t GPU_FILES < <(printf '%s\n' "${GPU_FILES[@]}" | grep -vxF "${flag#--ignore=}")
  done
  "$PY" -m pytest "${GPU_FILES[@]}" -m gpu -p no:cacheprovider --collect-only -q
  "$PY" bench/bench_gpu_train.py --check
  for script in "${SCRIPTS[@]}"; do bash "$script" --check; done
  bash tests/gpu/setup.sh --dry-run >/dev/null
  echo "run_all.sh --check: ok"
  exit 0
fi

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "run_all.sh: no CUDA device visible to $PY; the GPU tier needs one (use --check on CPU;" \
       "on a GPU machine, tests/gpu/setup.sh installs a CUDA build of torch)." >&2
  exit "$SKIP_PREREQ"
fi
mkdir -p "$OUT_DIR"
: > "$OUT_DIR/stages.tsv"
environment "$OUT_DIR/environment.json"

stage gpu_tests "${BUDGET[gpu_tests]}" "${PYTEST[@]}" -q -rs --durations=10 --junitxml="$OUT_DIR/gpu_tests.xml"
stage bench "${BUDGET[bench]}" "$PY" bench/bench_gpu_train.py --out "$OUT_DIR/bench_gpu_train.json"
for i in "${!SCRIPTS[@]}"; do
  stage "${NAMES[$i]}" "${BUDGET[${NAMES[$i]}]}" bash "${SCRIPTS[$i]}"
done
write_summary
