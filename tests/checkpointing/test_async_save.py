"""save_state(async_save=True): same files as a synchronous save, crash safety, one save at a time."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

import accelerando.checkpointing.files as F
from accelerando import Accelerator
from accelerando.checkpointing import latest_checkpoint
from accelerando.checkpointing.atomic import read_manifest
from accelerando.utils import ProjectConfiguration


def _setup(tmp_path, **config):
    project = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, **config)
    acc = Accelerator(project_config=project)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    model[1].weight = torch.nn.Parameter(model[1].weight)  # a plain model; tied weights covered below
    opt = torch.optim.Adam(model.parameters())
    dl = torch.utils.data.DataLoader(torch.randn(32, 8), batch_size=4, shuffle=True)
    model, opt, dl = acc.prepare(model, opt, dl)
    for i, batch in enumerate(dl):
        acc.backward(model(batch).sum())
        opt.step()
        opt.zero_grad()
        if i == 2:
            break
    return acc


def _checksums(path):
    return {name: (entry.size, entry.checksum) for name, entry in read_manifest(path).files.items()}


def test_async_result_equals_sync_byte_for_byte(tmp_path):
    acc = _setup(tmp_path)
    synchronous = acc.save_state()
    handle = acc.save_state(async_save=True)
    asynchronous = handle.result()
    assert asynchronous != synchronous
    assert _checksums(asynchronous) == _checksums(synchronous)
    assert latest_checkpoint(str(tmp_path)) == asynchronous


def test_project_configuration_field_and_next_save_waits(tmp_path):
    acc = _setup(tmp_path, async_save=True)
    first = acc.save_state()
    assert hasattr(first, "result")
    second = acc.save_state(async_save=False)  # waits for the first, then saves synchronously
    assert first.done() and isinstance(second, str)
    assert first.result().endswith("checkpoint_0") and second.endswith("checkpoint_1")


def test_a_failed_background_write_leaves_the_previous_checkpoint_newest(tmp_path, monkeypatch):
    acc = _setup(tmp_path)
    previous = acc.save_state()

    def broken(*args, **kwargs):
        raise OSError("the disk went away")

    monkeypatch.setattr(F, "save_model_weights", broken)
    handle = acc.save_state(async_save=True)
    with pytest.raises(OSError, match="went away"):
        handle.result()
    assert latest_checkpoint(str(tmp_path)) == previous
    monkeypatch.undo()
    acc.load_state()  # the previous one loads
    assert acc.resume_point.checkpoint == previous


def _trained(tmp_path):
    project = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    acc = Accelerator(project_config=project)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters())
    model, opt = acc.prepare(model, opt)
    _steps(acc, model, opt, 2)
    return acc, model, opt


def _steps(acc, model, opt, count):
    for _ in range(count):
        acc.backward(model(torch.randn(4, 8)).square().sum())  # BatchNorm's buffers change here
        opt.step()
        opt.zero_grad()


def test_overlapped_copy_holds_the_optimizer_step_and_equals_a_sync_save(tmp_path, monkeypatch):
    """The parameters and Adam state are copied after the training went on to its next step."""
    import accelerando.checkpointing.async_save as A

    acc, model, opt = _trained(tmp_path)
    synchronous = acc.save_state()
    entered = threading.Event()
    finish = A._Snapshot.finish

    def after_the_step_waits(self):
        assert entered.wait(60), "the optimizer step never waited for the copy"
        finish(self)

    monkeypatch.setattr(A._Snapshot, "finish", after_the_step_waits)
    handle = acc.save_state(async_save=True)
    held = opt._snapshot_wait
    assert held is not None

    def wait():
        entered.set()
        held()

    opt._snapshot_wait = wait
    _steps(acc, model, opt, 2)  # forward/backward run during the copy; the step waits for it
    folder = handle.result()
    assert _checksums(folder) == _checksums(synchronous)  # byte for byte, though the training moved on
    assert entered.is_set()
    monkeypatch.undo()
    no_overlap = acc.save_state(async_save=True, overlap_snapshot=False)
    assert opt._snapshot_wait is None  # nothing held: everything was copied before returning
    no_overlap.result()


def test_no_pending_save_costs_the_step_nothing(tmp_path):
    """Counted work: a step after a committed asynchronous save makes the same Python calls as before."""
    acc, model, opt = _trained(tmp_path)

    def calls_of_one_step():
        acc.backward(model(torch.randn(4, 8)).square().sum())
        seen = []
        sys.setprofile(lambda frame, event, arg: seen.append(frame.f_code) if event == "call" else None)
        try:
            opt.step()
        finally:
            sys.setprofile(None)
        opt.zero_grad()
        return [(code.co_filename, code.co_name) for code in seen]

    before = calls_of_one_step()
    acc.save_state(async_save=True).result()
    after = calls_of_one_step()
    assert after == before
    assert not any("checkpointing" in filename for filename, _ in after)
    assert "_snapshot_wait" not in vars(opt) or opt._snapshot_wait is None


def test_fsdp_shards_are_staged_not_written_while_an_async_save_collects(tmp_path):
    """save_or_stage writes at once outside an asynchronous save and only stages inside one."""
    from accelerando.checkpointing.async_dcp import ShardWrites, collecting, save_or_stage
    from accelerando.checkpointing.target import CheckpointMemory

    tensor = torch.arange(6.0)
    writes = ShardWrites(CheckpointMemory())
    with collecting(writes):
        save_or_stage({"model": {"w": tensor}}, str(tmp_path / "staged"))
    assert not (tmp_path / "staged").exists() and len(writes.pending) == 1
    tensor.add_(1)  # the staged copy is a snapshot
    ((staged, folder),) = writes.pending
    assert torch.equal(staged["model"]["w"], torch.arange(6.0)) and folder.endswith("staged")


def test_gradients_of_an_unfinished_cycle_are_copied_before_the_next_backward(tmp_path, monkeypatch):
    """Mid-accumulation, backward adds into ``.grad`` in place: those are copied in the foreground."""
    import accelerando.checkpointing.async_save as A

    acc, model, opt = _trained(tmp_path)
    backward_done = threading.Event()
    finish = A._Snapshot.finish

    def after_the_backward(self):
        assert backward_done.wait(60)
        finish(self)

    acc.gradient_state._set_sync_gradients(False)
    try:
        acc.backward(model(torch.randn(4, 8)).square().sum())
        synchronous = acc.save_state()
        monkeypatch.setattr(A._Snapshot, "finish", after_the_backward)
        handle = acc.save_state(async_save=True)
        acc.backward(model(torch.randn(4, 8)).square().sum())  # before the background copies anything
        backward_done.set()
        folder = handle.result()
    finally:
        acc.gradient_state._set_sync_gradients(True)
    assert any(name.startswith("gradients") or "grad" in name for name in _checksums(folder))
    assert _checksums(folder) == _checksums(synchronous)


_EXIT_SCRIPT = """
import sys, time, torch
import accelerando.checkpointing.async_save as A
from accelerando import Accelerator
from accelerando.utils import ProjectConfiguration

finish = A._Snapshot.finish
def slow(self):
    time.sleep(1.0)  # still copying when the script ends
    finish(self)
A._Snapshot.finish = slow
acc = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=sys.argv[1], automatic_checkpoint_naming=True))
model, opt = acc.prepare(torch.nn.Linear(4, 2), torch.optim.SGD(torch.nn.Linear(4, 2).parameters(), lr=0.1))
acc.save_state(async_save=True)
print("returned", flush=True)
"""


def test_the_end_of_the_process_waits_for_a_pending_save(tmp_path):
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "returned" in done.stdout
    assert latest_checkpoint(str(tmp_path)).endswith("checkpoint_0")
    assert read_manifest(latest_checkpoint(str(tmp_path))).files
