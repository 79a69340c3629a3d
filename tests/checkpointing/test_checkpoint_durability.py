"""Durable and scratch ``save_state``: the fsync calls each mode makes, counted, and atomicity in both.

A durable save (the default) flushes every file it wrote, the manifest, the staging folder and the
parent folder; a scratch save (``save_state(durable=False)``, ``ACCELERANDO_CHECKPOINT_DURABLE=0``)
makes no fsync at all, and keeps the staging folder, the manifest and the atomic rename.
"""

from __future__ import annotations

import os

import pytest
import torch

from accelerando import Accelerator
from accelerando.checkpointing import CheckpointError, list_checkpoints, verify_checkpoint
from accelerando.checkpointing.atomic import MANIFEST_NAME
from accelerando.plugins.project import ProjectConfiguration

pytestmark = pytest.mark.usefixtures("fresh_state")


def _prepared(tmp_path, **config: object) -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer]:
    accelerator = Accelerator(
        cpu=True, project_config=ProjectConfiguration(project_dir=str(tmp_path), **config)
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    return accelerator, model, optimizer


def test_durable_save_flushes_each_file_once_then_the_manifest_and_both_folders(tmp_path, fsyncs) -> None:
    accelerator, _, _ = _prepared(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder)
    files = sorted(verify_checkpoint(folder).files)
    assert len(files) >= 3  # weights, optimizer, random states at least
    # Each file once (in the staging folder), the manifest, the staging folder, the parent: no more.
    assert len(fsyncs.paths) == len(files) + 3, fsyncs.paths
    # The files, the manifest and the staging folder are flushed together (in any order), before the
    # rename; the parent folder after it.
    staged = fsyncs.paths[:-1]
    staging = [path for path in staged if os.path.basename(path).endswith(".partial")]
    assert len(staging) == 1 and os.path.dirname(staging[0]) == str(tmp_path), staged
    flushed = sorted(os.path.basename(path) for path in staged if path not in staging)
    assert flushed == sorted([*files, MANIFEST_NAME])
    assert all(os.path.dirname(path) == staging[0] for path in staged if path not in staging)
    assert fsyncs.paths[-1] == str(tmp_path)


@pytest.mark.parametrize("how", ["keyword", "environment"])
def test_scratch_save_makes_no_fsync_and_loads_back_verified(tmp_path, fsyncs, monkeypatch, how) -> None:
    if how == "environment":
        monkeypatch.setenv("ACCELERANDO_CHECKPOINT_DURABLE", "0")
    accelerator, model, _ = _prepared(tmp_path)
    if how == "environment":
        assert accelerator.settings.checkpoint_durable is False
    folder = str(tmp_path / "ckpt")
    kwargs = {"durable": False} if how == "keyword" else {}
    accelerator.save_state(folder, **kwargs)
    accelerator.save_state(folder, **kwargs)  # overwrite: the atomic swap and the trash, still no fsync
    assert fsyncs.paths == []
    verify_checkpoint(folder, checksums=True)  # the manifest describes every file, checksums included
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.zero_()
    accelerator.load_state(folder)
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # no staging or trash folder left


def test_keyword_wins_over_the_setting(tmp_path, fsyncs, monkeypatch) -> None:
    monkeypatch.setenv("ACCELERANDO_CHECKPOINT_DURABLE", "false")
    accelerator, _, _ = _prepared(tmp_path)
    accelerator.save_state(str(tmp_path / "ckpt"), durable=True)
    assert len(fsyncs.paths) == len(verify_checkpoint(str(tmp_path / "ckpt")).files) + 3


def test_scratch_rotation_and_async_save_make_no_fsync(tmp_path, fsyncs) -> None:
    accelerator, _, _ = _prepared(tmp_path, automatic_checkpoint_naming=True, total_limit=1)
    accelerator.save_state(durable=False)
    accelerator.save_state(durable=False)  # rotates checkpoint_0 away
    accelerator.save_state(durable=False, async_save=True).result()  # rotates checkpoint_1 away
    assert fsyncs.paths == []
    assert [n for n, _ in list_checkpoints(str(tmp_path / "checkpoints"))] == [2]


@pytest.mark.parametrize("durable", [True, False])
def test_a_failed_save_commits_nothing_in_either_mode(tmp_path, durable) -> None:
    accelerator, model, _ = _prepared(tmp_path)
    folder = str(tmp_path / "ckpt")
    accelerator.save_state(folder, durable=durable)
    before = {name: (tmp_path / "ckpt" / name).read_bytes() for name in os.listdir(folder)}

    def failing_hook(models, weights, output_dir) -> None:
        (open(os.path.join(output_dir, "half_written.bin"), "wb")).close()
        raise RuntimeError("the process died half-way")

    handle = accelerator.register_save_state_pre_hook(failing_hook)
    with torch.no_grad():
        model.weight.add_(1.0)
    with pytest.raises((RuntimeError, CheckpointError), match="half-way"):
        accelerator.save_state(folder, durable=durable)
    handle.remove()
    # The previous checkpoint is untouched and complete; nothing of the failed save is visible.
    assert {name: (tmp_path / "ckpt" / name).read_bytes() for name in os.listdir(folder)} == before
    verify_checkpoint(folder, checksums=True)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_durable_must_be_a_bool(tmp_path) -> None:
    accelerator, _, _ = _prepared(tmp_path)
    with pytest.raises(TypeError, match="durable"):
        accelerator.save_state(str(tmp_path / "ckpt"), durable="no")
