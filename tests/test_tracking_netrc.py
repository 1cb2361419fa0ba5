"""W&B online mode needs a key: WANDB_API_KEY or a ~/.netrc entry for W&B's API host, read with
the standard library's netrc (a host named only in a comment, or another host's entry, is not a key)."""

from __future__ import annotations

from pathlib import Path

from posenc.record.tracking import _has_netrc_key


def test_a_netrc_entry_for_wandbs_host_is_a_key_and_nothing_else_is(tmp_path: Path, monkeypatch):
    path = tmp_path / "netrc"
    monkeypatch.setenv("NETRC", str(path))
    assert not _has_netrc_key()  # no file
    path.write_text("# api.wandb.ai is where the key would go\nmachine example.com login u password p\n")
    path.chmod(0o600)
    assert not _has_netrc_key()
    path.write_text("machine api.wandb.ai\n  login user\n  password 0123456789abcdef\n")
    assert _has_netrc_key()
