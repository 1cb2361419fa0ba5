"""The Hugging Face Hub, asked once and quickly: is it reachable, and what to tell the user
when it is not. Nothing here retries: a corpus or tokenizer that cannot be fetched fails in
seconds with one line naming HF_HUB_OFFLINE and the cache directory."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

from posenc.errors import UserError

TRUE = ("1", "true", "yes", "on")


def offline() -> bool:
    """HF_HUB_OFFLINE / HF_DATASETS_OFFLINE: use the local cache only."""
    return any(os.environ.get(k, "").lower() in TRUE for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def cache_dir() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_DATASETS_CACHE") or str(constants.HF_HOME)


def reachable(timeout: float = 3.0) -> bool:
    """One TCP connection to the Hub's host, with a short timeout (no HTTP, no retries)."""
    url = urlparse(endpoint())
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=timeout).close()
        return True
    except OSError:
        return False


def unavailable(what: str) -> UserError:
    """The one-line error for something the Hub should provide but cannot."""
    if offline():
        return UserError(f"{what} is not in the local cache ({cache_dir()}) and HF_HUB_OFFLINE=1 forbids "
                         f"downloading it — unset HF_HUB_OFFLINE on a machine with internet once, or use "
                         f"dataset=pystdlib / dataset=text and tokenizer=byte / bpe, which need no network")
    return UserError(f"{what} needs the Hugging Face Hub ({endpoint()}), which cannot be reached — connect to "
                     f"the internet, or set HF_HUB_OFFLINE=1 to use a copy in the cache ({cache_dir()})")


def check(what: str) -> None:
    """Fail fast when online use is impossible; in offline mode make sure the libraries, which
    read HF_HUB_OFFLINE once at import, look in the cache only and never retry the network."""
    if offline():
        import datasets
        from huggingface_hub import constants

        constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    elif not reachable():
        raise unavailable(what)
