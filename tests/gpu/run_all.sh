#!/usr/bin/env bash
# The GPU tier: every tests/gpu/run_*.sh (each checks its own prerequisites and runs its gpu-marked tests),
# then the gpu-marked tests elsewhere in tests/. Exit status: the first failure's, after running everything.
# Usage: tests/gpu/run_all.sh [--check]   (--check: prerequisites and collection only; runs on CPU too)
set -uo pipefail
cd "$(dirname "$0")/../.."
status=0
for script in tests/gpu/run_*.sh; do
  [[ "$script" == tests/gpu/run_all.sh ]] && continue
  echo "== $script $*"
  "$script" "$@" || { code=$?; [[ $status == 0 ]] && status=$code; }
done
PY="${PYTHON:-python3}"
if command -v hatch >/dev/null 2>&1 && ENV_DIR="$(hatch env find test 2>/dev/null)" && [[ -x "$ENV_DIR/bin/python" ]]; then
  PY="${PYTHON:-$ENV_DIR/bin/python}"
fi
echo "== other gpu-marked tests"
if [[ "${1:-}" == "--check" ]]; then
  "$PY" -m pytest tests -m gpu --collect-only -q --ignore=tests/gpu >/dev/null
else
  "$PY" -m pytest tests -m gpu -q -p no:cacheprovider --ignore=tests/gpu
fi
code=$?
[[ $code != 0 && $code != 5 && $status == 0 ]] && status=$code  # 5: no gpu-marked test outside tests/gpu
exit $status
