"""Turn Hydra's and OmegaConf's composition errors into one line a user can act on."""

from __future__ import annotations

import re

from posenc.errors import UserError


def explain(e: BaseException) -> str:
    """One line: what went wrong — what to do instead."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(e, UserError):
        return str(e)
    if isinstance(e, MissingConfigException) and e.missing_cfg_file:
        group, _, choice = e.missing_cfg_file.rpartition("/")
        options = ", ".join(e.options or [])
        if group:
            if options:
                return f"unknown {group} '{choice}' — choose one of: {options}"
            return f"unknown {group} '{choice}' — there is no conf/{group}/{choice}.yaml; add it or check the spelling"
        return f"no config '{choice}' — check --config-name / --config-dir"
    if isinstance(e, OverrideParseException):
        return f"cannot parse override '{e.override}' — write key=value, a group choice, or a,b,c with -m"
    if isinstance(e, ConfigCompositionException):
        text = str(e)
        m = re.search(r"Could not override '([^']+)'", text)
        if m:
            key = m.group(1)
            return (f"unknown config key '{key}' — check the spelling (see `posenc train --help` and "
                    f"`posenc train --cfg job`), or write +{key}=... to add a new key")
        m = re.search(r"Could not append to config\. An item is already at '([^']+)'", text)
        if m:
            return f"'{m.group(1)}' already exists — drop the + prefix to override it"
        cause = e.__cause__
        if isinstance(cause, OmegaConfBaseException):
            return f"{_first_line(text)}: {_first_line(str(cause))}"
        return _first_line(text)
    if isinstance(e, OmegaConfBaseException):
        return f"bad configuration: {_first_line(str(e))}"
    return f"{type(e).__name__}: {_first_line(str(e))} (run with --debug for the traceback)"


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text)
