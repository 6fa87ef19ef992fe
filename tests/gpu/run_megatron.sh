#!/usr/bin/env bash
# MegatronModel's GPU checks, in one go (< 10 minutes on an H100/H200); part of tests/gpu/run_all.sh:
#   tp=pp=1 bf16 training through megatron-core's schedule with loss falling; the schedule with 4 micro-batches
#   equal to one batch; distributed-optimizer save/resume continuing the same losses; LoRA through the
#   schedule saved as a PEFT adapter; several multi-LoRA tenants interleaved, each with its own distributed
#   optimizer; bf16 LoRA (frozen bf16 weights, fp32 master copies); when transformer-engine[pytorch] imports,
#   Qwen3-MoE and the seed-001 families megatron runs only with TE (Qwen3.5, Qwen3.5-MoE, DeepSeek-V3) against HF,
#   and an fp8 step; with two GPUs, TP=2 vs TP=1 and (TE) CP=2 vs CP=1 training.
# Usage: tests/gpu/run_megatron.sh [--check]   (PYTHON=... picks the interpreter; see tests/gpu/python.sh)
# --check: verify the script's own prerequisites and that the tests collect (runs on CPU too).
# Exit status 77: no CUDA device or megatron-core not installed (tests/gpu/setup.sh installs it); else pytest's.
set -euo pipefail
cd "$(dirname "$0")/../.."

source tests/gpu/python.sh  # sets PY

TESTS=tests/gpu/test_megatron_gpu.py
BUDGET=600  # seconds (run_all.sh gives this stage its own budget from this line)

if [[ "${1:-}" == "--check" ]]; then
  "$PY" -c "import megatron.core, twinkle_megatron, peft, transformers" >/dev/null
  "$PY" -m pytest "$TESTS" --collect-only -q -m gpu
  exit 0
fi

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "run_megatron.sh: no CUDA device visible to $PY; these checks need a GPU." >&2
  exit 77
fi
if ! "$PY" -c "import megatron.core, twinkle_megatron" 2>/dev/null; then
  echo "run_megatron.sh: megatron-core or twinkle-megatron is not installed for $PY:" \
       "pip install -e packages/twinkle-megatron (or tests/gpu/setup.sh)." >&2
  exit 77
fi
"$PY" - <<'EOF'
import torch
from twinkle_megatron.te import import_te
te, why = import_te()
print(f"GPU: {torch.cuda.get_device_name(0)} | torch {torch.__version__} | "
      f"transformer-engine: {'yes' if te is not None else 'no (' + why + ')'}")
EOF
exec timeout "$BUDGET" "$PY" -m pytest "$TESTS" -m gpu -q -p no:cacheprovider -rs --durations=10
