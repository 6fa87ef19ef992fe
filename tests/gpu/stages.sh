# Sourced by tests/gpu/run_all.sh (and by tests/gpu/test_run_all.py, which drives it with stand-in stages):
# running a stage within its own time budget, naming what its exit status means, and the summary.
#
# Exit statuses, the same in every tests/gpu script:
#   0  passed
#   77 a prerequisite is missing (no CUDA device, an optional extra not installed): the stage is skipped,
#      and its log says what to install (tests/gpu/setup.sh installs everything)
#   124, 137  the stage ran out of its budget (timeout: TERM, then KILL after a grace period)
#   anything else is a failure; pytest's own: 1 tests failed, 2 interrupted, 3 internal error,
#   4 usage error, 5 no tests collected. None of them is ever read as "skipped".
# The caller sets OUT_DIR (logs, stages.tsv) and PY (the interpreter) before calling stage / write_summary.

SKIP_PREREQ=77
KILL_GRACE=30  # seconds between timeout's TERM and KILL

stage_state() {  # stage_state RC LIMIT: what an exit status means, one line
  local rc="$1" limit="$2"
  case "$rc" in
    0) echo "passed" ;;
    "$SKIP_PREREQ") echo "skipped: prerequisite missing" ;;
    124|137) echo "timeout after ${limit}s" ;;
    1) echo "failed (rc=1: tests failed)" ;;
    2) echo "failed (rc=2: interrupted or usage error)" ;;
    3) echo "failed (rc=3: pytest internal error)" ;;
    4) echo "failed (rc=4: pytest usage error)" ;;
    5) echo "failed (rc=5: no tests collected)" ;;
    *) echo "failed (rc=$rc)" ;;
  esac
}

script_budget() {  # script_budget SCRIPT DEFAULT: the BUDGET=<seconds> a run_*.sh declares for itself
  local budget
  budget="$(sed -n 's/^BUDGET=\([0-9][0-9]*\).*/\1/p' "$1" | head -n 1)"
  echo "${budget:-$2}"
}

stage() {  # stage NAME SECONDS COMMAND...: COMMAND with its own budget of SECONDS; appends to $OUT_DIR/stages.tsv
  local name="$1" limit="$2" rc began
  shift 2
  began=$SECONDS
  set +e
  timeout --kill-after="$KILL_GRACE" "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$(stage_state "$rc" "$limit")" "$((SECONDS - began))" "$limit" "$rc" \
    >> "$OUT_DIR/stages.tsv"
}

environment() {  # environment [FILE]: torch, the GPUs and each optional component's version (printed; JSON to FILE)
  "$PY" - "${1:-}" <<'EOF'
import importlib.metadata
import json
import sys

info = {}
try:
    import torch

    info["torch"] = torch.__version__
    info["cuda"] = torch.version.cuda
    info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
except Exception as exc:  # noqa: BLE001 - a report, not a check
    info["torch"] = f"not importable: {exc}"
for dist in ("liger-kernel", "megatron-core", "transformer-engine", "vllm", "twinkle-core", "twinkle-hf",
             "twinkle-megatron"):
    try:
        info[dist] = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        info[dist] = None
print("environment: " + ", ".join(f"{k}={v}" for k, v in info.items()))
if sys.argv[1]:
    with open(sys.argv[1], "w") as f:
        json.dump(info, f, indent=2)
EOF
}

write_summary() {  # prints the table, writes $OUT_DIR/summary.json; exit status 0 unless a stage failed
  # (with STRICT=1 a skipped stage counts as failed too)
  "$PY" - "$OUT_DIR" "${STRICT:-0}" <<'EOF'
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
rows = [line.split("\t") for line in (out / "stages.tsv").read_text().splitlines() if line]
stages = [{"stage": n, "status": s, "seconds": int(t), "budget_s": int(b), "rc": int(rc)} for n, s, t, b, rc in rows]
summary = {"stages": stages}
if (out / "environment.json").is_file():
    summary["environment"] = json.loads((out / "environment.json").read_text())
benches = {}
for path in sorted(out.glob("bench*.json")):  # bench_gpu_train.json (run_all.sh), bench_0_5b.json ... (first_run.sh)
    try:
        benches[path.stem] = json.loads(path.read_text())
    except ValueError:  # a benchmark cut short mid-write
        benches[path.stem] = {"error": "unreadable (cut short?)"}
if benches:
    summary["bench"] = benches
print(f"\n{'stage':<11} {'status':<38} {'seconds':>7} {'budget':>6}")
for row in stages:
    print(f"{row['stage']:<11} {row['status']:<38} {row['seconds']:>7} {row['budget_s']:>6}")
for name, bench in benches.items():
    for row in bench.get("rows", []):
        mfu = f"{100 * row['mfu']:.1f}%" if row.get("mfu") is not None else "n/a"
        print(f"{name} {row['mode']:<5} {row['variant']:<13} {row['tokens_per_s']:>9.0f} tokens/s  MFU {mfu}")
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(f"written: {out / 'summary.json'}")
ok = ("passed",) if sys.argv[2] == "1" else ("passed", "skipped")
sys.exit(0 if all(r["status"].startswith(ok) for r in stages) else 1)
EOF
}
