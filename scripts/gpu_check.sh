#!/usr/bin/env bash
# The GPU check, one command (issue 12): the CUDA tests, the bench at GPT-2 small shape (also with
# document masks and a local/global layout: tokens/s and the fraction of blocks FlexAttention skips),
# and a 16x evaluation of model=small for every encoding, gathered into one JSON report.
#
#   bash scripts/gpu_check.sh [OUT_DIR]        # default: outputs/gpu_check/<date-time>
#
# Needs a CUDA GPU; run it from the repository root (the tests live in tests/).
set -uo pipefail
out=${1:-outputs/gpu_check/$(date +%Y-%m-%d_%H-%M-%S)}
mkdir -p "$out"
export WANDB_MODE=offline WANDB_SILENT=true

echo "== CUDA tests -> $out/cuda_tests.xml"
# -n 0: one process on the one GPU (pyproject runs a worker per core, 16 CUDA contexts here)
python -m pytest -m cuda -n 0 -q -p no:cacheprovider --junitxml "$out/cuda_tests.xml" tests | tee "$out/cuda_tests.txt"
tests_rc=${PIPESTATUS[0]}

echo "== bench: model=base, T=1024, B=16, bf16, compiled -> $out/bench.json"
posenc bench model=base trainer.seq_len=1024 trainer.batch_size=16 --json "$out/bench.json"
bench_rc=$?

echo "== masked bench: documents of 256 tokens, and Gemma 3 5:1 layout (window 256) -> $out/bench_documents.json, bench_gemma3.json"
posenc bench model=base trainer.seq_len=1024 trainer.batch_size=16 bench.encodings=[nope,rope,alibi,t5_bias] \
  bench.document_length=256 --json "$out/bench_documents.json"
posenc bench model=base trainer.seq_len=1024 trainer.batch_size=16 bench.encodings=[rope] layout=gemma3 \
  layout.window=256 --json "$out/bench_gemma3.json"

echo "== 16x evaluation: model=small, 1024 -> 16384 tokens -> $out/eval16.json"
posenc bench model=small trainer.seq_len=1024 trainer.batch_size=8 bench.steps=1 bench.rounds=1 \
  bench.eval_length_multiple=16 bench.reference=false --json "$out/eval16.json"
eval_rc=$?

python - "$out" "$tests_rc" "$bench_rc" "$eval_rc" <<'PY'
import json, pathlib, re, sys
out, tests_rc, bench_rc, eval_rc = pathlib.Path(sys.argv[1]), *map(int, sys.argv[2:])
def load(name):
    path = out / name
    return json.loads(path.read_text()) if path.exists() else None
summary = (out / "cuda_tests.txt").read_text().strip().splitlines()[-1:] if (out / "cuda_tests.txt").exists() else []
report = {"cuda_tests": {"exit_code": tests_rc, "summary": summary[0] if summary else None},
          "bench": load("bench.json"), "bench_exit_code": bench_rc,
          "bench_documents": load("bench_documents.json"), "bench_gemma3": load("bench_gemma3.json"),
          "eval16": load("eval16.json"), "eval16_exit_code": eval_rc}
(out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
print(f"wrote {out / 'report.json'}")
PY
exit $(( tests_rc || bench_rc || eval_rc ))
