"""What scripts/gpu_check.sh runs, and its dry run's composition: no GPU, no run.

    python3 gpu_check_plan.py targets        # one `posenc check` target per line: every encoding, then
                                             # every hybrid layout (a layer kind with a recurrent mixer)
                                             # at its pattern's length, so each kind has a layer
    python3 gpu_check_plan.py compose FILE   # compose the config of every posenc command in FILE (one
                                             # shell-quoted command per line), as that command composes it

`compose` goes through the functions the commands themselves compose through (posenc.config.compose
and its checks for `train`, compose_subject and --only's groups for `check`, the bench's encoding
selection, per-encoding configs and option checks for `bench`), so an override that names no key,
an unknown encoding or a bad value fails here, on a CPU, with the command's own one-line error —
not minutes into a GPU run. Nothing is built beyond each encoding; `device=cuda` is not resolved.
"""

from __future__ import annotations

import shlex
import sys
from collections import Counter
from pathlib import Path


def targets() -> list[str]:
    """Every encoding, then every layout one of whose kinds mixes with a recurrence, with as many
    layers as its pattern (read from its YAML: composing each would cost a second here)."""
    from omegaconf import OmegaConf

    from posenc.config import group_options
    from posenc.config.searchpath import config_file

    out = [f"encoding={name}" for name in group_options("encoding")]
    for name in group_options("layout"):
        with config_file(f"layout/{name}.yaml").open() as f:
            layout = OmegaConf.load(f)
        if any(kind.get("mixer", "softmax") != "softmax" for kind in (layout.get("kinds") or {}).values()):
            out.append(f"layout={name} model.n_layer={len(layout.pattern)}")
    return out


def posenc_argv(line: str) -> list[str]:
    """The argv after `posenc` of a command line (an `env VAR=VALUE …` prefix skipped)."""
    argv = shlex.split(line)
    if argv and argv[0] == "env":
        argv = argv[1:]
        while argv and "=" in argv[0] and not argv[0].startswith("-"):
            argv = argv[1:]
    if not argv or argv[0] != "posenc" or len(argv) < 2:
        raise ValueError(f"not a posenc command: {line}")
    return argv[1:]


def compose_train(args: list[str]) -> None:
    from posenc.build import check_encodable
    from posenc.config import apply_choice_schemas, compose, validate

    cfg = compose(args, bench=False)
    validate(apply_choice_schemas(cfg))
    check_encodable(cfg)


def compose_check(args: list[str]) -> None:
    from posenc.check import compose_subject
    from posenc.cli.check import groups

    only, rest = [], []
    it = iter(args)
    for a in it:
        if a == "--only":
            only.append(next(it))
        elif a.startswith("-"):
            raise ValueError(f"gpu_check_plan.py does not know `posenc check {a}`")
        else:
            rest.append(a)
    groups(only)
    compose_subject(rest)


def compose_bench(args: list[str]) -> None:
    from posenc.bench.plan import check_encoding_overrides, encoding_config, select_encodings, validate
    from posenc.build import check_encodable
    from posenc.cli.bench import split_json_flag

    overrides, _ = split_json_flag(args)
    names, overrides, cfg = select_encodings(overrides)
    validate(cfg.bench)
    check_encoding_overrides(overrides, names)
    for name in names:
        check_encodable(encoding_config(overrides, name))


COMMANDS = {"train": compose_train, "check": compose_check, "bench": compose_bench}


def compose_all(lines: list[str]) -> int:
    """Compose every command; one `error: <command>: <why>` line and exit code 1 at the first that fails."""
    done: Counter[str] = Counter()
    for line in lines:
        try:
            command, *args = posenc_argv(line)
            if command not in COMMANDS:
                raise ValueError(f"gpu_check_plan.py composes {', '.join(COMMANDS)}, not `posenc {command}`")
            COMMANDS[command](args)
        except Exception as e:  # noqa: BLE001 - a UserError, a ValueError, Hydra's errors: no common base
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(f"error: {line}: {first}", file=sys.stderr)
            return 1
        done[command] += 1
    print(f"composed the config of {sum(done.values())} posenc commands "
          f"({', '.join(f'{n} {c}' for c, n in done.items())})")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["targets"]:
        print("\n".join(targets()))
        return 0
    if argv[:1] == ["compose"] and len(argv) == 2:
        return compose_all([line for line in Path(argv[1]).read_text().splitlines() if line.strip()])
    print("usage: gpu_check_plan.py targets | compose FILE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
