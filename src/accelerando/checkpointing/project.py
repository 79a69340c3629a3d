"""The project folder's checkpoint layout (``checkpoints/checkpoint_<n>``) and resume points."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Protocol

import accelerando.checkpointing.atomic as atomic
from accelerando.checkpointing.foreign import is_reference_checkpoint
from accelerando.checkpointing.target import CheckpointTarget, LoadsOwnCheckpoints, MemorySlot

__all__ = [
    "CHECKPOINTS_FOLDER",
    "NUMBERED",
    "RESUME_POINT",
    "ResumePoint",
    "checkpoint_numbers",
    "checkpoints_dir",
    "latest_checkpoint",
    "owns_loading",
    "resume_point",
]

CHECKPOINTS_FOLDER = "checkpoints"
NUMBERED = re.compile(r"^checkpoint_(\d+)$")


@dataclass(frozen=True)
class ResumePoint:
    """Where a run stands after ``load_state``: what an auto-resuming script needs to continue.

    Attributes:
        checkpoint: The folder that was loaded.
        step: The accelerator's micro-step counter (``accelerator.step``) at the save.
        epoch: Epoch of the first prepared dataloader at the save (0 without dataloaders).
        batches_to_skip: Batches of that epoch already consumed, which the script must skip with
            ``accelerator.skip_first_batches``; 0 in stateful mode, where the loader itself resumes.
            Counted in this run's batches: after a save on another number of processes (or batch
            size) it is the saved global position in whole batches of this run, rounded down, and
            skipping exactly this many starts at the exact sample the saved run stopped at (see
            ``PreparedLoaderMixin.load_state_dict``).
        dataloaders: ``(epoch, position)`` for every prepared dataloader, in order, in this run's batches.
    """

    checkpoint: str
    step: int
    epoch: int = 0
    batches_to_skip: int = 0
    dataloaders: tuple[tuple[int, int], ...] = ()


def _no_resume_point() -> ResumePoint | None:
    return None


# What the last load_state of an Accelerator restored (in its checkpoint memory).
RESUME_POINT: MemorySlot[ResumePoint | None] = MemorySlot("resume point", _no_resume_point)


class _Resumable(Protocol):
    @property
    def resume_point(self) -> ResumePoint | None: ...


def checkpoints_dir(target: CheckpointTarget) -> str:
    """The ``checkpoints`` folder of the project (automatic checkpoint naming).

    Raises:
        ValueError: If no project folder is configured (the message names the two ways to give one).
    """
    project_dir = target.project_configuration.project_dir
    if project_dir is None:
        raise ValueError(
            "automatic_checkpoint_naming needs a project folder; pass project_dir= to Accelerator or "
            "ProjectConfiguration(project_dir=...)."
        )
    return os.path.join(os.fspath(project_dir), CHECKPOINTS_FOLDER)


def checkpoint_numbers(root: str) -> list[int]:
    """Numbers of every ``checkpoint_<n>`` entry under ``root``, complete or not, ascending.

    Damaged and incomplete folders count: a new checkpoint must never take one of their names.
    """
    if not os.path.isdir(root):
        return []
    return sorted(int(match.group(1)) for name in os.listdir(root) if (match := NUMBERED.match(name)))


def owns_loading(target: CheckpointTarget, folder: str | None = None) -> bool:
    """Whether the strategy restores models and optimizers itself: sharded layouts, or (with ``folder``)
    a checkpoint of another layout that it loads through a conversion it planned for that folder.
    """
    strategy = target.strategy
    return isinstance(strategy, LoadsOwnCheckpoints) or (folder is not None and strategy.converts(folder))


def latest_checkpoint(project_dir: str | os.PathLike) -> str | None:
    """Newest complete checkpoint folder under ``<project_dir>/checkpoints``, or None.

    Complete means committed (it has a manifest), or written by the reference library's
    ``save_state`` (its layout, without a manifest); damage is found when loading.

    Args:
        project_dir: The run's project folder.

    Returns:
        The folder path, or None when there is none (a fresh run).
    """
    root = os.path.join(os.fspath(project_dir), CHECKPOINTS_FOLDER)
    found = [(int(number), path) for number, path in atomic.list_checkpoints(root)]
    for name in os.listdir(root) if os.path.isdir(root) else []:
        match = NUMBERED.match(name)
        path = os.path.join(root, name)
        if match and not os.path.islink(path) and os.path.isdir(path):
            names = os.listdir(path)
            if atomic.MANIFEST_NAME not in names and is_reference_checkpoint(names, path):
                found.append((int(match.group(1)), path))
    return max(found)[1] if found else None


def resume_point(accelerator: _Resumable) -> ResumePoint | None:
    """What the last ``load_state`` of ``accelerator`` restored, or None if it loaded nothing.

    Example:
        >>> if latest_checkpoint(project_dir):
        ...     accelerator.load_state()
        >>> point = resume_point(accelerator)
        >>> start_epoch, skip = (point.epoch, point.batches_to_skip) if point else (0, 0)
    """
    return accelerator.resume_point
