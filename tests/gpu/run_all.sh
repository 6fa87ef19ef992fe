#!/usr/bin/env bash
# twinkle's GPU tier on one CUDA GPU, in one go (budget: 9 minutes on an H100/H200-class GPU):
#   1. every test marked `gpu` anywhere under tests/ (collected by marker, so new ones join automatically),
#      except the files a tests/gpu/run_*.sh script owns (its TESTS= line): bf16/fp16 training (full and
#      LoRA), liger kernels vs torch numerics, fused linear CE memory on CUDA, the meta-device sharded load
#      on a one-GPU NCCL mesh, ...;
#   2. bench/bench_gpu_train.py: tokens/s and MFU of a 0.5B dense model in bf16, twinkle next to a
#      hand-written transformers+peft loop in the same run;
#   3. every other tests/gpu/run_*.sh: run_vllm.sh (the vLLM sampler; reported as skipped, exit 3, when
#      the twinkle-hf[vllm] extra is not installed), run_megatron.sh (schedule, distributed optimizer,
#      Transformer Engine, fp8) last, with what is left of the budget.
# Prints a table of the stages and the benchmark, and writes $OUT_DIR/summary.json (+ junit XML, bench JSON).
#
# Usage: tests/gpu/run_all.sh [--check] [--out DIR]     (PYTHON=... picks the interpreter)
#   --check: on any machine (CPU too): the scripts parse, the gpu tests collect and import, the benchmark and
#            every run_*.sh accept their arguments. Run by the normal test suite (tests/gpu/test_run_all.py).
set -euo pipefail
cd "$(dirname "$0")/../.."

CHECK=0
OUT_DIR="gpu-results"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --check) CHECK=1; shift ;;
    --out) OUT_DIR="${2:?--out needs a directory}"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "run_all.sh: unknown argument '$1' (takes --check and --out DIR)" >&2; exit 2 ;;
  esac
done

source tests/gpu/python.sh  # sets PY
export PYTHON="$PY"  # the run_*.sh scripts use the same interpreter

# the stage scripts, megatron (the longest) last; the test files each one owns are left out of stage 1
mapfile -t SCRIPTS < <(ls tests/gpu/run_*.sh | grep -v -e run_all.sh -e run_megatron.sh; \
                       [[ -f tests/gpu/run_megatron.sh ]] && echo tests/gpu/run_megatron.sh)
IGNORE=()
for script in "${SCRIPTS[@]}"; do
  owned="$(sed -n 's/^TESTS=//p' "$script")"
  [[ -n "$owned" ]] && IGNORE+=(--ignore="$owned")
done
PYTEST=("$PY" -m pytest tests -m gpu -p no:cacheprovider "${IGNORE[@]}")

if [[ "$CHECK" == 1 ]]; then
  for script in "${SCRIPTS[@]}"; do bash -n "$script"; done
  # only the files that use the marker (collecting all of tests/ would double the suite's start-up)
  mapfile -t GPU_FILES < <(grep -rlE "mark\.gpu" tests --include='test_*.py' | sort)
  for flag in "${IGNORE[@]}"; do
    mapfile -t GPU_FILES < <(printf '%s\n' "${GPU_FILES[@]}" | grep -vxF "${flag#--ignore=}")
  done
  "$PY" -m pytest "${GPU_FILES[@]}" -m gpu -p no:cacheprovider --collect-only -q
  "$PY" bench/bench_gpu_train.py --check
  for script in "${SCRIPTS[@]}"; do bash "$script" --check; done
  echo "run_all.sh --check: ok"
  exit 0
fi

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "run_all.sh: no CUDA device visible to $PY; the GPU tier needs one (use --check on CPU)." >&2
  exit 2
fi
mkdir -p "$OUT_DIR"
BUDGET=540  # seconds for all stages together
START=$SECONDS
STATUS=()

stage() {  # stage NAME SECONDS COMMAND...: runs COMMAND with at most SECONDS (and what is left of BUDGET)
  local name="$1" limit="$2" left rc began
  shift 2
  left=$((BUDGET - (SECONDS - START)))
  (( limit > left )) && limit=$left
  if (( limit <= 0 )); then
    STATUS+=("$name skipped(budget) 0")
    return
  fi
  began=$SECONDS
  set +e
  timeout "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  local state=passed
  (( rc == 124 )) && state="timeout(${limit}s)"
  (( rc == 3 )) && state="skipped(prereq)"  # a script's optional prerequisite is not installed (its log says)
  (( rc != 0 && rc != 3 && rc != 124 )) && state="failed(rc=$rc)"
  STATUS+=("$name $state $((SECONDS - began))")
}

"$PY" -c "import torch; print(f'GPU: {torch.cuda.get_device_name(0)} | torch {torch.__version__}')"
stage gpu_tests 200 "${PYTEST[@]}" -q -rs --durations=10 --junitxml="$OUT_DIR/gpu_tests.xml"
stage bench 150 "$PY" bench/bench_gpu_train.py --out "$OUT_DIR/bench_gpu_train.json"
for script in "${SCRIPTS[@]}"; do
  name="$(basename "$script" .sh)"
  name="${name#run_}"
  limit=150
  [[ "$name" == megatron ]] && limit=480
  stage "$name" "$limit" bash "$script"
done

"$PY" - "$OUT_DIR" "${STATUS[@]}" <<'EOF'
import json, sys
from pathlib import Path

out, rows = Path(sys.argv[1]), [r.split(" ") for r in sys.argv[2:]]
summary = {"stages": [{"stage": n, "status": s, "seconds": int(t)} for n, s, t in rows]}
bench = out / "bench_gpu_train.json"
if bench.is_file():
    summary["bench"] = json.loads(bench.read_text())
print(f"\n{'stage':<11} {'status':<16} {'seconds':>7}")
for row in summary["stages"]:
    print(f"{row['stage']:<11} {row['status']:<16} {row['seconds']:>7}")
for row in summary.get("bench", {}).get("rows", []):
    mfu = f"{100 * row['mfu']:.1f}%" if row.get("mfu") is not None else "n/a"
    print(f"bench {row['mode']:<5} {row['variant']:<13} {row['tokens_per_s']:>9.0f} tokens/s  MFU {mfu}")
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(f"written: {out / 'summary.json'}")
sys.exit(0 if all(r["status"] in ("passed", "skipped(prereq)") for r in summary["stages"]) else 1)
EOF
