"""The work a ``save_state`` does, counted (never timed): threads started, writes, bytes read back, waits
on the disk, objects pickled.

A small save is fixed costs only, so each is counted against what the files need: no thread started
per save (the pools keep theirs), one ``write`` per small file (serialized in memory, hashed from that
buffer), nothing read back, and in a durable save two waits on the disk whatever the number of files
(the files, the manifest and the staging folder flushed together, then the parent folder after the
rename); a scratch save makes no ``fsync`` at all.
"""

from __future__ import annotations

import io
import os
import pickletools
import threading
import zipfile

import pytest
import torch

from accelerando import Accelerator
from accelerando.checkpointing import atomic, files, verify_checkpoint
from accelerando.checkpointing.atomic import MANIFEST_NAME

pytestmark = pytest.mark.usefixtures("fresh_state")


def _tiny(tmp_path, width: int = 4) -> Accelerator:
    """The harness's small save: a ``width`` x 2 linear layer and SGD (a 1024-wide one is above
    ``files.SMALL_FILE_BYTES``: its weights go through safetensors' own writer)."""
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(width, 2 if width < 1024 else width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    accelerator.prepare(model, optimizer)
    for durable in (True, False):  # imports, the pools' threads, lazy set-up
        accelerator.save_state(str(tmp_path / "warm"), durable=durable)
    return accelerator


def _read_bytes() -> int:
    with open("/proc/self/io", encoding="ascii") as handle:
        fields = dict(line.split(": ") for line in handle.read().splitlines())
    return int(fields["rchar"])


@pytest.mark.parametrize("durable", [True, False])
def test_a_small_save_starts_no_thread(tmp_path, monkeypatch, durable: bool) -> None:
    accelerator = _tiny(tmp_path)
    started: list[str] = []
    real_start = threading.Thread.start

    def counting_start(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    for _ in range(3):
        accelerator.save_state(str(tmp_path / "ckpt"), durable=durable)  # a new folder, then overwrites
    assert started == []


@pytest.mark.parametrize("durable", [True, False])
def test_each_small_file_is_written_in_one_write(tmp_path, monkeypatch, durable: bool) -> None:
    accelerator = _tiny(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder, durable=durable)
    writes: list[str] = []
    real_write = os.write

    def counting_write(fd: int, data: bytes) -> int:
        writes.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counting_write)
    accelerator.save_state(folder, durable=durable)
    monkeypatch.undo()
    names = sorted(verify_checkpoint(folder, checksums=True).files)
    assert names == ["model.safetensors", "optimizer.bin", "random_states_0.pkl"]
    # One write per file, one for the manifest (written under a temporary name, then renamed).
    assert sorted(writes) == sorted([*names, MANIFEST_NAME + ".tmp"]), writes


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs /proc/self/io")
@pytest.mark.parametrize("width", [4, 1024])
def test_a_save_reads_nothing_back(tmp_path, width: int) -> None:
    accelerator = _tiny(tmp_path, width)
    folder = str(tmp_path / "ckpt")
    baseline = -(_read_bytes() - _read_bytes())  # what reading /proc/self/io itself counts
    before = _read_bytes()
    accelerator.save_state(folder)
    read = _read_bytes() - before - baseline
    allowed = 0
    if width >= 1024:  # safetensors wrote the file: its header (the layout) is read to hash it
        with open(os.path.join(folder, "model.safetensors"), "rb") as handle:
            allowed = 8 + int.from_bytes(handle.read(8), "little")
        weights = verify_checkpoint(folder).files["model.safetensors"].size
        assert weights > files.SMALL_FILE_BYTES and allowed < 1024
    assert read <= allowed + 8, (read, allowed)  # + 8: /proc/self/io's numbers grew a digit or two
    verify_checkpoint(folder, checksums=True)  # the checksums computed from memory are the files'


def test_a_durable_save_waits_on_the_disk_twice(tmp_path, monkeypatch, fsyncs) -> None:
    accelerator = _tiny(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    batches: list[tuple[list[str], list[str]]] = []
    real_flush_all = atomic.flush_all

    def counting_flush_all(paths: list[str], folders: list[str] = ()) -> None:
        batches.append(([os.path.basename(p) for p in paths], [os.path.dirname(f) for f in folders]))
        real_flush_all(paths, folders)

    monkeypatch.setattr(atomic, "flush_all", counting_flush_all)
    fsyncs.paths.clear()
    accelerator.save_state(folder)  # overwrites: the swap, then the previous checkpoint is deleted
    names = sorted(verify_checkpoint(folder).files)
    # One batch: every file, the manifest and the staging folder (in the parent), flushed together ...
    assert [(sorted(paths), folders) for paths, folders in batches] == [
        (sorted([*names, MANIFEST_NAME]), [str(tmp_path)])
    ]
    # ... then the parent folder, once: each file once, nothing twice, no flush for the deletion.
    assert len(fsyncs.paths) == len(names) + 3
    assert fsyncs.paths[-1] == str(tmp_path)
    atomic.wait_for_removals()  # the replaced folder is removed in the background
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "warm"]


def test_a_scratch_save_flushes_nothing(tmp_path, monkeypatch, fsyncs) -> None:
    accelerator = _tiny(tmp_path)
    fsyncs.paths.clear()
    calls: list[object] = []
    monkeypatch.setattr(atomic, "flush_all", lambda *args: calls.append(args))
    for _ in range(2):
        accelerator.save_state(str(tmp_path / "ckpt"), durable=False)
    assert fsyncs.paths == [] and calls == []


def test_the_random_states_pickle_a_few_objects(tmp_path) -> None:
    """Python's and NumPy's generator states are packed into bytes: torch.save calls persistent_id once
    per pickled object, 1,250 times for them as lists of ints."""
    accelerator = _tiny(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder, durable=False)
    with zipfile.ZipFile(os.path.join(folder, "random_states_0.pkl")) as archive:
        pickled = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    opcodes = sum(1 for _ in pickletools.genops(io.BytesIO(pickled)))
    assert opcodes < 200, opcodes
