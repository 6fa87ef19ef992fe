#!/usr/bin/env bash
# VLLMSampler on a real vLLM engine, one CUDA GPU (< 3 minutes): sampled logprobs against the trainer's full
# forward, before and after syncing a LoRA adapter and full weights. Needs `pip install 'twinkle-hf[vllm]'`.
# Exit status 3: vllm is not installed (run_all.sh reports the stage as skipped).
# Usage: tests/gpu/run_vllm.sh [--check]   (--check: the test collects; says whether vLLM is importable; runs on CPU)
set -euo pipefail
cd "$(dirname "$0")/../.."

source tests/gpu/python.sh  # sets PY

TESTS=tests/gpu/test_vllm_gpu.py

if [[ "${1:-}" == "--check" ]]; then
  "$PY" -m pytest "$TESTS" --collect-only -q -m gpu >/dev/null
  "$PY" -c "import vllm" 2>/dev/null && echo "run_vllm.sh: vllm importable" \
    || echo "run_vllm.sh: vllm not installed here (pip install 'twinkle-hf[vllm]' on the GPU machine)"
  exit 0
fi

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "run_vllm.sh: no CUDA device visible to $PY; these checks need a GPU." >&2
  exit 1
fi
if ! "$PY" -c "import vllm" 2>/dev/null; then
  echo "run_vllm.sh: vllm is not installed for $PY: pip install 'twinkle-hf[vllm]'." >&2
  exit 3  # run_all.sh reports the stage as skipped (an optional extra), not as failed
fi
exec "$PY" -m pytest "$TESTS" -m gpu -q -p no:cacheprovider
