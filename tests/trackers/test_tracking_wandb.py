"""Weights & Biases tracker in offline mode: read the run's records back from its .wandb file."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from accelerando.tracking import TrackingManager

pytest.importorskip("wandb", reason="wandb is not installed (pip install wandb)")

_BLOCK = 32768  # the .wandb file is a LevelDB-style log of 32 KiB blocks after a 7-byte header


def _records(raw: bytes):
    pos, pending = 7, b""
    while pos + 7 <= len(raw):
        left = _BLOCK - pos % _BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        data, pos = raw[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            yield data
        elif kind == 2:
            pending = data
        elif kind == 3:
            pending += data
        elif kind == 4:
            yield pending + data


def _read_until_exit(path: Path, record_type: type, timeout: float = 60.0) -> list:
    # wandb's service process may still be writing the file when finish() returns: wait for "exit".
    deadline = time.monotonic() + timeout
    while True:
        records = []
        for data in _records(path.read_bytes()):
            record = record_type()
            record.ParseFromString(data)
            records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def test_offline_run_holds_config_and_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from wandb.proto import wandb_internal_pb2

    monkeypatch.setenv("WANDB_SILENT", "true")
    manager = TrackingManager("wandb")
    manager.init(
        "proj",
        config={"lr": 0.1, "nested": {"a": 1}},
        init_kwargs={"wandb": {"mode": "offline", "dir": str(tmp_path), "name": "r1"}},
    )
    for step in range(3):
        manager.log({"loss": 1.0 / (step + 1)}, step=step)
    run = manager.get_tracker("wandb", unwrap=True)
    assert run.project == "proj" and run.name == "r1"
    manager.finish()

    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    records = _read_until_exit(run_file, wandb_internal_pb2.Record)
    config, history = {}, []
    for record in records:
        kind = record.WhichOneof("record_type")
        # the config travels in the run record or in config records, depending on timing
        if kind == "run":
            config.update({u.key: json.loads(u.value_json) for u in record.run.config.update})
        elif kind == "config":
            config.update({u.key: json.loads(u.value_json) for u in record.config.update})
        elif kind == "history":
            history.append(
                {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            )
    assert config["lr"] == 0.1 and config["nested"] == {"a": 1}
    assert [(h["_step"], h["loss"]) for h in history] == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
