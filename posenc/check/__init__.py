"""`posenc check`: the encoding contract stated as properties, run on any encoding (built-in or a
plug-in) in seconds on a CPU, and by posenc's own tests on every shipped encoding.

One module per group of properties, each property a function ``(Subject) -> list[CheckResult]``:

- model.py: causality, loss at init ≈ ln V, default positions, documents packing, sliding
  windows, lengths past training;
- length.py: the first t tokens of a window give the logits they give alone (what reads the
  window's length);
- paths.py: every attention path equal to a float64 reference built from the encoding's own
  hooks (reference.py), score_mod = position_bias = distance_bias, shift invariance;
- kernel.py: an encoding's own kernel (``fused_attention``) equal to its hooks' explicit-mask path,
  output and gradients;
- hooks.py: which hook, where a property fails (a second measurement, on each hook alone);
- flex_backward.py: FlexAttention's compiled backward accepts every score_mod (inductor's rule:
  each captured tensor that needs a gradient indexed once), traced on a CPU;
- learning.py: every parameter receives a gradient that is not negligible;
- state.py: safetensors round trip and bit-exact resume through posenc's own checkpoint code;
- cuda.py: at head_dim 64 and 128, T = 1024: the CUDA kernels forward and backward against
  float64, and compiled bf16 training steps (not offered without CUDA).

Every property that can differ between evaluation and training is measured in both (subject.MODES).
runner.py runs them and returns typed results (results.py), and names the set (``check_version``);
posenc/cli/check.py prints them; verdict.py keeps each encoding's verdict for the other commands.
What each property means and why: docs/check.md.
"""

from posenc.check.results import CheckResult, Status
from posenc.check.runner import CHECKS, check_version, run_checks
from posenc.check.subject import Subject, compose_subject

__all__ = ["CHECKS", "CheckResult", "Status", "Subject", "check_version", "compose_subject", "run_checks"]
