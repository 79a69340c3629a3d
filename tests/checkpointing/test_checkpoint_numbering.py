"""Checkpoint numbering: after automatic resume fell back past a damaged checkpoint, the next save takes a
fresh number (no ``checkpoint_<n>`` name is ever reused, damaged and incomplete ones included), and
rotation still keeps ``total_limit`` intact checkpoints."""

from __future__ import annotations

import os

import pytest
import torch

from accelerando import Accelerator
from accelerando.checkpointing import list_checkpoints, verify_checkpoint
from accelerando.plugins.project import ProjectConfiguration
from suite_support import reset_accelerator_state

pytestmark = pytest.mark.usefixtures("fresh_state")


def _run(project: str, total_limit: int | None = 2):
    """A fresh Accelerator (as a restarted process would build it) with a model."""
    reset_accelerator_state()
    config = ProjectConfiguration(
        project_dir=project, automatic_checkpoint_naming=True, total_limit=total_limit
    )
    accelerator = Accelerator(cpu=True, project_config=config)
    model = accelerator.prepare(torch.nn.Linear(4, 3))
    return accelerator, model


def _fill(model, value: float) -> None:
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(value)


def _value(model) -> float:
    values = {float(v) for p in model.parameters() for v in p.detach().flatten()}
    assert len(values) == 1
    return values.pop()


def _damage(folder: str) -> None:
    path = os.path.join(folder, "model.safetensors")
    with open(path, "r+b") as handle:
        handle.seek(-3, os.SEEK_END)
        byte = handle.read(1)
        handle.seek(-3, os.SEEK_END)
        handle.write(bytes([byte[0] ^ 0x01]))


def _numbers(root: str) -> list[int]:
    return [n for n, _ in list_checkpoints(root)]


@pytest.mark.parametrize("restart", [False, True], ids=["same-accelerator", "restarted"])
def test_save_after_a_fallback_takes_a_fresh_number_and_rotation_keeps_the_limit(
    tmp_path, restart: bool
) -> None:
    project = str(tmp_path)
    root = os.path.join(project, "checkpoints")
    accelerator, model = _run(project)
    for value in (0.0, 1.0, 2.0):
        _fill(model, value)
        accelerator.save_state()
    assert _numbers(root) == [1, 2]
    _damage(os.path.join(root, "checkpoint_2"))
    if restart:
        accelerator._checkpoints.target.release_locks()
        accelerator, model = _run(project)
    with pytest.warns(UserWarning, match="Skipping damaged checkpoint"):
        accelerator.load_state()
    assert _value(model) == 1.0 and accelerator.save_iteration == 2

    _fill(model, 3.0)
    path = accelerator.save_state()  # used to fail: "checkpoint_2 already exists"
    assert os.path.basename(path) == "checkpoint_3" and accelerator.save_iteration == 4
    # The damaged checkpoint_2 does not count: the two intact ones, 1 and 3, are kept.
    assert _numbers(root) == [1, 2, 3]
    _fill(model, 4.0)
    accelerator.save_state()
    assert _numbers(root) == [3, 4]  # once older than every kept checkpoint, the damaged one goes too
    for number in (3, 4):
        verify_checkpoint(os.path.join(root, f"checkpoint_{number}"), checksums=True)
    _fill(model, -1.0)
    accelerator.load_state()
    assert _value(model) == 4.0 and accelerator.save_iteration == 5
    accelerator._checkpoints.target.release_locks()


def test_incomplete_folders_numbers_are_never_reused(tmp_path) -> None:
    """A newer ``checkpoint_<n>`` without a manifest (a save of another tool, or copied half-way) keeps
    its name: the resumed run saves past it and leaves it alone."""
    project = str(tmp_path)
    root = os.path.join(project, "checkpoints")
    accelerator, model = _run(project, total_limit=None)
    _fill(model, 1.0)
    accelerator.save_state()
    os.makedirs(os.path.join(root, "checkpoint_1"))
    (tmp_path / "checkpoints" / "checkpoint_1" / "note.txt").write_text("not ours")
    os.makedirs(os.path.join(root, "checkpoint_7"))
    accelerator._checkpoints.target.release_locks()
    accelerator, model = _run(project, total_limit=None)
    with pytest.warns(UserWarning, match="incomplete checkpoint"):
        accelerator.load_state()
    assert accelerator.save_iteration == 1
    assert os.path.basename(accelerator.save_state()) == "checkpoint_8"
    assert os.path.basename(accelerator.save_state()) == "checkpoint_9"
    assert (tmp_path / "checkpoints" / "checkpoint_1" / "note.txt").read_text() == "not ours"
    accelerator._checkpoints.target.release_locks()


def test_a_run_that_did_not_resume_numbers_after_the_existing_checkpoints(tmp_path) -> None:
    """Its iteration (0) is older than what rotation keeps: saving checkpoint_0 would have it deleted at
    once by its own rotation, so it continues the numbering; an iteration the user set to an existing
    checkpoint's number is still refused."""
    project = str(tmp_path)
    root = os.path.join(project, "checkpoints")
    accelerator, model = _run(project)
    for value in (0.0, 1.0, 2.0):
        _fill(model, value)
        accelerator.save_state()
    accelerator._checkpoints.target.release_locks()
    accelerator, model = _run(project)
    _fill(model, 9.0)
    assert os.path.basename(accelerator.save_state()) == "checkpoint_3"
    assert _numbers(root) == [2, 3]
    accelerator.project_configuration.iteration = 2
    with pytest.raises(ValueError, match="checkpoint_2' already exists.*next free number \\(4\\)"):
        accelerator.save_state()
    accelerator._checkpoints.target.release_locks()
