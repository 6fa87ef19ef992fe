# Sourced by the GPU-tier scripts: PY is the interpreter they run ($PYTHON, else the environment
# tests/gpu/setup.sh made in .venv-gpu, else the hatch "test" environment, else python3).
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv-gpu/bin/python ]]; then
    PY=".venv-gpu/bin/python"
  elif command -v hatch >/dev/null 2>&1 && ENV_DIR="$(hatch env find test 2>/dev/null)" && [[ -x "$ENV_DIR/bin/python" ]]; then
    PY="$ENV_DIR/bin/python"
  else
    PY="python3"
  fi
fi
