#!/usr/bin/env bash
# Context extension, end to end (issue 17; docs/context_extension.md): train a RoPE parent at
# T = 64 per seed, extend each to 4T with every RoPE scaling method (none, linear, ntk, dynamic,
# yarn, llama3, longrope), each with no fine-tune (0 steps) and with a 50-step fine-tune at 4T,
# score every run at 1, 2, 4, 8, 16 × T on the same validation tokens, and compare (mean and
# interval over the seeds; one seed gives no error bars).
#   scripts/context_extension_study.sh [extra overrides for every run, e.g. device=cuda]
#   SEEDS=0 scripts/context_extension_study.sh          # one seed: 3-6 min on a busy 2-core CPU
#   TASK=passkey scripts/context_extension_study.sh     # the passkey arm: the same on passkey retrieval
# Three seeds (the default): ~11 min on a busy 2-core CPU. PYTHON: the interpreter with posenc (python3).
# TASK=passkey: a RoPE parent trained on passkey at T = 64 (experiment=context_extension_passkey_parent),
# every method × {0, fine-tune} steps at 4T (experiment=context_extension_passkey), scored by exact
# match at 1, 2, 4, 8, 16 × T; compare's headline is accuracy at 4T, the figure/table accuracy in %.
set -euo pipefail
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" WANDB_MODE="${WANDB_MODE:-offline}" WANDB_SILENT=true
posenc="${POSENC:-posenc}"
read -r -a seeds <<< "${SEEDS:-0 1 2}"
case "${TASK:-}" in
    "") preset=context_extension; metric=() ;;
    passkey) preset=context_extension_passkey; metric=(--metric tasks/passkey/accuracy@256) ;;
    *) echo "error: TASK must be empty (perplexity) or passkey, got '$TASK'" >&2; exit 2 ;;
esac
study="outputs/$preset/$(date +%Y-%m-%d_%H-%M-%S)"
started=$(date +%s)

# the parents: one sweep, job i has seed seeds[i]
"$posenc" train -m "experiment=${preset}_parent" "seed=$(IFS=,; echo "${seeds[*]}")" logger=none \
    "hydra.sweep.dir=$study/parent" "$@"
extended=()
for i in "${!seeds[@]}"; do
    # every method × {0, fine-tune} steps from parent i (job dir <i>_<its swept values>), with its seed;
    # the path is quoted: its job dir's name holds '=' (0_seed=0), which an unquoted override cannot
    parent=$(ls -d "$study/parent/${i}_"*/)
    "$posenc" train -m "experiment=$preset" "trainer.init_from='${parent%/}'" "seed=${seeds[$i]}" \
        logger=none "hydra.sweep.dir=$study/extended/seed${seeds[$i]}" "$@"
    extended+=("$study/extended/seed${seeds[$i]}")
done
"$posenc" compare "${extended[@]}" --by encoding.scaling --by trainer.max_steps ${metric[@]+"${metric[@]}"} --out "$study"
# per fine-tune state, ppl (passkey: accuracy) against length in units of T: <preset>.png / .md
"${PYTHON:-python3}" "$(dirname "$0")/context_extension_plot.py" "$study" "${extended[@]}"
echo "context extension study${TASK:+ ($TASK)}: $study, ${#seeds[@]} seed(s), $(( $(date +%s) - started )) s"
