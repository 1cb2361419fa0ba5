#!/usr/bin/env bash
# The GPU check, one command (issues 12 and 43): within 8 minutes on one H100, into one folder of 8 files.
#
# What it runs (every command is printed by --dry-run, which needs no GPU):
#   1. at once, the GPU shared (until GPU_CHECK_SECONDS * 57% from the start):
#      - the CUDA tests, 4 workers: pytest -m cuda (tests/test_cuda.py: every encoding and layout, head_dim 64
#        and 128 at T 1024 among them);
#      - `posenc check --only cuda` for every encoding and every hybrid layout (a layer kind with a recurrent
#        mixer, at its pattern's length), 4 at a time: fp32 against float64 and compiled bf16 training steps
#        at head_dim 64 and 128, T 1024;
#      - 300 training steps (model=tiny, T 128, batch 8) of nope and of t5_bias on the GPU (bf16, compiled),
#        one after the other, beside the same two on the CPU (fp32, 4 threads each);
#   2. then the GPU alone, for the timings:
#      - posenc bench at model=base, T=1024, batch 16, bf16, compiled, 1 warm-up step and 1 round of 3 steps,
#        for nope, rope, alibi, t5_bias, fox, path, stick_breaking, and rope under layout=qwen3_next;
#      - the 16x evaluation of model=small (T 1024 -> a forward pass at 16384 tokens) for nope, rope, alibi,
#        t5_bias.
# Every command runs under a deadline (GPU_CHECK_SECONDS, default 470 s from the start, the install included):
# whatever hangs, the check ends within 8 minutes, and report.json shows what was cut (exit code 124).
#
# The 8 files it writes into OUT_DIR (default ./outputs/gpu_check/<date-time>), and nothing else:
#   report.json             every command with its exit code and seconds; the tests' summary line; each check's
#                           verdict and failed rows; the bench rows; the 16x evaluation; the GPU's and the CPU's
#                           validation loss after 300 steps, side by side; how every run and bench row ran its
#                           kernels (each layer kind's path, compiled or not: summary.json's and the rows'
#                           "kernels") and every fallback in one list; torch, Triton and the GPU
#   cuda_tests.txt          pytest's output (-ra: every skip, failure and error named)
#   check.txt               posenc check's tables, one per encoding and hybrid layout
#   bench.json              posenc bench --json: model=base, the 7 encodings
#   bench_qwen3_next.json   posenc bench --json: model=base, layout=qwen3_next
#   eval16.json             posenc bench --json: model=small, bench.eval_length_multiple=16
#   bench.log               the benches' own output
#   runs.log                the four training runs' output
# Training runs and per-command logs go to a scratch directory, removed at the end.
#
# Usage: scripts/gpu_check.sh [--dry-run] [--install WHEELS_DIR] [OUT_DIR]
#   --dry-run            print every command it would run, and compose each posenc command's config (an
#                        override with a typo fails here, on a CPU); runs nothing, writes nothing
#   --install WHEELS_DIR first install the wheels in WHEELS_DIR (posenc's and every dependency the machine
#                        lacks) into $SITE (default /tmp/site) and use that install, as by hand:
#                          python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site WHEELS_DIR/*.whl
#                          export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
# It runs from any directory: the commands run in the scratch directory, outside the repository, so the
# installed posenc is the one imported (not the source tree), and the tests are this checkout's tests/.
set -uo pipefail

usage() { sed -n '/^# Usage:/,/^# It runs/p' "$0" | sed 's/^# \{0,1\}//'; }
dry=0 wheels="" out=""
while (($#)); do
  case $1 in
    --dry-run) dry=1 ;;
    --install) wheels=${2:?--install needs a directory of wheels}; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "error: unknown option $1 — see $0 --help" >&2; exit 2 ;;
    *) out=$1 ;;
  esac
  shift
done

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
start=$(date +%s)
budget=${GPU_CHECK_SECONDS:-470}
shared_end=$((start + budget * 57 / 100))   # phase 1: everything at once
bench_end=$((start + budget - 80))          # phase 2: the bench, then the layout's bench, then the 16x evaluation
layout_end=$((start + budget - 50))
eval_end=$((start + budget - 10))           # 10 s left for the report
export WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 COLUMNS=160 PYTHONUNBUFFERED=1

