"""Counted work of ``save_state``: fsync calls and bytes written, against what the raw floor does.

The raw floor of a durable save is each file written once and flushed once. ``save_state`` adds the
manifest and one flush per folder it changes (the staging folder, its parent), and no more:
overwriting a checkpoint or rotating old ones away adds at most one flush of the parent folder, and
every payload byte is written once, hashed for the manifest as it is written (never read back).
"""

from __future__ import annotations

import mmap
import os

import pytest
import torch

from accelerando import Accelerator
from accelerando.checkpointing import list_checkpoints, verify_checkpoint
from accelerando.checkpointing.digest import PIECE_BYTES, available, file_digest
from accelerando.checkpointing.written import StreamDigest
from accelerando.plugins.project import ProjectConfiguration

pytestmark = pytest.mark.usefixtures("fresh_state")


def _prepared(tmp_path, **config: object) -> Accelerator:
    accelerator = Accelerator(
        cpu=True, project_config=ProjectConfiguration(project_dir=str(tmp_path), **config)
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, 256)).sum().backward()
    optimizer.step()
    return accelerator


def _written_bytes() -> int:
    with open("/proc/self/io", encoding="ascii") as handle:
        fields = dict(line.split(": ") for line in handle.read().splitlines())
    return int(fields["wchar"])


def test_overwriting_a_checkpoint_flushes_each_folder_once(tmp_path, fsyncs) -> None:
    accelerator = _prepared(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    fsyncs.paths.clear()
    accelerator.save_state(folder)  # the atomic swap, then the previous checkpoint goes to the trash
    files = verify_checkpoint(folder).files
    # Each file, the manifest, the staging folder, the parent: moving the old one away adds none.
    assert len(fsyncs.paths) == len(files) + 3, fsyncs.paths
    assert fsyncs.paths[-1] == str(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_rotation_flushes_the_checkpoints_folder_once_for_all_deletions(tmp_path, fsyncs) -> None:
    accelerator = _prepared(tmp_path, automatic_checkpoint_naming=True, total_limit=3)
    for _ in range(3):
        accelerator.save_state()
    accelerator.project_configuration.total_limit = 1
    fsyncs.paths.clear()
    accelerator.save_state()  # checkpoint_3; rotation deletes checkpoint_0, _1 and _2
    root = str(tmp_path / "checkpoints")
    assert [n for n, _ in list_checkpoints(root)] == [3]
    files = verify_checkpoint(os.path.join(root, "checkpoint_3")).files
    # The save's own flushes, then one flush of the checkpoints folder for the three deletions.
    assert len(fsyncs.paths) == len(files) + 4, fsyncs.paths
    assert fsyncs.paths[-2:] == [root, root]
    assert not [name for name in os.listdir(root) if name.startswith(".checkpoint_")]  # no trash left


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs /proc/self/io")
def test_a_save_writes_each_payload_byte_once(tmp_path) -> None:
    accelerator = _prepared(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)  # first save: imports and lazy set-up are done
    before = _written_bytes()
    accelerator.save_state(str(tmp_path / "second"))
    written = _written_bytes() - before
    payload = sum(entry.size for entry in verify_checkpoint(str(tmp_path / "second")).files.values())
    manifest = os.path.getsize(tmp_path / "second" / "checkpoint_manifest.json")
    assert payload > 700_000  # weights + AdamW state of a 256 x 256 layer
    # The files once, the manifest once, the lock's 512-byte record: nothing written twice.
    assert payload + manifest <= written <= payload + manifest + 4096, (written, payload, manifest)


def test_a_save_hashes_while_writing_and_reads_no_file_back(tmp_path, monkeypatch) -> None:
    accelerator = _prepared(tmp_path)
    accelerator.save_state(str(tmp_path / "first"))  # imports and lazy set-up are done
    reads: list[str] = []
    real_mmap, real_pread = mmap.mmap, os.pread

    def counting_mmap(fd: int, *args: object, **kwargs: object) -> mmap.mmap:
        reads.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_mmap(fd, *args, **kwargs)

    def counting_pread(fd: int, size: int, offset: int) -> bytes:
        reads.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_pread(fd, size, offset)

    monkeypatch.setattr(mmap, "mmap", counting_mmap)
    monkeypatch.setattr(os, "pread", counting_pread)
    folder = str(tmp_path / "second")
    accelerator.save_state(folder)
    monkeypatch.undo()
    assert reads == []
    # The checksums computed while writing are those of the bytes on disk.
    files = verify_checkpoint(folder, checksums=True).files
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl"} <= set(files)


@pytest.mark.parametrize("algorithm", ["xxh3_64-p64m", "crc32-p64m"])
def test_stream_digest_equals_the_digest_of_the_file(tmp_path, algorithm) -> None:
    if not available(algorithm):
        pytest.skip(f"{algorithm} needs xxhash")
    data = os.urandom(1 << 16) * (PIECE_BYTES // (1 << 16) + 1)  # a bit over one piece
    for size in (0, 1, PIECE_BYTES, len(data)):
        path = tmp_path / f"f{size}"
        path.write_bytes(data[:size])
        stream = StreamDigest(algorithm)
        for start in range(0, size, 3 * 2**20 + 7):  # chunks that straddle the piece boundary
            stream.update(memoryview(data)[start : min(size, start + 3 * 2**20 + 7)])
        assert stream.entry() == file_digest(str(path), algorithm), size
