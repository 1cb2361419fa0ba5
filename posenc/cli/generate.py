"""`posenc generate RUN_DIR`: text from a trained run, decoded with a KV cache and streamed
(posenc/eval/generation.py). The text goes to stdout; what a user should know (the training length
crossed, the speed, what the cache kept) to stderr, so that `posenc generate … > out.txt` holds the text."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from posenc.cli.common import err_console, run_guarded, user_wants_traceback, without_debug
from posenc.cli.runs import RUN_DIR_HELP


def generate(
    ctx: typer.Context,
    run_dir: Path = typer.Argument(..., help=RUN_DIR_HELP),
    prompt: str | None = typer.Option(None, "--prompt", help="the text to continue"),
    prompt_file: Path | None = typer.Option(None, "--prompt-file", help="a file whose text to continue"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", help="how many tokens to generate"),
    temperature: float = typer.Option(0.8, "--temperature", help="softmax temperature; 0: greedy"),
    top_k: int = typer.Option(200, "--top-k", help="draw from the k most likely tokens; 0: from all"),
    seed: int = typer.Option(0, "--seed", help="the sampler's seed: the same seed gives the same text"),
) -> None:
    """Continue a prompt with a trained run, a token at a time; Hydra overrides follow (device=cpu).

    Example: `posenc generate outputs/…/run --prompt "def main(" --max-new-tokens 200 --seed 1`.
    """
    from posenc.errors import UserError  # start-up: each command imports what it needs when it runs
    from posenc.eval.generation import Settings, generate_run

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def say(line: str) -> None:
        err_console.print(f"\n[dim]note: {line}[/]", highlight=False, soft_wrap=True, markup=True)

    def run() -> None:
        if (prompt is None) == (prompt_file is None):
            raise UserError("give the text to continue with --prompt TEXT or --prompt-file PATH (one of them)")
        try:
            text = prompt if prompt is not None else prompt_file.read_text(encoding="utf-8")
        except OSError as e:
            raise UserError(f"cannot read --prompt-file {prompt_file}: {e.strerror or e}") from None
        settings = Settings(text, max_new_tokens, temperature, top_k or None, seed)
        done = generate_run(run_dir, without_debug(ctx.args), settings, write, say)
        write("\n")
        rate = done.new_tokens / done.decode_s if done.decode_s > 0 else float("inf")
        err_console.print(
            f"[dim]{done.new_tokens} tokens in {done.decode_s:.2f} s ({rate:.1f} tokens/s) after a prompt of "
            f"{done.prompt_tokens} tokens ({done.prefill_s:.2f} s); the cache kept {'; '.join(done.cache)}: "
            f"{done.cache_bytes / 2**20:.2f} MiB"
            + (f"; the sequence was run again {done.restarts} times (a stale cache)" if done.restarts else "") + "[/]",
            highlight=False, soft_wrap=True)

    run_guarded(run, user_wants_traceback(ctx.args))


def register(app: typer.Typer) -> None:
    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(generate)
