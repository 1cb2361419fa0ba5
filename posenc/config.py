"""Where posenc's Hydra configs live, and reading them outside of a run."""

from __future__ import annotations

from importlib.resources import files

from omegaconf import OmegaConf

#: the top-level conf/ directory, shipped inside the package as posenc.conf
CONFIG_MODULE = "posenc.conf"
CONFIG_PATH = f"pkg://{CONFIG_MODULE}"


def config_dir():
    return files(CONFIG_MODULE)


def group_options(group: str) -> list[str]:
    """The choices of a config group, e.g. group_options('encoding') -> ['alibi', ...]."""
    directory = config_dir().joinpath(group)
    return sorted(p.name[: -len(".yaml")] for p in directory.iterdir() if p.name.endswith(".yaml"))


def encoding_catalogue() -> list[tuple[str, str, dict]]:
    """(name, one-line description, options with defaults) for every encoding config."""
    out = []
    for name in group_options("encoding"):
        text = config_dir().joinpath("encoding", f"{name}.yaml").read_text()
        lines = text.splitlines()
        header = [line.lstrip("# ").strip() for line in lines[: next((i for i, l in enumerate(lines) if not l.startswith("#")), len(lines))]]
        doc = " ".join(header)
        node = OmegaConf.create(text)
        options = {k: node._get_node(k)._value() for k in node if k not in ("_target_", "name")}
        out.append((name, doc, options))
    return out