quote() {  # the arguments as one shell line: plain words as they are, the rest in single quotes
  local a sep=""
  for a; do
    if [[ $a =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then printf '%s%s' "$sep" "$a"; else printf "%s'%s'" "$sep" "${a//\'/\'\\\'\'}"; fi
    sep=" "
  done
  echo
}

if ((dry)); then
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/posenc-gpu-check-dry.XXXXXX")
  out=${out:-outputs/gpu_check/DATE-TIME}
else
  out=${out:-outputs/gpu_check/$(date +%Y-%m-%d_%H-%M-%S)}
  mkdir -p "$out" && out=$(cd "$out" && pwd) || { echo "error: cannot create $out" >&2; exit 1; }
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/posenc-gpu-check.XXXXXX")
fi
trap 'rm -rf "$scratch"' EXIT
plan=$scratch/posenc_commands.txt steps=$scratch/steps.tsv
: >"$plan"; : >"$steps"

# step NAME LOG END [CWD=dir] CMD...: CMD under a deadline at END (epoch seconds), its output appended to LOG, its
# exit code and seconds appended to steps.tsv; under --dry-run the command is printed (and kept for composing)
step() {
  local name=$1 log=$2 end=$3 cwd=$scratch t0 rc left
  shift 3
  if [[ $1 == CWD=* ]]; then cwd=${1#CWD=}; shift; fi
  if ((dry)); then
    quote "$@"
    [[ $1 == posenc || ($1 == env && " $* " == *" posenc "*) ]] && quote "$@" >>"$plan"
    return 0
  fi
  mkdir -p "$cwd"
  t0=$(date +%s) left=$((end - t0))
  ((left < 1)) && left=1
  echo "== $name: $(quote "$@")" >>"$log"
  (cd "$cwd" && timeout -s INT -k 15 "$left" "$@") >>"$log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - t0))" "$(quote "$@")" >>"$steps"
  echo "$(date +%H:%M:%S) $name: exit $rc after $(($(date +%s) - t0)) s"
  return "$rc"
}
background() { if ((dry)); then "$@"; else "$@" & fi; }

if [[ -n $wheels ]]; then
  site=${SITE:-/tmp/site}
  step install "$scratch/install.log" "$shared_end" \
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl || exit 1
  ((dry)) || export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PATH=$site/bin:$PATH
fi
if ! ((dry)) && ! command -v posenc >/dev/null; then
  echo "error: no posenc on PATH — pip install the project, or give --install WHEELS_DIR" >&2; exit 1
fi
mapfile -t targets < <(cd "$scratch" && python3 "$here/gpu_check_plan.py" targets) && ((${#targets[@]})) \
  || { echo "error: could not list the encodings and layouts (is posenc importable?)" >&2; exit 1; }

run() {  # run DEVICE ENCODING: 300 training steps, in a directory of its own
  step "train $2 on $1" "$scratch/run-$1-$2.log" "$shared_end" CWD="$scratch/run-$1-$2" "${@:3}" \
    posenc train "encoding=$2" "device=$1" trainer.max_steps=300 trainer.seq_len=128 trainer.batch_size=8 \
    trainer.eval_interval=100 eval.at_end=false logger=none
}
checks() {  # posenc check --only cuda for every target, 4 at a time
  local i=0 t
  for t in "${targets[@]}"; do
    i=$((i + 1))
    ((dry)) || while (($(jobs -rp | wc -l) >= 4)); do wait -n; done
    # shellcheck disable=SC2086 # a target is overrides separated by spaces
    background step "check $t" "$scratch/check-$(printf %02d $i).txt" "$shared_end" posenc check --only cuda $t
  done
  wait
}
gpu_runs() { run cuda nope; run cuda t5_bias; }
cpu_runs() { background run cpu nope env OMP_NUM_THREADS=4; background run cpu t5_bias env OMP_NUM_THREADS=4; wait; }
tests() {
  step "CUDA tests" "$out/cuda_tests.txt" "$shared_end" \
    python3 -m pytest -m cuda -n 4 --dist load -q -ra --tb=short -p no:cacheprovider "$repo/tests"
}

echo "== 1. at once, the GPU shared (until +$((shared_end - start)) s)"
background tests
background checks
background gpu_runs
background cpu_runs
wait

echo "== 2. the GPU alone: timings (until +$((eval_end - start)) s)"
timing=(model=base trainer.seq_len=1024 trainer.batch_size=16 bench.warmup=1 bench.steps=3 bench.rounds=1
        bench.reference=false)
step bench "$out/bench.log" "$bench_end" posenc bench "${timing[@]}" \
  'bench.encodings=[nope,rope,alibi,t5_bias,fox,path,stick_breaking]' --json "$out/bench.json"
step "bench layout=qwen3_next" "$out/bench.log" "$layout_end" posenc bench "${timing[@]}" layout=qwen3_next \
  'bench.encodings=[rope]' --json "$out/bench_qwen3_next.json"
step "16x evaluation" "$out/bench.log" "$eval_end" posenc bench model=small trainer.seq_len=1024 trainer.batch_size=8 \
  'bench.encodings=[nope,rope,alibi,t5_bias]' bench.warmup=0 bench.steps=1 bench.rounds=1 bench.reference=false \
  bench.eval_length_multiple=16 --json "$out/eval16.json"

if ((dry)); then
  echo "== composing every posenc command's config"
  (cd "$scratch" && python3 "$here/gpu_check_plan.py" compose "$plan")
  exit $?
fi

cat "$scratch"/check-*.txt >"$out/check.txt" 2>/dev/null
cat "$scratch"/run-*.log >"$out/runs.log" 2>/dev/null
python3 - "$out" "$scratch" <<'PY'
"""report.json: every step, and what each measured, read from the files the steps wrote."""
import json, pathlib, re, sys
out, scratch = map(pathlib.Path, sys.argv[1:3])

def load(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None

steps = [dict(zip(("name", "exit_code", "seconds", "command"), line.split("\t", 3)))
         for line in (scratch / "steps.tsv").read_text().splitlines()]
for s in steps:
    s["exit_code"], s["seconds"] = int(s["exit_code"]), int(s["seconds"])
    s["timed_out"] = s["exit_code"] in (124, 137)
tests = (out / "cuda_tests.txt").read_text() if (out / "cuda_tests.txt").exists() else ""
summary = [l.strip("= ") for l in tests.splitlines() if re.search(r"\d+ (passed|failed|error|skipped)", l)]
checks = {}
for f in sorted(scratch.glob("check-*.txt")):
    text = f.read_text()
    target = re.search(r"^== check (.*?): ", text, re.M)
    verdict = [l for l in text.splitlines() if re.match(r"(all \d+ properties hold|\d+ of \d+ properties fail)", l)]
    checks[target.group(1) if target else f.name] = {
        "verdict": verdict[-1] if verdict else None,
        "failed_rows": [" ".join(l.replace("│", " ").split()) for l in text.splitlines() if "✗" in l]}
runs, kernels, fallbacks = {}, {}, []
for run in sorted(scratch.glob("run-*-*/")):
    _, device, encoding = run.name.split("-", 2)
    found = sorted(run.glob("outputs/**/summary.json"))
    written = (load(found[-1]) or {}) if found else {}
    runs.setdefault(encoding, {})[device] = written.get("val/loss")
    kernels.setdefault(encoding, {})[device] = written.get("kernels")  # posenc/nn/kernels.py's record

def fell(where, record):  # every fallback of a record, one line each (posenc/record/kernel_record.py's line)
    for f in (record or {}).get("fallbacks", []):
        who = f["layer_kind"] + (f" ({f['encoding']})" if f.get("encoding") else "")
        step = "" if f.get("step") is None else f" at step {f['step']}"
        fallbacks.append(f"{where}: {who}: {f['left']} -> {f['took']}{step}: {f['reason']}")

for encoding, by_device in kernels.items():
    for device, record in by_device.items():
        fell(f"train {encoding} on {device}", record)
for name in ("bench", "bench_qwen3_next", "eval16"):
    for row in (load(out / f"{name}.json") or {}).get("results", []):
        fell(f"{name} {row['name']}", row.get("kernels"))
for r in runs.values():
    if r.get("cuda") and r.get("cpu"):
        r["relative_difference"] = abs(r["cuda"] - r["cpu"]) / r["cpu"]
        r["within_3_percent"] = r["relative_difference"] <= 0.03
import torch
env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
try:
    import triton
    env["triton"] = triton.__version__
except ImportError:
    env["triton"] = None
report = {"environment": env, "steps": steps, "cuda_tests": summary[-1] if summary else None, "checks": checks,
          "bench": load(out / "bench.json"), "bench_qwen3_next": load(out / "bench_qwen3_next.json"),
          "eval16": load(out / "eval16.json"), "runs_val_loss": runs, "runs_kernels": kernels,
          "kernel_fallbacks": fallbacks}
(out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
failed = [s["name"] for s in steps if s["exit_code"]]
print(f"wrote {out / 'report.json'}; {len(steps) - len(failed)} of {len(steps)} commands succeeded"
      + (f"; failed: {', '.join(failed)}" if failed else "")
      + (f"; {len(fallbacks)} kernel fallbacks (report.json: kernel_fallbacks)" if fallbacks else ""))
sys.exit(1 if failed else 0)
PY
