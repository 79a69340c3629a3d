"""Issue 41 item 5: bounded reads. An archive is checked before ``torch.load`` inflates anything in it.

A ~3 MB ``optimizer.bin`` whose ``data.pkl`` is deflated (it inflates to ~3 GB; the pickle itself is
valid, so before the fix the load even succeeded, after allocating twice the inflated size: a 500 MB
bomb raised max RSS by 917 MB) is refused with one line, and max RSS of the loading process stays
within 200 MB of its baseline. Every other reader that ``torch.load``s a file refuses it too, an
entry declaring more bytes than the file holds is refused, the total is bounded, and what
``torch.save`` writes (zip or legacy format) still loads.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys

import pytest
import torch

from accelerando.big_modeling.reading import load_state_dict
from accelerando.checkpointing import files as F
from accelerando.checkpointing.manifest import CheckpointError
from accelerando.common.serialization import load
from accelerando.core.safe_files import UnsafeArchiveError, check_archive

sys.path.insert(0, os.path.dirname(__file__))
import zip_bomb_worker as bombs  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "zip_bomb_worker.py")
RSS_BOUND_KIB = 200 * 1024


def test_a_3_mb_bomb_is_refused_and_memory_stays_bounded(tmp_path) -> None:
    """The whole load_state path (manifest recomputed, so every check before the reader passes)."""
    done = subprocess.run(
        [sys.executable, WORKER, str(tmp_path / "ckpt"), "3000"],  # inflates to ~3 GB
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert 2_000_000 < result["file_bytes"] < 4_000_000, result
    error = result["error"]
    assert error.startswith("CheckpointError: Refused to load ") and "optimizer.bin" in error, error
    assert "'archive/data.pkl' is compressed" in error and "\n" not in error, error
    assert result["peak_kib"] - result["baseline_kib"] < RSS_BOUND_KIB, result


@pytest.fixture
def bomb(tmp_path) -> str:
    """A 64 KB file whose data.pkl inflates to 64 MiB (enough to be refused, cheap to build)."""
    path = str(tmp_path / "bomb.bin")
    bombs.write_bomb(path, {"weight": torch.ones(4)}, 64 * 2**20)
    return path


def test_every_reader_refuses_the_bomb(bomb) -> None:
    with pytest.raises(CheckpointError, match=r"bomb\.bin'.*is compressed"):
        F.torch_load(bomb)
    with open(bomb, "rb") as handle:
        data = memoryview(bytearray(handle.read()))
    with pytest.raises(CheckpointError, match="is compressed"):
        F.torch_load(bomb, data=data)  # the bytes read (and verified) once by load_state
    with pytest.raises(UnsafeArchiveError, match="is compressed"):
        load(bomb)  # accelerando.utils.load
    with pytest.raises(ValueError, match="is compressed"):
        load_state_dict(bomb)  # big-model loading
    with open(bomb, "rb") as handle, pytest.raises(CheckpointError, match="item 'x' of .*is compressed"):
        F.bounded_archive(io.BytesIO(handle.read()), "item 'x' of shard")  # a DCP bytes item


def _saved(tmp_path, **kwargs: object) -> str:
    path = str(tmp_path / "state.bin")
    torch.save({"weight": torch.arange(1000.0), "step": 3}, path, **kwargs)
    return path


def test_an_entry_declaring_more_than_the_file_is_refused(tmp_path) -> None:
    path = _saved(tmp_path)
    with open(path, "rb") as handle:
        data = bytearray(handle.read())
    central = data.index(b"PK\x01\x02")  # the first central directory record
    struct.pack_into("<I", data, central + 24, 2**31)  # its uncompressed size: 2 GiB
    with open(path, "wb") as handle:
        handle.write(data)
    with pytest.raises(UnsafeArchiveError, match=r"declares 2147483648 bytes, more than the file's"):
        check_archive(path)


def test_the_total_is_bounded_and_configurable(tmp_path) -> None:
    path = _saved(tmp_path)
    check_archive(path)  # torch.save's own archive: within its size
    with pytest.raises(UnsafeArchiveError, match=r"entries declare \d+ bytes in all, more than the 100"):
        check_archive(path, max_total_bytes=100)


def test_what_torch_save_writes_still_loads(tmp_path) -> None:
    for kwargs in ({}, {"_use_new_zipfile_serialization": False}):  # zip, and the legacy format
        path = _saved(tmp_path, **kwargs)
        check_archive(path)
        assert torch.equal(F.torch_load(path)["weight"], torch.arange(1000.0))
        assert load(path)["step"] == 3


def test_a_damaged_central_directory_is_refused(tmp_path) -> None:
    path = _saved(tmp_path)
    with open(path, "rb") as handle:
        data = handle.read()
    with open(path, "wb") as handle:
        handle.write(data[: len(data) // 2])  # starts as a zip, has no central directory
    with pytest.raises(UnsafeArchiveError, match="central directory cannot be read"):
        check_archive(path)
