"""save_state(async_save=True): same files as a synchronous save, crash safety, one save at a time."""

from __future__ import annotations

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
