#!/usr/bin/env bash
# The install step of the GPU tier: run once on a fresh CUDA machine, from the clone, then tests/gpu/run_all.sh.
# Into a virtual environment (.venv-gpu by default, which the GPU scripts then pick up on their own):
#   1. vLLM, an extra (skipped with --no-vllm): first, because it pins the torch it was built for;
#   2. a CUDA build of torch (>= 2.9) from PyTorch's index (--torch-index), unless vLLM brought one;
#      from here on torch is pinned (a pip constraint), so nothing below replaces it;
#   3. the project's packages, editable from this clone (twinkle-core, -hf[liger], -megatron, -npu, -server),
#      which brings megatron-core (twinkle-megatron's dependency), and the test environment's dependencies
#      as pyproject.toml's [tool.hatch.envs.test] lists them (liger-kernel pinned there, pytest, ...),
#      plus the offline test models (scripts/ensure_test_models.py);
#   4. only with --with-te: transformer-engine[pytorch], which compiles against this torch (10-20 minutes);
#      if it fails, or builds but does not import (which would break `import megatron.core`), it is
#      removed again and reported. Without it (the default) the Megatron TE/fp8 tests skip.
# Ends with the environment (torch, CUDA, GPUs, liger, megatron-core, transformer-engine, vLLM) and a table of
# the steps. Exit status: 0 every required step worked (an optional one, vLLM or TE, may have failed: the table
# says so), 1 a required step failed, 2 usage error, 77 no NVIDIA driver on this machine (nvidia-smi).
#
# Usage: tests/gpu/setup.sh [--venv DIR | --python PY] [--torch-index URL] [--no-vllm] [--with-te] [--dry-run]
#   --venv DIR         the environment to create or reuse (default .venv-gpu)
#   --python PY        install into this interpreter's environment instead (a conda env, a container's python)
#   --torch-index URL  another wheel index for torch (default: PyPI, like every other package here)
#   --with-te          build transformer-engine too (--no-te, the default, is accepted)
#   --dry-run          print the commands and run nothing (any machine; run_all.sh --check does this)
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=".venv-gpu"
TARGET_PY=""
TORCH_INDEX=""  # PyPI
TORCH_SPEC="torch>=2.9"  # twinkle-core's requirement
VLLM_SPEC="vllm>=0.10"   # twinkle-hf[vllm]
TE_SPEC="transformer-engine[pytorch]>=2.0"  # twinkle-megatron[fp8]; never the bare meta package
PACKAGES=(-e packages/twinkle-core -e "packages/twinkle-hf[liger]" -e packages/twinkle-megatron
          -e packages/twinkle-npu -e packages/twinkle-server)
WITH_VLLM=1
WITH_TE=0
DRY=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --venv) VENV="${2:?--venv needs a directory}"; shift 2 ;;
    --python) TARGET_PY="${2:?--python needs an interpreter}"; shift 2 ;;
    --torch-index) TORCH_INDEX="${2:?--torch-index needs a URL}"; shift 2 ;;
    --no-vllm) WITH_VLLM=0; shift ;;
    --no-te) WITH_TE=0; shift ;;
    --with-te) WITH_TE=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

STEPS=()  # "name<TAB>result" rows for the closing table
run() {  # run COMMAND...: echo it; execute it unless --dry-run
  echo "+ $*"
  (( DRY )) || "$@"
}
step() {  # step NAME optional|required COMMAND...: run it and record the outcome (a required failure stops)
  local name="$1" kind="$2" rc=0
  shift 2
  echo "== $name"
  run "$@" || rc=$?
  if (( DRY )); then
    STEPS+=("$name	planned ($kind)")
  elif (( rc == 0 )); then
    STEPS+=("$name	ok")
  elif [[ "$kind" == optional ]]; then
    STEPS+=("$name	FAILED (rc=$rc; optional, continuing)")
  else
    STEPS+=("$name	FAILED (rc=$rc)")
    table
    echo "setup.sh: '$name' failed; nothing after it was installed." >&2
    exit 1
  fi
  return 0
}
table() {
  echo
  printf '%s\n' "${STEPS[@]}" | awk -F'\t' '{printf "%-40s %s\n", $1, $2}'
}

