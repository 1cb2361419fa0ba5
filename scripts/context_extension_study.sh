#!/usr/bin/env bash
# Context extension, end to end (issue 17; README "Context extension"): train a RoPE parent at
# T = 64, extend it to 4T with every RoPE scaling method (none, linear, ntk, dynamic, yarn,
# llama3, longrope), each with no fine-tune (0 steps) and with a 50-step fine-tune at 4T,
# score every run at 1, 2, 4, 8, 16 × T on the same validation tokens, and compare.
#   scripts/context_extension_study.sh [extra overrides for both steps, e.g. device=cuda]
# ~15 min on a busy 2-core CPU. One seed: no error bars (seed=0,1,2 on the parent for more).
set -euo pipefail
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" WANDB_MODE="${WANDB_MODE:-offline}" WANDB_SILENT=true
posenc="${POSENC:-posenc}"
study="outputs/context_extension/$(date +%Y-%m-%d_%H-%M-%S)"
started=$(date +%s)

"$posenc" train -m experiment=context_extension_parent logger=none "hydra.sweep.dir=$study/parent" "$@"
parent="$study/parent/0_rope"
"$posenc" train -m experiment=context_extension "trainer.init_from=$parent" logger=none \
    "hydra.sweep.dir=$study/extended" "$@"
"$posenc" compare "$study/extended" --by encoding.scaling --by trainer.max_steps
echo "context extension study: $study, $(( $(date +%s) - started )) s"
