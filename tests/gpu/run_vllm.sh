#!/usr/bin/env bash
# VLLMSampler on a real vLLM engine, one CUDA GPU (< 3 minutes): sampled logprobs against the trainer's full
# forward, before and after syncing a LoRA adapter and full weights, on vLLM's default engine (V1, engine core
# in its own process, LoRA enabled). Needs `pip install 'twinkle-hf[vllm]'` (tests/gpu/setup.sh installs it).
# Exit status 77: no CUDA device or vllm not installed (run_all.sh reports the stage as skipped); else pytest's.
# Usage: tests/gpu/run_vllm.sh [--check]   (--check: the test collects; says whether vLLM is importable; runs on CPU)
set -euo pipefail
cd "$(dirname "$0")/../.."

source tests/gpu/python.sh  # sets PY

TESTS=tests/gpu/test_vllm_gpu.py
BUDGET=240  # seconds (run_all.sh gives this stage its own budget from this line)

if [[ "${1:-}" == "--check" ]]; then
  "$PY" -m pytest "$TESTS" --collect-only -q -m gpu >/dev/null
  "$PY" -c "import vllm" 2>/dev/null && echo "run_vllm.sh: vllm importable" \
    || echo "run_vllm.sh: vllm not installed here (pip install 'twinkle-hf[vllm]' on the GPU machine)"
  exit 0
fi

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "run_vllm.sh: no CUDA device visible to $PY; these checks need a GPU." >&2
  exit 77
fi
if ! "$PY" -c "import vllm" 2>/dev/null; then
  echo "run_vllm.sh: vllm is not installed for $PY: pip install 'twinkle-hf[vllm]' (or tests/gpu/setup.sh)." >&2
  exit 77  # a missing optional extra: run_all.sh reports the stage as skipped, not as failed
fi
exec timeout "$BUDGET" "$PY" -m pytest "$TESTS" -m gpu -q -p no:cacheprovider -rs
