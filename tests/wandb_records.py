"""What an offline W&B run holds, read from its run-*.wandb file: the records wandb's own service
wrote (protobuf ``Record``s from wandb.proto), for tests that ask what a lab's dashboard will get.

The file is W&B's transaction log: a 7-byte header (``:W&B``, magic 0xBEE1, version), then records
in LevelDB's log format, 32 KiB blocks of chunks, each ``crc32c (4) | length (2) | kind (1)``
(1 whole, 2 first, 3 middle, 4 last), a block's tail shorter than a chunk header left as padding.
wandb 0.31 reads it in its Go core only, so the few lines that read it are here."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

BLOCK, CHUNK_HEADER = 32768, 7


def records(path: Path) -> Iterator:
    """Every Record of a run-*.wandb file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1, f"{path} is not a W&B transaction log"
    pos, pending = 7, b""
    while pos + CHUNK_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        _, length, kind = struct.unpack("<IHB", data[pos:pos + CHUNK_HEADER])
        if left < CHUNK_HEADER or (kind == 0 and length == 0):  # the block's padding
            pos += left
            continue
        if pos + CHUNK_HEADER + length > len(data):  # a record still being written: the log ends before it
            return
        chunk = data[pos + CHUNK_HEADER:pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def offline_run(run_dir: Path) -> dict:
    """An offline run in run_dir as {group, config, history_keys, artifacts}: the run's group, its
    config (each top-level key's value), every key any history row logged, and each logged
    artifact as {name, type, aliases, files: {path: md5 base64}}."""
    [log] = Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")
    run: dict = {"group": None, "config": {}, "history_keys": set(), "artifacts": []}
    for record in records(log):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run["group"] = record.run.run_group
            run["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            run["config"].update({i.key: json.loads(i.value_json) for i in record.config.update if i.key})
        elif kind == "history":
            run["history_keys"].update(i.key or "/".join(i.nested_key) for i in record.history.item)
        elif kind == "artifact":
            a = record.artifact
            run["artifacts"].append({"name": a.name, "type": a.type, "aliases": list(a.aliases),
                                     "files": {m.path: m.digest for m in a.manifest.contents}})
    return run
