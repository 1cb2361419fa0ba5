"""The encodings on offer, read from conf/ on disk (posenc's and the plugins'): their YAML, one
line of description each, and their options with defaults (`posenc encodings`)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from posenc.config.searchpath import config_file, group_options
from posenc.errors import UserError


def encoding_catalogue() -> list[tuple[str, str, dict]]:
    """(name, one-line description, options with defaults) for every encoding config."""
    out = []
    for name in group_options("encoding"):
        lines = encoding_yaml(name).splitlines()
        header = [line.lstrip("# ").strip() for line in lines[: next((i for i, l in enumerate(lines) if not l.startswith("#")), len(lines))]]
        out.append((name, " ".join(header), encoding_options(name)))
    return out


def encoding_yaml(name: str) -> str:
    """The text of encoding/NAME.yaml, from posenc's conf/ or a plugin's (posenc/config/searchpath.py)."""
    found = config_file(f"encoding/{name}.yaml")
    if found is None:
        raise UserError(f"no encoding '{name}' — see `posenc encodings`")
    return found.read_text()


def encoding_options(name: str) -> dict[str, object]:
    """An encoding YAML's keys with their defaults: those of the encoding it extends (a plain
    ``- fox`` entry in its defaults), the encodings it wraps (``/encoding@<key>: <name>``, chosen
    with ``encoding@encoding.<key>=…``; ``override`` changes the one it extends), then its own."""
    node = OmegaConf.create(encoding_yaml(name))
    options: dict[str, object] = {}
    for entry in node.get("defaults") or []:
        if isinstance(entry, str) and entry != "_self_":
            options.update(encoding_options(entry))
        elif isinstance(entry, DictConfig):
            for group, choice in entry.items():
                group = str(group).removeprefix("override ")
                if group.startswith("/encoding@"):
                    options[group.split("@", 1)[1]] = choice
    raw = OmegaConf.to_container(node, resolve=False)  # as written: an interpolation stays "${...}"
    options.update({k: v for k, v in raw.items() if k not in ("_target_", "name", "defaults")})
    return options