if (( ! DRY )) && ! nvidia-smi >/dev/null 2>&1; then
  echo "setup.sh: no NVIDIA driver here (nvidia-smi fails or is missing); the GPU tier needs a CUDA GPU." >&2
  exit 77
fi

if [[ -n "$TARGET_PY" ]]; then
  PY="$TARGET_PY"
else
  PY="$VENV/bin/python"
  if [[ ! -x "$PY" ]]; then
    # --system-site-packages: a CUDA torch the machine already has is reused (kept below), not downloaded
    step "virtual environment $VENV" required python3 -m venv --system-site-packages "$VENV"
  fi
fi
PIP=("$PY" -m pip install)
step "pip" required "$PY" -m pip install --upgrade pip

cuda_torch() {  # the installed torch is a CUDA build, new enough (TORCH_SPEC), that sees a GPU
  (( ! DRY )) && "$PY" -c "import sys, torch; v = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]); \
sys.exit(0 if v >= (2, 9) and torch.version.cuda and torch.cuda.is_available() else 1)" 2>/dev/null
}
KEEP=()  # what later installs must keep as it is (pip then resolves against its requirements too)
if (( WITH_VLLM )); then
  step "vLLM (extra)" optional "${PIP[@]}" "$VLLM_SPEC" "$TORCH_SPEC"
  if (( ! DRY )) && VLLM_VERSION="$("$PY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null)"; then
    KEEP+=("vllm==$VLLM_VERSION")
  fi
fi
if cuda_torch; then
  STEPS+=("CUDA torch	kept: $("$PY" -c 'import torch; print(torch.__version__)')")
else
  INDEX=()
  [[ -n "$TORCH_INDEX" ]] && INDEX=(--index-url "$TORCH_INDEX")
  step "CUDA torch" required "${PIP[@]}" "$TORCH_SPEC" "${INDEX[@]}"
fi

CONSTRAINTS="$(mktemp -t twinkle-gpu-constraints.XXXXXX)"
trap 'rm -f "$CONSTRAINTS"' EXIT
if (( DRY )); then
  echo "+ (constraints file: torch==<the version installed above>)"
else
  "$PY" -c "import torch; print('torch==' + torch.__version__)" > "$CONSTRAINTS"
fi
step "twinkle packages (editable)" required "${PIP[@]}" -c "$CONSTRAINTS" "${PACKAGES[@]}" "${KEEP[@]}"

test_deps() {  # test_deps PYTHON: pyproject.toml's [tool.hatch.envs.test] dependencies, one a line
  "$1" - <<'EOF'
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: twinkle-core depends on tomli there
    import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["tool"]["hatch"]["envs"]["test"]["dependencies"]))
EOF
}
mapfile -t TEST_DEPS < <(test_deps "$( (( DRY )) && echo "${PYTHON:-python3}" || echo "$PY")")
step "test dependencies (liger, pytest...)" required "${PIP[@]}" -c "$CONSTRAINTS" "${TEST_DEPS[@]}" "${KEEP[@]}"
step "offline test models" required "$PY" scripts/ensure_test_models.py

if (( WITH_TE )); then
  step "transformer-engine (where it builds)" optional "${PIP[@]}" -c "$CONSTRAINTS" --no-build-isolation "$TE_SPEC" \
    "${KEEP[@]}"
  if (( ! DRY )) && ! "$PY" -c "import transformer_engine.pytorch" >/dev/null 2>&1; then
    echo "setup.sh: transformer_engine.pytorch does not import; removing transformer-engine (it would break" \
         "import megatron.core). The Megatron TE/fp8 tests will skip." >&2
    "$PY" -m pip uninstall -y transformer-engine transformer-engine-torch transformer-engine-cu12 >/dev/null 2>&1 || true
    STEPS+=("transformer-engine import	FAILED (removed; optional)")
  fi
fi

step "imports" required "$PY" -c "import torch, twinkle, twinkle_hf, twinkle_megatron, liger_kernel, megatron.core; \
assert torch.cuda.is_available(), 'torch sees no CUDA device'"
if (( ! DRY )); then
  source tests/gpu/stages.sh
  environment
fi
table
[[ -z "$TARGET_PY" ]] && echo "next: tests/gpu/run_all.sh   (it uses $VENV on its own; PYTHON=... picks another)"
exit 0
