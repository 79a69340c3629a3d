"""Counted work of ``save_state``: fsync calls and bytes written, against what the raw floor does.

The raw floor of a durable save is each file written once and flushed once. ``save_state`` adds the
manifest and one flush per folder it changes (the staging folder, its parent), and no more:
overwriting a checkpoint or rotating old ones away adds at most one flush of the parent folder, and
every payload byte is written once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
import torch

from accelerando import Accelerator
from accelerando.checkpointing import list_checkpoints, verify_checkpoint
from accelerando.plugins.project import ProjectConfiguration

pytestmark = pytest.mark.usefixtures("fresh_state")


class FsyncCounter:
    """Wraps ``os.fsync``: records the path each call flushed (any thread)."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self._lock = threading.Lock()
        self._real = os.fsync

    def __call__(self, fd: int) -> None:
        with self._lock:
            self.paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        self._real(fd)


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[FsyncCounter]:
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to name the flushed files")
    counter = FsyncCounter()
    monkeypatch.setattr(os, "fsync", counter)
    yield counter


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
