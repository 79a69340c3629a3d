"""A full disk during ``save_state``: ``OSError(ENOSPC)`` saying "no space left on device" with the bytes
needed and free, nothing committed, the staging folder gone, earlier checkpoints untouched.

For real on a 2 MiB tmpfs (needs root and a kernel that lets us mount; skipped otherwise), and by
faking the failure at the writers, in each form it takes (errno, torch's zip writer, torch's legacy
writer, safetensors), in every step of the save.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess

import pytest
import torch

from accelerando import Accelerator
from accelerando.checkpointing import atomic, files, list_checkpoints, verify_checkpoint
from accelerando.plugins.project import ProjectConfiguration

pytestmark = pytest.mark.usefixtures("fresh_state")


def _setup(project: str, width: int = 16):
    config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True, total_limit=2)
    accelerator = Accelerator(cpu=True, project_config=config)
    model = torch.nn.Linear(width, width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    return accelerator, model


def _assert_nothing_lost(accelerator, root: str, committed: list[int]) -> None:
    assert [n for n, _ in list_checkpoints(root)] == committed
    for _, path in list_checkpoints(root):
        verify_checkpoint(path, checksums=True)
    assert [n for n in os.listdir(root) if n.startswith(".")] == []  # the staging folder is gone
    assert accelerator.save_iteration == committed[-1] + 1


def _numbers_in(message: str) -> tuple[int, int]:
    needed = re.search(r"needs about ([\d,]+) bytes", message)
    free = re.search(r"and ([\d,]+) bytes \([^)]*\) are free", message)
    assert needed and free, message
    return int(needed.group(1).replace(",", "")), int(free.group(1).replace(",", ""))


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs mounted at ``tmp_path / "disk"`` (root only)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as err:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root and mount rights): {err}")
    try:
        yield str(disk)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False, capture_output=True, timeout=30)


def test_a_really_full_disk(small_disk) -> None:
    project = os.path.join(small_disk, "run")
    root = os.path.join(project, "checkpoints")
    accelerator, _ = _setup(project, width=320)  # ~0.4 MB of weights, ~0.8 MB of AdamW state
    accelerator.save_state()
    try:
        with pytest.raises(OSError) as caught:
            accelerator.save_state()  # a second ~1.2 MB checkpoint does not fit in the 2 MiB
        error = caught.value
        assert error.errno == errno.ENOSPC
        assert "no space left on device" in str(error) and "checkpoint_1" in str(error)
        needed, free = _numbers_in(str(error))
        assert needed >= 320 * 321 * 4 * 3  # weights + two AdamW moments
        assert 0 < free < needed
        _assert_nothing_lost(accelerator, root, [0])
    finally:
        accelerator._checkpoints.target.release_locks()


_ENOSPC_FORMS = {
    "errno": lambda: OSError(errno.ENOSPC, "No space left on device"),
    "torch-zip-writer": lambda: RuntimeError(
        "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"
    ),
    "torch-legacy-writer": lambda: RuntimeError("write(): fd 3 failed with No space left on device"),
}


@pytest.mark.parametrize("form", sorted(_ENOSPC_FORMS))
def test_torch_writer_running_out_of_space(tmp_path, monkeypatch, form: str) -> None:
    accelerator, _ = _setup(str(tmp_path))
    root = os.path.join(str(tmp_path), "checkpoints")
    accelerator.save_state()
    real_save = torch.save

    def save_until_full(obj, path, *args, **kwargs):
        real_save(obj, path, *args, **kwargs)  # part of the file reached the disk
        raise _ENOSPC_FORMS[form]()

    monkeypatch.setattr(files.torch, "save", save_until_full)
    # torch's zip writer does not say why a write fell short: a nearly full disk makes it ENOSPC.
    monkeypatch.setattr(atomic, "free_bytes", lambda folder: 1000)
    with pytest.raises(OSError, match="no space left on device") as caught:
        accelerator.save_state()
    assert caught.value.errno == errno.ENOSPC
    needed, free = _numbers_in(str(caught.value))
    assert needed >= 16 * 17 * 4 * 3 and free >= 1000
    assert isinstance(caught.value.__cause__, type(_ENOSPC_FORMS[form]()))
    _assert_nothing_lost(accelerator, root, [0])
    monkeypatch.setattr(files.torch, "save", real_save)
    assert os.path.basename(accelerator.save_state()) == "checkpoint_1"  # the next save works again
    accelerator._checkpoints.target.release_locks()


@pytest.mark.parametrize("writer", ["save_file", "one write from memory"])
def test_safetensors_running_out_of_space(tmp_path, monkeypatch, writer: str) -> None:
    import safetensors.torch
    from safetensors import SafetensorError

    from accelerando.checkpointing import written

    accelerator, _ = _setup(str(tmp_path))
    accelerator.save_state()

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    def short_write(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if writer == "save_file":  # big weights: safetensors writes the file from the tensors' memory
        monkeypatch.setattr(files, "SMALL_FILE_BYTES", 0)
        monkeypatch.setattr(safetensors.torch, "save_file", full)
    else:  # small weights are serialized in memory and written in one write
        monkeypatch.setattr(written, "_write_all", short_write)
    with pytest.raises(OSError, match="no space left on device") as caught:
        accelerator.save_state()
    assert caught.value.errno == errno.ENOSPC
    _assert_nothing_lost(accelerator, os.path.join(str(tmp_path), "checkpoints"), [0])
    accelerator._checkpoints.target.release_locks()


def test_disk_full_when_writing_the_manifest(tmp_path, monkeypatch) -> None:
    accelerator, _ = _setup(str(tmp_path))
    accelerator.save_state()
    real_commit = atomic.commit

    def commit_on_a_full_disk(staging, final_dir, manifest, durable=True, **flushes):
        with open(os.path.join(staging, atomic.MANIFEST_NAME + ".tmp"), "w") as handle:
            handle.write("{")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "commit", commit_on_a_full_disk)
    with pytest.raises(OSError, match="no space left on device"):
        accelerator.save_state()
    _assert_nothing_lost(accelerator, os.path.join(str(tmp_path), "checkpoints"), [0])
    monkeypatch.setattr(atomic, "commit", real_commit)
    accelerator.save_state()
    accelerator._checkpoints.target.release_locks()


def test_a_short_write_with_space_left_is_not_called_a_full_disk(tmp_path, monkeypatch) -> None:
    """torch's "unexpected pos" with plenty of space free (e.g. an I/O error) keeps its own message."""
    accelerator, _ = _setup(str(tmp_path))

    def broken(obj, path, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    monkeypatch.setattr(files.torch, "save", broken)
    monkeypatch.setattr(atomic, "free_bytes", lambda folder: 1 << 40)
    with pytest.raises(RuntimeError, match="unexpected pos") as caught:
        accelerator.save_state()
    assert "no space" not in str(caught.value)
    assert os.listdir(os.path.join(str(tmp_path), "checkpoints")) == []
    accelerator._checkpoints.target.release_locks()


def test_every_process_raises_the_same_kind_of_error() -> None:
    """What the processes that did not fail raise, from the failed process's report."""
    from accelerando.checkpointing import save
    from accelerando.checkpointing.lock import CheckpointLockedError

    full = atomic.no_space_error(OSError(errno.ENOSPC, "x"), "/nowhere/ckpt", "/nowhere/.ckpt.partial", 10)
    with pytest.raises(OSError, match="process 1: .*no space left on device") as caught:
        save._raise_reported(None, [(1, save._report(full))], "write")
    assert caught.value.errno == errno.ENOSPC
    refusal = CheckpointLockedError("Cannot save into '/p': another process is writing checkpoints there")
    with pytest.raises(CheckpointLockedError) as caught:
        save._raise_reported(None, [(0, save._report(refusal))], "prepare")
    assert str(caught.value) == str(refusal)
    with pytest.raises(
        atomic.CheckpointError, match="Checkpoint not saved: process 1 failed to write: KeyError: 'k'"
    ):
        save._raise_reported(None, [(1, save._report(KeyError("k")))], "write")


def test_explicit_form_reports_a_full_disk(tmp_path, monkeypatch) -> None:
    import safetensors.torch

    from accelerando.checkpointing import save_accelerator_state

    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.torch, "save", full)
    monkeypatch.setattr(safetensors.torch, "save_file", full)
    monkeypatch.setattr(atomic, "free_bytes", lambda folder: 1000)
    with pytest.raises(OSError, match="no space left on device") as caught:
        save_accelerator_state(str(tmp_path / "explicit"), [model.state_dict()], [optimizer], process_index=0)
    assert caught.value.errno == errno.ENOSPC
    message = str(caught.value)
    assert f"{64 * 64 * 4 + 64 * 4:,} bytes" in message and "1,000 bytes are free" in message
    assert "incomplete" in message
